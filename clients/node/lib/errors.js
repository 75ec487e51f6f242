// The two errors a call rejects with: what the server answered (`err`), and
// a connection that failed, which also tells whether a write may have applied.

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
