//! rankd, the server: wires the engine in `rankd-shards` to the world.
//! `docs/ARCHITECTURE.md` follows a request from socket to fsync and back.
//!
//! - [`request_path`]: what a request passes through — the connection that
//!   reads frames, the router (one per I/O thread, called by its
//!   connections) that hashes players to shards and fans reads out, the
//!   shard actors that apply batches and commit them;
//! - [`protocol`]: requests decoded from msgpack and replies encoded (the
//!   words themselves are `rankd-client`'s);
//! - [`server`]: start-up (data dir layout, opening shards), the listener,
//!   graceful shutdown;
//! - [`operations`]: what operators see and tune — Prometheus metrics, CPU
//!   accounting by thread, the allocator, background thread priorities;
//! - [`tools`]: the `rankd` command line and its client subcommands,
//!   import/export, the offline check;
//! - [`security`]: tokens with roles, per-connection access, TLS;
//! - [`watches`]: watches, and the evaluator that pushes what they follow;
//! - [`settings`]: every `serve` setting, from flags and the TOML file;
//! - [`error`]: the one place errors become protocol codes;
//! - [`clock`]: the wall clock that decides which period a write lands in;
//! - `hooks` (feature `test-hooks`): test and debug controls.

pub mod clock;
pub mod error;
#[cfg(feature = "test-hooks")]
pub mod hooks;
pub mod operations;
pub mod protocol;
pub mod request_path;
pub mod security;
pub mod server;
pub mod settings;
pub mod tools;
pub mod watches;
