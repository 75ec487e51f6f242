//! Watches that outlive their connection: when it breaks or the server
//! closes it, a [`ResumingWatcher`] connects again and asks again for every
//! open watch, as the Python and Node clients do
//! (`clients/conformance/transport.md`). Each watch keeps the id its caller
//! got, whatever the server numbers it on the new connection; its first
//! push there is the current state, so no change made meanwhile is missed.

use std::collections::{BTreeMap, HashMap};

use serde::de::DeserializeOwned;

use crate::connect::ConnectOptions;
use crate::error::ClientError;
use crate::retry::{jittered, RetryPolicy};
use crate::watch::{Push, WatchEvent, WatchId, WatchSpec, Watcher};

/// Reconnections in a row a [`ResumingWatcher`] tries, by default, before
/// its stream fails (the Node client's `watchRetries` default too).
pub const DEFAULT_WATCH_RETRIES: u32 = 10;

/// A [`Watcher`] that reconnects: after a lost connection it connects
/// again (waiting the retry backoff first: a random time between half and
/// all of 100 ms × 2ⁿ⁻¹, at most 2 s), `auth`s with its token, and asks
/// again for every open watch. It gives up after `retries` reconnections in
/// a row have failed: [`ResumingWatcher::next_event`] then returns the last
/// error.
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
    /// Where to connect again.
    addr: String,
    /// How (TLS, the token).
    options: ConnectOptions,
    /// Reconnections in a row tried before giving up.
    retries: u32,
    /// The watches of the current connection.
    watcher: Watcher<S>,
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

impl ResumingWatcher {
    /// Connects to `addr` now, so a wrong address or token shows at once;
    /// later connections are tried up to `retries` times in a row.
    pub async fn connect_with(addr: &str, options: &ConnectOptions, retries: u32) -> Result<Self, ClientError> {
        let watcher = Watcher::connect_with(addr, options).await?;
        Ok(Self {
            addr: addr.to_string(),
            options: options.clone(),
            retries,
            watcher,
            specs: BTreeMap::new(),
            ids: HashMap::new(),
            next_id: 1,
            reconnects: 0,
        })
    }
}

impl<S: DeserializeOwned> ResumingWatcher<S> {
    /// This watcher with its pushes' scores read as `T` (see
    /// [`Watcher::with_scores`]).
    pub fn with_scores<T: DeserializeOwned>(self) -> ResumingWatcher<T> {
        let Self { addr, options, retries, watcher, specs, ids, next_id, reconnects } = self;
        let watcher = watcher.with_scores::<T>();
        ResumingWatcher { addr, options, retries, watcher, specs, ids, next_id, reconnects }
    }

    /// Starts a watch on the current connection; it is asked for again on
    /// every new one. Its first push, the current state, follows at once.
    pub async fn watch(&mut self, spec: &WatchSpec) -> Result<WatchId, ClientError> {
        let WatchId(on_connection) = self.watcher.watch(spec).await?;
        let id = self.next_id;
        self.next_id += 1;
        self.specs.insert(id, spec.clone());
        self.ids.insert(on_connection, id);
        Ok(WatchId(id))
    }

    /// Ends a watch: `true` if it was active on the current connection. It
    /// is not asked for again, whatever the answer.
    pub async fn unwatch(&mut self, watch: WatchId) -> Result<bool, ClientError> {
        self.specs.remove(&watch.0);
        let Some(on_connection) = self.ids.iter().find_map(|(&on, &id)| (id == watch.0).then_some(on)) else {
            return Ok(false);
        };
        self.ids.remove(&on_connection);
        self.watcher.unwatch(WatchId(on_connection)).await
    }

    /// The open watches, by their callers' ids.
    pub fn watches(&self) -> impl Iterator<Item = WatchId> + '_ {
        self.specs.keys().map(|&id| WatchId(id))
    }

    /// Connections replaced so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects
    }

    /// The next push, its `watch` the caller's id; reconnects when the
    /// connection is lost. `None` once the connection has closed with no
    /// watch open. Cancel-safe: a reconnection cut short starts over at the
    /// next call.
    pub async fn next_event(&mut self) -> Result<Option<Push<S>>, ClientError> {
        loop {
            match self.watcher.next_event().await {
                Ok(Some(push)) => {
                    if let Some(push) = self.for_caller(push) {
                        return Ok(Some(push));
                    }
                }
                Ok(None) if self.specs.is_empty() => return Ok(None),
                Ok(None) | Err(ClientError::Io(_)) => self.resume().await?,
                Err(error) => return Err(error),
            }
        }
    }

    /// `push` under its caller's id; `None` for a watch ended meanwhile.
    fn for_caller(&mut self, mut push: Push<S>) -> Option<Push<S>> {
        let on_connection = push.watch.0;
        let id = *self.ids.get(&on_connection)?;
        if matches!(push.event, WatchEvent::Ended) {
            self.ids.remove(&on_connection);
            self.specs.remove(&id);
        }
        push.watch = WatchId(id);
        Some(push)
    }

    /// A new connection with every open watch asked for again, tried up
    /// to `retries` times; a watch the new connection refuses ends, and
    /// its error is returned once the others are asked for.
    async fn resume(&mut self) -> Result<(), ClientError> {
        let policy = RetryPolicy::default();
        let mut last = None;
        for attempt in 1..=self.retries {
            tokio::time::sleep(jittered(policy.pause(attempt))).await;
            let mut watcher = match Watcher::connect_with(&self.addr, &self.options).await {
                Ok(watcher) => watcher.with_scores::<S>(),
                Err(error) => {
                    last = Some(error);
                    continue;
                }
            };
            let asked: Vec<WatchSpec> = self.specs.values().cloned().collect();
            let started = match watcher.watch_many(&asked).await {
                Ok(started) => started,
                Err(error) => {
                    last = Some(error);
                    continue;
                }
            };
            // Only now, and from here without waiting: a reconnection cut
            // short leaves the old, closed connection, and starts over.
            self.watcher = watcher;
            self.reconnects += 1;
            self.ids.clear();
            let mut refused = None;
            let ids: Vec<u64> = self.specs.keys().copied().collect();
            for (id, result) in ids.into_iter().zip(started) {
                match result {
                    Ok(WatchId(on_connection)) => {
                        self.ids.insert(on_connection, id);
                    }
                    Err(error) => {
                        self.specs.remove(&id);
                        refused = Some(error);
                    }
                }
            }
            return refused.map_or(Ok(()), Err);
        }
        Err(last.unwrap_or_else(|| ClientError::Config("a ResumingWatcher with 0 retries cannot reconnect".into())))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

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

    #[tokio::test]
    async fn a_reconnection_cut_short_starts_over_at_the_next_call() {
        let addr = serve(|n, mut peer| async move {
            // 0 serves a watch and closes; 1 never answers (held 5 s); 2 serves.
            let Some(request) = peer.request().await else { return };
            if n == 1 {
                return tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
            peer.reply(id(&request), map(&[("watch", 7.into())])).await;
            peer.push(7, Value::Array(vec![entry("a", n as i64, 1)])).await;
            if n == 2 {
                let _ = peer.request().await;
            }
        })
        .await;
        let mut watcher = ResumingWatcher::connect_with(&addr, &ConnectOptions::default(), 5).await.unwrap();
        let top = watcher.watch(&WatchSpec::top("b", 1)).await.unwrap();
        assert_eq!(watcher.next_event().await.unwrap().unwrap().event, top_of(0));
        let cut = tokio::time::timeout(std::time::Duration::from_millis(500), watcher.next_event()).await;
        assert!(cut.is_err(), "cut short while connection 1 holds the watch request");
        let within = std::time::Duration::from_secs(2);
        let push = tokio::time::timeout(within, watcher.next_event()).await.expect("no wait for connection 1");
        let push = push.unwrap().unwrap();
        assert_eq!((push.watch, push.event, watcher.reconnects()), (top, top_of(2), 1));
    }

    #[tokio::test]
    async fn with_no_watch_open_a_closed_connection_ends_the_stream() {
        let addr = serve(|_, _| async {}).await;
        let mut watcher = ResumingWatcher::connect_with(&addr, &ConnectOptions::default(), 3).await.unwrap();
        assert!(watcher.next_event().await.unwrap().is_none());
        assert_eq!(watcher.reconnects(), 0);
    }
}
