//! rankd's wire protocol and a pipelining async client.
//!
//! A service ranks its players in five lines:
//!
//! ```no_run
//! # async fn demo() -> Result<(), rankd_client::ClientError> {
//! use rankd_client::{Client, Mode};
//! let mut rankd = Client::connect("127.0.0.1:7070").await?;
//! rankd.set("arena", "alice", 1200, Mode::Best).await?;
//! let me = rankd.rank("arena", "alice").await?.expect("alice was just written");
//! println!("alice is #{} of {} with {}", me.rank, me.count, me.score);
//! # Ok(()) }
//! ```
//!
//! Beyond loopback, [`Client::connect_with`] speaks TLS and presents a
//! token (here a read token: writes would answer `unauthorized`):
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use rankd_client::{Client, ConnectOptions, TlsOptions};
//! let tls = TlsOptions { ca_file: Some("ca.pem".into()), ..TlsOptions::default() };
//! let options = ConnectOptions { tls: Some(tls), token: Some(std::env::var("RANKD_TOKEN")?.into()) };
//! let mut rankd = Client::connect_with("rankd.internal:7070", &options).await?;
//! for entry in rankd.top("arena", 3, 0).await? {
//!     println!("#{} {} {}", entry.rank, entry.player, entry.score);
//! }
//! # Ok(()) }
//! ```
//!
//! `examples/leaderboard.rs` is a whole program (`cargo run -p
//! rankd-client --example leaderboard -- 127.0.0.1:7070`). Ops without a
//! method here, or with fields a method does not take (`window`, `period`,
//! a board's `windows`), go through [`Call`] and [`Client::call`]. The
//! protocol itself, for clients in other languages, is `docs/PROTOCOL.md`
//! in the repository.
//!
//! - [`protocol`]: op names, error codes, limits and field values, shared
//!   with the server so each is written once;
//! - [`frame`]: the length-prefixed framing, both ways;
//! - [`Call`]: a request, encoded as it is built; [`Client`]: a connection
//!   that sends calls alone or pipelined and decodes replies into any
//!   `serde` type (`serde::de::IgnoredAny` to skip them);
//! - [`ConnectOptions`]: TLS ([`TlsOptions`]) and a token, for
//!   [`Client::connect_with`];
//! - [`RankInfo`], [`Entry`], [`BoardInfo`]: the ops' result types.
//!
//! Depends on tokio, serde and rmp-serde, and (feature `tls`, on by default)
//! rustls, so any service can use it.

#![warn(missing_docs)]

mod call;
#[cfg(feature = "cli")]
pub mod cli;
mod client;
mod connect;
mod error;
pub mod frame;
pub mod protocol;
mod reply;

pub use call::{set_call, Call};
pub use client::{AuthGrant, Client};
pub use connect::{ConnectOptions, TlsOptions, Token};
pub use error::ClientError;
pub use protocol::{ErrorCode, Mode, OpKind, Order, Ties, Window};
pub use reply::{BoardInfo, Entry, RankInfo};
