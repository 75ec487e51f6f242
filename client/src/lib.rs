//! rankd's wire protocol and a pipelining async client.
//!
//! A service ranks its players in a few lines:
//!
//! ```no_run
//! # async fn demo() -> Result<(), rankd_client::ClientError> {
//! use rankd_client::{Client, Mode};
//! let mut rankd = Client::connect("127.0.0.1:7070").await?;
//! rankd.set("arena", "alice", 1200, Mode::Best).await?;
//! let me = rankd.rank("arena", "alice").await?;
//! println!("alice is #{} of {}", me.as_ref().map_or(0, |r| r.rank), me.map_or(0, |r| r.count));
//! # Ok(()) }
//! ```
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
pub use client::{Access, Client};
pub use connect::{ConnectOptions, TlsOptions, Token};
pub use error::ClientError;
pub use protocol::{ErrorCode, Mode, OpKind, Order, Ties, Window};
pub use reply::{BoardInfo, Entry, RankInfo};
