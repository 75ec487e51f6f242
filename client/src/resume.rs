//! Watches that outlive their connection: when it breaks or the server
//! closes it, a [`ResumingWatcher`] connects again and asks again for every
//! open watch, as the Python and Node clients do
//! (`clients/conformance/transport.md`). Each watch keeps the id its caller
//! got, whatever the server numbers it on the new connection; its first
//! push there is the current state, so no change made meanwhile is missed.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use serde::de::DeserializeOwned;

use crate::connect::ConnectOptions;
use crate::error::ClientError;
use crate::retry::{jittered, timed_out, RetryPolicy};
use crate::watch::{Push, WatchEvent, WatchId, WatchSpec, Watcher};

/// Reconnections in a row a [`ResumingWatcher`] tries, by default, before
/// its stream fails (the Node client's `watchRetries` default too).
pub const DEFAULT_WATCH_RETRIES: u32 = 10;

/// A [`Watcher`] that reconnects: after a lost connection it connects
/// again (waiting the retry backoff first: a random time between half and
/// all of 100 ms × 2ⁿ⁻¹, at most 2 s), `auth`s with its token, and asks
/// again for every open watch, each try bounded by the attempt timeout (5 s
/// by default, as a [`RetryPolicy`]'s). It gives up after `retries`
/// reconnections in a row have failed: [`ResumingWatcher::next_event`] then
/// returns the last error.
///
/// It is a [`Stream`] of pushes too, as a [`Watcher`] is.
///
/// ```no_run
/// # async fn demo() -> Result<(), rankd_client::ClientError> {
/// use rankd_client::{ConnectOptions, ResumingWatcher, WatchSpec, DEFAULT_WATCH_RETRIES};
/// let options = ConnectOptions::default();
/// let mut watcher = ResumingWatcher::connect_with("127.0.0.1:7070", &options, DEFAULT_WATCH_RETRIES).await?;
/// let top = watcher.watch(&WatchSpec::top("arena", 10)).await?;
/// println!("watching the top 10 as watch {top}");
/// while let Some(push) = watcher.next_event().await? {
///     println!("{} {:?} (reconnected {} times)", push.watch, push.event, watcher.reconnects());
/// }
/// # Ok(()) }
/// ```
pub struct ResumingWatcher<S = i64> {
    /// The watches of the current connection.
    watcher: Watcher<S>,
    /// The rest, which does not depend on how scores decode.
    state: ResumeState,
}

/// What a [`ResumingWatcher`] keeps besides its current connection.
struct ResumeState {
    /// Where to connect again.
    addr: String,
    /// How (TLS, the token).
    options: ConnectOptions,
    /// Reconnections in a row tried before giving up.
    retries: u32,
    /// How long one reconnection, connecting and asking included, may take.
    attempt_timeout: Duration,
    /// The reconnection under way, if any: kept across calls, so a
    /// `next_event` cut short leaves it to go on at the next one.
    reconnecting: Option<Reconnecting>,
    /// The error of a watch the last new connection refused, for the next
    /// `next_event` (the watch has ended).
    refused: Option<ClientError>,
    /// Every open watch, by the id its caller holds.
    specs: BTreeMap<u64, WatchSpec>,
    /// The caller's id of each open watch, by its id on the current
    /// connection.
    ids: HashMap<u64, u64>,
    /// The next caller's id.
    next_id: u64,
    /// Connections replaced so far.
    reconnects: u64,
}

/// A reconnection's tries, which end with a new connection and the answer
/// there to each open watch, asked for in the order of their callers' ids.
/// No watch opens or ends while one is under way: `watch` and `unwatch`
/// finish it first, and the closed connection pushes nothing.
type Reconnecting = Pin<Box<dyn Future<Output = Result<Reconnected, ClientError>> + Send>>;

/// A new connection and the answer to each watch asked for again there.
type Reconnected = (Watcher, Vec<Result<WatchId, ClientError>>);

impl ResumingWatcher {
    /// Connects to `addr` now, so a wrong address or token shows at once;
    /// later connections are tried up to `retries` times in a row.
    pub async fn connect_with(addr: &str, options: &ConnectOptions, retries: u32) -> Result<Self, ClientError> {
        let watcher = Watcher::connect_with(addr, options).await?;
        Ok(Self {
            watcher,
            state: ResumeState {
                addr: addr.to_string(),
                options: options.clone(),
                retries,
                attempt_timeout: RetryPolicy::default().timeout,
                reconnecting: None,
                refused: None,
                specs: BTreeMap::new(),
                ids: HashMap::new(),
                next_id: 1,
                reconnects: 0,
            },
        })
    }
}

impl<S: DeserializeOwned> ResumingWatcher<S> {
    /// This watcher with its pushes' scores read as `T` (see
    /// [`Watcher::with_scores`]).
    pub fn with_scores<T: DeserializeOwned>(self) -> ResumingWatcher<T> {
        ResumingWatcher { watcher: self.watcher.with_scores::<T>(), state: self.state }
    }

    /// This watcher with each reconnection try, connecting and asking for
    /// the watches included, abandoned after `timeout` (a server that
    /// accepts but never answers is then tried again).
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.state.attempt_timeout = timeout;
        self
    }

    /// Starts a watch on the current connection, once a reconnection under
    /// way has finished; it is asked for again on every new one. Its first
    /// push, the current state, follows at once.
    pub async fn watch(&mut self, spec: &WatchSpec) -> Result<WatchId, ClientError> {
        self.finish_reconnecting().await?;
        let WatchId(on_connection) = self.watcher.watch(spec).await?;
        let id = self.state.next_id;
        self.state.next_id += 1;
        self.state.specs.insert(id, spec.clone());
        self.state.ids.insert(on_connection, id);
        Ok(WatchId(id))
    }

    /// Ends a watch: `true` if it was active on the current connection
    /// (once a reconnection under way has finished). It is not asked for
    /// again, whatever the answer.
    pub async fn unwatch(&mut self, watch: WatchId) -> Result<bool, ClientError> {
        let reconnected = self.finish_reconnecting().await;
        self.state.specs.remove(&watch.0);
        reconnected?;
        let Some(on_connection) = self.state.ids.iter().find_map(|(&on, &id)| (id == watch.0).then_some(on)) else {
            return Ok(false);
        };
        self.state.ids.remove(&on_connection);
        self.watcher.unwatch(WatchId(on_connection)).await
    }

    /// The open watches, by their callers' ids.
    pub fn watches(&self) -> impl Iterator<Item = WatchId> + '_ {
        self.state.specs.keys().map(|&id| WatchId(id))
    }

    /// Connections replaced so far.
    pub fn reconnects(&self) -> u64 {
        self.state.reconnects
    }

    /// The next push, its `watch` the caller's id; reconnects when the
    /// connection is lost. `None` once the connection has closed with no
    /// watch open. Cancel-safe: a reconnection cut short goes on at the
    /// next call.
    pub async fn next_event(&mut self) -> Result<Option<Push<S>>, ClientError> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The poll form of [`ResumingWatcher::next_event`].
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Push<S>>, ClientError>> {
        loop {
            ready!(self.poll_reconnecting(cx))?;
            if let Some(error) = self.state.refused.take() {
                return Poll::Ready(Err(error));
            }
            match ready!(self.watcher.poll_event(cx)) {
                Ok(Some(push)) => {
                    if let Some(push) = self.state.for_caller(push) {
                        return Poll::Ready(Ok(Some(push)));
                    }
                }
                Ok(None) if self.state.specs.is_empty() => return Poll::Ready(Ok(None)),
                Ok(None) | Err(ClientError::Io(_)) => self.state.start_reconnecting(),
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }

    /// Waits for a reconnection under way, if any.
    async fn finish_reconnecting(&mut self) -> Result<(), ClientError> {
        std::future::poll_fn(|cx| self.poll_reconnecting(cx)).await
    }

    /// Drives the reconnection under way, if any: its error if it failed;
    /// once it is over, its connection replaces the old one.
    fn poll_reconnecting(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ClientError>> {
        if let Some(watcher) = ready!(self.state.poll_reconnecting(cx))? {
            self.watcher = watcher.with_scores::<S>();
        }
        Poll::Ready(Ok(()))
    }
}

impl ResumeState {
    /// `push` under its caller's id; `None` for a watch ended meanwhile.
    fn for_caller<S>(&mut self, mut push: Push<S>) -> Option<Push<S>> {
        let on_connection = push.watch.0;
        let id = *self.ids.get(&on_connection)?;
        if matches!(push.event, WatchEvent::Ended) {
            self.ids.remove(&on_connection);
            self.specs.remove(&id);
        }
        push.watch = WatchId(id);
        Some(push)
    }

    /// Starts a reconnection that asks again for every open watch.
    fn start_reconnecting(&mut self) {
        let specs: Vec<WatchSpec> = self.specs.values().cloned().collect();
        let tries = reconnect(self.addr.clone(), self.options.clone(), specs, self.retries, self.attempt_timeout);
        self.reconnecting = Some(Box::pin(tries));
    }

    /// Drives the reconnection under way: `None` if there is none, its
    /// error if it failed, else the new connection. A watch the new
    /// connection refused ends, and its error waits for the next
    /// `next_event` (the others are on).
    fn poll_reconnecting(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Watcher>, ClientError>> {
        let Some(reconnecting) = &mut self.reconnecting else { return Poll::Ready(Ok(None)) };
        let result = ready!(reconnecting.as_mut().poll(cx));
        self.reconnecting = None;
        let (watcher, started) = result?;
        self.reconnects += 1;
        self.ids.clear();
        let asked: Vec<u64> = self.specs.keys().copied().collect();
        for (id, result) in asked.into_iter().zip(started) {
            match result {
                Ok(WatchId(on_connection)) => {
                    self.ids.insert(on_connection, id);
                }
                Err(error) => {
                    self.specs.remove(&id);
                    self.refused = Some(error);
                }
            }
        }
        Poll::Ready(Ok(Some(watcher)))
    }
}

/// A new connection to `addr` with `specs` asked for again, tried up to
/// `retries` times after the backoff, each try bounded by `timeout`.
async fn reconnect(
    addr: String,
    options: ConnectOptions,
    specs: Vec<WatchSpec>,
    retries: u32,
    timeout: Duration,
) -> Result<Reconnected, ClientError> {
    let policy = RetryPolicy::default();
    let mut last = None;
    for attempt in 1..=retries {
        tokio::time::sleep(jittered(policy.pause(attempt))).await;
        let attempt = async {
            let mut watcher = Watcher::connect_with(&addr, &options).await?;
            let started = watcher.watch_many(&specs).await?;
            Ok((watcher, started))
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(reconnected)) => return Ok(reconnected),
            Ok(Err(error)) => last = Some(error),
            Err(_) => last = Some(timed_out()),
        }
    }
    Err(last.unwrap_or_else(|| ClientError::Config("a ResumingWatcher with 0 retries cannot reconnect".into())))
}

impl<S: DeserializeOwned> Stream for ResumingWatcher<S> {
    type Item = Result<Push<S>, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx).map(Result::transpose)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures_util::StreamExt;
    use rmpv::Value;

    use super::*;
    use crate::reply::Entry;
    use crate::testing::{entry, field, id, map, serve};

    fn top_of(score: i64) -> WatchEvent {
        WatchEvent::Top(vec![Entry { player: "a".into(), score, rank: 1 }])
    }

    /// Connection `n` numbers its watches from `10 × (n + 1)` and pushes
    /// each one's first state, the top of score `n`; connection 0 closes
    /// after its first watch. Logs every unwatched id.
    async fn closing_first(unwatched: Arc<Mutex<Vec<u64>>>) -> String {
        serve(move |n, mut peer| {
            let unwatched = unwatched.clone();
            async move {
                let mut next = 10 * (n as u64 + 1);
                while let Some(request) = peer.request().await {
                    match field(&request, "op").as_str().unwrap() {
                        "watch" => {
                            peer.reply(id(&request), map(&[("watch", next.into())])).await;
                            peer.push(next, Value::Array(vec![entry("a", n as i64, 1)])).await;
                            next += 1;
                            if n == 0 {
                                return;
                            }
                        }
                        "unwatch" => {
                            unwatched.lock().unwrap().push(field(&request, "watch").as_u64().unwrap());
                            peer.reply(id(&request), true.into()).await;
                        }
                        op => panic!("unexpected {op}"),
                    }
                }
            }
        })
        .await
    }

    #[tokio::test]
    async fn a_lost_connection_is_replaced_and_its_watches_asked_for_again_under_the_callers_ids() {
        let unwatched = Arc::new(Mutex::new(Vec::new()));
        let addr = closing_first(unwatched.clone()).await;
        let mut watcher = ResumingWatcher::connect_with(&addr, &ConnectOptions::default(), 3).await.unwrap();
        let top = watcher.watch(&WatchSpec::top("b", 1)).await.unwrap();
        assert_eq!(top, WatchId(1));
        let first = watcher.next_event().await.unwrap().unwrap();
        assert_eq!((first.watch, first.event), (top, top_of(0)));
        // The server closed the connection: the next push is the state on
        // the new one (where the watch is 20), under the caller's id.
        let again = watcher.next_event().await.unwrap().unwrap();
        assert_eq!((again.watch, again.event), (top, top_of(1)));
        assert_eq!(watcher.reconnects(), 1);
        assert!(watcher.unwatch(top).await.unwrap());
        assert_eq!(*unwatched.lock().unwrap(), [20], "the watch's id on the new connection");
        assert_eq!(watcher.watches().count(), 0);
    }

    #[tokio::test]
    async fn it_gives_up_after_its_retries_in_a_row() {
        let connections = Arc::new(Mutex::new(0));
        let count = connections.clone();
        let addr = serve(move |n, mut peer| {
            *count.lock().unwrap() += 1;
            async move {
                // The first connection serves one watch, then closes; the
                // others close at once.
                if n == 0 {
                    let request = peer.request().await.unwrap();
                    peer.reply(id(&request), map(&[("watch", 1.into())])).await;
                    peer.push(1, Value::Array(vec![])).await;
                }
            }
        })
        .await;
        let mut watcher = ResumingWatcher::connect_with(&addr, &ConnectOptions::default(), 2).await.unwrap();
        watcher.watch(&WatchSpec::top("b", 1)).await.unwrap();
        assert_eq!(watcher.next_event().await.unwrap().unwrap().event, WatchEvent::Top(vec![]));
        let error = watcher.next_event().await.unwrap_err();
        assert!(matches!(error, ClientError::Io(_)), "{error:?}");
        assert_eq!((*connections.lock().unwrap(), watcher.reconnects()), (3, 0), "the first and 2 tries");
    }

    /// Connection 0 serves a watch and closes; connection `slow` answers
    /// its first watch request only after `hold`; the others, and its later
    /// ones, are answered at once. Each connection numbers its watches from
    /// 7 and pushes the top of its own number. Counts connections.
    async fn with_a_slow_connection(slow: usize, hold: Duration, connections: Arc<Mutex<usize>>) -> String {
        serve(move |n, mut peer| {
            *connections.lock().unwrap() += 1;
            async move {
                let mut next = 7;
                while let Some(request) = peer.request().await {
                    if n == slow && next == 7 {
                        tokio::time::sleep(hold).await;
                    }
                    peer.reply(id(&request), map(&[("watch", next.into())])).await;
                    peer.push(next, Value::Array(vec![entry("a", n as i64, 1)])).await;
                    next += 1;
                    if n == 0 {
                        return;
                    }
                }
            }
        })
        .await
    }

    /// A watcher of one top, with `attempt_timeout`, on
    /// [`with_a_slow_connection`] whose connection 1 holds its first answer
    /// for `hold`, past connection 0's push; and the connections counted.
    async fn past_the_first_connection(
        hold: Duration,
        attempt_timeout: Duration,
    ) -> (ResumingWatcher, WatchId, Arc<Mutex<usize>>) {
        let connections = Arc::new(Mutex::new(0));
        let addr = with_a_slow_connection(1, hold, connections.clone()).await;
        let watcher = ResumingWatcher::connect_with(&addr, &ConnectOptions::default(), 5).await.unwrap();
        let mut watcher = watcher.with_attempt_timeout(attempt_timeout);
        let top = watcher.watch(&WatchSpec::top("b", 1)).await.unwrap();
        assert_eq!(watcher.next_event().await.unwrap().unwrap().event, top_of(0));
        (watcher, top, connections)
    }

    #[tokio::test]
    async fn a_reconnection_cut_short_goes_on_at_the_next_call() {
        let default_timeout = RetryPolicy::default().timeout;
        let (mut watcher, top, connections) =
            past_the_first_connection(Duration::from_millis(800), default_timeout).await;
        let cut = tokio::time::timeout(Duration::from_millis(300), watcher.next_event()).await;
        assert!(cut.is_err(), "cut short while connection 1 holds the watch request");
        let push = watcher.next_event().await.unwrap().unwrap();
        assert_eq!((push.watch, push.event, watcher.reconnects()), (top, top_of(1), 1));
        assert_eq!(*connections.lock().unwrap(), 2, "the cut reconnection went on: no third connection");
    }

    #[tokio::test]
    async fn a_connection_that_never_answers_is_given_up_after_the_attempt_timeout() {
        let (mut watcher, top, connections) =
            past_the_first_connection(Duration::from_secs(30), Duration::from_millis(300)).await;
        let within = Duration::from_secs(10);
        let push = tokio::time::timeout(within, watcher.next_event()).await.expect("no wait for connection 1");
        let push = push.unwrap().unwrap();
        assert_eq!((push.watch, push.event, watcher.reconnects()), (top, top_of(2), 1));
        assert_eq!(*connections.lock().unwrap(), 3);
    }

    #[tokio::test]
    async fn a_watch_asked_for_during_a_reconnection_waits_for_the_new_connection() {
        let default_timeout = RetryPolicy::default().timeout;
        let (mut watcher, top, connections) =
            past_the_first_connection(Duration::from_millis(500), default_timeout).await;
        let cut = tokio::time::timeout(Duration::from_millis(200), watcher.next_event()).await;
        assert!(cut.is_err(), "cut short while connection 1 holds the watch request");
        let error = watcher.watch(&WatchSpec::top("c", 1)).await.map(|_| ());
        assert!(error.is_ok(), "asked on the new connection, not the closed one: {error:?}");
        assert_eq!((watcher.reconnects(), *connections.lock().unwrap()), (1, 2));
        let first = watcher.next_event().await.unwrap().unwrap();
        assert_eq!((first.watch, first.event), (top, top_of(1)));
    }

    #[tokio::test]
    async fn it_is_a_stream_of_pushes_across_reconnections() {
        let addr = closing_first(Arc::new(Mutex::new(Vec::new()))).await;
        let mut watcher = ResumingWatcher::connect_with(&addr, &ConnectOptions::default(), 3).await.unwrap();
        let top = watcher.watch(&WatchSpec::top("b", 1)).await.unwrap();
        let pushes: Vec<_> =
            (&mut watcher).take(2).map(|push| push.map(|push| (push.watch, push.event))).collect().await;
        let pushes: Result<Vec<_>, _> = pushes.into_iter().collect();
        assert_eq!(pushes.unwrap(), [(top, top_of(0)), (top, top_of(1))]);
        assert_eq!(watcher.reconnects(), 1);
    }

    #[tokio::test]
    async fn a_watch_the_new_connection_refuses_ends_with_its_error_and_the_others_go_on() {
        let addr = serve(|n, mut peer| async move {
            // 0 serves two watches, then closes; 1 refuses the first one
            // asked for again and serves the second.
            for k in 0..2 {
                let Some(request) = peer.request().await else { return };
                if n == 1 && k == 0 {
                    peer.fail(id(&request), "not_found").await;
                    continue;
                }
                peer.reply(id(&request), map(&[("watch", (k + 1).into())])).await;
                peer.push(k + 1, Value::Array(vec![entry("a", n as i64, 1)])).await;
            }
            if n == 1 {
                let _ = peer.request().await;
            }
        })
        .await;
        let mut watcher = ResumingWatcher::connect_with(&addr, &ConnectOptions::default(), 3).await.unwrap();
        let gone = watcher.watch(&WatchSpec::top("dropped", 1)).await.unwrap();
        let kept = watcher.watch(&WatchSpec::top("kept", 1)).await.unwrap();
        for _ in 0..2 {
            assert_eq!(watcher.next_event().await.unwrap().unwrap().event, top_of(0));
        }
        let error = watcher.next_event().await.unwrap_err();
        assert_eq!(error.code(), Some("not_found"), "{error:?}");
        let push = watcher.next_event().await.unwrap().unwrap();
        assert_eq!((push.watch, push.event), (kept, top_of(1)));
        assert_eq!(watcher.watches().collect::<Vec<_>>(), [kept], "{gone} ended");
    }

    #[tokio::test]
    async fn with_no_watch_open_a_closed_connection_ends_the_stream() {
        let addr = serve(|_, _| async {}).await;
        let mut watcher = ResumingWatcher::connect_with(&addr, &ConnectOptions::default(), 3).await.unwrap();
        assert!(watcher.next_event().await.unwrap().is_none());
        assert_eq!(watcher.reconnects(), 0);
    }
}
