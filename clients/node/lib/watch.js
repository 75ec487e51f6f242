// Watch, what `client.watch()` resolves with: the events the server pushes
// for one watch, as an async iterable and an EventEmitter, kept across the
// client's reconnections.

import { EventEmitter } from "node:events";

import { emitSafely } from "./emit.js";

// What the client (and its Subscriptions) and its watches share, out of the
// public API: symbol keys, which only the modules importing them can reach.
/** The `watch` request's fields, to ask again on a new connection. */
export const kRequest = Symbol("request");
/** The connection the watch lives on, or `undefined` while it has none. */
export const kConn = Symbol("conn");
/** Reconnections tried in a row without the watch getting a connection. */
export const kAttempts = Symbol("attempts");
/** Whether a `watch` request for it is in flight. */
export const kSubscribing = Symbol("subscribing");
/** `watch[kAttach](conn, id)`: the server answered on `conn` with `id`. */
export const kAttach = Symbol("attach");
/** `watch[kDetach]()`: off its connection. */
export const kDetach = Symbol("detach");
/** `watch[kDeliver](event)`: a push for it. */
export const kDeliver = Symbol("deliver");
/** `watch[kEnd](reason, error)`: ends it. */
export const kEnd = Symbol("end");
/** `client[kForget](watch)`: the watch ended; the client drops it. */
export const kForget = Symbol("forget");

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
