//! What a request passes through, in order: [`connection`] reads its frame
//! and decodes it, [`router`] sends it to the shards that hold its players
//! (or fans a read out to all of them), and each [`shard`] actor applies it
//! in its next round and answers once the round is durable; the connection
//! writes the answers with [`transmit`]. An `approx` rank is answered from
//! [`approx`]'s bucket summaries instead of a fan-out.

pub mod approx;
pub mod backup;
pub mod connection;
pub mod dense_registry;
pub mod router;
pub mod shard;
pub mod transmit;
