// A Node.js client for rankd (see docs/PROTOCOL.md): every message is a
// 4-byte big-endian length and one msgpack map; requests carry an `id` the
// server echoes, responses come back in request order, so many requests may
// be in flight on one connection at once. Protocol 1.1 adds idempotent
// writes (`wid`), which this client uses to send a write again after a lost
// connection, and watches (pushes without `id`), which it hands to `Watch`
// objects.
//
// Integers: msgpack carries 64-bit integers and JavaScript numbers are exact
// only up to 2^53 - 1. Results hold a `number` when the value is a safe
// integer and a `bigint` otherwise; requests take either (a `bigint` score
// travels as a 64-bit msgpack integer, exactly).

import { randomUUID } from "node:crypto";
import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import net from "node:net";
import tls from "node:tls";

import { Decoder, Encoder } from "@msgpack/msgpack";

/** The largest frame this client accepts from a server (64 MiB). */
export const MAX_FRAME = 64 * 1024 * 1024;

/** Default for `timeoutMs`: connecting, and waiting for each reply. */
export const DEFAULT_TIMEOUT_MS = 30_000;

/** Default for `writeRetries`: how many times a write with a `wid` is sent again. */
export const DEFAULT_WRITE_RETRIES = 3;

/** Default for `watchRetries`: how many reconnections a watch tries in a row before it ends. */
export const DEFAULT_WATCH_RETRIES = 10;

/** The wait before the first re-send (or reconnection); each further one doubles, up to `RETRY_DELAY_MAX_MS`. */
const RETRY_DELAY_MS = 100;
const RETRY_DELAY_MAX_MS = 2_000;

/** The writes that take a `wid` (protocol 1.1): the server applies a (board, wid) at most once. */
const WID_OPS = new Set(["set", "set_many", "remove"]);
/** Ops that change nothing: a connection lost while one was in flight leaves no doubt. */
const READ_OPS = new Set(["ping", "auth", "boards", "get", "count", "rank", "rank_of_score", "top", "around", "ranks", "watch", "unwatch"]);

const HEADER = 4;
const I64_MIN = -(2n ** 63n);
const U64_MAX = 2n ** 64n - 1n;
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/**
 * Milliseconds to wait before the `attempt`-th re-send of a write or
 * reconnection of a watch (1-based): 100, 200, 400, ... at most 2000; 0 for
 * attempt 0.
 */
export function retryDelay(attempt) {
  return attempt <= 0 ? 0 : Math.min(RETRY_DELAY_MS * 2 ** (attempt - 1), RETRY_DELAY_MAX_MS);
}

/** An error answered by the server: `{"err": {"code", "msg"}}`. */
export class RankdError extends Error {
  constructor(code, msg) {
    super(`${code}: ${msg}`);
    this.name = "RankdError";
    /** One of the protocol's codes: `bad_request`, `unauthorized`, ... */
    this.code = code;
    /** The server's explanation, for people. */
    this.msg = msg;
  }
}

/**
 * The connection failed, timed out, was closed, or the server broke the
 * protocol (bad framing, an unexpected id). Every request in flight on the
 * connection that is not sent again rejects with it. `maybeApplied` is true
 * when the request was a write that may or may not have applied; for a write
 * carrying a `wid`, `wid` is set (sending the same request again with it is
 * safe) and `sends` says how many times it was sent.
 */
export class RankdConnectionError extends Error {
  constructor(message, { cause, maybeApplied = false, wid, sends } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = "RankdConnectionError";
    this.maybeApplied = maybeApplied;
    if (wid !== undefined) this.wid = wid;
    if (sends !== undefined) this.sends = sends;
  }
}

/**
 * Connects to a rankd server; over TLS when `tls`, `caFile` or `certFile`
 * is given, then `auth`s with `token` if given (rejecting if refused). The
 * client reconnects the same way (and with the same token) when it must.
 */
export async function connect(
  host,
  port,
  {
    tls: useTls = false,
    caFile,
    serverName,
    certFile,
    keyFile,
    token,
    timeoutMs = DEFAULT_TIMEOUT_MS,
    retryWrites,
    writeRetries,
    reconnect,
    watchRetries,
  } = {},
) {
  if (certFile != null && keyFile == null) {
    throw new TypeError("certFile needs keyFile (the client certificate's private key)");
  }
  const secure = Boolean(useTls) || caFile != null || certFile != null;
  const dial = () => openSocket(host, port, secure, { caFile, serverName, certFile, keyFile }, timeoutMs);
  const socket = await dial();
  const client = new RankdClient(socket, { timeoutMs, retryWrites, writeRetries, reconnect, watchRetries, dial });
  if (token != null) {
    try {
      await client.auth(token);
    } catch (err) {
      client.destroy();
      throw err;
    }
  }
  return client;
}

/** A connected socket (TLS handshake done), or a rejection. */
async function openSocket(host, port, secure, tlsFiles, timeoutMs) {
  const socket = secure ? tls.connect(tlsOptions(host, port, tlsFiles)) : net.connect({ host, port });
  await new Promise((resolve, reject) => {
    const ready = secure ? "secureConnect" : "connect";
    let timer;
    const done = (err) => {
      clearTimeout(timer);
      socket.off(ready, onReady);
      socket.off("error", done);
      socket.off("close", onClose);
      if (err) {
        socket.destroy();
        reject(err);
      } else {
        resolve();
      }
    };
    const onReady = () => done();
    const onClose = () => done(new RankdConnectionError(`connection to ${host}:${port} closed while connecting`));
    if (timeoutMs > 0 && Number.isFinite(timeoutMs)) {
      const message = `connecting to ${host}:${port} timed out after ${timeoutMs} ms`;
      timer = setTimeout(() => done(new RankdConnectionError(message)), timeoutMs);
    }
    socket.once(ready, onReady);
    socket.once("error", done);
    socket.once("close", onClose);
  });
  return socket;
}

function tlsOptions(host, port, { caFile, serverName, certFile, keyFile }) {
  // The name the certificate must carry; SNI only takes a DNS name.
  const expected = serverName ?? host;
  const options = {
    host,
    port,
    checkServerIdentity: (_hostname, cert) => tls.checkServerIdentity(expected, cert),
  };
  if (!net.isIP(expected)) options.servername = expected;
  if (caFile != null) options.ca = readFileSync(caFile);
  if (certFile != null) {
    options.cert = readFileSync(certFile);
    options.key = readFileSync(keyFile);
  }
  return options;
}

/** Calls `emit` and, if a listener throws, rethrows that on a later tick so the client's state stays whole. */
function emitSafely(emitter, event, ...args) {
  try {
    emitter.emit(event, ...args);
  } catch (err) {
    process.nextTick(() => {
      throw err;
    });
  }
}

/**
 * One socket: frames out, replies matched to their requests in order,
 * pushes handed on, one timer for the oldest reply. It fails once (a lost
 * socket, a late reply, a protocol error), handing its unanswered requests
 * to `onFail`; the client decides which go again on a new connection.
 */
class Connection {
  socket;
  /** Set once the connection is unusable. */
  failure;
  /** Whether it failed because the server broke the protocol. */
  broken = false;
  /** The watches living on this connection, by the id the server gave them. */
  registry = new Map();
  /** Resolves when the socket has closed. */
  closed;
  /** Whether the socket has closed. */
  socketClosed = false;
  #timeoutMs;
  #hooks;
  #decoder = new Decoder({ useBigInt64: true });
  /** Requests sent and not yet answered, oldest first (entries of the client, with `deadline`). */
  #pending = [];
  #head = 0;
  #chunks = [];
  #buffered = 0;
  /** Bytes to gather before parsing again: a header, or the whole frame whose header is in. */
  #need = HEADER;
  #corked = false;
  #timer;

  constructor(socket, timeoutMs, hooks) {
    this.socket = socket;
    this.#timeoutMs = timeoutMs;
    this.#hooks = hooks;
    socket.setNoDelay?.(true);
    this.closed = new Promise((resolve) => socket.once("close", resolve));
    socket.on("data", (chunk) => this.#onData(chunk));
    socket.on("error", (err) => this.fail(new RankdConnectionError(`connection error: ${err.message}`, { cause: err })));
    socket.on("end", () => this.fail(new RankdConnectionError("connection closed by the server")));
    socket.on("close", () => {
      this.socketClosed = true;
      this.fail(new RankdConnectionError("connection closed"));
      hooks.onClose(this);
    });
  }

  get inflight() {
    return this.#pending.length - this.#head;
  }

  send(entry, frame) {
    entry.deadline = this.#timeoutMs ? Date.now() + this.#timeoutMs : 0;
    this.#pending.push(entry);
    this.#armTimer();
    // Frames written in the same tick go out together.
    if (!this.#corked) {
      this.#corked = true;
      this.socket.cork?.();
      process.nextTick(() => {
        this.#corked = false;
        this.socket.uncork?.();
      });
    }
    this.socket.write(frame);
  }

  /**
   * Marks the connection unusable, closes the socket and hands the
   * unanswered requests to the client; `broken`: the server broke the
   * protocol (nothing is sent again then).
   */
  fail(error, broken = false) {
    if (this.failure) return;
    this.failure = error;
    this.broken = broken;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const pending = this.#pending.slice(this.#head);
    this.#pending = [];
    this.#head = 0;
    this.#chunks = [];
    this.#buffered = 0;
    if (!this.socket.destroyed) this.socket.destroy();
    this.#hooks.onFail(this, error, pending);
  }

  #onData(chunk) {
    if (this.failure) return;
    this.#chunks.push(chunk);
    this.#buffered += chunk.length;
    // Join the chunks only once a whole frame is there (a big frame arrives
    // in many chunks: joining at each one would be quadratic).
    if (this.#buffered < this.#need) return;
    const buf = this.#chunks.length === 1 ? this.#chunks[0] : Buffer.concat(this.#chunks, this.#buffered);
    this.#chunks = [];
    this.#buffered = 0;
    let at = 0;
    while (buf.length - at >= HEADER) {
      const length = buf.readUInt32BE(at);
      if (length === 0 || length > MAX_FRAME) return this.#badFrameLength(length);
      if (buf.length - at < HEADER + length) break;
      const body = buf.subarray(at + HEADER, at + HEADER + length);
      at += HEADER + length;
      let message;
      try {
        message = this.#decoder.decode(body);
      } catch (err) {
        return this.fail(new RankdConnectionError(`undecodable frame from the server: ${err.message}`, { cause: err }), true);
      }
      this.#onMessage(message);
      if (this.failure) return;
    }
    const rest = at < buf.length ? buf.subarray(at) : undefined;
    if (rest) {
      this.#chunks = [rest];
      this.#buffered = rest.length;
    }
    this.#need = rest && rest.length >= HEADER ? HEADER + rest.readUInt32BE(0) : HEADER;
  }

  #badFrameLength(length) {
    this.fail(
      new RankdConnectionError(
        length === 0 ? "the server sent an empty frame" : `the server sent a frame of ${length} bytes, over the ${MAX_FRAME}-byte limit`,
      ),
      true,
    );
  }

  #onMessage(message) {
    if (message === null || typeof message !== "object" || Array.isArray(message) || message instanceof Uint8Array) {
      return this.fail(new RankdConnectionError("the server sent a frame that is not a map"), true);
    }
    if (!("id" in message) && "watch" in message) {
      this.#hooks.onPush(this, fromWire(message));
      return;
    }
    if (this.inflight === 0) {
      return this.fail(new RankdConnectionError(`the server answered id ${message.id} with no request in flight`), true);
    }
    const entry = this.#pending[this.#head];
    const id = message.id;
    const sent = entry.request.id;
    // Errors raised before the server could read an id (too_large, some
    // bad_frame) carry id 0; they still answer the oldest request.
    const matches = id === sent || (id === 0 && "err" in message) || (typeof id === "bigint" && id === BigInt(sent));
    if (!matches) {
      return this.fail(new RankdConnectionError(`expected a reply to id ${sent}, got id ${String(id)}`), true);
    }
    this.#pending[this.#head] = undefined;
    this.#head++;
    if (this.#head > 1024 && this.#head * 2 > this.#pending.length) {
      this.#pending = this.#pending.slice(this.#head);
      this.#head = 0;
    }
    if (this.inflight === 0) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
    if ("err" in message) {
      const err = message.err ?? {};
      entry.fail(new RankdError(String(err.code ?? "internal"), String(err.msg ?? "")));
    } else {
      entry.ok(fromWire(message.ok ?? null), message.dup === true, this);
    }
    this.#hooks.onSettle(this);
  }

  #armTimer() {
    if (!this.#timeoutMs || this.#timer || this.inflight === 0) return;
    const wait = Math.max(0, this.#pending[this.#head].deadline - Date.now());
    this.#timer = setTimeout(() => this.#onTimer(), wait);
  }

  // The oldest request has the earliest deadline (replies come in order), so
  // one timer, re-armed lazily, watches them all.
  #onTimer() {
    this.#timer = undefined;
    if (this.inflight === 0 || this.failure) return;
    if (this.#pending[this.#head].deadline <= Date.now()) {
      this.fail(new RankdConnectionError(`no reply from the server within ${this.#timeoutMs} ms`));
    } else {
      this.#armTimer();
    }
  }
}

// What the client and its watches share, out of the public API.
const kRequest = Symbol("request");
const kConn = Symbol("conn");
const kAttempts = Symbol("attempts");
const kSubscribing = Symbol("subscribing");
const kAttach = Symbol("attach");
const kDetach = Symbol("detach");
const kDeliver = Symbol("deliver");
const kEnd = Symbol("end");
const kForget = Symbol("forget");

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
  #watchRetries;
  #encoder = new Encoder({ useBigInt64: true });
  #nextId = 1;
  /** Requests waiting for a connection, in send order (writes to send again first). */
  #queue = [];
  /** Whether a reconnection is under way (calls queue meanwhile). */
  #reconnecting = false;
  /** Resolves the wait before the next reconnection attempt early (on destroy). */
  #wakeSleep;
  /** The open watches. */
  #watches = new Set();
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
    this.#watchRetries = watchRetries;
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
    return [...this.#watches];
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
      const entry = this.#entry(op, request, {
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
    await new Promise((resolve, reject) => this.#submit(this.#subscription(watch, resolve, reject)));
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
      for (const watch of [...this.#watches]) watch[kEnd]("the client is closed");
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
    for (const watch of [...this.#watches]) watch[kEnd]("the client was destroyed");
    const queued = this.#queue;
    this.#queue = [];
    for (const entry of queued) entry.fail(this.#lost(error, entry));
    this.#conn?.fail(error);
    this.#checkIdle();
    if (!this.#conn || this.#conn.socketClosed) this.#emitClose();
  }

  // -- requests -------------------------------------------------------------

  #entry(op, request, { guarded = false, wid, ok, fail }) {
    return { op, request, guarded, wid, sends: 0, retries: 0, deadline: 0, ok, fail };
  }

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
      const entry = this.#entry(op, { id: 0, op, ...fields }, { ok: resolve, fail: reject });
      if (conn.failure) reject(conn.failure);
      else this.#send(conn, entry);
    });
  }

  #send(conn, entry) {
    entry.request.id = this.#nextId++;
    let frame;
    try {
      const body = this.#encoder.encodeSharedRef(entry.request);
      frame = Buffer.allocUnsafe(HEADER + body.length);
      frame.writeUInt32BE(body.length, 0);
      frame.set(body, HEADER);
    } catch (err) {
      entry.fail(err);
      return;
    }
    entry.sends++;
    conn.send(entry, frame);
  }

  /** The error for `entry`, whose connection failed with `error` and which goes no further. */
  #lost(error, entry) {
    if (READ_OPS.has(entry.op) || entry.sends === 0 || !(error instanceof RankdConnectionError)) return error;
    const times = entry.sends === 1 ? "once" : `${entry.sends} times`;
    const note = entry.wid === undefined ? "" : ` (wid ${entry.wid}: at most once)`;
    return new RankdConnectionError(`${error.message}; the ${entry.op} was sent ${times} and may or may not have applied${note}`, {
      cause: error,
      maybeApplied: true,
      wid: entry.wid,
      sends: entry.sends,
    });
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
    conn.registry.get(push.watch)?.[kDeliver](push.event);
  }

  #onConnectionFailed(conn, error, pending) {
    const reconnect = this.#canReconnect();
    for (const watch of conn.registry.values()) {
      watch[kDetach]();
      if (!watch.active) continue;
      if (reconnect) watch[kAttempts]++;
      else watch[kEnd]("the connection was lost", error);
    }
    conn.registry.clear();
    const again = [];
    for (const entry of pending) {
      if (entry.guarded && reconnect && !conn.broken && entry.retries < this.#writeRetries) {
        entry.retries++;
        again.push(entry);
      } else {
        entry.fail(this.#lost(error, entry));
      }
    }
    if (again.length > 0) this.#queue.unshift(...again);
    this.#endExhaustedWatches(error);
    if (this.#queue.length > 0 || this.#waitingWatches().length > 0) this.#startReconnecting();
    this.#checkIdle();
    if (conn === this.#conn && reconnect) emitSafely(this, "disconnect", error);
  }

  /** The open watches without a connection, and not being asked for on one. */
  #waitingWatches() {
    return [...this.#watches].filter((watch) => watch[kConn] === undefined && !watch[kSubscribing]);
  }

  #endExhaustedWatches(error) {
    for (const watch of this.#waitingWatches()) {
      if (watch[kAttempts] > this.#watchRetries) {
        watch[kEnd](`the connection was lost and ${this.#watchRetries} reconnections failed`, error);
      }
    }
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
      const waiting = this.#waitingWatches();
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
          if (entry.guarded && entry.retries < this.#writeRetries) {
            entry.retries++;
            keep.push(entry);
          } else {
            entry.fail(this.#lost(error, entry));
          }
        }
        this.#queue = keep;
        for (const watch of this.#waitingWatches()) watch[kAttempts]++;
        this.#endExhaustedWatches(error);
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
        this.#send(conn, this.#entry("auth", { id: 0, op: "auth", token: this.#token }, { ok: () => {}, fail: () => {} }));
      }
      for (const watch of this.#waitingWatches()) {
        watch.resubscribes++;
        this.#send(conn, this.#subscription(watch));
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

  /**
   * The `watch` request of `watch`; the reply attaches it to the connection
   * that answered, at once (its pushes may follow in the same chunk). With
   * `resolve`, the first subscription (a refusal rejects); without, a
   * subscription again on a new connection (a refusal ends the watch).
   */
  #subscription(watch, resolve, reject) {
    watch[kSubscribing] = true;
    return this.#entry("watch", { id: 0, op: "watch", ...watch[kRequest] }, {
      ok: (result, _dup, conn) => {
        watch[kSubscribing] = false;
        const id = result !== null && typeof result === "object" ? result.watch : undefined;
        if (!(Number.isSafeInteger(id) && id >= 0)) {
          const error = new RankdConnectionError(`a watch reply is not {watch: <id>}: ${JSON.stringify(result)}`);
          if (resolve) reject(error);
          else watch[kEnd]("the server answered the watch oddly", error);
          return;
        }
        if (!watch.active && resolve === undefined) {
          // Ended while asked for again: the server need not keep it.
          this.#callOn(conn, "unwatch", { watch: id }).catch(() => {});
          return;
        }
        watch[kAttempts] = 0;
        watch[kAttach](conn, id);
        conn.registry.set(id, watch);
        this.#watches.add(watch);
        if (this.#closing) watch[kEnd]("the client is closed");
        resolve?.();
      },
      fail: (error) => {
        watch[kSubscribing] = false;
        if (resolve) reject(error);
        else if (error instanceof RankdError) watch[kEnd](`watching again was refused: ${error.message}`, error);
        else watch[kAttempts]++; // (a lost connection: the watch waits for the next one)
      },
    });
  }

  /** Forgets a watch that ended (called by the watch). */
  [kForget](watch) {
    this.#watches.delete(watch);
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

/**
 * A watch made by {@link RankdClient.watch}: the events the server pushes.
 * A `top` event is the list `top` would answer; a `player` event what `rank`
 * would answer, or `null` while the player is absent.
 *
 * - `for await (const event of watch)` takes the events in order and ends
 *   when the watch ends (leaving the loop early does not end the watch);
 *   `watch.events({idleMs})` also ends after `idleMs` without an event. At
 *   most `buffer` unread events are kept, the newest.
 * - The `event` event gives every event as it comes; `end` (reason, error)
 *   comes once, when the watch ends.
 * - A `top` watch ends after a `null` event: its board was dropped.
 * - If its connection is lost, the watch asks again on a new one (its first
 *   event there is the current state); when that fails `watchRetries` times
 *   in a row, it ends with the error, which the iteration throws.
 */
export class Watch extends EventEmitter {
  #client;
  #buffer;
  #events = [];
  #waiters = [];
  #ended;
  #error;

  /** Made by {@link RankdClient.watch}. */
  constructor(client, request, buffer = 1) {
    super();
    this.#client = client;
    this.#buffer = buffer;
    this[kRequest] = request;
    this[kConn] = undefined;
    this[kAttempts] = 0;
    this[kSubscribing] = false;
    /** The board watched. */
    this.board = request.board;
    /** The N of a `top` watch, else `undefined`. */
    this.top = request.top;
    /** The player of a `player` watch, else `undefined`. */
    this.player = request.player;
    /** The server's id of this watch on its current connection; `null` while it has none. */
    this.id = null;
    /** How many times the watch asked again on a new connection. */
    this.resubscribes = 0;
    /** The newest event received (`undefined` before the first). */
    this.latest = undefined;
  }

  /** Whether the watch may still deliver events. */
  get active() {
    return this.#ended === undefined;
  }

  /** Why the watch ended (`"unwatched"`, `"the board was dropped"`, ...), or `undefined` while it is active. */
  get ended() {
    return this.#ended;
  }

  /** The error that ended the watch, if one did (the iteration throws it). */
  get error() {
    return this.#error;
  }

  /** Unread events (for iteration). */
  get pending() {
    return this.#events.length;
  }

  /** Ends the watch (`client.unwatch(watch)`): `true` if the server had it open. */
  close() {
    return this.#client.unwatch(this);
  }

  [Symbol.asyncIterator]() {
    return this.events();
  }

  /**
   * The events, in order, until the watch ends (after its last event), or
   * until none comes for `idleMs` (the watch stays open). Throws the error
   * that ended the watch, if one did.
   */
  async *events({ idleMs } = {}) {
    for (;;) {
      if (this.#events.length > 0) {
        yield this.#events.shift();
        continue;
      }
      if (this.#ended !== undefined) {
        if (this.#error) throw this.#error;
        return;
      }
      if (!(await this.#wait(idleMs))) return;
    }
  }

  /** Resolves `true` when an event comes or the watch ends, `false` after `ms` (if given) without either. */
  #wait(ms) {
    return new Promise((resolve) => {
      const waiter = { resolve, timer: undefined };
      if (ms !== undefined && ms !== null && Number.isFinite(ms)) {
        waiter.timer = setTimeout(() => {
          this.#waiters = this.#waiters.filter((w) => w !== waiter);
          resolve(false);
        }, Math.max(0, ms));
      }
      this.#waiters.push(waiter);
    });
  }

  #wake() {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const waiter of waiters) {
      clearTimeout(waiter.timer);
      waiter.resolve(true);
    }
  }

  [kAttach](conn, id) {
    this[kConn] = conn;
    this.id = id;
  }

  /** Off its connection (lost, or the watch ended). */
  [kDetach]() {
    const conn = this[kConn];
    if (conn !== undefined && this.id !== null && conn.registry.get(this.id) === this) conn.registry.delete(this.id);
    this[kConn] = undefined;
    this.id = null;
  }

  [kDeliver](event) {
    if (this.#ended !== undefined) return;
    this.latest = event;
    this.#events.push(event);
    if (this.#events.length > this.#buffer) this.#events.shift();
    emitSafely(this, "event", event);
    if (event === null && this.top !== undefined) {
      // A top list is never nil otherwise: the board was dropped, and the
      // server ended the watch after this last push.
      this[kEnd]("the board was dropped");
    } else {
      this.#wake();
    }
  }

  [kEnd](reason, error) {
    if (this.#ended !== undefined) return;
    this.#ended = reason;
    this.#error = error;
    this[kDetach]();
    this.#client[kForget](this);
    this.#wake();
    emitSafely(this, "end", reason, error);
  }
}

if (typeof Symbol.asyncDispose === "symbol") {
  // `await using watch = await client.watch(...)` closes it at the end of the block.
  Watch.prototype[Symbol.asyncDispose] = async function dispose() {
    await this.close().catch(() => {});
  };
}

/**
 * A request value made ready for the encoder: integers beyond 32 bits become
 * `bigint` (the encoder, in BigInt mode, writes them as 64-bit integers; a
 * `number` there would go out as a float), and a `bigint` or `number` that
 * no 64-bit msgpack integer holds throws a RangeError instead of being
 * silently wrapped or rounded.
 */
function toWire(value) {
  switch (typeof value) {
    case "number":
      if (Number.isInteger(value) && (value >= 2 ** 32 || value < -(2 ** 31))) {
        if (!Number.isSafeInteger(value)) {
          throw new RangeError(`${value} is beyond Number.MAX_SAFE_INTEGER and may have lost precision: pass a BigInt`);
        }
        return BigInt(value);
      }
      return value;
    case "bigint":
      if (value < I64_MIN || value > U64_MAX) throw new RangeError(`${value} does not fit in a 64-bit integer`);
      return value;
    case "object":
      if (value === null || ArrayBuffer.isView(value) || value instanceof Date) return value;
      if (Array.isArray(value)) return value.map(toWire);
      if (value instanceof Map) return new Map(Array.from(value, ([k, v]) => [k, toWire(v)]));
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, toWire(v)]));
    default:
      return value;
  }
}

/** A decoded reply with every `bigint` that fits in a safe integer made a `number`. */
function fromWire(value) {
  if (typeof value === "bigint") {
    return value >= MIN_SAFE && value <= MAX_SAFE ? Number(value) : value;
  }
  if (value !== null && typeof value === "object" && !(value instanceof Uint8Array)) {
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) value[i] = fromWire(value[i]);
    } else {
      for (const key of Object.keys(value)) value[key] = fromWire(value[key]);
    }
  }
  return value;
}
