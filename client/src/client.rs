//! A connection to a rankd server: one method per op, and pipelines of any
//! calls.

use std::time::Duration;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::call::{set_call, Call};
use crate::connect::{self, ConnectOptions};
use crate::error::ClientError;
use crate::frame::FrameReader;
use crate::protocol::{Mode, OpKind, Order, Ties};
use crate::reply::{BoardInfo, Entry, Envelope, RankInfo};

/// Replies can be as large as requests, and a server may allow 64 MiB.
const MAX_REPLY: usize = 64 << 20;

/// What a successful `auth` granted.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum AuthGrant {
    /// Everything (a server without token roles answers `true`).
    Granted(bool),
    /// The token's role, `"read"` or `"write"`, on a server with roles.
    Role {
        /// The role's name.
        role: String,
    },
}

/// A connection to a rankd server.
pub struct Client {
    /// Replies, read while requests are still being written.
    reader: FrameReader<Box<dyn AsyncRead + Send + Unpin>>,
    /// Requests, written whole pipelines at a time.
    writer: Box<dyn AsyncWrite + Send + Unpin>,
    /// The id of the next request: replies are matched to calls by it.
    next_id: u64,
}

impl Client {
    /// Connects to `addr` (`host:port`) over plain TCP.
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with(addr, &ConnectOptions::default()).await
    }

    /// Connects to `addr` as `options` say: over TLS if asked, then `auth`
    /// with the token if one is given.
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Self, ClientError> {
        let (read, writer) = connect::open(addr, options.tls.as_ref()).await?;
        let mut client = Self { reader: FrameReader::new(read, MAX_REPLY), writer, next_id: 1 };
        if let Some(token) = &options.token {
            client.auth(&token.0).await?;
        }
        Ok(client)
    }

    /// Connects, retrying until `timeout` (for a server that is starting).
    pub async fn connect_retry(addr: &str, timeout: Duration) -> Result<Self, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match Self::connect(addr).await {
                Ok(client) => return Ok(client),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Sends one request and returns its result as a `T`.
    pub async fn call<T: DeserializeOwned>(&mut self, call: Call) -> Result<T, ClientError> {
        self.pipeline(std::slice::from_ref(&call))
            .await?
            .pop()
            .unwrap_or_else(|| Err(ClientError::Protocol("no reply".into())))
    }

    /// Sends every request before reading any reply (writing and reading at
    /// once, so a long pipeline cannot deadlock on full socket buffers), and
    /// returns each result in order. The outer error is the connection's; a
    /// call's own failure is its entry's.
    pub async fn pipeline<T: DeserializeOwned>(
        &mut self,
        calls: &[Call],
    ) -> Result<Vec<Result<T, ClientError>>, ClientError> {
        if let Some(why) = calls.iter().find_map(Call::invalid) {
            return Err(ClientError::Encode(why.to_string()));
        }
        let first = self.next_id;
        let mut out = Vec::with_capacity(calls.len() * 48);
        for (i, call) in calls.iter().enumerate() {
            call.encode(first + i as u64, &mut out);
        }
        self.next_id += calls.len() as u64;
        let writer = &mut self.writer;
        let reader = &mut self.reader;
        let write = async move { writer.write_all(&out).await };
        let read = async move {
            let mut results = Vec::with_capacity(calls.len());
            for i in 0..calls.len() {
                let body = reader.next_frame().await.map_err(|e| ClientError::Protocol(e.to_string()))?;
                let body = body.ok_or_else(|| ClientError::Protocol("connection closed".into()))?;
                let Envelope { id, result } = Envelope::<T>::decode(&body)?;
                let expected = first + i as u64;
                // id 0 answers a frame the server could not read an id from.
                if id != expected && !(id == 0 && result.is_err()) {
                    return Err(ClientError::Protocol(format!("reply id {id}, expected {expected}")));
                }
                results.push(result);
            }
            Ok::<_, ClientError>(results)
        };
        let (written, results) = tokio::join!(write, read);
        let results = results?;
        written?;
        Ok(results)
    }

    /// Sends raw bytes (for testing how a server takes malformed input).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.writer.write_all(bytes).await?;
        Ok(())
    }

    /// Reads one raw reply frame as a `T` (after [`Client::send_raw`]);
    /// `None` when the server closed the connection.
    pub async fn read_raw<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ClientError> {
        match self.reader.next_frame().await {
            Ok(Some(body)) => Ok(Some(rmp_serde::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))?)),
            Ok(None) => Ok(None),
            Err(e) => Err(ClientError::Protocol(e.to_string())),
        }
    }

    /// `ping`: `"pong"`.
    pub async fn ping(&mut self) -> Result<String, ClientError> {
        self.call(Call::new(OpKind::Ping)).await
    }

    /// `auth` with a token: what it grants, or `unauthorized`.
    pub async fn auth(&mut self, token: &str) -> Result<AuthGrant, ClientError> {
        self.call(Call::new(OpKind::Auth).with("token", token)).await
    }

    /// `create_board` with `order` and `ties`: `true` if created, `false`
    /// if it existed with this config.
    pub async fn create_board(&mut self, board: &str, order: Order, ties: Ties) -> Result<bool, ClientError> {
        self.call(Call::new(OpKind::CreateBoard).with("board", board).with("order", order).with("ties", ties)).await
    }

    /// `drop_board`: `true` if it existed.
    pub async fn drop_board(&mut self, board: &str) -> Result<bool, ClientError> {
        self.call(Call::new(OpKind::DropBoard).with("board", board)).await
    }

    /// `set`: the score stored after the write.
    pub async fn set(&mut self, board: &str, player: &str, score: i64, mode: Mode) -> Result<i64, ClientError> {
        self.call(set_call(board, player, score, mode)).await
    }

    /// `set_many`: the scores stored, in entry order; all or none apply.
    pub async fn set_many(
        &mut self,
        board: &str,
        entries: &[(&str, i64)],
        mode: Mode,
    ) -> Result<Vec<i64>, ClientError> {
        self.call(Call::new(OpKind::SetMany).with("board", board).with("entries", entries).with("mode", mode)).await
    }

    /// `get`: the player's score, if present.
    pub async fn get(&mut self, board: &str, player: &str) -> Result<Option<i64>, ClientError> {
        self.call(Call::new(OpKind::Get).with("board", board).with("player", player)).await
    }

    /// `remove`: `true` if the player was present.
    pub async fn remove(&mut self, board: &str, player: &str) -> Result<bool, ClientError> {
        self.call(Call::new(OpKind::Remove).with("board", board).with("player", player)).await
    }

    /// `count`: players on the board.
    pub async fn count(&mut self, board: &str) -> Result<u64, ClientError> {
        self.call(Call::new(OpKind::Count).with("board", board)).await
    }

    /// `rank`: the player's rank, score and the board's count, if present.
    pub async fn rank(&mut self, board: &str, player: &str) -> Result<Option<RankInfo>, ClientError> {
        self.call(Call::new(OpKind::Rank).with("board", board).with("player", player)).await
    }

    /// `rank_of_score`: the rank a new player with `score` would get.
    pub async fn rank_of_score(&mut self, board: &str, score: i64) -> Result<u64, ClientError> {
        self.call(Call::new(OpKind::RankOfScore).with("board", board).with("score", score)).await
    }

    /// `top`: `limit` players from 0-based position `offset`, best first.
    pub async fn top(&mut self, board: &str, limit: u64, offset: u64) -> Result<Vec<Entry>, ClientError> {
        self.call(Call::new(OpKind::Top).with("board", board).with("limit", limit).with("offset", offset)).await
    }

    /// `around`: the player with up to `before` better and `after` worse
    /// neighbours; empty if absent.
    pub async fn around(
        &mut self,
        board: &str,
        player: &str,
        before: u64,
        after: u64,
    ) -> Result<Vec<Entry>, ClientError> {
        let call = Call::new(OpKind::Around).with("board", board).with("player", player);
        self.call(call.with("before", before).with("after", after)).await
    }

    /// `boards`: every board with its config and count.
    pub async fn boards(&mut self) -> Result<Vec<BoardInfo>, ClientError> {
        self.call(Call::new(OpKind::Boards)).await
    }

    /// Sends `calls` as one pipeline and counts the results (ok, failed)
    /// without decoding them: for load generators.
    pub async fn pipeline_outcomes(&mut self, calls: &[Call]) -> Result<(u64, u64), ClientError> {
        let results = self.pipeline::<IgnoredAny>(calls).await?;
        let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        Ok((ok, results.len() as u64 - ok))
    }
}
