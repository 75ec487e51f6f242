// A Node.js client for rankd (see docs/PROTOCOL.md): every message is a
// 4-byte big-endian length and one msgpack map; requests carry an `id` the
// server echoes, responses come back in request order, so many requests may
// be in flight on one connection at once. Protocol 1.1 adds idempotent
// writes (`wid`), which this client uses to send a write again after a lost
// connection, and watches (pushes without `id`), which it hands to `Watch`
// objects.
//
// Integers: msgpack carries 64-bit integers and JavaScript numbers are exact
// only up to 2^53 - 1. Results hold a `number` when the value is a safe
// integer and a `bigint` otherwise; requests take either (a `bigint` score
// travels as a 64-bit msgpack integer, exactly).
//
// This file is the package's entry point and holds only its public names;
// the code is in lib/, one concept per module (internal: the package's
// "exports" map keeps them out of reach):
//
//   connect.js        connect(): TCP or TLS sockets, the client, its token
//   client.js         RankdClient: the API, what a broken connection resends
//   connection.js     one socket: replies matched in order, one reply timer
//   frames.js         length-prefixed msgpack frames, encoded and read
//   integers.js       64-bit integers as number or bigint
//   requests.js       a request's entry, and the error when one is lost
//   retry.js          how many re-sends and reconnections, and how far apart
//   watch.js          Watch: one watch's events
//   subscriptions.js  a client's open watches, kept across reconnections
//   errors.js         RankdError, RankdConnectionError
//   emit.js           events that a throwing listener cannot break

export { RankdClient } from "./lib/client.js";
export { connect } from "./lib/connect.js";
export { DEFAULT_TIMEOUT_MS } from "./lib/connection.js";
export { RankdConnectionError, RankdError } from "./lib/errors.js";
export { MAX_FRAME } from "./lib/frames.js";
export { DEFAULT_WATCH_RETRIES, DEFAULT_WRITE_RETRIES, retryDelay } from "./lib/retry.js";
export { Watch } from "./lib/watch.js";
