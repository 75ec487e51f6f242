// Idempotent writes (protocol 1.1 `wid`), run with `node --test`.
//
// Against the real rankd at RANKD_ADDR (skipped without it; TLS and tokens
// as client.test.js describes): a (board, wid) applies once and a repeat
// answers the first result with `dup`; a write whose reply is lost, to a
// dropped connection or to a timeout, is sent again with its wid through a
// byte relay and counts once. Against a scripted stand-in server (always
// run): what exactly goes out again, and when the client gives up.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { DEFAULT_WRITE_RETRIES, RankdConnectionError, retryDelay } from "../index.js";
import { ADDR, FakeServer, NO_SERVER, Relay, WID, freshBoard, open, rejectsWithCode, sleep, withClient } from "./support.js";

describe("idempotent writes against rankd", { skip: NO_SERVER }, () => {
  test("a repeated wid answers the first result with dup and counts once", async () => {
    await withClient(async (db) => {
      const board = freshBoard("wid");
      assert.deepEqual(await db.set(board, "p", 5, { mode: "incr", wid: "match-1", info: true }), {
        result: 5,
        dup: false,
        wid: "match-1",
        sends: 1,
      });
      // Sent again, as after a timeout; and from another connection.
      assert.deepEqual(await db.set(board, "p", 5, { mode: "incr", wid: "match-1", info: true }), {
        result: 5,
        dup: true,
        wid: "match-1",
        sends: 1,
      });
      await withClient(async (other) => {
        assert.equal(await other.set(board, "p", 5, { mode: "incr", wid: "match-1" }), 5, "the first result, plainly");
      });
      assert.equal(await db.get(board, "p"), 5, "counted once");
      // Without a wid of the caller's, each write gets its own.
      const fresh = await db.set(board, "p", 5, { mode: "incr", info: true });
      assert.equal(fresh.result, 10);
      assert.equal(fresh.dup, false);
      assert.match(fresh.wid, WID);
      assert.equal(await db.set(board, "p", 5, { mode: "incr" }), 15, "a plain write still resolves with the score");
      // Through call() too.
      assert.deepEqual(await db.call("set", { board, player: "p", score: 1, mode: "incr", wid: "match-1" }, { info: true }), {
        result: 5,
        dup: true,
        wid: "match-1",
        sends: 1,
      });
    });
  });

  test("setMany and remove apply once; a wid is per board; misuse is refused", async () => {
    await withClient(async (db) => {
      const board = freshBoard("wid_many");
      const other = freshBoard("wid_other");
      const batch = [["a", 1], ["b", 2]];
      assert.deepEqual(await db.setMany(board, batch, { mode: "incr", wid: "batch-1" }), [1, 2]);
      const again = await db.setMany(board, batch, { mode: "incr", wid: "batch-1", info: true });
      assert.deepEqual(again, { result: [1, 2], dup: true, wid: "batch-1", sends: 1 });
      assert.equal(await db.remove(board, "a", { wid: "rm-1" }), true);
      await db.set(board, "a", 9);
      assert.deepEqual(await db.remove(board, "a", { wid: "rm-1", info: true }), { result: true, dup: true, wid: "rm-1", sends: 1 });
      assert.equal(await db.get(board, "a"), 9, "the repeated remove changed nothing");
      assert.equal(await db.get(board, "b"), 2);
      assert.deepEqual(await db.setMany(other, batch, { mode: "incr", wid: "batch-1", info: true }), {
        result: [1, 2],
        dup: false,
        wid: "batch-1",
        sends: 1,
      });
      await rejectsWithCode(db.remove(board, "b", { wid: "batch-1" }), "bad_request"); // another kind of write
      await rejectsWithCode(db.set(board, "b", 1, { wid: "" }), "bad_request");
      await rejectsWithCode(db.set(board, "b", 1, { wid: "w".repeat(65) }), "bad_request");
      assert.equal(await db.set(board, "b", 3, { wid: "w".repeat(64) }), 3);
    });
  });

  test("a write whose reply is lost to a dropped connection is sent again with its wid and counts once", async () => {
    const relay = await new Relay().start(ADDR);
    const db = await open({}, relay.addr);
    try {
      const board = freshBoard("wid_cut");
      assert.equal(await db.ping(), "pong");
      const reconnected = new Promise((resolve) => db.once("reconnect", resolve));
      relay.cutNextReply(); // the server applies the write; its reply is lost with the connection
      const first = await db.set(board, "p", 5, { mode: "incr", info: true });
      await reconnected;
      assert.equal(first.result, 5, "the first send's result");
      assert.equal(first.dup, true, "the second send found the first applied");
      assert.equal(first.sends, 2);
      assert.match(first.wid, WID);
      assert.equal(db.reconnects, 1);
      assert.equal(relay.accepted, 2);
      assert.deepEqual(await db.set(board, "p", 5, { mode: "incr", info: true }).then(({ result, dup }) => ({ result, dup })), {
        result: 10,
        dup: false,
      });
      await withClient(async (other) => assert.equal(await other.get(board, "p"), 10, "each incr counted once"));
    } finally {
      db.destroy();
      await relay.stop();
    }
  });

  test("a write whose reply does not come in time is sent again with its wid", async () => {
    const relay = await new Relay().start(ADDR);
    const db = await open({ timeoutMs: 1_000 }, relay.addr);
    try {
      const board = freshBoard("wid_late");
      assert.equal(await db.ping(), "pong");
      relay.holdReplies();
      const started = Date.now();
      const write = db.setMany(board, [["a", 2], ["b", 3]], { mode: "incr", wid: "late-1", info: true });
      const read = db.get(board, "a"); // a read behind it is sent once more, after the write
      assert.deepEqual(await write, { result: [2, 3], dup: true, wid: "late-1", sends: 2 });
      assert.equal(await read, 2, "the read behind the late reply, sent again on the new connection");
      assert.ok(Date.now() - started >= 1_000, "sent again after the timeout");
      assert.equal(await db.get(board, "a"), 2, "counted once; the client works on its new connection");
    } finally {
      db.destroy();
      await relay.stop();
    }
  });

  test("with retryWrites off, a write whose connection is lost is not sent again", async () => {
    const relay = await new Relay().start(ADDR);
    const db = await open({ retryWrites: false }, relay.addr);
    try {
      const board = freshBoard("wid_off");
      assert.equal(await db.ping(), "pong");
      relay.cutNextReply();
      await assert.rejects(db.set(board, "p", 5, { mode: "incr" }), (err) => {
        assert.ok(err instanceof RankdConnectionError);
        assert.equal(err.maybeApplied, true);
        assert.equal(err.wid, undefined, "no wid was sent");
        assert.equal(err.sends, 1);
        return true;
      });
      assert.equal(relay.accepted, 1, "no reconnection for it");
      // The next call reconnects; the incr had applied once.
      assert.equal(await db.get(board, "p"), 5);
      assert.equal(db.reconnects, 1);
    } finally {
      db.destroy();
      await relay.stop();
    }
  });
});

describe("idempotent writes against a scripted server", () => {
  test("after the server drops the connection, the same request goes again with the same wid", async () => {
    const server = await new FakeServer(async (conn, index) => {
      if (index === 0) {
        conn.reply(await conn.read(), true); // auth
        await conn.read(); // the set: applied, then the connection is lost
        conn.drop();
      } else {
        const auth = await conn.read();
        assert.deepEqual(auth, { id: auth.id, op: "auth", token: "t0ken" }, "the token again, first");
        conn.reply(auth, true);
        const set = await conn.read();
        conn.reply(set, 7, { dup: true });
        for (let request; (request = await conn.read()); ) conn.reply(request, "pong");
      }
    }).start();
    const db = await server.connect({ token: "t0ken" });
    try {
      const events = [];
      db.on("disconnect", (err) => events.push(`disconnect: ${err.message}`));
      db.on("reconnect", () => events.push("reconnect"));
      const started = Date.now();
      const written = await db.set("b", "p", 7, { mode: "incr", info: true });
      assert.ok(Date.now() - started >= retryDelay(1) / 2, "waited (at least half of 100 ms) before sending again");
      const [first, second] = [server.connections[0].log[1], server.connections[1].log[1]];
      assert.match(first.wid, WID);
      assert.notEqual(first.id, second.id, "a new request id");
      assert.deepEqual({ ...second, id: first.id }, first, "the same request, the same wid");
      assert.deepEqual(written, { result: 7, dup: true, wid: first.wid, sends: 2 });
      assert.equal(db.reconnects, 1);
      assert.deepEqual(events, ["disconnect: connection closed by the server", "reconnect"]);
      assert.equal(await db.ping(), "pong", "later calls use the new connection");
    } finally {
      db.destroy();
      await server.stop();
    }
  });

  test("after a lost connection, writes with a wid and reads go again; create_board fails and says it may have applied", async () => {
    const server = await new FakeServer(async (conn, index) => {
      if (index === 0) {
        for (let i = 0; i < 5; i++) await conn.read();
        conn.drop();
      } else {
        for (let request; (request = await conn.read()); ) conn.reply(request, request.op === "remove" ? true : 1);
      }
    }).start();
    const db = await server.connect();
    try {
      const calls = [
        db.get("b", "p"),
        db.ranks("b", ["p", "q"]),
        db.createBoard("b2"),
        db.remove("b", "p", { wid: "rm-9" }),
        db.set("b", "p", 1, { mode: "incr", wid: "x" }),
      ];
      const outcomes = await Promise.allSettled(calls);
      const [get, ranks, create, remove, set] = outcomes;
      assert.deepEqual(get, { status: "fulfilled", value: 1 }, "a read is sent once more");
      assert.deepEqual(ranks, { status: "fulfilled", value: 1 }, "a friends list too");
      assert.equal(create.status, "rejected");
      assert.ok(create.reason instanceof RankdConnectionError);
      assert.equal(create.reason.maybeApplied, true, "create_board may have applied");
      assert.match(create.reason.message, /create_board was sent once and may or may not have applied/);
      assert.deepEqual(remove, { status: "fulfilled", value: true });
      assert.deepEqual(set, { status: "fulfilled", value: 1 });
      assert.deepEqual(
        server.connections[1].log.map(({ op, wid }) => [op, wid]),
        [["get", undefined], ["ranks", undefined], ["remove", "rm-9"], ["set", "x"]],
        "the reads and the writes with a wid, in their order, and nothing else",
      );
    } finally {
      db.destroy();
      await server.stop();
    }
  });

  test("a write is sent at most 1 + writeRetries times, with growing waits, then rejects with its wid", async () => {
    const server = await new FakeServer(async (conn) => {
      await conn.read();
      conn.drop();
    }).start();
    const db = await server.connect({ writeRetries: 2 });
    try {
      const started = Date.now();
      await assert.rejects(db.set("b", "p", 1, { mode: "incr", wid: "doomed" }), (err) => {
        assert.ok(err instanceof RankdConnectionError, String(err));
        assert.equal(err.maybeApplied, true);
        assert.equal(err.wid, "doomed");
        assert.equal(err.sends, 3);
        assert.match(err.message, /sent 3 times and may or may not have applied \(wid doomed: at most once\)/);
        return true;
      });
      assert.ok(Date.now() - started >= (retryDelay(1) + retryDelay(2)) / 2, "at least half of 100 ms, then of 200 ms");
      assert.deepEqual(
        server.connections.map((conn) => conn.log.map(({ op, wid }) => `${op} ${wid}`)),
        [["set doomed"], ["set doomed"], ["set doomed"]],
      );
    } finally {
      db.destroy();
      await server.stop();
    }
  });

  test("when reconnecting fails, each failed attempt uses up a re-send", async () => {
    const server = await new FakeServer(async (conn) => {
      await conn.read();
      conn.drop();
    }).start();
    const db = await server.connect({ writeRetries: 2, timeoutMs: 1_000 });
    await server.stop(); // nothing listens there any more
    try {
      await assert.rejects(db.set("b", "p", 1, { wid: "nowhere" }), (err) => {
        assert.equal(err.maybeApplied, true);
        assert.equal(err.sends, 1, "never sent again");
        assert.match(err.message, /reconnecting failed/);
        return true;
      });
      assert.equal(db.reconnects, 0);
    } finally {
      db.destroy();
    }
  });

  test("nothing is sent again to a server that broke the protocol", async () => {
    const server = await new FakeServer(async (conn) => {
      await conn.read();
      conn.send({ id: 999, ok: 1 });
      await conn.read();
    }).start();
    const db = await server.connect();
    try {
      await assert.rejects(db.set("b", "p", 1, { wid: "w-odd" }), (err) => {
        assert.ok(err instanceof RankdConnectionError);
        assert.match(err.message, /expected a reply to id 1, got id 999/);
        assert.deepEqual([err.maybeApplied, err.wid, err.sends], [true, "w-odd", 1]);
        return true;
      });
      await sleep(200);
      assert.equal(server.connections.length, 1);
    } finally {
      db.destroy();
      await server.stop();
    }
  });

  test("close waits for a write being sent again; destroy stops it", async () => {
    const server = await new FakeServer(async (conn, index) => {
      const set = await conn.read();
      if (index === 0 || index === 2) return conn.drop();
      conn.reply(set, 3);
    }).start();
    const db = await server.connect();
    let doomed;
    try {
      const write = db.set("b", "p", 3, { info: true });
      await new Promise((resolve) => db.once("disconnect", resolve));
      const closed = db.close();
      await assert.rejects(db.ping(), /the client is closed/);
      assert.deepEqual(await write, { result: 3, dup: false, wid: server.connections[1].log[0].wid, sends: 2 });
      await closed;

      doomed = await server.connect();
      const lost = doomed.set("b", "p", 4, { wid: "w-4" });
      await new Promise((resolve) => doomed.once("disconnect", resolve));
      doomed.destroy(); // while it waits to send again
      await assert.rejects(lost, (err) => err.maybeApplied === true && err.wid === "w-4" && /destroyed/.test(err.message));
      await sleep(300);
      assert.equal(server.connections.length, 3, "nothing sent after destroy");
    } finally {
      db.destroy();
      doomed?.destroy();
      await server.stop();
    }
  });

  test("the default retries are bounded: 3 re-sends after at most 100, 200 and 400 ms", () => {
    assert.equal(DEFAULT_WRITE_RETRIES, 3);
    assert.deepEqual([1, 2, 3, 4, 5, 6].map(retryDelay), [100, 200, 400, 800, 1600, 2000]);
    assert.equal(retryDelay(0), 0);
  });
});
