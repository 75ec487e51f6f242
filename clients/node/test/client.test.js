// Tests of the Node client, run with `node --test` (from clients/node:
// `npm test`).
//
// The framing tests drive a RankdClient over a fake socket and need nothing
// else. The rest run against a real rankd at RANKD_ADDR (host:port) and are
// skipped without it; with RANKD_TLS_CA (the CA that signed the server's
// certificate, for localhost and 127.0.0.1), RANKD_WRITE_TOKEN and
// RANKD_READ_TOKEN they connect over TLS with the write token and also check
// the token roles; RANKD_TLS_CLIENT_CERT and RANKD_TLS_CLIENT_KEY add a
// client certificate (a server that requires mutual TLS).
// tests/node_client.rs starts the servers and runs this file.

import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { describe, test } from "node:test";

import { decode } from "@msgpack/msgpack";

import { MAX_FRAME, RankdClient, RankdConnectionError } from "../index.js";
import { CA, CLIENT_CERT, CLIENT_KEY, NO_SERVER, READ_TOKEN, WRITE_TOKEN, frame, freshBoard, open, rejectsWithCode, withClient } from "./support.js";

const NO_SECURITY = NO_SERVER || (CA && WRITE_TOKEN && READ_TOKEN ? false : "RANKD_TLS_CA, RANKD_WRITE_TOKEN and RANKD_READ_TOKEN are not all set");
const NO_MUTUAL_TLS = NO_SECURITY || (CLIENT_CERT && CLIENT_KEY ? false : "RANKD_TLS_CLIENT_CERT and RANKD_TLS_CLIENT_KEY are not set");

/** assert.rejects with an error class. */
const rejects = (promise, type) => assert.rejects(promise, type);

// -- the oracle ----------------------------------------------------------

/**
 * What the server should answer for a board holding `scores` (a Map of
 * player to score; ASCII names, so JavaScript's string order is byte order)
 * under `order` and `ties` (competition or dense).
 */
function oracle(scores, { order = "desc", ties = "competition" } = {}) {
  const better = (a, b) => (order === "desc" ? a > b : a < b);
  const sorted = [...scores].sort(([pa, sa], [pb, sb]) =>
    better(sa, sb) ? -1 : better(sb, sa) ? 1 : pa < pb ? -1 : pa > pb ? 1 : 0,
  );
  const distinct = [...new Set(sorted.map(([, score]) => score))];
  const rankOfScore = (score) =>
    1 + (ties === "dense" ? distinct : sorted.map(([, s]) => s)).filter((other) => better(other, score)).length;
  const list = sorted.map(([player, score]) => ({ player, score, rank: rankOfScore(score) }));
  return { list, rankOfScore, count: list.length };
}

/** Checks every read op on `board` against the oracle for `scores`. */
async function assertBoardMatches(client, board, scores, config = {}) {
  const want = oracle(scores, config);
  assert.equal(await client.count(board), want.count, "count");
  assert.deepEqual(await client.top(board, { limit: 1000 }), want.list, "top (all)");
  assert.deepEqual(await client.top(board), want.list.slice(0, 10), "top (default limit)");
  assert.deepEqual(await client.top(board, { limit: 3, offset: 2 }), want.list.slice(2, 5), "top limit 3 offset 2");
  for (const [at, entry] of want.list.entries()) {
    const { player, score, rank } = entry;
    assert.equal(await client.get(board, player), score, `get ${player}`);
    assert.deepEqual(await client.rank(board, player), { rank, score, count: want.count }, `rank ${player}`);
    const around = want.list.slice(Math.max(0, at - 1), at + 3);
    assert.deepEqual(await client.around(board, player, { before: 1, after: 2 }), around, `around ${player}`);
  }
  const probes = [-1_000_000, -5, 0, 50, 899, 900, 901, 1200, 1300, 1_000_000, ...scores.values()];
  for (const score of probes) {
    assert.equal(await client.rankOfScore(board, score), want.rankOfScore(score), `rank_of_score ${score}`);
  }
  assert.equal(await client.get(board, "nobody"), null, "get of an absent player");
  assert.equal(await client.rank(board, "nobody"), null, "rank of an absent player");
  assert.deepEqual(await client.around(board, "nobody"), [], "around an absent player");
  // A friends list: every other player, one twice, one absent; best first.
  const friends = want.list.filter((_, i) => i % 2 === 0);
  const asked = [...friends.map((e) => e.player).reverse(), "nobody", friends[0]?.player].filter(Boolean);
  assert.deepEqual(await client.ranks(board, new Set(asked)), friends, "ranks of a friends list");
}

// -- against a real rankd ------------------------------------------------

describe("rankd-client against rankd", { skip: NO_SERVER }, () => {
  test("ping, auth, create_board, boards and drop_board", async () => {
    await withClient(async (db) => {
      assert.equal(await db.ping(), "pong");
      if (WRITE_TOKEN) {
        assert.deepEqual(await db.auth(WRITE_TOKEN), { role: "write" });
      } else {
        assert.equal(await db.auth("any token"), true, "a server without tokens accepts any");
      }
      const board = freshBoard("config");
      assert.equal(await db.createBoard(board, { order: "asc", ties: "dense" }), true, "created");
      assert.equal(await db.createBoard(board, { order: "asc", ties: "dense" }), false, "already there, same config");
      await rejectsWithCode(db.createBoard(board, { order: "desc" }), "conflict");
      await db.set(board, "alice", 3);
      const listed = (await db.boards()).find((b) => b.board === board);
      assert.deepEqual(listed, { board, order: "asc", ties: "dense", windows: ["all"], keep: 1, count: 1 });
      assert.equal(await db.dropBoard(board), true, "dropped");
      assert.equal(await db.dropBoard(board), false, "already gone");
      assert.equal((await db.boards()).find((b) => b.board === board), undefined, "no longer listed");
      assert.equal(await db.count(board), 0, "a dropped board reads as empty");
    });
  });

  test("writes, then every read agrees with the oracle (desc, competition)", async () => {
    await withClient(async (db) => {
      const board = freshBoard("desc");
      const scores = new Map();
      for (const [player, score] of [["alice", 1200], ["bob", 900], ["carol", 900], ["dave", 50], ["eve", -5]]) {
        assert.equal(await db.set(board, player, score), score, `set ${player}`);
        scores.set(player, score);
      }
      assert.equal(await db.set(board, "alice", 1100, { mode: "best" }), 1200, "best keeps the better score");
      assert.equal(await db.set(board, "dave", 25, { mode: "incr" }), 75, "incr adds");
      scores.set("dave", 75);
      assert.equal(await db.set(board, "bob", 950, { mode: "set" }), 950, "set replaces");
      scores.set("bob", 950);
      const many = [["frank", 900], ["gina", 1300], ["hank", 0], ["ivan", 900]];
      assert.deepEqual(await db.setMany(board, many), [900, 1300, 0, 900], "set_many");
      assert.deepEqual(await db.setMany(board, new Map([["hank", 5]]), { mode: "incr" }), [5], "set_many from a Map, incr");
      for (const [player, score] of many) scores.set(player, score);
      scores.set("hank", 5);
      await assertBoardMatches(db, board, scores);

      assert.equal(await db.remove(board, "carol"), true, "carol was there");
      assert.equal(await db.remove(board, "carol"), false, "carol is gone");
      scores.delete("carol");
      await assertBoardMatches(db, board, scores);
      assert.equal(await db.dropBoard(board), true);
    });
  });

  test("an ascending, dense board agrees with the oracle", async () => {
    await withClient(async (db) => {
      const board = freshBoard("asc");
      assert.equal(await db.createBoard(board, { order: "asc", ties: "dense" }), true);
      const scores = new Map([["ann", 31], ["ben", 27], ["cat", 31], ["dan", 45], ["eva", 27], ["fox", 1200]]);
      assert.deepEqual(await db.setMany(board, [...scores].map(([player, score]) => ({ player, score }))), [...scores.values()]);
      assert.equal(await db.set(board, "ben", 40, { mode: "best" }), 27, "best is the lower score here");
      await assertBoardMatches(db, board, scores, { order: "asc", ties: "dense" });
    });
  });

  test("64-bit scores round-trip exactly", async () => {
    await withClient(async (db) => {
      const board = freshBoard("i64");
      const max = 2n ** 63n - 1n;
      const min = -(2n ** 63n);
      const cases = [
        ["max", max],
        ["min", min],
        ["past-2^53", 2n ** 53n + 1n],
        ["below-2^53", -(2n ** 53n) - 3n],
        ["five-billion", 5_000_000_000],
        ["minus-five-billion", -5_000_000_000],
        ["safe-max", Number.MAX_SAFE_INTEGER],
        ["small-bigint", 42n],
      ];
      // Results are numbers when they are safe integers, bigints otherwise.
      const normal = (v) => (typeof v === "bigint" && v >= BigInt(Number.MIN_SAFE_INTEGER) && v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v);
      for (const [player, score] of cases) {
        assert.equal(await db.set(board, player, score), normal(score), `set ${player}`);
        assert.equal(await db.get(board, player), normal(score), `get ${player}`);
      }
      const top = await db.top(board, { limit: 2 });
      assert.deepEqual(top, [{ player: "max", score: max, rank: 1 }, { player: "past-2^53", score: 2n ** 53n + 1n, rank: 2 }]);
      assert.deepEqual(await db.rank(board, "min"), { rank: cases.length, score: min, count: cases.length });
      assert.equal(await db.rankOfScore(board, 2n ** 53n), 3);
      await rejectsWithCode(db.set(board, "max", 1, { mode: "incr" }), "bad_request"); // overflow changes nothing
      assert.equal(await db.get(board, "max"), max);
      await assert.rejects(db.set(board, "x", 2 ** 60), RangeError, "an unsafe number is refused, not rounded");
      await assert.rejects(db.set(board, "x", 2n ** 64n), RangeError, "a bigint past 64 bits is refused, not wrapped");
      await rejectsWithCode(db.set(board, "x", 2n ** 63n), "bad_request");
      await rejectsWithCode(db.set(board, "x", 1.5), "bad_request");
    });
  });

  test("1000 pipelined sets on one connection", async () => {
    await withClient(async (db) => {
      const board = freshBoard("pipeline");
      const sets = Array.from({ length: 1000 }, (_, i) => db.set(board, `player-${i}`, i * 7 - 3000));
      assert.equal(db.inflight, 1000, "all sent before any reply");
      const stored = await Promise.all(sets);
      assert.deepEqual(stored, Array.from({ length: 1000 }, (_, i) => i * 7 - 3000), "each reply matched to its request");
      assert.equal(db.inflight, 0);
      assert.equal(await db.count(board), 1000);
      assert.deepEqual(await db.rank(board, "player-999"), { rank: 1, score: 999 * 7 - 3000, count: 1000 });

      // Errors in a pipeline answer their own request and no other.
      const mixed = await Promise.allSettled([
        db.get(board, "player-1"),
        db.set("not a board", "p", 1),
        db.call("no_such_op"),
        db.count(board),
        db.ping(),
      ]);
      assert.deepEqual(
        mixed.map((r) => (r.status === "fulfilled" ? r.value : r.reason.code)),
        [7 - 3000, "bad_request", "unknown_op", 1000, "pong"],
      );
    });
  });

  test("errors carry the protocol's code and leave the connection usable", async () => {
    await withClient(async (db) => {
      const board = freshBoard("errors");
      await rejectsWithCode(db.set("has a space", "alice", 1), "bad_request");
      await rejectsWithCode(db.call("set", { board, player: "alice" }), "bad_request"); // no score
      await rejectsWithCode(db.top(board, { limit: 1001 }), "bad_request");
      await rejectsWithCode(db.call("frobnicate", { board }), "unknown_op");
      const tooMany = Array.from({ length: 10_001 }, (_, i) => [`p${i}`, i]);
      await rejectsWithCode(db.setMany(board, tooMany), "too_large");
      assert.equal(await db.ping(), "pong", "still served");
      assert.equal(await db.count(board), 0, "nothing written");
      const err = await db.set("has a space", "alice", 1).catch((e) => e);
      assert.ok(err instanceof Error && err.name === "RankdError");
      assert.match(err.message, /^bad_request: /);
    });
  });

  test("close waits for the replies in flight, then refuses new calls", async () => {
    const db = await open();
    const board = freshBoard("close");
    const sets = Array.from({ length: 50 }, (_, i) => db.set(board, `p${i}`, i));
    const closed = db.close();
    await rejects(db.ping(), RankdConnectionError);
    assert.equal((await Promise.all(sets)).length, 50);
    await closed;
    await rejects(db.ping(), RankdConnectionError);
    await withClient(async (other) => assert.equal(await other.count(board), 50));
  });
});

describe("TLS and token roles", { skip: NO_SECURITY }, () => {
  test("connects over TLS with the write token: auth answers its role", async () => {
    await withClient(async (db) => {
      assert.deepEqual(await db.auth(WRITE_TOKEN), { role: "write" });
      const board = freshBoard("tls");
      assert.equal(await db.set(board, "alice", 7), 7);
      assert.equal(await db.count(board), 1);
    });
    // The certificate's DNS name instead of its IP address.
    await withClient(async (db) => assert.equal(await db.ping(), "pong"), { serverName: "localhost" });
  });

  test("a read token reads and cannot write", async () => {
    const board = freshBoard("roles");
    await withClient((db) => db.set(board, "alice", 10));
    await withClient(async (db) => {
      assert.deepEqual(await db.auth(READ_TOKEN), { role: "read" });
      await rejectsWithCode(db.set(board, "bob", 1), "unauthorized");
      await rejectsWithCode(db.setMany(board, [["bob", 1]]), "unauthorized");
      await rejectsWithCode(db.remove(board, "alice"), "unauthorized");
      await rejectsWithCode(db.createBoard(freshBoard("roles")), "unauthorized");
      await rejectsWithCode(db.dropBoard(board), "unauthorized");
      assert.equal(await db.count(board), 1);
      assert.deepEqual(await db.top(board), [{ player: "alice", score: 10, rank: 1 }]);
      assert.ok((await db.boards()).some((b) => b.board === board));
      assert.equal(await db.ping(), "pong");
    }, { token: READ_TOKEN });
  });

  test("without a token only ping and auth are served; a wrong token fails connect", async () => {
    await withClient(async (db) => {
      assert.equal(await db.ping(), "pong");
      await rejectsWithCode(db.count("anything"), "unauthorized");
    }, { token: undefined });
    await rejectsWithCode(open({ token: "not-a-token" }), "unauthorized");
  });

  test("the server's certificate is checked", async () => {
    // The test CA is not among the system's roots.
    await assert.rejects(open({ caFile: undefined, tls: true }), (err) => /VERIFY|SELF_SIGNED|CERT/.test(err.code));
    // Nor is the certificate for this name.
    await assert.rejects(open({ serverName: "rankd.example" }), { code: "ERR_TLS_CERT_ALTNAME_INVALID" });
  });

  test("a plaintext client on the TLS port gets no answer", async () => {
    const db = await open({ caFile: undefined, certFile: undefined, token: undefined, timeoutMs: 5_000 });
    await rejects(db.ping(), RankdConnectionError);
    db.destroy();
  });

  test("mutual TLS: no client certificate, no service", { skip: NO_MUTUAL_TLS }, async () => {
    // Refused in the handshake (TLS 1.2) or right after it (1.3: the auth fails).
    const refused = (err) => err instanceof RankdConnectionError || /ERR_SSL|ECONNRESET/.test(err.code);
    await assert.rejects(open({ certFile: undefined, keyFile: undefined, timeoutMs: 5_000 }), refused);
  });
});

// -- framing, over a fake socket -----------------------------------------

/** A stand-in for a connected socket: records what the client writes; `feed` delivers bytes to it. */
class FakeSocket extends EventEmitter {
  written = [];
  destroyed = false;
  setNoDelay() {}
  cork() {}
  uncork() {}
  write(bytes) {
    this.written.push(Buffer.from(bytes));
    return true;
  }
  end() {
    this.destroy();
  }
  destroy() {
    if (this.destroyed) return;
    this.destroyed = true;
    queueMicrotask(() => this.emit("close"));
  }
  feed(bytes) {
    this.emit("data", Buffer.from(bytes));
  }
  /** The requests written so far, decoded. */
  requests() {
    const all = Buffer.concat(this.written);
    const out = [];
    for (let at = 0; at < all.length; ) {
      const length = all.readUInt32BE(at);
      out.push(decode(all.subarray(at + 4, at + 4 + length), { useBigInt64: true }));
      at += 4 + length;
    }
    return out;
  }
}

function fakeClient(options) {
  const socket = new FakeSocket();
  return { socket, client: new RankdClient(socket, options) };
}

describe("framing", () => {
  test("requests are length-prefixed maps with increasing ids and no unset fields", async () => {
    const { socket, client } = fakeClient();
    const replies = [client.set("b", "p", 5_000_000_000, { mode: undefined }), client.top("b", { limit: 3 }), client.ping()];
    const wid = socket.requests()[0].wid;
    assert.match(wid, /^[0-9a-f]{32}$/, "a write gets 32 random hex digits as its wid");
    assert.deepEqual(socket.requests(), [
      { id: 1, op: "set", board: "b", player: "p", score: 5_000_000_000n, wid },
      { id: 2, op: "top", board: "b", limit: 3 },
      { id: 3, op: "ping" },
    ]);
    socket.feed(Buffer.concat([frame({ id: 1, ok: 5_000_000_000 }), frame({ id: 2, ok: [] }), frame({ id: 3, ok: "pong" })]));
    assert.deepEqual(await Promise.all(replies), [5_000_000_000, [], "pong"]);
  });

  test("a reply marked dup resolves with its result; {info: true} tells the wid, dup and sends", async () => {
    const { socket, client } = fakeClient();
    const plain = client.set("b", "p", 5, { mode: "incr", wid: "w-1" });
    const detailed = client.remove("b", "p", { wid: "w-2", info: true });
    const fresh = client.setMany("b", [["p", 1]], { info: true });
    const [set, remove, many] = socket.requests();
    assert.deepEqual([set.wid, remove.wid], ["w-1", "w-2"]);
    assert.match(many.wid, /^[0-9a-f]{32}$/);
    assert.equal("info" in set || "info" in remove || "info" in many, false, "info is not sent");
    socket.feed(
      Buffer.concat([
        frame({ id: 1, ok: 5, dup: true }),
        frame({ id: 2, ok: true, dup: true }),
        frame({ id: 3, ok: [1] }),
      ]),
    );
    assert.equal(await plain, 5);
    assert.deepEqual(await detailed, { result: true, dup: true, wid: "w-2", sends: 1 });
    assert.deepEqual(await fresh, { result: [1], dup: false, wid: many.wid, sends: 1 });
  });

  test("with retryWrites off, writes go out as given", async () => {
    const { socket, client } = fakeClient({ retryWrites: false });
    assert.equal(client.retryWrites, false);
    client.set("b", "p", 1).catch(() => {});
    client.remove("b", "p", { wid: "mine" }).catch(() => {});
    assert.deepEqual(
      socket.requests().map(({ op, wid }) => [op, wid]),
      [["set", undefined], ["remove", "mine"]],
    );
    client.destroy();
  });

  test("replies split into single bytes, and many replies in one chunk", async () => {
    const { socket, client } = fakeClient();
    const calls = Array.from({ length: 6 }, (_, i) => client.get("b", `p${i}`));
    const bytes = Buffer.concat(calls.map((_, i) => frame({ id: i + 1, ok: i === 2 ? null : 2n ** 60n + BigInt(i) })));
    const cut = bytes.length - frame({ id: 6, ok: 2n ** 60n + 5n }).length - 3;
    for (const byte of bytes.subarray(0, 20)) socket.feed([byte]); // byte by byte
    socket.feed(bytes.subarray(20, cut)); // the rest of several frames and the start of one
    socket.feed(bytes.subarray(cut, cut + 2)); // part of a header
    socket.feed(bytes.subarray(cut + 2)); // the rest
    assert.deepEqual(await Promise.all(calls), calls.map((_, i) => (i === 2 ? null : 2n ** 60n + BigInt(i))));
  });

  test("a big reply in many chunks", async () => {
    const { socket, client } = fakeClient();
    const big = "x".repeat(3 * 1024 * 1024);
    const reply = client.call("echo");
    const bytes = frame({ id: 1, ok: big });
    for (let at = 0; at < bytes.length; at += 65536) socket.feed(bytes.subarray(at, at + 65536));
    assert.equal(await reply, big);
  });

  test("a frame over 64 MiB is refused and fails the connection", async () => {
    const { socket, client } = fakeClient();
    const reply = client.ping();
    const header = Buffer.alloc(4);
    header.writeUInt32BE(MAX_FRAME + 1);
    socket.feed(header);
    await assert.rejects(reply, (err) => err instanceof RankdConnectionError && /64|limit/.test(err.message));
    assert.ok(socket.destroyed);
    await assert.rejects(client.ping(), RankdConnectionError);
  });

  test("an error with id 0 answers the oldest request; a wrong id fails the connection", async () => {
    const { socket, client } = fakeClient();
    const first = client.setMany("b", []);
    const second = client.ping();
    socket.feed(frame({ id: 0, err: { code: "too_large", msg: "frame too large" } }));
    await rejectsWithCode(first, "too_large");
    socket.feed(frame({ id: 7, ok: "pong" }));
    await assert.rejects(second, RankdConnectionError);
  });

  test("pushes (frames without id) are events, not replies", async () => {
    const { socket, client } = fakeClient();
    const reply = client.call("watch", { board: "b", top: 3 });
    const pushes = [];
    client.on("push", (push) => pushes.push(push));
    socket.feed(Buffer.concat([frame({ id: 1, ok: { watch: 1 } }), frame({ watch: 1, event: [] }), frame({ watch: 1, event: null })]));
    assert.deepEqual(await reply, { watch: 1 });
    assert.deepEqual(pushes, [{ watch: 1, event: [] }, { watch: 1, event: null }]);
  });

  test("a reply that does not come within timeoutMs fails the connection", async () => {
    const { socket, client } = fakeClient({ timeoutMs: 50 });
    const started = Date.now();
    await assert.rejects(client.ping(), /within 50 ms/);
    assert.ok(Date.now() - started >= 45);
    assert.ok(socket.destroyed);
  });

  test("the server closing the connection rejects what is in flight", async () => {
    const { socket, client } = fakeClient();
    const reply = client.count("b");
    socket.emit("end");
    await assert.rejects(reply, /closed/);
  });
});
