// A client's open watches and what keeps them subscribed: a watch lives on
// one connection, so when that is lost it waits for the next one and asks
// again there, until `watchRetries` reconnections in a row have failed.

import { RankdConnectionError, RankdError } from "./errors.js";
import { newEntry } from "./requests.js";
import { kAttach, kAttempts, kConn, kDeliver, kDetach, kEnd, kRequest, kSubscribing } from "./watch.js";

/**
 * The open watches of one client. It builds their `watch` requests; the
 * client sends them. `hooks` (from the client): `callOn(conn, op, fields)`
 * sends a request on that connection only, `isClosing()` tells whether the
 * client is closing.
 */
export class Subscriptions {
  /** The open watches. */
  #open = new Set();
  #watchRetries;
  #hooks;

  constructor(watchRetries, hooks) {
    this.#watchRetries = watchRetries;
    this.#hooks = hooks;
  }

  /** The open watches, in a new array. */
  list() {
    return [...this.#open];
  }

  /** Forgets a watch that ended. */
  forget(watch) {
    this.#open.delete(watch);
  }

  /** Ends every open watch, for `reason` (the client is closing). */
  endAll(reason) {
    for (const watch of [...this.#open]) watch[kEnd](reason);
  }

  /** Hands a push that came on `conn` to its watch, if it is open there. */
  deliver(conn, push) {
    conn.registry.get(push.watch)?.[kDeliver](push.event);
  }

  /** The open watches without a connection, and not being asked for on one. */
  waiting() {
    return [...this.#open].filter((watch) => watch[kConn] === undefined && !watch[kSubscribing]);
  }

  /**
   * `conn` failed with `error`: its watches are off it; each still open
   * waits for a new connection if the client will `reconnect`, else ends.
   */
  connectionLost(conn, error, reconnect) {
    for (const watch of conn.registry.values()) {
      watch[kDetach]();
      if (!watch.active) continue;
      if (reconnect) watch[kAttempts]++;
      else watch[kEnd]("the connection was lost", error);
    }
    conn.registry.clear();
  }

  /** A reconnection failed with `error`: each waiting watch used up an attempt. */
  reconnectFailed(error) {
    for (const watch of this.waiting()) watch[kAttempts]++;
    this.endExhausted(error);
  }

  /** The server refused the client's token on a new connection (`error`): the waiting watches end with it. */
  reconnectRefused(error) {
    for (const watch of this.waiting()) watch[kEnd](`watching again was refused: ${error.message}`, error);
  }

  /** Ends the waiting watches that have tried `watchRetries` reconnections in a row. */
  endExhausted(error) {
    for (const watch of this.waiting()) {
      if (watch[kAttempts] > this.#watchRetries) {
        watch[kEnd](`the connection was lost and ${this.#watchRetries} reconnections failed`, error);
      }
    }
  }

  /**
   * The `watch` request of `watch`; the reply attaches it to the connection
   * that answered, at once (its pushes may follow in the same chunk). With
   * `resolve`, the first subscription (a refusal rejects); without, a
   * subscription again on a new connection (a refusal ends the watch).
   */
  subscription(watch, resolve, reject) {
    watch[kSubscribing] = true;
    return newEntry("watch", { id: 0, op: "watch", ...watch[kRequest] }, {
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
          this.#hooks.callOn(conn, "unwatch", { watch: id }).catch(() => {});
          return;
        }
        watch[kAttempts] = 0;
        watch[kAttach](conn, id);
        conn.registry.set(id, watch);
        this.#open.add(watch);
        if (this.#hooks.isClosing()) watch[kEnd]("the client is closed");
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
}
