//! The tree-shard actors: one per shard, each on its own thread, running
//! the single-writer batch loop ("job aggregation") over its engine with
//! group commit on two more threads (the engine's `commit` pipeline).
//!
//! - [`command`]: what a shard is asked to do, each command with its typed
//!   reply channel, and the answers held until durable;
//! - [`link`]: how the router reaches a shard, with its mailbox bound;
//! - [`batch_loop`]: the loop itself, a plain struct: rounds, sealing,
//!   waiting for the pipeline (`apply` applies one command; `maintenance`
//!   does the work between rounds);
//! - [`health`]: the failure and recovery rules;
//! - [`actor`]: the actix shell over the loop;
//! - [`engine_cell`]: the engine, shared with the router's in-place ranks;
//! - `commit_hooks`, [`relay`]: what the pipeline's threads report, and the
//!   answers they hand to the I/O threads in one go.

pub mod actor;
mod apply;
pub mod batch_loop;
pub mod command;
mod commit_hooks;
pub mod engine_cell;
pub mod health;
pub mod link;
mod maintenance;
pub mod relay;

pub use actor::ShardActor;
pub use batch_loop::{BatchLoop, LoopParts};
pub use command::{Buckets, Command, Counts, Forward, Pending, Ranked, Responder, Written};
pub use engine_cell::EngineCell;
pub use link::ShardLink;
pub use relay::ReplyRelay;
