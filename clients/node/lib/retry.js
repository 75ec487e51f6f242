// How many times, and after how long, a write with a `wid` is sent again and
// a watch asks again for a new connection: bounded in number and in time,
// with a doubling, randomized wait, so a server that is down or shedding
// load is not hammered, nor met by its clients all at once.

/** Default for `writeRetries`: how many times a write with a `wid` is sent again. */
export const DEFAULT_WRITE_RETRIES = 3;

/** Default for `watchRetries`: how many reconnections a watch tries in a row before it ends. */
export const DEFAULT_WATCH_RETRIES = 10;

/** Default for `retryDeadlineMs`: no re-send of a write starts later than this after its first send. */
export const DEFAULT_RETRY_DEADLINE_MS = 60_000;

/**
 * The largest `retryDeadlineMs` (5 minutes): the server remembers a `wid`
 * for its dedup horizon (10 minutes by default), and a re-send after that
 * may apply twice.
 */
export const MAX_RETRY_DEADLINE_MS = 300_000;

/** The wait before the first re-send (or reconnection); each further one doubles, up to `RETRY_DELAY_MAX_MS`. */
const RETRY_DELAY_MS = 100;
const RETRY_DELAY_MAX_MS = 2_000;

/**
 * The longest wait, in milliseconds, before the `attempt`-th re-send of a
 * write or reconnection of a watch (1-based): 100, 200, 400, ... at most
 * 2000; 0 for attempt 0. The wait taken is a random time between half of
 * it and all of it (see {@link backoff}).
 */
export function retryDelay(attempt) {
  return attempt <= 0 ? 0 : Math.min(RETRY_DELAY_MS * 2 ** (attempt - 1), RETRY_DELAY_MAX_MS);
}

/**
 * The wait taken before the `attempt`-th re-send or reconnection: a random
 * time between half and all of {@link retryDelay}(attempt), so clients that
 * lost the same server do not come back in step. `random` returns a number
 * in [0, 1).
 */
export function backoff(attempt, random = Math.random) {
  const cap = retryDelay(attempt);
  return cap / 2 + random() * (cap / 2);
}
