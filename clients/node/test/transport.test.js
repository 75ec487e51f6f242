// The shared transport rules (clients/conformance/transport.md), run with
// `node --test` against a scripted stand-in server (test/support.js), so
// they need no rankd: writes sent again after `overloaded` and `internal`,
// the randomized backoff, the retry deadline, the reply timeout counted from
// the previous reply, reads sent once more after a broken connection, the
// client's own frame limit, a token refused on reconnecting, and the wids
// the client makes.

import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { describe, test } from "node:test";

import { RankdClient, RankdConnectionError, RankdError, retryDelay } from "../index.js";
import { backoff } from "../lib/retry.js";
import { FakeServer, WID, sleep } from "./support.js";
import { encode } from "@msgpack/msgpack";

/** Runs `body(server, db)` with a scripted server and a client of it (`options`), both stopped afterwards. */
async function scripted(script, options, body) {
  const server = await new FakeServer(script).start();
  let db;
  try {
    db = await server.connect(options);
    return await body(server, db);
  } finally {
    db?.destroy();
    await server.stop();
  }
}

/** A script answering each request with `answer(request, conn, index)` (a `{ok}` or `{err}` map, or undefined for no answer). */
const answering = (answer) => async (conn, index) => {
  for (let request; (request = await conn.read()); ) {
    const reply = answer(request, conn, index);
    if (reply !== undefined) conn.send({ id: request.id, ...reply });
  }
};

const err = (code) => ({ err: { code, msg: `${code} (scripted)` } });

/** The gaps between the arrivals of a connection's requests, in ms. */
const gaps = (conn) => conn.arrivals.slice(1).map((at, i) => at - conn.arrivals[i]);

/** Runs `body()` with `Math.random` replaced by `random`, put back afterwards. */
async function withRandom(random, body) {
  const saved = Math.random;
  Math.random = random;
  try {
    return await body();
  } finally {
    Math.random = saved;
  }
}

describe("overloaded and internal", () => {
  test("a write answered internal is sent again on the same connection; it resolves with the second answer", async () => {
    let sets = 0;
    const script = answering((request) => (request.op !== "set" ? { ok: "pong" } : sets++ === 0 ? err("internal") : { ok: 5, dup: true }));
    await scripted(script, {}, async (server, db) => {
      const written = await db.set("b", "p", 5, { mode: "incr", info: true });
      const [conn] = server.connections;
      const [first, second] = conn.log;
      assert.match(first.wid, WID);
      assert.deepEqual(written, { result: 5, dup: true, wid: first.wid, sends: 2 });
      assert.notEqual(first.id, second.id, "a new request id");
      assert.deepEqual({ ...second, id: first.id }, first, "the same request, the same wid");
      assert.equal(server.connections.length, 1, "on the same connection");
      assert.ok(gaps(conn)[0] >= retryDelay(1) / 2 - 2, `after the backoff (${gaps(conn)[0]} ms)`);
      assert.equal(await db.ping(), "pong");
    });
  });

  test("a write answered overloaded every time rejects, once its re-sends are used up, with its wid and sends: it did not apply", async () => {
    await scripted(answering(() => err("overloaded")), { writeRetries: 2 }, async (server, db) => {
      const error = await db.set("b", "p", 1, { mode: "incr" }).catch((e) => e);
      assert.ok(error instanceof RankdError, String(error));
      assert.equal(error.code, "overloaded");
      assert.match(error.wid, WID);
      assert.equal(error.sends, 3);
      assert.equal(error.maybeApplied, false, "shed, never applied");
      const [conn] = server.connections;
      assert.equal(server.connections.length, 1);
      assert.deepEqual(conn.log.map(({ op, wid }) => `${op} ${wid}`), Array(3).fill(`set ${error.wid}`));
    });
  });

  test("a write answered internal every time rejects as maybe applied, with its wid and sends", async () => {
    await scripted(answering(() => err("internal")), { writeRetries: 1 }, async (server, db) => {
      await assert.rejects(db.remove("b", "p", { wid: "w-int" }), (error) => {
        assert.ok(error instanceof RankdConnectionError, String(error));
        assert.deepEqual([error.maybeApplied, error.wid, error.sends], [true, "w-int", 2]);
        assert.ok(error.cause instanceof RankdError && error.cause.code === "internal");
        assert.match(error.message, /^internal: .*the remove was sent 2 times and may or may not have applied \(wid w-int: at most once\)/);
        return true;
      });
      assert.equal(server.connections[0].log.length, 2);
    });
  });

  test("overloaded and internal to a read, or to a write without a wid, are final", async () => {
    const script = answering((request) => (request.op === "get" ? err("overloaded") : err("internal")));
    await scripted(script, { retryWrites: false }, async (server, db) => {
      await assert.rejects(db.get("b", "p"), (e) => e instanceof RankdError && e.code === "overloaded" && e.wid === undefined);
      await assert.rejects(db.set("b", "p", 1), (e) => e instanceof RankdError && e.code === "internal" && e.wid === undefined);
      await sleep(150);
      assert.deepEqual(server.connections[0].log.map(({ op }) => op), ["get", "set"], "each sent once");
    });
  });
});

describe("backoff", () => {
  test("the wait is a random time between half and all of retryDelay", () => {
    for (const attempt of [1, 2, 3, 4, 5, 6, 7]) {
      const cap = retryDelay(attempt);
      assert.equal(backoff(attempt, () => 0), cap / 2);
      assert.ok(backoff(attempt, () => 0.999_999) < cap && backoff(attempt, () => 0.999_999) > cap * 0.99);
      const waits = Array.from({ length: 100 }, () => backoff(attempt));
      assert.ok(waits.every((wait) => wait >= cap / 2 && wait <= cap), `attempt ${attempt}: ${waits}`);
      assert.ok(new Set(waits).size > 50, "random");
    }
    assert.equal(backoff(0), 0);
    assert.equal(retryDelay(7), 2_000, "retryDelay is the cap");
  });

  test("each re-send waits the randomized backoff: half the cap at the least random, all of it at the most", async () => {
    const random = Math.random;
    try {
      for (const [draw, check] of [
        [0, (total) => total >= 350 - 5 && total < 600],
        [0.99, (total) => total >= 0.99 * 700 - 5],
      ]) {
        Math.random = () => draw;
        await scripted(answering(() => err("overloaded")), { writeRetries: 3 }, async (server, db) => {
          await assert.rejects(db.set("b", "p", 1), (e) => e.code === "overloaded" && e.sends === 4);
          const waits = gaps(server.connections[0]);
          const total = waits.reduce((a, b) => a + b, 0);
          assert.ok(check(total), `random() = ${draw}: waits ${waits} (caps 100, 200, 400)`);
        });
      }
    } finally {
      Math.random = random;
    }
  });
});

describe("one backoff draw per re-send", () => {
  test("each re-send waits one random draw, whether after a lost connection, a failed reconnection or overloaded", async () => {
    const script = async (conn, index) => {
      const auth = await conn.read();
      if (index === 1) return conn.fail(auth, "overloaded"); // a failed reconnection
      conn.reply(auth, true);
      if (index === 0) {
        await conn.read(); // the set: its reply is lost with the connection
        return conn.drop();
      }
      let sets = 0;
      await answering((request) => (sets++ === 0 ? err("overloaded") : { ok: 4 }))(conn, index);
    };
    let draws = 0;
    const random = Math.random;
    await withRandom(
      () => {
        draws++;
        return random();
      },
      () =>
        scripted(script, { token: "t0ken" }, async (server, db) => {
          draws = 0;
          const written = await db.set("b", "p", 4, { info: true });
          assert.deepEqual([written.result, written.sends], [4, 3]);
          assert.equal(server.connections.length, 3);
          assert.deepEqual(server.connections[2].log.map(({ op }) => op), ["auth", "set", "set"]);
          assert.equal(draws, 3, "three re-sends (the second after the failed reconnection), three waits drawn");
        }),
    );
  });
});

describe("retry deadline", () => {
  test("retryDeadlineMs over 300 000 (5 minutes), or not a positive finite number, is refused", async () => {
    for (const retryDeadlineMs of [300_001, 0, -1, NaN, Infinity, "60000", null]) {
      assert.throws(() => new RankdClient(new EventEmitter(), { retryDeadlineMs }), RangeError, String(retryDeadlineMs));
    }
    const server = await new FakeServer(answering(() => ({ ok: "pong" }))).start();
    try {
      await assert.rejects(server.connect({ retryDeadlineMs: 600_000 }), /retryDeadlineMs .*at most 300000/);
      assert.equal(server.connections.length, 0, "refused before dialing");
      const db = await server.connect({ retryDeadlineMs: 300_000 });
      assert.equal(await db.ping(), "pong");
      db.destroy();
    } finally {
      await server.stop();
    }
  });

  test("no re-send after overloaded starts later than the deadline after the first send", async () => {
    await scripted(answering(() => err("overloaded")), { writeRetries: 20, retryDeadlineMs: 250 }, async (server, db) => {
      const error = await db.set("b", "p", 1).catch((e) => e);
      assert.equal(error.code, "overloaded");
      const { arrivals } = server.connections[0];
      assert.ok(error.sends >= 2 && error.sends < 21, `sends: ${error.sends}`);
      assert.equal(arrivals.length, error.sends);
      assert.ok(arrivals.at(-1) - arrivals[0] <= 250 + 100, `the last re-send ${arrivals.at(-1) - arrivals[0]} ms after the first send`);
    });
  });

  test("no re-send after a lost connection starts later than the deadline after the first send", async () => {
    const dropping = async (conn) => {
      await conn.read();
      conn.drop();
    };
    await scripted(dropping, { writeRetries: 20, retryDeadlineMs: 250 }, async (server, db) => {
      const error = await db.set("b", "p", 1, { wid: "w-dl" }).catch((e) => e);
      assert.ok(error instanceof RankdConnectionError, String(error));
      assert.deepEqual([error.maybeApplied, error.wid], [true, "w-dl"]);
      // A reconnection that dialled in time may find the deadline passed once
      // connected: it sends nothing, so only connections that got the write count.
      const arrivals = server.connections.map((conn) => conn.arrivals[0]).filter((at) => at !== undefined);
      assert.ok(error.sends >= 2 && error.sends < 21, `sends: ${error.sends}`);
      assert.equal(arrivals.length, error.sends);
      assert.ok(arrivals.at(-1) - arrivals[0] <= 250 + 100, `the last re-send ${arrivals.at(-1) - arrivals[0]} ms after the first send`);
    });
  });
});

describe("reply timeout", () => {
  test("a pipeline whose replies each come 0.6× the timeout after the previous one does not time out", async () => {
    const script = async (conn) => {
      const requests = [];
      for (let i = 0; i < 5; i++) requests.push(await conn.read());
      for (const request of requests) {
        await sleep(300);
        conn.reply(request, request.player);
      }
      for (let request; (request = await conn.read()); ) conn.reply(request, "pong");
    };
    await scripted(script, { timeoutMs: 500 }, async (server, db) => {
      const started = Date.now();
      const reads = ["a", "b", "c", "d", "e"].map((player) => db.get("b", player));
      assert.deepEqual(await Promise.all(reads), ["a", "b", "c", "d", "e"]);
      assert.ok(Date.now() - started >= 1_400, "longer than the timeout, as a whole");
      assert.equal(server.connections.length, 1, "the connection held");
      assert.equal(await db.ping(), "pong");
    });
  });

  test("a reply late after the previous one fails the connection: that read is not sent again, the one behind it is", async () => {
    const script = async (conn, index) => {
      if (index > 0) return answering((request) => ({ ok: `again ${request.player}` }))(conn, index);
      const [first] = [await conn.read(), await conn.read(), await conn.read()];
      await sleep(200);
      conn.reply(first, "a");
      await conn.read(); // nothing more is answered here
    };
    await scripted(script, { timeoutMs: 300 }, async (server, db) => {
      const started = Date.now();
      const [first, late, behind] = ["a", "b", "c"].map((player) => db.get("b", player));
      assert.equal(await first, "a");
      await assert.rejects(late, (e) => e instanceof RankdConnectionError && !e.maybeApplied && /within 300 ms/.test(e.message));
      const waited = Date.now() - started;
      assert.ok(waited >= 200 + 300 - 5, `timed out ${waited} ms after the send, 300 after the previous reply`);
      assert.equal(await behind, "again c", "sent once more on a new connection");
      assert.deepEqual(server.connections[1].log.map(({ player }) => player), ["c"], "not the late one");
    });
  });
});

describe("reads after a broken connection", () => {
  test("a read whose connection broke before its reply is sent once more on a new connection", async () => {
    const script = async (conn, index) => {
      if (index === 0) {
        await conn.read();
        return conn.drop();
      }
      await answering((request) => ({ ok: { rank: 1, score: 7, count: 1 } }))(conn, index);
    };
    await scripted(script, {}, async (server, db) => {
      assert.deepEqual(await db.rank("b", "p"), { rank: 1, score: 7, count: 1 });
      const [first, again] = server.connections.map((conn) => conn.log[0]);
      assert.deepEqual({ ...again, id: first.id }, first, "the same read");
      assert.equal(db.reconnects, 1);
    });
  });

  test("only once: a read whose second connection breaks too rejects", async () => {
    const dropping = async (conn) => {
      await conn.read();
      conn.drop();
    };
    await scripted(dropping, {}, async (server, db) => {
      await assert.rejects(db.top("b"), (e) => e instanceof RankdConnectionError && e.maybeApplied === false);
      await sleep(150);
      assert.equal(server.connections.length, 2, "sent twice, no more");
    });
  });

  test("without reconnect, a read whose connection broke rejects", async () => {
    const dropping = async (conn) => {
      await conn.read();
      conn.drop();
    };
    await scripted(dropping, { reconnect: false }, async (server, db) => {
      await assert.rejects(db.count("b"), RankdConnectionError);
      await sleep(100);
      assert.equal(server.connections.length, 1);
    });
  });
});

describe("maxFrame", () => {
  test("a request over maxFrame (1 MiB by default) is refused with too_large and not sent", async () => {
    await scripted(answering(() => ({ ok: "pong" })), {}, async (server, db) => {
      const entries = Array.from({ length: 10_000 }, (_, i) => [`${"p".repeat(200)}${i}`, i]); // about 2 MiB
      await assert.rejects(db.setMany("b", entries), (e) => {
        assert.ok(e instanceof RankdError, String(e));
        assert.equal(e.code, "too_large");
        assert.match(e.msg, /over the client's maxFrame of 1048576: not sent/);
        assert.equal(e.sends, 0);
        return true;
      });
      assert.equal(await db.ping(), "pong", "the connection is untouched");
      assert.deepEqual(server.connections[0].log.map(({ op }) => op), ["ping"], "the set_many never went out");
    });
  });

  test("maxFrame sets the limit; a wrong one is refused", async () => {
    await scripted(answering((request) => ({ ok: request.player })), { maxFrame: 100 }, async (server, db) => {
      assert.equal(await db.get("b", "p".repeat(50)), "p".repeat(50));
      await assert.rejects(db.get("b", "p".repeat(100)), (e) => e instanceof RankdError && e.code === "too_large");
      assert.equal(server.connections[0].log.length, 1);
    });
    for (const maxFrame of [0, -1, 1.5, "1024", 2 ** 32]) {
      assert.throws(() => new RankdClient(new EventEmitter(), { maxFrame }), RangeError, String(maxFrame));
    }
  });
});

describe("maxFrame and re-sends", () => {
  // A re-send carries a new request id, whose msgpack may be longer (up to
  // 9 bytes, a uint64): a request that may be sent again is checked once,
  // with room for the longest, so no re-send is refused after a send that
  // may have applied.
  const fields = { board: "b", player: "p", score: 1, wid: "w-edge" };
  const bodyWithId = (id) => encode({ id, op: "set", ...fields }).length;
  const pings = (db) => Promise.all(Array.from({ length: 126 }, () => db.ping())); // ids 1 to 126: the set gets 127
  const internalOnce = () => {
    let sets = 0;
    return answering((request) => (request.op !== "set" ? { ok: "pong" } : sets++ === 0 ? err("internal") : { ok: 1 }));
  };

  test("a write that fits with its first id but not with a re-send's is refused before it is sent", async () => {
    await scripted(internalOnce(), { maxFrame: bodyWithId(127) }, async (server, db) => {
      await pings(db);
      await assert.rejects(db.set("b", "p", 1, { wid: "w-edge" }), (e) => {
        assert.ok(e instanceof RankdError, String(e));
        assert.equal(e.code, "too_large");
        assert.deepEqual([e.sends, e.maybeApplied, e.wid], [0, false, "w-edge"]);
        assert.match(e.msg, /re-send.*over the client's maxFrame of \d+: not sent/);
        return true;
      });
      assert.deepEqual(server.connections[0].log.filter(({ op }) => op === "set"), [], "never sent");
      assert.equal(await db.ping(), "pong");
    });
  });

  test("a write that fits with room for the longest id is sent, and sent again with a longer id", async () => {
    assert.equal(bodyWithId(2 ** 32), bodyWithId(127) + 8);
    await scripted(internalOnce(), { maxFrame: bodyWithId(2 ** 32) }, async (server, db) => {
      await pings(db);
      const written = await db.set("b", "p", 1, { wid: "w-edge", info: true });
      assert.deepEqual([written.result, written.sends], [1, 2]);
      const ids = server.connections[0].log.filter(({ op }) => op === "set").map(({ id }) => id);
      assert.deepEqual(ids, [127, 128]);
    });
  });
});

describe("a write waiting to be sent again after overloaded", () => {
  /** Whether `wait` ms is one backoff before a first re-send, half to all of its cap (and a local reconnection). */
  const oneBackoff = (wait) => wait >= retryDelay(1) / 2 - 2 && wait <= retryDelay(1) + 40;

  test("if its connection breaks meanwhile and another call reconnected, it goes on that connection: none is left open", async () => {
    const script = async (conn, index) => {
      if (index === 0) {
        conn.fail(await conn.read(), "overloaded"); // the set
        await conn.read(); // the get: then the connection is lost
        return conn.drop();
      }
      await answering((request) => ({ ok: request.op === "set" ? 1 : "p" }))(conn, index);
    };
    await withRandom(
      () => 0.99,
      () =>
        scripted(script, {}, async (server, db) => {
          const write = db.set("b", "p", 1, { info: true });
          assert.equal(await db.get("b", "p"), "p", "sent once more, at once, on a new connection");
          const written = await write;
          assert.deepEqual([written.result, written.sends], [1, 2]);
          await db.close();
          assert.ok(await server.allClosed(), `every connection the client opened is closed: ${server.connections.map((c) => c.closed)}`);
          assert.equal(server.connections.length, 2, "one new connection, for both");
          const [first, second] = server.connections;
          assert.deepEqual(second.log.map(({ op }) => op), ["get", "set"]);
          const wait = second.arrivals[1] - first.arrivals[0];
          assert.ok(oneBackoff(wait), `re-sent ${wait} ms after the first send (one backoff: ${retryDelay(1) / 2} to ${retryDelay(1)})`);
        }),
    );
  });

  test("if its connection breaks meanwhile, it goes on a new connection without waiting a second backoff", async () => {
    const script = async (conn, index) => {
      if (index === 0) {
        conn.fail(await conn.read(), "overloaded");
        await sleep(10);
        return conn.drop(); // nothing in flight: no reconnection until the set is due
      }
      await answering(() => ({ ok: 1 }))(conn, index);
    };
    await withRandom(
      () => 0.99,
      () =>
        scripted(script, {}, async (server, db) => {
          const written = await db.set("b", "p", 1, { info: true });
          assert.deepEqual([written.result, written.sends], [1, 2]);
          const [first, second] = server.connections;
          const wait = second.arrivals[0] - first.arrivals[0];
          assert.ok(oneBackoff(wait), `re-sent ${wait} ms after the first send (one backoff: ${retryDelay(1) / 2} to ${retryDelay(1)})`);
          await db.close();
          assert.equal(server.connections.length, 2);
          assert.ok(await server.allClosed(), `every connection the client opened is closed: ${server.connections.map((c) => c.closed)}`);
        }),
    );
  });
});

describe("auth on reconnecting", () => {
  test("a token refused on a new connection fails the calls waiting for it with unauthorized; a write in doubt keeps its wid", async () => {
    const script = async (conn, index) => {
      if (index === 0) {
        conn.reply(await conn.read(), true); // auth
        await conn.read(); // the set: then the connection is lost
        return conn.drop();
      }
      const auth = await conn.read();
      assert.deepEqual(auth, { id: auth.id, op: "auth", token: "t0ken" });
      conn.fail(auth, "unauthorized", "token revoked");
      // As rankd: only ping is served without a token.
      await answering((request) => (request.op === "ping" ? { ok: "pong" } : err("unauthorized")))(conn, index);
    };
    await scripted(script, { token: "t0ken" }, async (server, db) => {
      let read;
      db.once("disconnect", () => (read = db.get("b", "p"))); // waits for the new connection
      const write = db.set("b", "p", 1, { mode: "incr" });
      await assert.rejects(write, (e) => {
        assert.ok(e instanceof RankdError, String(e));
        assert.equal(e.code, "unauthorized");
        assert.match(e.msg, /refused the client's token.*token revoked/);
        assert.deepEqual([e.maybeApplied, e.sends], [true, 1], "sent once, its reply lost: in doubt");
        assert.match(e.wid, WID);
        assert.equal(e.wid, server.connections[0].log[1].wid);
        return true;
      });
      await assert.rejects(read, (e) => e instanceof RankdError && e.code === "unauthorized" && e.maybeApplied === false);
      assert.deepEqual(server.connections[1].log.map(({ op }) => op), ["auth"], "nothing sent behind the refused token");
      assert.equal(await db.ping(), "pong", "the connection stays, for what needs no token");
    });
  });

  test("the calls waiting for a new connection are sent once its token is accepted", async () => {
    const script = async (conn, index) => {
      conn.reply(await conn.read(), true); // auth
      if (index === 0) {
        await conn.read();
        return conn.drop();
      }
      await answering((request) => ({ ok: request.op === "set" ? 3 : "pong" }))(conn, index);
    };
    await scripted(script, { token: "t0ken" }, async (server, db) => {
      assert.deepEqual(await db.set("b", "p", 3, { info: true }).then(({ result, sends }) => [result, sends]), [3, 2]);
      assert.deepEqual(server.connections[1].log.map(({ op }) => op), ["auth", "set"]);
    });
  });
});

describe("wids", () => {
  test("a wid the client makes is 32 random hex digits, one per write", async () => {
    await scripted(answering(() => ({ ok: true })), {}, async (server, db) => {
      await Promise.all([db.set("b", "p", 1), db.setMany("b", [["p", 1]]), db.remove("b", "p")]);
      const wids = server.connections[0].log.map(({ wid }) => wid);
      for (const wid of wids) assert.match(wid, /^[0-9a-f]{32}$/);
      assert.equal(new Set(wids).size, 3);
    });
  });
});
