//! A connection to a rankd server: one method per op, and pipelines of any
//! calls.

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::call::{set_call, Call};
use crate::connect::{self, ConnectOptions};
use crate::error::ClientError;
use crate::frame::FrameReader;
use crate::protocol::{ErrorCode, Mode, OpKind, Order, Ties};
use crate::push::{PushBuffer, RawPush};
use crate::reply::{ApproxRankInfo, ApproxRankOfScore, BoardInfo, Entry, Envelope, Incoming, RankInfo};

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

/// A write's result, and whether the server had applied it before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written<T> {
    /// The result (`ok`): for a repeat, the first application's.
    pub value: T,
    /// The server answered `"dup": true`: the request's `wid` had already
    /// been applied (within the dedup horizon), so this one changed nothing.
    pub dup: bool,
}

/// A connection to a rankd server.
///
/// Pushes of watches (protocol 1.1) that arrive while a call waits for its
/// reply are set aside, the newest of each watch kept: take them with
/// [`Client::take_push`] or [`Client::next_push`], or use a
/// [`crate::Watcher`], which decodes them.
pub struct Client {
    /// Replies, read while requests are still being written.
    pub(crate) reader: FrameReader<Box<dyn AsyncRead + Send + Unpin>>,
    /// Requests, written whole pipelines at a time.
    pub(crate) writer: Box<dyn AsyncWrite + Send + Unpin>,
    /// The id of the next request: replies are matched to calls by it.
    next_id: u64,
    /// Set while a pipeline's requests and replies are under way, cleared
    /// once every reply is read: still set when the next pipeline starts,
    /// the last one was abandoned (its future dropped, as by a timeout) or
    /// failed part way, and what is on the wire is out of step with the
    /// calls. Such a client answers every call with an error: connect again.
    unsettled: bool,
    /// Pushes read while waiting for replies.
    pushes: PushBuffer,
    /// Requests whose frame body is longer are refused unsent
    /// ([`ConnectOptions::max_frame`]).
    max_frame: usize,
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
        let mut client = Self {
            reader: FrameReader::new(read, MAX_REPLY),
            writer,
            next_id: 1,
            unsettled: false,
            pushes: PushBuffer::default(),
            max_frame: options.max_frame,
        };
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

    /// Sends one write and returns its result with the server's `dup` flag
    /// (set when the call's `wid` had already been applied).
    ///
    /// ```no_run
    /// # async fn demo(rankd: &mut rankd_client::Client) -> Result<(), rankd_client::ClientError> {
    /// use rankd_client::{set_call, Mode};
    /// let call = set_call("arena", "alice", 5, Mode::Incr).with("wid", "order-81723");
    /// let written = rankd.call_written::<i64>(call).await?;
    /// println!("alice has {} (counted before: {})", written.value, written.dup);
    /// # Ok(()) }
    /// ```
    pub async fn call_written<T: DeserializeOwned>(&mut self, call: Call) -> Result<Written<T>, ClientError> {
        self.pipeline_written(std::slice::from_ref(&call))
            .await?
            .pop()
            .unwrap_or_else(|| Err(ClientError::Protocol("no reply".into())))
    }

    /// Sends every request before reading any reply (writing and reading at
    /// once, so a long pipeline cannot deadlock on full socket buffers), and
    /// returns each result in order. The outer error is the connection's (a
    /// connection the server closed or that broke is [`ClientError::Io`]); a
    /// call's own failure is its entry's. A call whose frame is over
    /// [`ConnectOptions::max_frame`] is not sent: its entry is a `too_large`
    /// [`ClientError::Server`] error, and the others go as usual. Pushes
    /// arriving in between are set aside (see [`Client::take_push`]). Not
    /// cancel-safe: a pipeline whose future is dropped (by a timeout, say)
    /// leaves its replies on the wire, and every later call fails at once
    /// rather than read them as its own ([`Client::is_out_of_step`]);
    /// connect again.
    pub async fn pipeline<T: DeserializeOwned>(
        &mut self,
        calls: &[Call],
    ) -> Result<Vec<Result<T, ClientError>>, ClientError> {
        let results = self.pipeline_written::<T>(calls).await?;
        Ok(results.into_iter().map(|result| result.map(|written| written.value)).collect())
    }

    /// [`Client::pipeline`], each result with the server's `dup` flag.
    pub async fn pipeline_written<T: DeserializeOwned>(
        &mut self,
        calls: &[Call],
    ) -> Result<Vec<Result<Written<T>, ClientError>>, ClientError> {
        if let Some(why) = calls.iter().find_map(Call::invalid) {
            return Err(ClientError::Encode(why.to_string()));
        }
        if self.unsettled {
            return Err(ClientError::Protocol(
                "an earlier call on this connection was abandoned or failed part way, so its replies are out of \
                 step with the calls: connect again"
                    .into(),
            ));
        }
        self.unsettled = true;
        let first = self.next_id;
        let mut out = Vec::with_capacity(calls.len() * 48);
        // Calls refused for their size (index, frame body length), in order:
        // their ids go unused, which the protocol allows.
        let mut refused = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let start = out.len();
            call.encode(first + i as u64, &mut out);
            // The frame's body: what follows its 4-byte length.
            let len = out.len().saturating_sub(start + 4);
            if len > self.max_frame {
                out.truncate(start);
                refused.push((i, len));
            }
        }
        self.next_id += calls.len() as u64;
        let max_frame = self.max_frame;
        let writer = &mut self.writer;
        let reader = &mut self.reader;
        let pushes = &mut self.pushes;
        // Flushed too: over TLS a write that meets a full socket keeps its
        // last records in the TLS layer until something flushes them.
        let write = async move {
            writer.write_all(&out).await?;
            writer.flush().await
        };
        let read = async move {
            let mut results = Vec::with_capacity(calls.len());
            let mut refused = refused.into_iter().peekable();
            while results.len() < calls.len() {
                if let Some((_, len)) = refused.next_if(|&(i, _)| i == results.len()) {
                    results.push(Err(too_large(len, max_frame)));
                    continue;
                }
                let body = reader.next_frame().await?.ok_or_else(ClientError::closed)?;
                let Envelope { id, result, dup } = match Incoming::<T>::decode(&body)? {
                    Incoming::Reply(envelope) => envelope,
                    Incoming::Push(watch) => {
                        pushes.add(RawPush::new(watch, body, Instant::now()));
                        continue;
                    }
                };
                let expected = first + results.len() as u64;
                // id 0 answers a frame the server could not read an id from.
                if id != expected && !(id == 0 && result.is_err()) {
                    return Err(ClientError::Protocol(format!("reply id {id}, expected {expected}")));
                }
                results.push(result.map(|value| Written { value, dup }));
            }
            Ok::<_, ClientError>(results)
        };
        let (written, results) = tokio::join!(write, read);
        let results = results?;
        written?;
        self.unsettled = false;
        Ok(results)
    }

    /// Whether a call was abandoned or failed part way on this connection,
    /// which then answers every call with an error (see
    /// [`Client::pipeline`]): a pool or a retrying client connects again.
    pub fn is_out_of_step(&self) -> bool {
        self.unsettled
    }

    /// The oldest push set aside while a call waited for its reply, if any
    /// (no I/O).
    pub fn take_push(&mut self) -> Option<RawPush> {
        self.pushes.pop()
    }

    /// Pushes set aside and not yet taken.
    pub fn buffered_pushes(&self) -> usize {
        self.pushes.len()
    }

    /// Pushes this client set aside and then dropped because a newer push of
    /// the same watch arrived before they were taken (each push carries the
    /// watch's whole state), or, past 256 watches with pushes pending, the
    /// oldest.
    pub fn coalesced_pushes(&self) -> u64 {
        self.pushes.coalesced()
    }

    /// Forgets the pushes set aside for `watch`.
    pub(crate) fn discard_pushes(&mut self, watch: u64) {
        self.pushes.discard(watch);
    }

    /// The next push: one set aside, else the next frame read, which must be
    /// a push (no call is waiting for a reply). `None` once the server has
    /// closed the connection. Cancel-safe.
    pub async fn next_push(&mut self) -> Result<Option<RawPush>, ClientError> {
        std::future::poll_fn(|cx| self.poll_push(cx)).await
    }

    /// The poll form of [`Client::next_push`], for hand-written streams.
    pub fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<RawPush>, ClientError>> {
        if let Some(push) = self.pushes.pop() {
            return Poll::Ready(Ok(Some(push)));
        }
        let body = match std::task::ready!(self.reader.poll_next_frame(cx)) {
            Ok(Some(body)) => body,
            Ok(None) => return Poll::Ready(Ok(None)),
            Err(e) => return Poll::Ready(Err(e.into())),
        };
        Poll::Ready(match Incoming::<IgnoredAny>::decode(&body) {
            Ok(Incoming::Push(watch)) => Ok(Some(RawPush::new(watch, body, Instant::now()))),
            Ok(Incoming::Reply(Envelope { id, .. })) => {
                Err(ClientError::Protocol(format!("reply id {id} while no request was waiting")))
            }
            Err(e) => Err(e),
        })
    }

    /// Sends raw bytes (for testing how a server takes malformed input).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.writer.write_all(bytes).await?;
        self.writer.flush().await?;
        Ok(())
    }

    /// Reads one raw reply frame as a `T` (after [`Client::send_raw`]);
    /// `None` when the server closed the connection.
    pub async fn read_raw<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ClientError> {
        match self.reader.next_frame().await {
            Ok(Some(body)) => Ok(Some(rmp_serde::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))?)),
            Ok(None) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// A fresh request id, for requests sent outside [`Client::pipeline`].
    pub(crate) fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
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

    /// `rank` with `approx: true`: the player's rank estimated from the
    /// board's bucket summary, without a fan-out over the shards; the exact
    /// rank (as of the summary, refreshed at least once a second) lies
    /// within `rank ± error`. `None` if the player is absent; a dense board
    /// answers `bad_request`.
    pub async fn rank_approx(&mut self, board: &str, player: &str) -> Result<Option<ApproxRankInfo>, ClientError> {
        self.call(Call::new(OpKind::Rank).with("board", board).with("player", player).with("approx", true)).await
    }

    /// `rank_of_score` with `approx: true`: the rank a new player with
    /// `score` would get, estimated from the board's bucket summary alone.
    pub async fn rank_of_score_approx(&mut self, board: &str, score: i64) -> Result<ApproxRankOfScore, ClientError> {
        self.call(Call::new(OpKind::RankOfScore).with("board", board).with("score", score).with("approx", true)).await
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

    /// `ranks`: the `players` present on the board, each once, best first,
    /// with their board-wide ranks: a friends leaderboard in one call
    /// (protocol 1.1; at most [`crate::protocol::MAX_RANKS`] names).
    pub async fn ranks(&mut self, board: &str, players: &[&str]) -> Result<Vec<Entry>, ClientError> {
        self.call(Call::new(OpKind::Ranks).with("board", board).with("players", players)).await
    }

    /// `boards`: the first 1000 boards (every board, on a server holding
    /// fewer) with their configs and counts, in byte order of their names.
    pub async fn boards(&mut self) -> Result<Vec<BoardInfo>, ClientError> {
        self.call(Call::new(OpKind::Boards)).await
    }

    /// One page of `boards`: up to `limit` (1 to 10 000) boards whose names
    /// start with `prefix`, after the board named `after` if given. Ask
    /// again with `after` set to the last name until a page comes back
    /// shorter than `limit`.
    pub async fn boards_page(
        &mut self,
        prefix: &str,
        after: Option<&str>,
        limit: u64,
    ) -> Result<Vec<BoardInfo>, ClientError> {
        let call = Call::new(OpKind::Boards).with("prefix", prefix).with_opt("after", after).with("limit", limit);
        self.call(call).await
    }

    /// Sends `calls` as one pipeline and counts the results (ok, failed)
    /// without decoding them: for load generators.
    pub async fn pipeline_outcomes(&mut self, calls: &[Call]) -> Result<(u64, u64), ClientError> {
        let results = self.pipeline_written::<IgnoredAny>(calls).await?;
        let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        Ok((ok, results.len() as u64 - ok))
    }
}

/// The client's own `too_large`, for a request it did not send.
pub(crate) fn too_large(len: usize, max_frame: usize) -> ClientError {
    ClientError::Server {
        code: ErrorCode::TooLarge.name().to_string(),
        msg: format!("a request of {len} bytes is over the max frame of {max_frame} bytes: not sent"),
    }
}

#[cfg(test)]
mod tests {
    use rmpv::Value;

    use super::*;
    use crate::testing::{entry, id, map, serve};

    #[tokio::test]
    async fn pushes_between_replies_are_set_aside_the_newest_of_each_watch() {
        let addr = serve(|_, mut peer| async move {
            let (first, second) = (peer.request().await.unwrap(), peer.request().await.unwrap());
            peer.push(1, Value::Array(vec![entry("a", 1, 1)])).await;
            peer.reply(id(&first), "pong".into()).await;
            peer.push(2, Value::Nil).await;
            peer.push(1, Value::Array(vec![entry("a", 2, 1)])).await;
            peer.reply(id(&second), "pong".into()).await;
            // Read by next_push, then a clean close.
            peer.push(3, Value::Nil).await;
        })
        .await;
        let mut client = Client::connect(&addr).await.unwrap();
        let replies = client.pipeline::<String>(&[Call::new(OpKind::Ping), Call::new(OpKind::Ping)]).await.unwrap();
        assert_eq!(replies.into_iter().map(Result::unwrap).collect::<Vec<_>>(), ["pong", "pong"]);
        assert_eq!((client.buffered_pushes(), client.coalesced_pushes()), (2, 1));
        let two = client.take_push().unwrap();
        assert_eq!((two.watch(), two.event::<Vec<Entry>>().unwrap()), (2, None));
        let one = client.take_push().unwrap();
        assert_eq!(one.event::<Vec<Entry>>().unwrap().unwrap()[0].score, 2, "the newer push of watch 1");
        assert!(client.take_push().is_none());
        assert_eq!(client.next_push().await.unwrap().unwrap().watch(), 3);
        assert!(client.next_push().await.unwrap().is_none(), "closed");
    }

    #[tokio::test]
    async fn a_reply_while_no_call_waits_is_a_protocol_error() {
        let addr = serve(|_, mut peer| async move {
            peer.reply(9, true.into()).await;
            let _ = peer.request().await;
        })
        .await;
        let mut client = Client::connect(&addr).await.unwrap();
        let error = client.next_push().await.unwrap_err();
        assert!(matches!(&error, ClientError::Protocol(why) if why.contains("reply id 9")), "{error}");
    }

    #[tokio::test]
    async fn a_call_abandoned_part_way_fails_every_later_call_rather_than_hand_it_a_late_reply() {
        let addr = serve(|n, mut peer| async move {
            if n == 0 {
                // Answered late: after the caller gave up on it.
                let slow = peer.request().await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                peer.reply(id(&slow), "pong".into()).await;
            }
            while let Some(request) = peer.request().await {
                peer.reply(id(&request), "pong".into()).await;
            }
        })
        .await;
        let mut client = Client::connect(&addr).await.unwrap();
        let abandoned = tokio::time::timeout(std::time::Duration::from_millis(50), client.ping()).await;
        assert!(abandoned.is_err(), "the server holds the reply back");
        assert!(client.is_out_of_step());
        let error = client.ping().await.unwrap_err();
        assert!(matches!(&error, ClientError::Protocol(why) if why.contains("connect again")), "{error}");
        let mut fresh = Client::connect(&addr).await.unwrap();
        assert_eq!(fresh.ping().await.unwrap(), "pong");
        assert!(!fresh.is_out_of_step());
    }

    #[tokio::test]
    async fn a_pipelined_call_over_max_frame_fails_alone_and_unsent() {
        let ops = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = ops.clone();
        let addr = serve(move |_, mut peer| {
            let ops = log.clone();
            async move {
                while let Some(request) = peer.request().await {
                    ops.lock().unwrap().push(crate::testing::field(&request, "op").as_str().unwrap().to_string());
                    peer.reply(id(&request), "pong".into()).await;
                }
            }
        })
        .await;
        let options = ConnectOptions { max_frame: 64, ..ConnectOptions::default() };
        assert_eq!(ConnectOptions::default().max_frame, 1 << 20);
        let mut client = Client::connect_with(&addr, &options).await.unwrap();
        let big = Call::new(OpKind::Ping).with("pad", "x".repeat(64));
        let calls = [Call::new(OpKind::Ping), big, Call::new(OpKind::Ping)];
        let results = client.pipeline::<String>(&calls).await.unwrap();
        assert_eq!(results[0].as_deref().unwrap(), "pong");
        let refused = results[1].as_ref().unwrap_err();
        assert_eq!(refused.error_code(), Some(crate::ErrorCode::TooLarge), "{refused}");
        assert_eq!(results[2].as_deref().unwrap(), "pong");
        assert_eq!(client.ping().await.unwrap(), "pong");
        assert_eq!(*ops.lock().unwrap(), ["ping", "ping", "ping"], "the large call never went out");
    }

    #[tokio::test]
    async fn writes_report_the_dup_flag() {
        let addr = serve(|_, mut peer| async move {
            let mut applied = std::collections::HashMap::new();
            while let Some(request) = peer.request().await {
                let wid = crate::testing::field(&request, "wid").as_str().map(str::to_string);
                let score = crate::testing::field(&request, "score").as_i64().unwrap();
                let (ok, dup) = match wid {
                    Some(wid) => match applied.get(&wid) {
                        Some(&first) => (first, true),
                        None => {
                            applied.insert(wid, score);
                            (score, false)
                        }
                    },
                    None => (score, false),
                };
                let mut reply = vec![("id", id(&request).into()), ("ok", ok.into())];
                if dup {
                    reply.push(("dup", true.into()));
                }
                peer.send(map(&reply)).await;
            }
        })
        .await;
        let mut client = Client::connect(&addr).await.unwrap();
        let call = |score| set_call("b", "p", score, Mode::Incr).with("wid", "w1");
        assert_eq!(client.call_written::<i64>(call(5)).await.unwrap(), Written { value: 5, dup: false });
        assert_eq!(client.call_written::<i64>(call(5)).await.unwrap(), Written { value: 5, dup: true });
        let plain = client.pipeline_written::<i64>(&[set_call("b", "p", 7, Mode::Set)]).await.unwrap();
        assert_eq!(plain[0].as_ref().unwrap(), &Written { value: 7, dup: false });
        assert_eq!(client.call::<i64>(call(9)).await.unwrap(), 5, "call drops the flag");
    }
}
