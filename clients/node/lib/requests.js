// A request's life in the client: the entry that follows it from the call
// to its reply (through re-sends), which ops may be sent again, and the
// error of one that goes no further.

import { RankdConnectionError, RankdError } from "./errors.js";

/** The writes that take a `wid` (protocol 1.1): the server applies a (board, wid) at most once. */
export const WID_OPS = new Set(["set", "set_many", "remove"]);
/** Ops that change nothing: a connection lost while one was in flight leaves no doubt. */
const READ_OPS = new Set(["ping", "auth", "boards", "get", "count", "rank", "rank_of_score", "top", "around", "ranks", "watch", "unwatch"]);
/**
 * The reads sent once more on a new connection when theirs broke before the
 * reply (`watch` and `unwatch` belong to their connection and are handled
 * by the watches; `auth` by the reconnection itself).
 */
const RESENT_READS = new Set(["ping", "boards", "get", "count", "rank", "rank_of_score", "top", "around", "ranks"]);
/** Answers after which a write with a `wid` is sent again on the same connection. */
const RETRIED_CODES = new Set(["overloaded", "internal"]);

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
 * @property {boolean} waited Whether it already waited the backoff before its next re-send (then a reconnection does not wait it again).
 * @property {number} firstSent When it was first sent (ms since the epoch; 0: not yet).
 * @property {number} sentAt When it was last sent, set by the connection.
 * @property {boolean} inDoubt Whether a send may have applied without the client knowing (a lost reply, `internal`).
 * @property {boolean} timedOut Whether its own reply was late (a read is then not sent again).
 * @property {boolean} resent Whether a read was already sent once more.
 * @property {Error | undefined} lastError What its last send met, for the error when it goes no further.
 * @property {(result: unknown, dup: boolean, conn: Connection) => void} ok
 * @property {(error: Error) => void} fail
 */

/** A new {@link RequestEntry}, not yet sent. */
export function newEntry(op, request, { guarded = false, wid, ok, fail }) {
  return {
    op,
    request,
    guarded,
    wid,
    sends: 0,
    retries: 0,
    waited: false,
    firstSent: 0,
    sentAt: 0,
    inDoubt: false,
    timedOut: false,
    resent: false,
    lastError: undefined,
    ok,
    fail,
  };
}

/** Whether `entry` may be sent again (with a new request id): a write with a `wid`, or a read sent once more after a broken connection. */
export function mayResend(entry) {
  return entry.guarded || RESENT_READS.has(entry.op);
}

/** Whether `entry` is a read sent once more on a new connection after its connection broke; if so, marks it. */
export function resendRead(entry) {
  if (!RESENT_READS.has(entry.op) || entry.resent || entry.timedOut) return false;
  entry.resent = true;
  return true;
}

/** Whether the server's `error` to `entry` calls for sending it again on the same connection (a write with a `wid`). */
export function retriedAnswer(entry, error) {
  return entry.guarded && RETRIED_CODES.has(error.code);
}

/**
 * The error for `entry`, whose connection failed with `error` and which goes
 * no further. A write that was sent tells whether it may have applied, and
 * its `wid` and sends.
 */
export function lostError(error, entry) {
  if (READ_OPS.has(entry.op) || entry.sends === 0 || !(error instanceof RankdConnectionError)) return error;
  return new RankdConnectionError(`${error.message}; ${sentNote(entry)}`, {
    cause: error,
    maybeApplied: entry.inDoubt,
    wid: entry.wid,
    sends: entry.sends,
  });
}

/**
 * The error for `entry`, a request the server answered with `error` (a
 * {@link RankdError}) and which goes no further. For a write with a `wid`
 * the error tells the `wid`, the sends and whether one of them may have
 * applied; when that is so (a lost reply, or `internal`), it is a
 * {@link RankdConnectionError} with `maybeApplied`, whose `cause` is the
 * server's error, unless the server refused it outright (`unauthorized`,
 * `bad_request`, ...: a RankdError, still with `maybeApplied`).
 */
export function serverError(error, entry) {
  if (!entry.guarded) return error;
  const info = { maybeApplied: entry.inDoubt, wid: entry.wid, sends: entry.sends };
  if (entry.inDoubt && RETRIED_CODES.has(error.code)) {
    return new RankdConnectionError(`${error.message}; ${sentNote(entry)}`, { ...info, cause: error });
  }
  return new RankdError(error.code, error.msg, info);
}

/** "the set was sent 2 times and may or may not have applied (wid ...: at most once)". */
function sentNote(entry) {
  const times = entry.sends === 1 ? "once" : `${entry.sends} times`;
  const state = entry.inDoubt ? "may or may not have applied" : "did not apply";
  const note = entry.wid === undefined ? "" : ` (wid ${entry.wid}: at most once)`;
  return `the ${entry.op} was sent ${times} and ${state}${note}`;
}
