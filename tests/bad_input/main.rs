//! Hostile input against the real server: malformed frames, wrong field
//! types, out-of-range values, oversized frames and lists. Every case checks
//! the exact protocol error code and id, and that the harm stays contained
//! (the connection stays usable when the protocol says so, other clients are
//! unaffected, acknowledged writes survive).

#[path = "../common/mod.rs"]
mod common;

mod containment;
mod fields;
mod framing;
mod helpers;
mod oversized;
mod scores;
