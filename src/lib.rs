//! rankd, the server: wires the engine in `rankd-shards` to the world.
//!
//! - [`protocol`]: frames and msgpack requests/replies (the contract);
//! - [`router`]: the router actor — hashes players to shards, fans reads out;
//! - [`shard`]: the tree-shard actor running the batch loop;
//! - [`server`]: TCP listener and per-connection pipelining;
//! - [`transfer`]: `rankd import` / `rankd export`;
//! - [`config`]: CLI flags and the TOML file;
//! - [`layout`]: what a data dir holds and the check that it fits;
//! - [`metrics`]: Prometheus metrics and their HTTP endpoint;
//! - [`priority`]: background threads at a low CPU priority;
//! - [`allocator`]: what the server asks of jemalloc beyond malloc and free;
//! - [`error`]: the one place errors become protocol codes.

pub mod allocator;
pub mod check;
pub mod cli;
pub mod clock;
pub mod config;
pub mod connection;
pub mod error;
#[cfg(feature = "test-hooks")]
pub mod hooks;
pub mod layout;
pub mod metrics;
pub mod priority;
pub mod protocol;
pub mod router;
pub mod server;
pub mod settings;
pub mod shard;
pub mod thread_cpu;
pub mod transfer;
