// The two errors a call rejects with: what the server answered (`err`), and
// a connection that failed. Both tell whether a write may have applied.

/**
 * An error answered by the server: `{"err": {"code", "msg"}}`. For a write
 * the client sends again (one with a `wid`), `wid` and `sends` say which
 * write and how many times it went out, and `maybeApplied` whether an
 * earlier send may have applied it (its reply was lost, or it was answered
 * `internal`).
 */
export class RankdError extends Error {
  constructor(code, msg, { cause, maybeApplied = false, wid, sends } = {}) {
    super(`${code}: ${msg}`, cause === undefined ? undefined : { cause });
    this.name = "RankdError";
    /** One of the protocol's codes: `bad_request`, `unauthorized`, ... */
    this.code = code;
    /** The server's explanation, for people. */
    this.msg = msg;
    this.maybeApplied = maybeApplied;
    if (wid !== undefined) this.wid = wid;
    if (sends !== undefined) this.sends = sends;
  }
}

/**
 * The connection failed, timed out, was closed, or the server broke the
 * protocol (bad framing, an unexpected id); or a write's re-sends ran out
 * after `internal` answers. Every request in flight on the connection that
 * is not sent again rejects with it. `maybeApplied` is true when the request
 * was a write that may or may not have applied; for a write carrying a
 * `wid`, `wid` is set (sending the same request again with it is safe) and
 * `sends` says how many times it was sent.
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
