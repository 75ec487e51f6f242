//! Watches (protocol 1.1): a connection asks the server to push a board's
//! top or a player's rank whenever it changes, instead of polling.
//!
//! A [`Watcher`] is a connection for watches: [`Watcher::watch`] starts one
//! from a [`WatchSpec`], and the watcher is a [`Stream`] of typed
//! [`Push`]es (or call [`Watcher::next_event`]). The server pushes the
//! current state at once, then each change (only acknowledged writes),
//! coalesced to at most one push per `interval_ms`; a reader that falls
//! behind gets the latest state, not a backlog.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_core::Stream;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::call::Call;
use crate::client::Client;
use crate::connect::ConnectOptions;
use crate::error::ClientError;
use crate::protocol::{OpKind, Window};
use crate::push::RawPush;
use crate::reply::{Entry, RankInfo};

/// What a watch follows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WatchTarget {
    /// The best N players (1 to [`crate::protocol::MAX_WATCH_TOP`]), as
    /// `top` lists them.
    Top(u64),
    /// One player's rank, score and the board's count, as `rank` answers.
    Player(String),
}

/// A `watch` request: the board, what of it, and how often it may push.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WatchSpec {
    /// The board watched (it need not exist yet).
    pub board: String,
    /// Its top N or one player.
    pub target: WatchTarget,
    /// The window watched; `None` is the board's first.
    pub window: Option<Window>,
    /// The period: 0 (current, when `None`), -1 the previous, ...
    pub period: Option<i64>,
    /// At most one push per this many milliseconds
    /// ([`crate::protocol::WATCH_INTERVAL_MS`]); `None` is the server's
    /// default ([`crate::protocol::DEFAULT_WATCH_INTERVAL_MS`]).
    pub interval_ms: Option<u64>,
}

impl WatchSpec {
    /// Watch the best `n` players of `board`.
    pub fn top(board: impl Into<String>, n: u64) -> Self {
        Self::new(board.into(), WatchTarget::Top(n))
    }

    /// Watch `player`'s rank on `board`.
    pub fn player(board: impl Into<String>, player: impl Into<String>) -> Self {
        Self::new(board.into(), WatchTarget::Player(player.into()))
    }

    fn new(board: String, target: WatchTarget) -> Self {
        Self { board, target, window: None, period: None, interval_ms: None }
    }

    /// In `window` instead of the board's first.
    pub fn window(mut self, window: Window) -> Self {
        self.window = Some(window);
        self
    }

    /// In a past `period` (-1 the previous, down to the board's `-keep`).
    pub fn period(mut self, period: i64) -> Self {
        self.period = Some(period);
        self
    }

    /// At most one push per `interval` (whole milliseconds, 10 ms to 60 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval_ms = Some(u64::try_from(interval.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// The `watch` request.
    pub fn call(&self) -> Call {
        let call = Call::new(OpKind::Watch).with("board", &self.board);
        let call = match &self.target {
            WatchTarget::Top(n) => call.with("top", n),
            WatchTarget::Player(player) => call.with("player", player),
        };
        call.with_opt("window", self.window).with_opt("period", self.period).with_opt("interval_ms", self.interval_ms)
    }
}

/// A watch's id, unique on its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WatchId(pub u64);

impl fmt::Display for WatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a push says. Serializes as the wire's `event`: the list, the
/// `{rank, score, count}` map, or nil. `S` is how scores read (see
/// [`Watcher::with_scores`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum WatchEvent<S = i64> {
    /// A `top` watch: the whole list, best first, as `top` answers it.
    Top(Vec<Entry<S>>),
    /// A `player` watch: the player's rank, score and the board's count, or
    /// `None` while the player is absent. A dropped board ends a player
    /// watch with `None` too, which the push does not tell apart;
    /// [`Watcher::unwatch`] then answers `false`.
    Player(Option<RankInfo<S>>),
    /// A `top` watch ended: its board was dropped. No push follows.
    Ended,
}

/// One push of a watch. Serializes as on the wire: `{"watch", "event"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Push<S = i64> {
    /// Which watch.
    pub watch: WatchId,
    /// The watched state.
    pub event: WatchEvent<S>,
    /// When the push was read off the connection.
    #[serde(skip)]
    pub received: Instant,
}

/// What a watch's pushes decode as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Top,
    Player,
}

/// The result of `watch`.
#[derive(Deserialize)]
struct Started {
    /// The new watch's id.
    watch: u64,
}

/// A connection that watches: start watches, then read their pushes as a
/// [`Stream`] of [`Push`]es (or with [`Watcher::next_event`]).
///
/// Nothing is read while the stream is not polled: the server then
/// coalesces (a slow reader gets the latest state, not a backlog), but it
/// closes a connection whose pushes go unread for its idle timeout. Pushes
/// that arrive while [`Watcher::watch`] or [`Watcher::unwatch`] wait for
/// their reply are kept, the newest of each watch. Watches end with their
/// connection: after the stream ends, connect again and watch again, or
/// use a [`crate::ResumingWatcher`], which does.
///
/// ```no_run
/// # async fn demo() -> Result<(), rankd_client::ClientError> {
/// use futures_util::StreamExt;
/// use rankd_client::{ConnectOptions, WatchEvent, WatchSpec, Watcher};
/// let mut watcher = Watcher::connect_with("127.0.0.1:7070", &ConnectOptions::default()).await?;
/// watcher.watch(&WatchSpec::top("arena", 10)).await?;
/// while let Some(push) = watcher.next().await {
///     if let WatchEvent::Top(entries) = push?.event {
///         println!("{} on top", entries.len());
///     }
/// }
/// # Ok(()) }
/// ```
///
/// Scores read as `S`: `i64`, or, for boards with fields,
/// [`crate::FieldScores`] ([`crate::Score`] for both kinds), chosen with
/// [`Watcher::with_scores`].
pub struct Watcher<S = i64> {
    /// The connection.
    client: Client,
    /// The watches started here and not ended, by id.
    watches: HashMap<u64, Kind>,
    /// The connection closed or failed: the stream has ended.
    closed: bool,
    /// Pushes of watches this watcher did not start (or already ended).
    strays: u64,
    /// How the pushes' scores decode.
    scores: PhantomData<fn() -> S>,
}

impl Watcher {
    /// Connects to `addr` (`host:port`) over plain TCP.
    pub async fn connect(addr: &str) -> Result<Self, ClientError> {
        Self::connect_with(addr, &ConnectOptions::default()).await
    }

    /// Connects to `addr` as `options` say (TLS, a token to `auth` with).
    pub async fn connect_with(addr: &str, options: &ConnectOptions) -> Result<Self, ClientError> {
        Ok(Self::from_client(Client::connect_with(addr, options).await?))
    }

    /// Watches on an open connection (one that has no watches yet: pushes of
    /// watches it started with [`Client::call`] are skipped).
    pub fn from_client(client: Client) -> Self {
        Self { client, watches: HashMap::new(), closed: false, strays: 0, scores: PhantomData }
    }
}

impl<S: DeserializeOwned> Watcher<S> {
    /// This watcher with its pushes' scores read as `T`: on a board with
    /// fields, `Watcher::connect(addr).await?.with_scores::<FieldScores>()`.
    pub fn with_scores<T>(self) -> Watcher<T> {
        let Self { client, watches, closed, strays, .. } = self;
        Watcher { client, watches, closed, strays, scores: PhantomData }
    }

    /// Starts a watch. Its first push, the current state, follows at once.
    /// A connection holds at most 64 watches: the server answers
    /// `too_large` beyond.
    pub async fn watch(&mut self, spec: &WatchSpec) -> Result<WatchId, ClientError> {
        self.watch_many(std::slice::from_ref(spec))
            .await?
            .pop()
            .unwrap_or_else(|| Err(ClientError::Protocol("no reply".into())))
    }

    /// Starts several watches in one round trip; each result is its own
    /// (the outer error is the connection's).
    pub async fn watch_many(&mut self, specs: &[WatchSpec]) -> Result<Vec<Result<WatchId, ClientError>>, ClientError> {
        let calls: Vec<Call> = specs.iter().map(WatchSpec::call).collect();
        let results = self.client.pipeline::<Started>(&calls).await?;
        Ok(specs
            .iter()
            .zip(results)
            .map(|(spec, result)| {
                let Started { watch } = result?;
                let kind = match spec.target {
                    WatchTarget::Top(_) => Kind::Top,
                    WatchTarget::Player(_) => Kind::Player,
                };
                self.watches.insert(watch, kind);
                Ok(WatchId(watch))
            })
            .collect())
    }

    /// Ends a watch: `true` if it was active. No push of it follows.
    pub async fn unwatch(&mut self, watch: WatchId) -> Result<bool, ClientError> {
        let active = self.client.call(Call::new(OpKind::Unwatch).with("watch", watch.0)).await?;
        self.watches.remove(&watch.0);
        self.client.discard_pushes(watch.0);
        Ok(active)
    }

    /// The watches started here that have not ended, as far as this client
    /// knows (a player watch's board drop is not seen: see
    /// [`WatchEvent::Player`]).
    pub fn watches(&self) -> impl Iterator<Item = WatchId> + '_ {
        self.watches.keys().map(|&id| WatchId(id))
    }

    /// The connection, for other requests (their replies are matched as
    /// usual; pushes that arrive meanwhile are kept for the stream).
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Pushes the client dropped because a newer one of the same watch
    /// arrived while a call waited for its reply (the server's own
    /// coalescing is not counted here: it is not seen).
    pub fn coalesced(&self) -> u64 {
        self.client.coalesced_pushes()
    }

    /// Pushes skipped because they named no watch of this watcher.
    pub fn strays(&self) -> u64 {
        self.strays
    }

    /// The next push: `None` once the connection has closed. Cancel-safe.
    pub async fn next_event(&mut self) -> Result<Option<Push<S>>, ClientError> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The poll form of [`Watcher::next_event`].
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Push<S>>, ClientError>> {
        loop {
            if self.closed {
                return Poll::Ready(Ok(None));
            }
            let raw = match std::task::ready!(self.client.poll_push(cx)) {
                Ok(Some(raw)) => raw,
                Ok(None) => {
                    self.closed = true;
                    return Poll::Ready(Ok(None));
                }
                Err(e) => {
                    self.closed = true;
                    return Poll::Ready(Err(e));
                }
            };
            if let Some(push) = self.decode(raw) {
                return Poll::Ready(push.map(Some));
            }
        }
    }

    /// The push typed by its watch's kind; `None` for a stray.
    fn decode(&mut self, raw: RawPush) -> Option<Result<Push<S>, ClientError>> {
        let Some(&kind) = self.watches.get(&raw.watch()) else {
            self.strays += 1;
            return None;
        };
        let event = match kind {
            Kind::Top => raw.event::<Vec<Entry<S>>>().map(|event| match event {
                Some(entries) => WatchEvent::Top(entries),
                None => {
                    self.watches.remove(&raw.watch());
                    WatchEvent::Ended
                }
            }),
            Kind::Player => raw.event::<RankInfo<S>>().map(WatchEvent::Player),
        };
        Some(event.map(|event| Push { watch: WatchId(raw.watch()), event, received: raw.received() }))
    }
}

impl<S: DeserializeOwned> Stream for Watcher<S> {
    type Item = Result<Push<S>, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx).map(Result::transpose)
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use rmpv::Value;

    use super::*;
    use crate::testing::{entry, field, id, map, serve};

    #[test]
    fn specs_encode_their_fields() {
        let mut out = Vec::new();
        let spec = WatchSpec::top("b", 3).window(Window::Daily).period(-1).interval(Duration::from_millis(50));
        spec.call().encode(4, &mut out);
        let request = rmpv::decode::read_value(&mut &out[4..]).unwrap();
        assert_eq!(field(&request, "op").as_str(), Some("watch"));
        assert_eq!(field(&request, "top").as_u64(), Some(3));
        assert_eq!(field(&request, "window").as_str(), Some("daily"));
        assert_eq!(field(&request, "period").as_i64(), Some(-1));
        assert_eq!(field(&request, "interval_ms").as_u64(), Some(50));
        assert!(field(&request, "player").is_nil());
        out.clear();
        WatchSpec::player("b", "alice").call().encode(5, &mut out);
        let request = rmpv::decode::read_value(&mut &out[4..]).unwrap();
        assert_eq!(field(&request, "player").as_str(), Some("alice"));
        for absent in ["top", "window", "period", "interval_ms"] {
            assert!(field(&request, absent).is_nil(), "{absent} sent");
        }
    }

    fn rank(rank: u64, score: i64, count: u64) -> Value {
        map(&[("rank", rank.into()), ("score", score.into()), ("count", count.into())])
    }

    #[tokio::test]
    async fn a_watcher_streams_typed_pushes() {
        let addr = serve(|_, mut peer| async move {
            let mut next_watch = 1u64;
            while let Some(request) = peer.request().await {
                let id = id(&request);
                match field(&request, "op").as_str().unwrap() {
                    "watch" => {
                        let watch = next_watch;
                        next_watch += 1;
                        peer.reply(id, map(&[("watch", watch.into())])).await;
                        // The first push, at once.
                        let event = match field(&request, "player").as_str() {
                            None => Value::Array(vec![entry("a", 9, 1), entry("b", 7, 2)]),
                            Some("alice") => rank(3, 5, 10),
                            Some(_) => Value::Nil,
                        };
                        peer.push(watch, event).await;
                    }
                    "unwatch" => {
                        assert_eq!(field(&request, "watch").as_u64(), Some(3));
                        peer.push(99, Value::Nil).await;
                        peer.reply(id, true.into()).await;
                    }
                    "ping" => {
                        peer.reply(id, "pong".into()).await;
                        peer.push(2, rank(2, 8, 10)).await;
                        peer.push(1, Value::Nil).await;
                        return;
                    }
                    op => panic!("unexpected {op}"),
                }
            }
        })
        .await;
        let mut watcher = Watcher::connect(&addr).await.unwrap();
        assert_eq!(watcher.watch(&WatchSpec::top("b", 2)).await.unwrap(), WatchId(1));
        let players = [WatchSpec::player("b", "alice"), WatchSpec::player("b", "ghost")];
        let ids: Vec<WatchId> = watcher.watch_many(&players).await.unwrap().into_iter().map(Result::unwrap).collect();
        assert_eq!(ids, [WatchId(2), WatchId(3)]);
        let mut events = Vec::new();
        for _ in 0..3 {
            let push = watcher.next().await.unwrap().unwrap();
            events.push((push.watch.0, push.event));
        }
        let top =
            vec![Entry { player: "a".into(), score: 9, rank: 1 }, Entry { player: "b".into(), score: 7, rank: 2 }];
        let alice = RankInfo { rank: 3, score: 5, count: 10 };
        assert_eq!(
            events,
            [(1, WatchEvent::Top(top)), (2, WatchEvent::Player(Some(alice))), (3, WatchEvent::Player(None))]
        );
        assert!(watcher.unwatch(WatchId(3)).await.unwrap());
        assert_eq!(watcher.client().ping().await.unwrap(), "pong");
        let push = watcher.next_event().await.unwrap().unwrap();
        assert_eq!(
            (push.watch, push.event),
            (WatchId(2), WatchEvent::Player(Some(RankInfo { rank: 2, score: 8, count: 10 })))
        );
        let push = watcher.next().await.unwrap().unwrap();
        assert_eq!((push.watch, push.event), (WatchId(1), WatchEvent::Ended));
        assert_eq!(watcher.watches().collect::<Vec<_>>(), [WatchId(2)]);
        assert!(watcher.next().await.is_none(), "the server closed");
        assert!(watcher.next().await.is_none(), "and stays closed");
        assert_eq!(watcher.strays(), 1, "the push of watch 99");
    }

    #[tokio::test]
    async fn a_refused_watch_fails_alone() {
        let addr = serve(|_, mut peer| async move {
            let (a, b) = (peer.request().await.unwrap(), peer.request().await.unwrap());
            peer.reply(id(&a), map(&[("watch", 1.into())])).await;
            let err = map(&[("code", "too_large".into()), ("msg", "64 watches".into())]);
            peer.send(map(&[("id", id(&b).into()), ("err", err)])).await;
            peer.push(1, Value::Array(vec![])).await;
        })
        .await;
        let mut watcher = Watcher::connect(&addr).await.unwrap();
        let results = watcher.watch_many(&[WatchSpec::top("b", 1), WatchSpec::top("b", 1)]).await.unwrap();
        assert_eq!(results[0].as_ref().unwrap(), &WatchId(1));
        assert_eq!(results[1].as_ref().unwrap_err().error_code(), Some(crate::ErrorCode::TooLarge));
        assert_eq!(watcher.next_event().await.unwrap().unwrap().event, WatchEvent::Top(vec![]));
    }

    #[tokio::test]
    async fn a_watcher_reads_composite_scores_when_told() {
        let addr = serve(|_, mut peer| async move {
            let request = peer.request().await.unwrap();
            peer.reply(id(&request), map(&[("watch", 1.into())])).await;
            let score = map(&[("trophies", 7.into()), ("retries", 1.into())]);
            peer.push(1, map(&[("rank", 1.into()), ("score", score), ("count", 1.into())])).await;
        })
        .await;
        let mut watcher = Watcher::connect(&addr).await.unwrap().with_scores::<crate::FieldScores>();
        watcher.watch(&WatchSpec::player("cup", "alice")).await.unwrap();
        let WatchEvent::Player(Some(info)) = watcher.next().await.unwrap().unwrap().event else {
            panic!("a player push")
        };
        assert_eq!((info.rank, info.score.get("trophies"), info.score.get("retries")), (1, Some(7), Some(1)));
    }
}
