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
//! let token = Some(std::env::var("RANKD_TOKEN")?.into());
//! let options = ConnectOptions { tls: Some(tls), token, ..ConnectOptions::default() };
//! let mut rankd = Client::connect_with("rankd.internal:7070", &options).await?;
//! for entry in rankd.top("arena", 3, 0).await? {
//!     println!("#{} {} {}", entry.rank, entry.player, entry.score);
//! }
//! # Ok(()) }
//! ```
//!
//! A live leaderboard does not poll: a [`Watcher`] (its own connection)
//! watches a board's top or a player's rank (protocol 1.1) and is a
//! `Stream` of pushes, the current state first, then each change, at most
//! one per `interval_ms` (a slow reader gets the latest state, not a
//! backlog):
//!
//! ```no_run
//! # async fn demo() -> Result<(), rankd_client::ClientError> {
//! use futures_util::StreamExt;
//! use rankd_client::{ConnectOptions, WatchEvent, WatchSpec, Watcher};
//! let mut watcher = Watcher::connect_with("127.0.0.1:7070", &ConnectOptions::default()).await?;
//! let top = watcher.watch(&WatchSpec::top("arena", 10)).await?;
//! let me = watcher.watch(&WatchSpec::player("arena", "alice").interval(std::time::Duration::from_secs(1))).await?;
//! while let Some(push) = watcher.next().await {
//!     let push = push?;
//!     match push.event {
//!         WatchEvent::Top(entries) => println!("top: {} players, best {:?}", entries.len(), entries.first()),
//!         WatchEvent::Player(Some(info)) => println!("alice is #{} with {}", info.rank, info.score),
//!         WatchEvent::Player(None) => println!("alice is not on the board"),
//!         WatchEvent::Ended => println!("watch {} ended: the board was dropped", push.watch),
//!     }
//! #   let _ = (top, me);
//! }
//! # Ok(()) }
//! ```
//!
//! A write that times out may or may not have applied; sent again, an
//! `incr` would count twice. A [`RetryingClient`] gives each write a random
//! `wid` (protocol 1.1) and, on a timeout or a broken or closed connection,
//! reconnects and sends it again with the same `wid` (and on `overloaded`
//! or `internal`, on the same connection): the server applies it once and
//! answers the repeat with the first result, flagged [`Written::dup`]. The
//! [`RetryPolicy`] bounds the re-sends (3, none starting over 60 s after
//! the first attempt, with a random backoff from 100 ms); a write given up
//! on fails with [`ClientError::MaybeApplied`], which carries its `wid` to
//! send it again later:
//!
//! ```no_run
//! # async fn demo() -> Result<(), rankd_client::ClientError> {
//! use std::time::Duration;
//! use rankd_client::{ConnectOptions, Mode, RetryPolicy, RetryingClient};
//! let policy = RetryPolicy { timeout: Duration::from_secs(2), retries: 5, ..RetryPolicy::default() };
//! let mut rankd = RetryingClient::new("127.0.0.1:7070", ConnectOptions::default(), policy)?;
//! let coins = rankd.set("arena", "alice", 50, Mode::Incr).await?;
//! println!("alice has {} coins (a retry found the write applied: {})", coins.value, coins.dup);
//! // A read, sent once more if its connection breaks before the reply.
//! println!("{:?}", rankd.read(async |c| c.rank("arena", "alice").await).await?);
//! # Ok(()) }
//! ```
//!
//! A write with a `wid` of the caller's own (a transaction id) goes through
//! [`RetryingClient::write_with_wid`], or, unretried, through
//! [`Client::call_written`] (`set_call(..).with("wid", id)`), which returns
//! the `dup` flag too.
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
//!   `serde` type (`serde::de::IgnoredAny` to skip them), setting pushes
//!   aside ([`RawPush`]);
//! - [`Watcher`], [`WatchSpec`], [`Push`], [`WatchEvent`]: watches;
//!   [`ResumingWatcher`]: watches asked for again on a new connection when
//!   one is lost (both are `Stream`s of pushes);
//! - [`RetryingClient`], [`RetryPolicy`], [`Written`], [`WidSource`]:
//!   idempotent writes, retried as every rankd client does
//!   (`clients/conformance/transport.md`);
//! - [`ConnectOptions`]: TLS ([`TlsOptions`]), a token and the largest
//!   request frame to send (`max_frame`, 1 MiB: a larger request fails
//!   with `too_large`, unsent), for [`Client::connect_with`];
//! - [`RankInfo`], [`ApproxRankInfo`], [`ApproxRankOfScore`], [`Entry`],
//!   [`BoardInfo`]: the ops' result types;
//! - [`fields`]: composite scores (protocol 1.1): [`BoardSpec`] and
//!   [`FieldSpec`] for [`Client::create_board_with`], scores as
//!   [`FieldScores`] through the `_fields` methods ([`Client::top_fields`],
//!   ...), and [`Score`] for either kind of board;
//! - `cli` (feature `cli`): command-line flags for connecting and watching,
//!   and how the `rankd` CLI prints pushes.
//!
//! Depends on tokio, serde and rmp-serde, and (feature `tls`, on by default)
//! rustls, so any service can use it.

#![warn(missing_docs)]

mod backup;
mod call;
#[cfg(feature = "cli")]
pub mod cli;
mod client;
mod connect;
mod error;
pub mod fields;
pub mod frame;
pub mod protocol;
mod push;
mod reply;
mod resume;
mod retry;
#[cfg(test)]
mod testing;
mod watch;
mod wid;

pub use backup::{BackupChunk, BackupHeader, BackupPart, BackupStream, BackupSummary};
pub use call::{set_call, Call};
pub use client::{AuthGrant, Client, Written};
pub use connect::{ConnectOptions, TlsOptions, Token};
pub use error::ClientError;
pub use fields::{set_fields_call, BoardSpec, FieldScores, FieldSpec, FieldsError, Score};
pub use protocol::{ErrorCode, Mode, OpKind, Order, Ties, Window};
pub use push::RawPush;
pub use reply::{ApproxRankInfo, ApproxRankOfScore, BoardInfo, Entry, RankInfo};
pub use resume::{ResumingWatcher, DEFAULT_WATCH_RETRIES};
pub use retry::{RetryPolicy, RetryingClient};
pub use watch::{Push, WatchEvent, WatchId, WatchSpec, WatchTarget, Watcher};
pub use wid::WidSource;
