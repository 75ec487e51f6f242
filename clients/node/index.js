// A Node.js client for rankd, protocol version 1 (see protocol.md): every
// message is a 4-byte big-endian length and one msgpack map; requests carry
// an `id` the server echoes, responses come back in request order, so many
// requests may be in flight on one connection at once.
//
// Integers: msgpack carries 64-bit integers and JavaScript numbers are exact
// only up to 2^53 - 1. Results hold a `number` when the value is a safe
// integer and a `bigint` otherwise; requests take either (a `bigint` score
// travels as a 64-bit msgpack integer, exactly).

import { EventEmitter } from "node:events";
import { readFileSync } from "node:fs";
import net from "node:net";
import tls from "node:tls";

import { Decoder, Encoder } from "@msgpack/msgpack";

/** The largest frame this client accepts from a server (64 MiB). */
export const MAX_FRAME = 64 * 1024 * 1024;

/** Default for `timeoutMs`: connecting, and waiting for each reply. */
export const DEFAULT_TIMEOUT_MS = 30_000;

const HEADER = 4;
const I64_MIN = -(2n ** 63n);
const U64_MAX = 2n ** 64n - 1n;
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

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
 * connection is rejected with it, and the connection is unusable afterwards.
 */
export class RankdConnectionError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "RankdConnectionError";
  }
}

/**
 * Connects to a rankd server; over TLS when `tls`, `caFile` or `certFile`
 * is given, then `auth`s with `token` if given (rejecting if refused).
 */
export async function connect(
  host,
  port,
  { tls: useTls = false, caFile, serverName, certFile, keyFile, token, timeoutMs = DEFAULT_TIMEOUT_MS } = {},
) {
  if (certFile != null && keyFile == null) {
    throw new TypeError("certFile needs keyFile (the client certificate's private key)");
  }
  const secure = Boolean(useTls) || caFile != null || certFile != null;
  const socket = secure
    ? tls.connect(tlsOptions(host, port, { caFile, serverName, certFile, keyFile }))
    : net.connect({ host, port });
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
  const client = new RankdClient(socket, { timeoutMs });
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

/**
 * One connection to a rankd server. Every method returns a promise; calls
 * may be made without waiting for earlier ones (they are pipelined), and
 * each settles with its own reply. Events: `push` (a v1.1 watch push, the
 * raw `{watch, event}` map) and `close`.
 */
export class RankdClient extends EventEmitter {
  #socket;
  #timeoutMs;
  #encoder = new Encoder({ useBigInt64: true });
  #decoder = new Decoder({ useBigInt64: true });
  #nextId = 1;
  /** Requests sent and not yet answered, oldest first: `{id, resolve, reject, deadline}`. */
  #pending = [];
  #head = 0;
  #chunks = [];
  #buffered = 0;
  /** Bytes to gather before parsing again: a header, or the whole frame whose header is in. */
  #need = HEADER;
  #corked = false;
  #timer;
  /** Set once the connection is unusable: the error new calls reject with. */
  #failure;
  #closing;
  #closed;
  /** Called when the last request in flight settles (for `close`). */
  #onIdle;

  /** Use {@link connect}; this wraps an already connected socket. */
  constructor(socket, { timeoutMs = DEFAULT_TIMEOUT_MS } = {}) {
    super();
    this.#socket = socket;
    this.#timeoutMs = timeoutMs > 0 && Number.isFinite(timeoutMs) ? timeoutMs : 0;
    socket.setNoDelay(true);
    this.#closed = new Promise((resolve) => socket.once("close", resolve));
    socket.on("data", (chunk) => this.#onData(chunk));
    socket.on("error", (err) => this.#fail(new RankdConnectionError(`connection error: ${err.message}`, { cause: err })));
    socket.on("end", () => this.#fail(new RankdConnectionError("connection closed by the server")));
    socket.on("close", () => {
      this.#fail(new RankdConnectionError("connection closed"));
      this.emit("close");
    });
  }

  /** How many requests are in flight (sent, not yet answered). */
  get inflight() {
    return this.#pending.length - this.#head;
  }

  /**
   * Sends `op` with `fields` and resolves with its `ok` result, or rejects
   * with a {@link RankdError}. Fields that are `undefined` or `null` are left
   * out, so the server applies its defaults. For ops without a method here.
   */
  call(op, fields = {}) {
    if (this.#closing) return Promise.reject(new RankdConnectionError("the client is closed"));
    if (this.#failure) return Promise.reject(this.#failure);
    const id = this.#nextId++;
    const request = { id, op };
    let body;
    try {
      for (const [key, value] of Object.entries(fields)) {
        if (value !== undefined && value !== null && key !== "id" && key !== "op") request[key] = toWire(value);
      }
      body = this.#encoder.encodeSharedRef(request);
    } catch (err) {
      return Promise.reject(err);
    }
    const frame = Buffer.allocUnsafe(HEADER + body.length);
    frame.writeUInt32BE(body.length, 0);
    frame.set(body, HEADER);
    return new Promise((resolve, reject) => {
      const deadline = this.#timeoutMs ? Date.now() + this.#timeoutMs : 0;
      this.#pending.push({ id, resolve, reject, deadline });
      this.#armTimer();
      this.#write(frame);
    });
  }

  /** `"pong"`. */
  ping() {
    return this.call("ping");
  }

  /** `true`, or `{role: "read" | "write"}` on a server with token roles. */
  auth(token) {
    return this.call("auth", { token });
  }

  /** `true` if created, `false` if it already existed with this config. */
  createBoard(board, { order, ties, windows, keep, ...extra } = {}) {
    return this.call("create_board", { ...extra, board, order, ties, windows, keep });
  }

  /** `true` if the board existed. */
  dropBoard(board) {
    return this.call("drop_board", { board });
  }

  /** `[{board, order, ties, windows, keep, count}]`. */
  boards(options = {}) {
    return this.call("boards", { ...options });
  }

  /** Writes a score; resolves with the score stored (first window). */
  set(board, player, score, { mode, ...extra } = {}) {
    return this.call("set", { ...extra, board, player, score, mode });
  }

  /**
   * `entries`: `[player, score]` pairs or `{player, score}` objects (an
   * array, a Map, any iterable); resolves with the stored scores, in order.
   */
  setMany(board, entries, { mode, ...extra } = {}) {
    const list = Array.from(entries, (entry) => (Array.isArray(entry) ? entry : [entry.player, entry.score]));
    return this.call("set_many", { ...extra, board, entries: list, mode });
  }

  /** The player's score, or `null`. */
  get(board, player, { window, period, ...extra } = {}) {
    return this.call("get", { ...extra, board, player, window, period });
  }

  /** `true` if the player was present. */
  remove(board, player, options = {}) {
    return this.call("remove", { ...options, board, player });
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

  /**
   * Closes the connection once every request in flight is answered; new
   * calls reject at once. Resolves when the socket is closed.
   */
  close() {
    this.#closing ??= (async () => {
      if (this.inflight > 0 && !this.#failure) await new Promise((resolve) => (this.#onIdle = resolve));
      if (!this.#socket.destroyed) this.#socket.end();
      await this.#closed;
    })();
    return this.#closing;
  }

  /** Closes the connection now; requests in flight reject. */
  destroy() {
    this.#fail(new RankdConnectionError("the client was destroyed"));
  }

  #write(frame) {
    // Frames written in the same tick go out together.
    if (!this.#corked) {
      this.#corked = true;
      this.#socket.cork();
      process.nextTick(() => {
        this.#corked = false;
        this.#socket.uncork();
      });
    }
    this.#socket.write(frame);
  }

  #onData(chunk) {
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
        return this.#fail(new RankdConnectionError(`undecodable frame from the server: ${err.message}`, { cause: err }));
      }
      this.#onMessage(message);
      if (this.#failure) return;
    }
    const rest = at < buf.length ? buf.subarray(at) : undefined;
    if (rest) {
      this.#chunks = [rest];
      this.#buffered = rest.length;
    }
    this.#need = rest && rest.length >= HEADER ? HEADER + rest.readUInt32BE(0) : HEADER;
  }

  #badFrameLength(length) {
    this.#fail(
      new RankdConnectionError(
        length === 0 ? "the server sent an empty frame" : `the server sent a frame of ${length} bytes, over the ${MAX_FRAME}-byte limit`,
      ),
    );
  }

  #onMessage(message) {
    if (message === null || typeof message !== "object" || Array.isArray(message) || message instanceof Uint8Array) {
      return this.#fail(new RankdConnectionError("the server sent a frame that is not a map"));
    }
    if (!("id" in message) && "watch" in message) {
      this.emit("push", fromWire(message));
      return;
    }
    if (this.inflight === 0) {
      return this.#fail(new RankdConnectionError(`the server answered id ${message.id} with no request in flight`));
    }
    const request = this.#pending[this.#head];
    const id = message.id;
    // Errors raised before the server could read an id (too_large, some
    // bad_frame) carry id 0; they still answer the oldest request.
    const matches = id === request.id || (id === 0 && "err" in message) || (typeof id === "bigint" && id === BigInt(request.id));
    if (!matches) {
      return this.#fail(new RankdConnectionError(`expected a reply to id ${request.id}, got id ${String(id)}`));
    }
    this.#pending[this.#head] = undefined;
    this.#head++;
    if (this.#head > 1024 && this.#head * 2 > this.#pending.length) {
      this.#pending = this.#pending.slice(this.#head);
      this.#head = 0;
    }
    if ("err" in message) {
      const err = message.err ?? {};
      request.reject(new RankdError(String(err.code ?? "internal"), String(err.msg ?? "")));
    } else {
      request.resolve(fromWire(message.ok ?? null));
    }
    if (this.inflight === 0) this.#idle();
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
    if (this.inflight === 0 || this.#failure) return;
    if (this.#pending[this.#head].deadline <= Date.now()) {
      this.#fail(new RankdConnectionError(`no reply from the server within ${this.#timeoutMs} ms`));
    } else {
      this.#armTimer();
    }
  }

  #fail(error) {
    if (!this.#failure) this.#failure = error;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const pending = this.#pending.slice(this.#head);
    this.#pending = [];
    this.#head = 0;
    this.#chunks = [];
    this.#buffered = 0;
    if (!this.#socket.destroyed) this.#socket.destroy();
    for (const request of pending) request.reject(error);
    this.#idle();
  }

  #idle() {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const onIdle = this.#onIdle;
    this.#onIdle = undefined;
    onIdle?.();
  }
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
