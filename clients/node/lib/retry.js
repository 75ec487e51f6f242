// How many times, and after how long, a write with a `wid` is sent again and
// a watch asks again for a new connection: bounded, with a doubling wait, so
// a server that is down is not hammered.

/** Default for `writeRetries`: how many times a write with a `wid` is sent again. */
export const DEFAULT_WRITE_RETRIES = 3;

/** Default for `watchRetries`: how many reconnections a watch tries in a row before it ends. */
export const DEFAULT_WATCH_RETRIES = 10;

/** The wait before the first re-send (or reconnection); each further one doubles, up to `RETRY_DELAY_MAX_MS`. */
const RETRY_DELAY_MS = 100;
const RETRY_DELAY_MAX_MS = 2_000;

/**
 * Milliseconds to wait before the `attempt`-th re-send of a write or
 * reconnection of a watch (1-based): 100, 200, 400, ... at most 2000; 0 for
 * attempt 0.
 */
export function retryDelay(attempt) {
  return attempt <= 0 ? 0 : Math.min(RETRY_DELAY_MS * 2 ** (attempt - 1), RETRY_DELAY_MAX_MS);
}
