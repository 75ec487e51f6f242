// RankdClient, the public API: a method per op, all pipelined on one
// connection at a time. It decides what is sent again (writes with a `wid`
// after a lost reply, `overloaded` or `internal`; reads once after a broken
// connection; the open watches) and what rejects, and reconnects with a
// growing, randomized wait. clients/conformance/transport.md has the rules.

import { randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";

import { Connection, DEFAULT_TIMEOUT_MS } from "./connection.js";
import { emitSafely } from "./emit.js";
import { RankdConnectionError, RankdError } from "./errors.js";
import { DEFAULT_MAX_FRAME, FrameEncoder, MAX_ID_BYTES, uintBytes } from "./frames.js";
import { fromWire, toWire } from "./integers.js";
import { WID_OPS, lostError, mayResend, newEntry, resendRead, retriedAnswer, serverError } from "./requests.js";
import {
  DEFAULT_RETRY_DEADLINE_MS,
  DEFAULT_WATCH_RETRIES,
  DEFAULT_WRITE_RETRIES,
  MAX_RETRY_DEADLINE_MS,
  backoff,
  retryDelay,
} from "./retry.js";
import { Subscriptions } from "./subscriptions.js";
import { Watch, kAttempts, kConn, kEnd, kForget } from "./watch.js";

/**
 * The client's options, checked (a `RangeError` names the first wrong one)
 * and with their defaults. {@link connect} checks them before it dials.
 */
export function clientOptions({
  timeoutMs = DEFAULT_TIMEOUT_MS,
  retryWrites = true,
  writeRetries = DEFAULT_WRITE_RETRIES,
  retryDeadlineMs = DEFAULT_RETRY_DEADLINE_MS,
  maxFrame = DEFAULT_MAX_FRAME,
  reconnect = true,
  watchRetries = DEFAULT_WATCH_RETRIES,
} = {}) {
  if (!Number.isInteger(writeRetries) || writeRetries < 0) throw new RangeError("writeRetries must be an integer, 0 or more");
  if (!Number.isInteger(watchRetries) || watchRetries < 0) throw new RangeError("watchRetries must be an integer, 0 or more");
  if (typeof retryDeadlineMs !== "number" || !Number.isFinite(retryDeadlineMs) || retryDeadlineMs <= 0 || retryDeadlineMs > MAX_RETRY_DEADLINE_MS) {
    // A wid is remembered for the server's dedup horizon (10 minutes by
    // default): a re-send after it may apply twice.
    throw new RangeError(
      `retryDeadlineMs must be a number of ms above 0 and at most ${MAX_RETRY_DEADLINE_MS} (5 minutes, well within the server's dedup horizon), got ${String(retryDeadlineMs)}`,
    );
  }
  if (!Number.isInteger(maxFrame) || maxFrame < 1 || maxFrame > 0xffff_ffff) {
    throw new RangeError(`maxFrame must be an integer number of bytes from 1 to ${0xffff_ffff}, got ${String(maxFrame)}`);
  }
  return {
    timeoutMs: timeoutMs > 0 && Number.isFinite(timeoutMs) ? timeoutMs : 0,
    retryWrites: Boolean(retryWrites),
    writeRetries,
    retryDeadlineMs,
    maxFrame,
    reconnect: Boolean(reconnect),
    watchRetries,
  };
}

/**
 * A client of a rankd server. Every method returns a promise; calls may be
 * made without waiting for earlier ones (they are pipelined), and each
 * settles with its own reply.
 *
 * With `retryWrites` (the default) every `set`, `setMany` and `remove`
 * carries a `wid` (32 random hex digits unless given), and one whose reply
 * is lost to a timeout or a broken connection is sent again, with the same
 * `wid`, on a new connection; one answered `overloaded` or `internal`, on
 * the same connection: up to `writeRetries` times, none later than
 * `retryDeadlineMs` after its first send, each after a random wait between
 * half and all of 100 ms, 200 ms, 400 ms, ... (at most 2 s). A read whose
 * connection broke before its reply is sent once more on a new connection
 * (not one whose own reply was late). `createBoard`, `dropBoard` and writes
 * without a `wid` in flight when a connection breaks reject with a
 * {@link RankdConnectionError}. With `reconnect` (the default; needs a
 * client made by {@link connect}) a broken connection is replaced when a
 * request is sent again, by the next call, and for the open watches.
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
  #retryDeadlineMs;
  #maxFrame;
  #reconnect;
  #encoder = new FrameEncoder();
  #nextId = 1;
  /** Requests waiting for a connection, in send order (those to send again first). */
  #queue = [];
  /** Writes waiting to be sent again (after `overloaded` or `internal`): `{entry, timer}`. */
  #delayed = new Set();
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
  constructor(socket, options = {}) {
    super();
    const { timeoutMs, retryWrites, writeRetries, retryDeadlineMs, maxFrame, reconnect, watchRetries } = clientOptions(options);
    this.#timeoutMs = timeoutMs;
    this.#retryWrites = retryWrites;
    this.#writeRetries = writeRetries;
    this.#retryDeadlineMs = retryDeadlineMs;
    this.#maxFrame = maxFrame;
    this.#reconnect = reconnect;
    this.#subscriptions = new Subscriptions(watchRetries, {
      callOn: (conn, op, fields) => this.#callOn(conn, op, fields),
      isClosing: () => Boolean(this.#closing),
    });
    this.#dial = options.dial;
    /** How many times a broken connection was replaced by a new one. */
    this.reconnects = 0;
    this.#conn = this.#adopt(socket);
  }

  /** How many requests are in flight (sent and not yet answered, or waiting to be sent again or for a new connection). */
  get inflight() {
    return (this.#conn?.inflight ?? 0) + this.#queue.length + this.#delayed.size;
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
    if (writeOp && this.#retryWrites && request.wid === undefined) request.wid = randomBytes(16).toString("hex");
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
    const delayed = [...this.#delayed];
    this.#delayed.clear();
    for (const { entry, timer } of delayed) {
      clearTimeout(timer);
      entry.fail(lostError(error, entry));
    }
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

  /** The current connection if it is usable. */
  #healthy() {
    const conn = this.#conn;
    return conn && !conn.failure ? conn : undefined;
  }

  /** Sends `entry` on the current connection, or queues it for a new one. */
  #submit(entry) {
    const conn = this.#healthy();
    if (conn && !this.#reconnecting) return this.#send(conn, entry);
    if (this.#canReconnect()) {
      this.#queue.push(entry);
      this.#startReconnecting();
      return;
    }
    entry.fail(lostError(this.#failure ?? this.#conn?.failure ?? new RankdConnectionError("not connected"), entry));
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
    const size = frame.length - 4;
    // The server would answer too_large and close the connection, failing
    // everything in flight on it. Checked once, before the first send: a
    // request that may be sent again is checked with room for the longest
    // id a re-send may carry, so no re-send (after a send that may have
    // applied) is refused.
    const room = mayResend(entry) ? MAX_ID_BYTES - uintBytes(entry.request.id) : 0;
    if (entry.sends === 0 && size + room > this.#maxFrame) {
      const over = size > this.#maxFrame ? "" : ` (${size + room} with room for the longer request id of a re-send)`;
      const msg = `the ${entry.op} request is ${size} bytes${over}, over the client's maxFrame of ${this.#maxFrame}: not sent`;
      entry.fail(serverError(new RankdError("too_large", msg), entry));
      return;
    }
    if (entry.sends === 0) entry.firstSent = Date.now();
    entry.sends++;
    conn.send(entry, frame);
  }

  /**
   * Uses up a re-send of `entry`, a write with a `wid` whose last send met
   * `error`; false (no re-send) when the re-sends are used up, or when it
   * could not start within the retry deadline even after the shortest wait.
   * The wait itself is drawn by who sends it again: the timer of
   * {@link #onError}, or the reconnection.
   */
  #spendRetry(entry, error) {
    entry.lastError = error;
    if (!entry.guarded || entry.retries >= this.#writeRetries) return false;
    const soonest = Date.now() + retryDelay(entry.retries + 1) / 2;
    if (entry.sends > 0 && soonest > entry.firstSent + this.#retryDeadlineMs) return false;
    entry.retries++;
    entry.waited = false;
    return true;
  }

  /** Whether `entry`, a re-send, may no longer start (its retry deadline has passed); if so, fails it. */
  #expired(entry, at = Date.now()) {
    if (!entry.guarded || entry.sends === 0 || at <= entry.firstSent + this.#retryDeadlineMs) return false;
    this.#giveUp(entry);
    return true;
  }

  /** Fails `entry`, a write whose re-sends are used up, with the error its last send met. */
  #giveUp(entry) {
    const last = entry.lastError ?? new RankdConnectionError("no reply");
    entry.fail(last instanceof RankdError ? serverError(last, entry) : lostError(last, entry));
  }

  /** The server answered `entry` on `conn` with `error`: final, or (`overloaded`, `internal` to a write with a `wid`) sent again there after a wait. */
  #onError(conn, entry, error) {
    if (!retriedAnswer(entry, error)) return entry.fail(serverError(error, entry));
    if (error.code === "internal") entry.inDoubt = true;
    if (!this.#spendRetry(entry, error)) return this.#giveUp(entry);
    const wait = backoff(entry.retries);
    if (this.#expired(entry, Date.now() + wait)) return;
    const delayed = { entry };
    delayed.timer = setTimeout(() => {
      this.#delayed.delete(delayed);
      if (this.#expired(entry)) return this.#checkIdle();
      // On the same connection; if it broke meanwhile, on the one that
      // replaced it, or a new one (which need not wait again).
      entry.waited = true;
      this.#submit(entry);
      this.#checkIdle();
    }, wait);
    this.#delayed.add(delayed);
  }

  // -- connections ----------------------------------------------------------

  #adopt(socket) {
    return new Connection(socket, this.#timeoutMs, {
      onPush: (conn, push) => this.#onPush(conn, push),
      onError: (conn, entry, error) => this.#onError(conn, entry, error),
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
    // (A connection lost while reconnecting, before its `auth` was answered,
    // is a failed reconnection, not a disconnect.)
    const established = !this.#reconnecting;
    const reconnect = this.#canReconnect();
    this.#subscriptions.connectionLost(conn, error, reconnect);
    const again = [];
    for (const entry of pending) {
      entry.inDoubt = true;
      const resend = reconnect && !conn.broken && (entry.guarded ? this.#spendRetry(entry, error) : resendRead(entry));
      if (resend) {
        again.push(entry);
      } else {
        entry.lastError = error;
        entry.fail(lostError(error, entry));
      }
    }
    if (again.length > 0) this.#queue.unshift(...again);
    this.#subscriptions.endExhausted(error);
    if (this.#queue.length > 0 || this.#subscriptions.waiting().length > 0) this.#startReconnecting();
    this.#checkIdle();
    if (conn === this.#conn && reconnect && established) emitSafely(this, "disconnect", error);
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
   * Opens a new connection (waiting first as the retries so far require,
   * but not again for a write that already waited its backoff),
   * authenticates it with the last token the server accepted (waiting for
   * the answer), then asks again for the watches that lost theirs and sends
   * what is queued, pipelined. A failed attempt uses up a retry of each
   * write with a `wid` and of each watch waiting, and fails the other calls
   * queued. A refused token fails what waits for the connection with the
   * server's `unauthorized`. It never replaces a usable connection: what
   * waits is sent there instead.
   */
  async #reconnectLoop() {
    for (;;) {
      if (this.#destroyed || (this.#queue.length === 0 && this.#subscriptions.waiting().length === 0)) {
        this.#reconnecting = false;
        this.#checkIdle();
        return;
      }
      const current = this.#healthy();
      if (current) return this.#sendWaiting(current);
      const waiting = this.#subscriptions.waiting();
      const attempt = Math.max(
        0,
        ...this.#queue.map((entry) => (entry.waited ? 0 : entry.retries)),
        ...waiting.map((watch) => watch[kAttempts]),
      );
      const delay = backoff(attempt);
      // Writes whose re-send could not start within their deadline go no further.
      const wakeAt = Date.now() + delay;
      this.#queue = this.#queue.filter((entry) => !this.#expired(entry, wakeAt));
      if (this.#queue.length === 0 && waiting.length === 0) continue;
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
        this.#attemptFailed(new RankdConnectionError(`reconnecting failed: ${cause.message}`, { cause }));
        continue;
      }
      if (this.#destroyed || this.#healthy()) {
        socket.destroy();
        continue;
      }
      const conn = this.#adopt(socket);
      this.#conn = conn;
      if (this.#token != null) {
        try {
          await new Promise((resolve, reject) => {
            this.#send(conn, newEntry("auth", { id: 0, op: "auth", token: this.#token }, { ok: resolve, fail: reject }));
          });
        } catch (err) {
          if (this.#destroyed) continue;
          if (err instanceof RankdError && err.code === "unauthorized") {
            this.#tokenRefused(err);
          } else {
            // Lost, late, or not served (`overloaded`...): a failed attempt.
            const error = err instanceof RankdConnectionError ? err : new RankdConnectionError(`auth answered ${err.message}`, { cause: err });
            conn.fail(error);
            this.#attemptFailed(new RankdConnectionError(`reconnecting failed: ${error.message}`, { cause: error }));
            continue;
          }
        }
      }
      this.reconnects++;
      this.#sendWaiting(conn, true);
      return;
    }
  }

  /** Ends a reconnection: asks again on `conn` for the waiting watches and sends what is queued; `reconnected`: `conn` is new. */
  #sendWaiting(conn, reconnected = false) {
    for (const watch of this.#subscriptions.waiting()) {
      watch.resubscribes++;
      this.#send(conn, this.#subscriptions.subscription(watch));
    }
    const queued = this.#queue;
    this.#queue = [];
    const now = Date.now();
    for (const entry of queued) if (!this.#expired(entry, now)) this.#send(conn, entry);
    this.#reconnecting = false;
    if (reconnected) emitSafely(this, "reconnect");
    this.#checkIdle();
  }

  /**
   * A reconnection failed with `error`: each write with a `wid` queued uses
   * up a re-send (or goes no further), each watch waiting an attempt; the
   * other calls queued fail.
   */
  #attemptFailed(error) {
    const keep = [];
    for (const entry of this.#queue) {
      if (entry.guarded && this.#spendRetry(entry, error)) {
        keep.push(entry);
      } else {
        entry.fail(lostError(error, entry));
      }
    }
    this.#queue = keep;
    this.#subscriptions.reconnectFailed(error);
  }

  /**
   * The server refused the client's token (`refusal`, its `unauthorized`)
   * on a new connection: what waits for it fails with `unauthorized`, writes
   * in doubt keeping their `maybeApplied`, `wid` and `sends`; the waiting
   * watches end. The connection stays, for calls that need no token (and
   * `auth` with another one).
   */
  #tokenRefused(refusal) {
    const msg = `the server refused the client's token on a new connection (${refusal.msg}); the request was not sent there`;
    const error = new RankdError("unauthorized", msg, { cause: refusal });
    const queued = this.#queue;
    this.#queue = [];
    for (const entry of queued) entry.fail(serverError(error, entry));
    this.#subscriptions.reconnectRefused(error);
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
