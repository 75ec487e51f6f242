// Watches (protocol 1.1 `watch` and `unwatch`), run with `node --test`.
//
// Against the real rankd at RANKD_ADDR (skipped without it; TLS and tokens
// as client.test.js describes): a `top` watch follows writes and its last
// event is what `top` answers; a `player` watch follows one player;
// unwatching stops the pushes; a connection holds 64 watches; dropping the
// board ends a `top` watch with a null event. Against a scripted stand-in
// server (always run): pushes routed by id, also in the chunk of the
// `watch` reply; a watch asking again on a new connection; a watch ending
// when no new connection can be had.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { RankdConnectionError, Watch } from "../index.js";
import { FakeServer, NO_SERVER, freshBoard, open, rejectsWithCode, sleep } from "./support.js";

/** The first event of `watch` that satisfies `predicate`, within `timeoutMs`. */
async function eventWhere(watch, predicate, what = "an event", timeoutMs = 5_000) {
  const seen = [];
  for await (const event of watch.events({ idleMs: timeoutMs })) {
    if (predicate(event)) return event;
    seen.push(event);
  }
  assert.fail(`no ${what} within ${timeoutMs} ms (watch ${watch.ended ?? "active"}); saw ${JSON.stringify(seen)}`);
}

const next = (watch, timeoutMs) => eventWhere(watch, () => true, "event", timeoutMs);

/** A small deterministic generator of integers in [0, n). */
function rng(seed) {
  let state = seed >>> 0;
  return (n) => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state % n;
  };
}

/** Runs `body` with two clients, destroyed afterwards. */
async function withTwo(body) {
  const [db, writer] = await Promise.all([open(), open()]);
  try {
    return await body(db, writer);
  } finally {
    db.destroy();
    writer.destroy();
  }
}

describe("watches against rankd", { skip: NO_SERVER }, () => {
  test("a top watch follows writes; its last event is what top answers", async () => {
    await withTwo(async (db, writer) => {
      const board = freshBoard("watch_top");
      const pushes = [];
      db.on("push", (push) => pushes.push(push));
      const watch = await db.watch(board, { top: 5 }, { intervalMs: 10, buffer: 10_000 });
      assert.ok(watch instanceof Watch);
      assert.equal(typeof watch.id, "number");
      assert.deepEqual([watch.board, watch.top, watch.player], [board, 5, undefined]);
      assert.deepEqual(await next(watch), [], "the first event is the current state: an empty board");
      const emitted = [];
      watch.on("event", (event) => emitted.push(event));
      const random = rng(5);
      for (let round = 0; round < 20; round++) {
        // Writes from another connection, and on the watching one between pushes.
        const entries = Array.from({ length: 20 }, () => [`p${String(random(40)).padStart(2, "0")}`, 1 + random(49)]);
        await writer.setMany(board, entries, { mode: "incr" });
        await db.set(board, `p${String(random(40)).padStart(2, "0")}`, 1 + random(49), { mode: "incr" });
        if (round % 5 === 0) await sleep(30);
      }
      const fresh = await writer.top(board, { limit: 5 });
      const events = [];
      for await (const event of watch.events({ idleMs: 500 })) events.push(event);
      assert.ok(events.length > 0, "the writes were pushed");
      assert.deepEqual(events.at(-1), fresh, "the last event is what top answers");
      assert.deepEqual(watch.latest, fresh);
      assert.deepEqual(emitted, events, "the `event` events are the iterated ones");
      for (const event of events) {
        assert.ok(Array.isArray(event) && event.length > 0 && event.length <= 5);
        const ranks = event.map((entry) => entry.rank);
        assert.deepEqual(ranks, [...ranks].sort((a, b) => a - b));
      }
      for (let i = 1; i < events.length; i++) assert.notDeepEqual(events[i], events[i - 1], "an event only when the value changes");
      assert.ok(events.length < 20 * 21, "pushes are coalesced, not one per write");
      assert.ok(pushes.length > events.length, "the raw pushes are `push` events too");
      assert.ok(pushes.every((push) => push.watch === watch.id));
      assert.ok(watch.active, "ending the loop leaves the watch open");
      assert.equal(await watch.close(), true);
    });
  });

  test("a player watch follows the player", async () => {
    await withTwo(async (db, writer) => {
      const board = freshBoard("watch_player");
      const watch = await db.watch(board, { player: "alice", intervalMs: 10, buffer: 100 });
      assert.deepEqual([watch.top, watch.player], [undefined, "alice"]);
      assert.equal(await next(watch), null, "alice is absent");
      await writer.set(board, "alice", 10);
      assert.deepEqual(await eventWhere(watch, (e) => e !== null, "alice"), { rank: 1, score: 10, count: 1 });
      await writer.set(board, "bob", 20);
      assert.deepEqual(await eventWhere(watch, (e) => e?.count === 2, "bob's arrival"), { rank: 2, score: 10, count: 2 });
      await writer.set(board, "carol", 5); // below alice: her rank stays, the count does not
      assert.deepEqual(await eventWhere(watch, (e) => e?.count === 3, "carol's arrival"), { rank: 2, score: 10, count: 3 });
      await writer.remove(board, "alice");
      assert.equal(await eventWhere(watch, (e) => e === null, "alice's removal"), null);
      assert.ok(watch.active, "a player watch stays open while the player is absent");
      await writer.set(board, "alice", 30);
      assert.deepEqual(await eventWhere(watch, (e) => e !== null, "alice again"), { rank: 1, score: 30, count: 3 });
      assert.equal(await db.unwatch(watch), true);
    });
  });

  test("unwatch, by watch or by id, stops the pushes", async () => {
    await withTwo(async (db, writer) => {
      const board = freshBoard("unwatch");
      const top = await db.watch(board, { top: 3, intervalMs: 10 });
      const player = await db.watch(board, { player: "a" }, { intervalMs: 10 });
      assert.notEqual(top.id, player.id);
      assert.deepEqual(await next(top), []);
      assert.equal(await next(player), null);
      const ends = [];
      top.on("end", (reason) => ends.push(reason));
      const topId = top.id;
      assert.equal(await top.close(), true, "the server had it open");
      assert.deepEqual([top.active, top.ended, top.id, ends], [false, "unwatched", null, ["unwatched"]]);
      const playerId = player.id;
      assert.equal(await db.unwatch(playerId), true, "by the id the server gave");
      assert.equal(player.ended, "unwatched");
      const pushes = [];
      db.on("push", (push) => pushes.push(push));
      await writer.set(board, "a", 1);
      await sleep(300);
      assert.deepEqual(pushes.filter((push) => push.watch === topId || push.watch === playerId), [], "no push after unwatch");
      assert.deepEqual(await top[Symbol.asyncIterator]().next(), { value: undefined, done: true }, "an ended watch's iteration ends");
      assert.equal(await top.close(), false, "already ended");
      assert.equal(await db.unwatch(topId), false, "the server no longer has it");
      assert.equal(await db.ping(), "pong");
    });
  });

  test("a connection holds 64 watches: the 65th is too_large", async () => {
    await withTwo(async (db) => {
      const board = freshBoard("watch_64");
      const watches = await Promise.all(Array.from({ length: 64 }, (_, i) => db.watch(board, { player: `p${i}` })));
      assert.equal(new Set(watches.map((watch) => watch.id)).size, 64, "64 ids");
      assert.equal(db.watches.length, 64);
      await rejectsWithCode(db.watch(board, { top: 1 }), "too_large");
      assert.equal(db.watches.length, 64, "the refused watch is not kept");
      assert.equal(await db.ping(), "pong", "the connection stays usable");
      assert.equal(await watches[0].close(), true);
      const another = await db.watch(board, { top: 1 });
      assert.deepEqual(await next(another), []);
      // Other connections have their own 64.
      await (async () => {
        const other = await open();
        try {
          assert.deepEqual(await next(await other.watch(board, { top: 2 })), []);
        } finally {
          other.destroy();
        }
      })();
    });
  });

  test("dropping the board ends a top watch after a null event; a player watch stays open", async () => {
    await withTwo(async (db, writer) => {
      const board = freshBoard("watch_drop");
      await writer.setMany(board, [["a", 1], ["b", 2]]);
      const top = await db.watch(board, { top: 3 }, { intervalMs: 10 });
      const player = await db.watch(board, { player: "a" }, { intervalMs: 10 });
      const ends = [];
      top.on("end", (reason, error) => ends.push([reason, error]));
      assert.equal((await next(top)).length, 2);
      assert.deepEqual(await next(player), { rank: 2, score: 1, count: 2 });
      assert.equal(await writer.dropBoard(board), true);
      const rest = [];
      for await (const event of top) rest.push(event); // ends by itself
      assert.equal(rest.at(-1), null, "the last event is null");
      assert.deepEqual([top.active, top.ended, top.error], [false, "the board was dropped", undefined]);
      assert.deepEqual(ends, [["the board was dropped", undefined]]);
      assert.equal(await eventWhere(player, (e) => e === null, "the drop"), null);
      assert.ok(player.active, "for a player watch, null is also an absent player");
      assert.equal(await player.close(), false, "the server had ended it");
      assert.equal(await top.close(), false);
      // The name is free again, and a watch of it starts afresh.
      const again = await db.watch(board, { top: 3 });
      assert.deepEqual(await next(again), []);
    });
  });

  test("bad watches are refused", async () => {
    await withTwo(async (db) => {
      const board = freshBoard("watch_bad");
      await assert.rejects(db.watch(board, {}), TypeError);
      await assert.rejects(db.watch(board, { top: 3, player: "a" }), TypeError);
      await assert.rejects(db.watch(board, { top: 3 }, { buffer: 0 }), RangeError);
      await rejectsWithCode(db.watch(board, { top: 0 }), "bad_request");
      await rejectsWithCode(db.watch(board, { top: 101 }), "bad_request");
      await rejectsWithCode(db.watch(board, { top: 3 }, { intervalMs: 5 }), "bad_request");
      await rejectsWithCode(db.watch("no spaces allowed", { top: 3 }), "bad_request");
      assert.equal(db.watches.length, 0);
    });
  });
});

describe("watches against a scripted server", () => {
  test("pushes go to their own watch, also in the chunk of the watch reply", async () => {
    const server = await new FakeServer(async (conn) => {
      const first = await conn.read();
      conn.send({ id: first.id, ok: { watch: 1 } }, { watch: 1, event: [] });
      const second = await conn.read();
      conn.send(
        { id: second.id, ok: { watch: 2 } },
        { watch: 2, event: null },
        { watch: 1, event: [{ player: "a", score: 5, rank: 1 }] },
        { watch: 77, event: "nobody's" },
      );
      const get = await conn.read();
      conn.send({ watch: 2, event: { rank: 1, score: 5, count: 1 } }, { id: get.id, ok: 5 });
      for (let request; (request = await conn.read()); ) conn.reply(request, true);
    }).start();
    const db = await server.connect();
    try {
      const pushes = [];
      db.on("push", (push) => pushes.push(push.watch));
      const top = await db.watch("b", { top: 3 }, { intervalMs: 50, buffer: 10 });
      const player = await db.watch("b", { player: "a" }, { buffer: 10 });
      assert.deepEqual(server.connections[0].log.slice(0, 2).map(({ id, ...rest }) => rest), [
        { op: "watch", board: "b", top: 3, interval_ms: 50 },
        { op: "watch", board: "b", player: "a" },
      ]);
      assert.equal(await db.get("b", "a"), 5, "a reply after pushes");
      assert.deepEqual([top.pending, player.pending], [2, 2]);
      assert.deepEqual(await next(top), []);
      assert.deepEqual(await next(top), [{ player: "a", score: 5, rank: 1 }]);
      assert.equal(await next(player), null);
      assert.deepEqual(await next(player), { rank: 1, score: 5, count: 1 });
      assert.deepEqual(pushes, [1, 2, 1, 77, 2]);
      assert.equal(await db.unwatch(top), true);
      assert.deepEqual(server.connections[0].log.at(-1), { id: server.connections[0].log.at(-1).id, op: "unwatch", watch: 1 });
    } finally {
      db.destroy();
      await server.stop();
    }
  });

  test("a watch whose connection is lost asks again on a new one", async () => {
    const server = await new FakeServer(async (conn, index) => {
      const watch = await conn.read();
      if (index === 0) {
        conn.send({ id: watch.id, ok: { watch: 3 } }, { watch: 3, event: [{ player: "a", score: 1, rank: 1 }] });
        await conn.read(); // a ping
        conn.drop();
        return;
      }
      conn.send({ id: watch.id, ok: { watch: 9 } }, { watch: 9, event: [{ player: "a", score: 2, rank: 1 }] });
      for (let request; (request = await conn.read()); ) conn.reply(request, true);
    }).start();
    const db = await server.connect();
    try {
      const watch = await db.watch("b", { top: 1 }, { buffer: 10 });
      assert.equal(watch.id, 3);
      assert.deepEqual(await next(watch), [{ player: "a", score: 1, rank: 1 }]);
      assert.equal(await db.ping(), true, "a read in flight is sent once more, on the new connection");
      assert.deepEqual(await next(watch), [{ player: "a", score: 2, rank: 1 }], "the current state on the new connection");
      assert.deepEqual([watch.id, watch.resubscribes, db.reconnects, watch.active], [9, 1, 1, true]);
      const [first, again] = server.connections.map((conn) => conn.log[0]);
      assert.deepEqual({ ...again, id: first.id }, first, "the same watch request");
      assert.equal(await watch.close(), true);
      assert.deepEqual(server.connections[1].log.at(-1).watch, 9, "unwatched by its new id");
    } finally {
      db.destroy();
      await server.stop();
    }
  });

  test("a watch ends with the error when no new connection can be had", async () => {
    const server = await new FakeServer(async (conn) => {
      const watch = await conn.read();
      conn.send({ id: watch.id, ok: { watch: 1 } }, { watch: 1, event: [] });
      await conn.read();
    }).start();
    const db = await server.connect({ watchRetries: 2 });
    const once = await server.connect({ reconnect: false });
    try {
      const watch = await db.watch("b", { top: 1 });
      const alone = await once.watch("b", { top: 1 });
      assert.deepEqual(await next(watch), []);
      assert.deepEqual(await next(alone), []);
      await server.stop(); // drops the connections, and nothing listens any more
      const started = Date.now();
      await assert.rejects(
        (async () => {
          for await (const event of alone) assert.fail(`no event expected, got ${JSON.stringify(event)}`);
        })(),
        RankdConnectionError,
        "without reconnect, the watch ends with the connection",
      );
      assert.equal(alone.ended, "the connection was lost");
      await assert.rejects(
        (async () => {
          for await (const event of watch) assert.fail(`no event expected, got ${JSON.stringify(event)}`);
        })(),
        (err) => err instanceof RankdConnectionError && /reconnecting failed/.test(err.message),
      );
      assert.equal(watch.ended, "the connection was lost and 2 reconnections failed");
      assert.ok(Date.now() - started >= 150, "after at least half of 100 ms, then of 200 ms");
      assert.equal(db.watches.length, 0);
    } finally {
      db.destroy();
      once.destroy();
    }
  });
});
