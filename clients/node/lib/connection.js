// One socket to the server. Replies come back in request order, so matching
// them needs no table, and only the oldest request's reply can be late: one
// timer watches them all.

import { RankdConnectionError, RankdError } from "./errors.js";
import { FrameReader } from "./frames.js";
import { fromWire } from "./integers.js";

/**
 * Default for `timeoutMs`: connecting, and waiting for each reply (from the
 * later of its request's send and the previous reply on the connection).
 */
export const DEFAULT_TIMEOUT_MS = 30_000;

/**
 * One socket: frames out, replies matched to their requests in order,
 * pushes handed on, one timer for the oldest reply. A reply is late when it
 * has not come within the timeout of the later of its request's send and
 * the previous reply (a long pipeline the server works through does not
 * time out as a whole). It fails once (a lost socket, a late reply, a
 * protocol error), handing its unanswered requests to `onFail`; the client
 * decides which go again on a new connection.
 *
 * `hooks` (from the client): `onPush(conn, push)`, `onError(conn, entry,
 * error)` (the server answered `entry` with a {@link RankdError}),
 * `onFail(conn, error, pending)`, `onSettle(conn)` (a reply settled its
 * request) and `onClose(conn)` (the socket closed).
 */
export class Connection {
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
  #reader = new FrameReader();
  /** Requests sent and not yet answered, oldest first (entries of the client, with `sentAt`). */
  #pending = [];
  /** When the last reply came (ms since the epoch; 0: none yet). */
  #lastReply = 0;
  #head = 0;
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

  /** Writes `frame`, the request of `entry`, whose reply is then due (see {@link Connection}). */
  send(entry, frame) {
    entry.sentAt = Date.now();
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
    this.#reader.clear();
    if (!this.socket.destroyed) this.socket.destroy();
    this.#hooks.onFail(this, error, pending);
  }

  #onData(chunk) {
    if (this.failure) return;
    const broken = this.#reader.read(chunk, (message) => {
      this.#onMessage(message);
      return !this.failure;
    });
    if (broken) this.fail(broken, true);
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
    this.#lastReply = Date.now();
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
      this.#hooks.onError(this, entry, new RankdError(String(err.code ?? "internal"), String(err.msg ?? "")));
    } else {
      entry.ok(fromWire(message.ok ?? null), message.dup === true, this);
    }
    this.#hooks.onSettle(this);
  }

  /** When the oldest request's reply is due: its send or the previous reply, whichever is later, plus the timeout. */
  #due() {
    return Math.max(this.#pending[this.#head].sentAt, this.#lastReply) + this.#timeoutMs;
  }

  #armTimer() {
    if (!this.#timeoutMs || this.#timer || this.inflight === 0) return;
    this.#timer = setTimeout(() => this.#onTimer(), Math.max(0, this.#due() - Date.now()));
  }

  // Only the oldest request's reply can be late (replies come in order), and
  // its due time only moves later (with each reply): one timer, re-armed
  // lazily when it fires, watches them all.
  #onTimer() {
    this.#timer = undefined;
    if (this.inflight === 0 || this.failure) return;
    if (this.#due() <= Date.now()) {
      this.#pending[this.#head].timedOut = true;
      this.fail(new RankdConnectionError(`no reply from the server within ${this.#timeoutMs} ms`));
    } else {
      this.#armTimer();
    }
  }
}
