// RankdClient, the public API: a method per op, all pipelined on one
// connection at a time. When a connection breaks, it decides what goes on a
// new one (writes with a `wid`, the open watches, later calls) and what
// rejects, and reconnects with a growing wait.

import { randomUUID } from "node:crypto";
import { EventEmitter } from "node:events";

import { Connection, DEFAULT_TIMEOUT_MS } from "./connection.js";
import { emitSafely } from "./emit.js";
import { RankdConnectionError } from "./errors.js";
import { FrameEncoder } from "./frames.js";
import { fromWire, toWire } from "./integers.js";
import { WID_OPS, lostError, newEntry, spendRetry } from "./requests.js";
import { DEFAULT_WATCH_RETRIES, DEFAULT_WRITE_RETRIES, retryDelay } from "./retry.js";
import { Subscriptions } from "./subscriptions.js";
import { Watch, kAttempts, kConn, kEnd, kForget } from "./watch.js";

/**
 * A client of a rankd server. Every method returns a promise; calls may be
 * made without waiting for earlier ones (they are pipelined), and each
 * settles with its own reply.
 *
 * With `retryWrites` (the default) every `set`, `setMany` and `remove`
 * carries a `wid` (a random UUID unless given), and one whose reply is lost
 * to a timeout or a broken connection is sent again, with the same `wid`, on
 * a new connection: up to `writeRetries` times, after 100 ms, 200 ms, 400 ms,
 * ... (at most 2 s). Reads, `createBoard`, `dropBoard` and writes without a
 * `wid` in flight when a connection breaks reject with a
 * {@link RankdConnectionError}. With `reconnect` (the default; needs a
 * client made by {@link connect}) a broken connection is replaced when a
 * write is sent again, by the next call, and for the open watches.
 *
 * Events: `push` (every watch push, the raw `{watch, event}` map),
 * `disconnect` (a connection was lost; the client may reconnect),
 * `reconnect` (a new connection is up) and `close` (the client is done).
 */
export class RankdClient extends EventEmitter {
  /** The current connection (it may have failed). */
  #conn;
  #dial;
  #token;
  #timeoutMs;
  #retryWrites;
  #writeRetries;
  #reconnect;
  #encoder = new FrameEncoder();
  #nextId = 1;
  /** Requests waiting for a connection, in send order (writes to send again first). */
  #queue = [];
  /** Whether a reconnection is under way (calls queue meanwhile). */
  #reconnecting = false;
  /** Resolves the wait before the next reconnection attempt early (on destroy). */
  #wakeSleep;
  /** The open watches. */
  #subscriptions;
  /** Set once the client is closed or destroyed: the error new calls reject with. */
  #failure;
  #closing;
  #destroyed = false;
  #closeEmitted = false;
  /** Called when nothing is in flight or queued (for `close`). */
  #onIdle;

  /**
   * Use {@link connect}; this wraps an already connected socket. `dial`, a
   * function resolving to a new connected socket, lets the client
   * reconnect; without it a broken connection ends the client.
   */
  constructor(
    socket,
    {
      timeoutMs = DEFAULT_TIMEOUT_MS,
      retryWrites = true,
      writeRetries = DEFAULT_WRITE_RETRIES,
      reconnect = true,
      watchRetries = DEFAULT_WATCH_RETRIES,
      dial,
    } = {},
  ) {
    super();
    if (!Number.isInteger(writeRetries) || writeRetries < 0) throw new RangeError("writeRetries must be an integer, 0 or more");
    if (!Number.isInteger(watchRetries) || watchRetries < 0) throw new RangeError("watchRetries must be an integer, 0 or more");
    this.#timeoutMs = timeoutMs > 0 && Number.isFinite(timeoutMs) ? timeoutMs : 0;
    this.#retryWrites = Boolean(retryWrites);
    this.#writeRetries = writeRetries;
    this.#reconnect = Boolean(reconnect);
    this.#subscriptions = new Subscriptions(watchRetries, {
      callOn: (conn, op, fields) => this.#callOn(conn, op, fields),
      isClosing: () => Boolean(this.#closing),
    });
    this.#dial = dial;
    /** How many times a broken connection was replaced by a new one. */
    this.reconnects = 0;
    this.#conn = this.#adopt(socket);
  }

  /** How many requests are in flight (sent and not yet answered, or waiting for a new connection). */
  get inflight() {
    return (this.#conn?.inflight ?? 0) + this.#queue.length;
  }

  /** Whether writes get a `wid` and are sent again after a lost reply. */
  get retryWrites() {
    return this.#retryWrites;
  }

  /** The open watches. */
  get watches() {
    return this.#subscriptions.list();
  }

  /**
   * Sends `op` with `fields` and resolves with its `ok` result, or rejects
   * with a {@link RankdError}. Fields that are `undefined` or `null` are left
   * out, so the server applies its defaults. For ops without a method here.
   * A `set`, `set_many` or `remove` gets a `wid` with `retryWrites`, as from
   * its method; with `{info: true}` a write resolves with `{result, dup, wid,
   * sends}`. (A `watch` made here has no {@link Watch}: its pushes are only
   * `push` events; use `watch()`.)
   */
  call(op, fields = {}, { info = false } = {}) {
    const refusal = this.#refusal();
    if (refusal) return Promise.reject(refusal);
    const request = { id: 0, op };
    try {
      for (const [key, value] of Object.entries(fields)) {
        if (value !== undefined && value !== null && key !== "id" && key !== "op") request[key] = toWire(value);
      }
    } catch (err) {
      return Promise.reject(err);
    }
    const writeOp = WID_OPS.has(op);
    if (writeOp && this.#retryWrites && request.wid === undefined) request.wid = randomUUID();
    const wid = writeOp ? request.wid : undefined;
    return new Promise((resolve, reject) => {
      const entry = newEntry(op, request, {
        guarded: writeOp && wid !== undefined && this.#retryWrites,
        wid,
        ok: (value, dup) => resolve(info ? { result: value, dup, wid, sends: entry.sends } : value),
        fail: reject,
      });
      this.#submit(entry);
    });
  }

  /** `"pong"`. */
  ping() {
    return this.call("ping");
  }

  /**
   * `true`, or `{role: "read" | "write"}` on a server with token roles. The
   * client authenticates new connections with the last accepted token.
   */
  async auth(token) {
    const result = await this.call("auth", { token });
    this.#token = token;
    return result;
  }

  /** `true` if created, `false` if it already existed with this config. */
  createBoard(board, { order, ties, windows, keep, ...extra } = {}) {
    return this.call("create_board", { ...extra, board, order, ties, windows, keep });
  }

  /** `true` if the board existed. Its `top` watches get a last `null` event and end. */
  dropBoard(board) {
    return this.call("drop_board", { board });
  }

  /** `[{board, order, ties, windows, keep, count}]`. */
  boards(options = {}) {
    return this.call("boards", { ...options });
  }

  /**
   * Writes a score; resolves with the score stored (first window), or with
   * `{result, dup, wid, sends}` given `info: true`. `wid`: applied at most
   * once (a fresh one is made with `retryWrites`).
   */
  set(board, player, score, { mode, wid, info, ...extra } = {}) {
    return this.call("set", { ...extra, board, player, score, mode, wid }, { info });
  }

  /**
   * `entries`: `[player, score]` pairs or `{player, score}` objects (an
   * array, a Map, any iterable); resolves with the stored scores, in order
   * (`wid`, `info` as for `set`).
   */
  setMany(board, entries, { mode, wid, info, ...extra } = {}) {
    const list = Array.from(entries, (entry) => (Array.isArray(entry) ? entry : [entry.player, entry.score]));
    return this.call("set_many", { ...extra, board, entries: list, mode, wid }, { info });
  }

  /** The player's score, or `null`. */
  get(board, player, { window, period, ...extra } = {}) {
    return this.call("get", { ...extra, board, player, window, period });
  }

  /** `true` if the player was present (`wid`, `info` as for `set`). */
  remove(board, player, { wid, info, ...extra } = {}) {
    return this.call("remove", { ...extra, board, player, wid }, { info });
  }

  /** The number of players. */
  count(board, { window, period, ...extra } = {}) {
    return this.call("count", { ...extra, board, window, period });
  }

  /** `{rank, score, count}`, or `null` if the player is absent. */
  rank(board, player, { window, period, ...extra } = {}) {
    return this.call("rank", { ...extra, board, player, window, period });
  }

  /** The rank a new player with `score` would get. */
  rankOfScore(board, score, { window, period, ...extra } = {}) {
    return this.call("rank_of_score", { ...extra, board, score, window, period });
  }

  /** `[{player, score, rank}]`, best first. */
  top(board, { limit, offset, window, period, ...extra } = {}) {
    return this.call("top", { ...extra, board, limit, offset, window, period });
  }

  /** The player with up to `before` better and `after` worse neighbours; `[]` if absent. */
  around(board, player, { before, after, window, period, ...extra } = {}) {
    return this.call("around", { ...extra, board, player, before, after, window, period });
  }

  /** A friends leaderboard in one call: those of `players` (1 to 1000 names) present, each once, best first, each with its board-wide rank. */
  ranks(board, players, { window, period, ...extra } = {}) {
    return this.call("ranks", { ...extra, board, players: [...players], window, period });
  }

  /**
   * Follows a board's best `top` (1 to 100) entries, or one `player`'s rank
   * (exactly one of the two, in `target` or `options`): resolves with a
   * {@link Watch} once the server has accepted it; the server pushes the
   * current value at once, then each new one when it changes (at most once
   * per `intervalMs`, 10 to 60 000, default 100). `buffer` (default 1): how
   * many unread events the watch keeps for iteration, the newest.
   */
  async watch(board, target = {}, options = {}) {
    const { top, player, window, period, intervalMs, buffer = 1, ...extra } = { ...target, ...options };
    if ((top == null) === (player == null)) throw new TypeError("watch takes exactly one of {top} and {player}");
    if (!Number.isInteger(buffer) || buffer < 1) throw new RangeError("a watch's buffer holds at least 1 event");
    const request = { ...extra, board, top, player, window, period, interval_ms: intervalMs };
    for (const key of Object.keys(request)) if (request[key] === undefined || request[key] === null) delete request[key];
    const refusal = this.#refusal();
    if (refusal) throw refusal;
    const watch = new Watch(this, request, buffer);
    await new Promise((resolve, reject) => this.#submit(this.#subscriptions.subscription(watch, resolve, reject)));
    return watch;
  }

  /**
   * Ends a watch: a {@link Watch}, or the id of one on the current
   * connection (as a `watch` op answered). Resolves with `true` if the
   * server had it open; `false` if not, or if its connection is gone (the
   * watch went with it). Events received before stay readable.
   */
  async unwatch(watch) {
    let conn;
    let id;
    if (watch instanceof Watch) {
      conn = watch[kConn];
      id = watch.id;
      watch[kEnd]("unwatched");
    } else {
      conn = this.#conn;
      id = watch;
      conn?.registry.get(typeof id === "bigint" ? fromWire(id) : id)?.[kEnd]("unwatched");
    }
    if (conn === undefined || conn.failure || id == null || this.#destroyed) return false;
    try {
      return await this.#callOn(conn, "unwatch", { watch: id });
    } catch (err) {
      if (err instanceof RankdConnectionError) return false;
      throw err;
    }
  }

  /**
   * Closes the connection once every request in flight is answered (writes
   * being sent again included); new calls reject at once, and the watches
   * end. Resolves when the socket is closed.
   */
  close() {
    this.#closing ??= (async () => {
      this.#subscriptions.endAll("the client is closed");
      if (this.inflight > 0 || this.#reconnecting) await new Promise((resolve) => (this.#onIdle = resolve));
      const conn = this.#conn;
      this.#failure ??= new RankdConnectionError("the client is closed");
      if (conn && !conn.socket.destroyed) conn.socket.end();
      if (conn) await conn.closed;
      this.#emitClose();
    })();
    return this.#closing;
  }

  /** Closes the connection now; requests in flight reject, watches end. */
  destroy() {
    if (this.#destroyed) return;
    this.#destroyed = true;
    const error = new RankdConnectionError("the client was destroyed");
    this.#failure ??= error;
    this.#wakeSleep?.();
    this.#subscriptions.endAll("the client was destroyed");
    const queued = this.#queue;
    this.#queue = [];
    for (const entry of queued) entry.fail(lostError(error, entry));
    this.#conn?.fail(error);
    this.#checkIdle();
    if (!this.#conn || this.#conn.socketClosed) this.#emitClose();
  }

  // -- requests -------------------------------------------------------------

  /** Why a new call is refused now, if it is. */
  #refusal() {
    if (this.#destroyed) return this.#failure;
    if (this.#closing) return new RankdConnectionError("the client is closed");
    return undefined;
  }

  #canReconnect() {
    return this.#reconnect && this.#dial !== undefined && !this.#destroyed;
  }

  /** Sends `entry` on the current connection, or queues it for a new one. */
  #submit(entry) {
    const conn = this.#conn;
    if (conn && !conn.failure && !this.#reconnecting) return this.#send(conn, entry);
    if (this.#canReconnect()) {
      this.#queue.push(entry);
      this.#startReconnecting();
      return;
    }
    entry.fail(this.#failure ?? conn?.failure ?? new RankdConnectionError("not connected"));
  }

  /** Sends `entry` on `conn` only (an `unwatch` names an id of that connection). */
  #callOn(conn, op, fields) {
    const refusal = this.#refusal();
    if (refusal) return Promise.reject(refusal);
    return new Promise((resolve, reject) => {
      const entry = newEntry(op, { id: 0, op, ...fields }, { ok: resolve, fail: reject });
      if (conn.failure) reject(conn.failure);
      else this.#send(conn, entry);
    });
  }

  #send(conn, entry) {
    entry.request.id = this.#nextId++;
    let frame;
    try {
      frame = this.#encoder.encode(entry.request);
    } catch (err) {
      entry.fail(err);
      return;
    }
    entry.sends++;
    conn.send(entry, frame);
  }

  // -- connections ----------------------------------------------------------

  #adopt(socket) {
    return new Connection(socket, this.#timeoutMs, {
      onPush: (conn, push) => this.#onPush(conn, push),
      onFail: (conn, error, pending) => this.#onConnectionFailed(conn, error, pending),
      onSettle: () => this.#checkIdle(),
      onClose: (conn) => {
        if (conn === this.#conn && (this.#failure || !this.#canReconnect())) this.#emitClose();
      },
    });
  }

  #onPush(conn, push) {
    emitSafely(this, "push", push);
    this.#subscriptions.deliver(conn, push);
  }

  #onConnectionFailed(conn, error, pending) {
    const reconnect = this.#canReconnect();
    this.#subscriptions.connectionLost(conn, error, reconnect);
    const again = [];
    for (const entry of pending) {
      if (reconnect && !conn.broken && spendRetry(entry, this.#writeRetries)) {
        again.push(entry);
      } else {
        entry.fail(lostError(error, entry));
      }
    }
    if (again.length > 0) this.#queue.unshift(...again);
    this.#subscriptions.endExhausted(error);
    if (this.#queue.length > 0 || this.#subscriptions.waiting().length > 0) this.#startReconnecting();
    this.#checkIdle();
    if (conn === this.#conn && reconnect) emitSafely(this, "disconnect", error);
  }

  #startReconnecting() {
    if (this.#reconnecting || !this.#canReconnect()) return;
    this.#reconnecting = true;
    this.#reconnectLoop().catch((err) => {
      // (Not expected: the loop handles its failures. Fail what waits.)
      this.#reconnecting = false;
      const queued = this.#queue;
      this.#queue = [];
      for (const entry of queued) entry.fail(err);
      this.#checkIdle();
    });
  }

  /**
   * Opens a new connection (waiting first as the retries so far require),
   * authenticates it, asks again for the watches that lost theirs and sends
   * what is queued, all pipelined. A failed attempt uses up a retry of each
   * write with a `wid` and of each watch waiting, and fails the other calls
   * queued (they were never sent).
   */
  async #reconnectLoop() {
    for (;;) {
      const waiting = this.#subscriptions.waiting();
      if (this.#destroyed || (this.#queue.length === 0 && waiting.length === 0)) {
        this.#reconnecting = false;
        this.#checkIdle();
        return;
      }
      const attempt = Math.max(0, ...this.#queue.map((entry) => entry.retries), ...waiting.map((watch) => watch[kAttempts]));
      const delay = retryDelay(attempt);
      if (delay > 0) {
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, delay);
          this.#wakeSleep = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.#wakeSleep = undefined;
      }
      if (this.#destroyed) continue;
      let socket;
      try {
        socket = await this.#dial();
      } catch (cause) {
        if (this.#destroyed) continue;
        const error = new RankdConnectionError(`reconnecting failed: ${cause.message}`, { cause });
        const keep = [];
        for (const entry of this.#queue) {
          if (spendRetry(entry, this.#writeRetries)) {
            keep.push(entry);
          } else {
            entry.fail(lostError(error, entry));
          }
        }
        this.#queue = keep;
        this.#subscriptions.reconnectFailed(error);
        continue;
      }
      if (this.#destroyed) {
        socket.destroy();
        continue;
      }
      const conn = this.#adopt(socket);
      this.#conn = conn;
      this.reconnects++;
      if (this.#token != null) {
        // Its refusal shows in every reply after it (`unauthorized`).
        this.#send(conn, newEntry("auth", { id: 0, op: "auth", token: this.#token }, { ok: () => {}, fail: () => {} }));
      }
      for (const watch of this.#subscriptions.waiting()) {
        watch.resubscribes++;
        this.#send(conn, this.#subscriptions.subscription(watch));
      }
      const queued = this.#queue;
      this.#queue = [];
      for (const entry of queued) this.#send(conn, entry);
      this.#reconnecting = false;
      emitSafely(this, "reconnect");
      this.#checkIdle();
      return;
    }
  }

  /** Forgets a watch that ended (called by the watch). */
  [kForget](watch) {
    this.#subscriptions.forget(watch);
    this.#checkIdle();
  }

  #checkIdle() {
    if (this.#onIdle && this.inflight === 0 && !this.#reconnecting) {
      const onIdle = this.#onIdle;
      this.#onIdle = undefined;
      onIdle();
    }
  }

  #emitClose() {
    if (this.#closeEmitted) return;
    this.#closeEmitted = true;
    emitSafely(this, "close");
  }
}
