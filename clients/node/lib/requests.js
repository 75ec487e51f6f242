// A request's life in the client: the entry that follows it from the call
// to its reply (through re-sends on new connections), which ops are safe to
// lose, and the error of one that goes no further.

import { RankdConnectionError } from "./errors.js";

/** The writes that take a `wid` (protocol 1.1): the server applies a (board, wid) at most once. */
export const WID_OPS = new Set(["set", "set_many", "remove"]);
/** Ops that change nothing: a connection lost while one was in flight leaves no doubt. */
const READ_OPS = new Set(["ping", "auth", "boards", "get", "count", "rank", "rank_of_score", "top", "around", "ranks", "watch", "unwatch"]);

/**
 * @typedef {object} RequestEntry
 * One request, from the call to its reply: what the client queues, sends
 * (and sends again) and a {@link Connection} answers.
 * @property {string} op
 * @property {object} request The map sent; `id` is set anew at each send.
 * @property {boolean} guarded Whether it may be sent again after a lost reply (a write with a `wid`).
 * @property {string | undefined} wid
 * @property {number} sends How many times it was sent.
 * @property {number} retries How many re-sends it used up.
 * @property {number} deadline When its reply is due (ms since the epoch; 0: never), set by the connection.
 * @property {(result: unknown, dup: boolean, conn: Connection) => void} ok
 * @property {(error: Error) => void} fail
 */

/** A new {@link RequestEntry}, not yet sent. */
export function newEntry(op, request, { guarded = false, wid, ok, fail }) {
  return { op, request, guarded, wid, sends: 0, retries: 0, deadline: 0, ok, fail };
}

/**
 * Whether `entry` may be sent again after its reply was lost (a write with a
 * `wid` and re-sends left); if so, counts the re-send.
 */
export function spendRetry(entry, writeRetries) {
  if (!entry.guarded || entry.retries >= writeRetries) return false;
  entry.retries++;
  return true;
}

/** The error for `entry`, whose connection failed with `error` and which goes no further. */
export function lostError(error, entry) {
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
