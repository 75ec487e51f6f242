//! Writes that survive timeouts and broken connections without counting
//! twice: each write gets a `wid` (protocol 1.1), and a write whose answer
//! did not come is sent again, on a new connection, with the same `wid`, so
//! the server applies it at most once.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::call::{set_call, Call};
use crate::client::{Client, Written};
use crate::connect::ConnectOptions;
use crate::error::ClientError;
use crate::protocol::{Mode, OpKind, MAX_WID};
use crate::wid::WidSource;

/// How [`RetryingClient`] retries.
///
/// Retries must end within the server's dedup horizon (10 minutes by
/// default): a `wid` older than that may apply again. With the defaults a
/// write gives up after about 4 × 5 s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How long one attempt, connecting included, may take before it is
    /// abandoned (and its connection closed).
    pub timeout: Duration,
    /// Attempts after the first, at most.
    pub retries: u32,
    /// Pause before the first retry; it doubles with each retry.
    pub backoff: Duration,
    /// The longest pause between two attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            retries: 3,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// A connection whose writes carry a `wid` and are retried until answered.
///
/// An attempt that times out, or whose connection breaks, is sent again on
/// a new connection with the same `wid`; so is one the server answers
/// `overloaded` or `internal` (after a pause). A retried write the server
/// had applied answers the first result with [`Written::dup`] set: an
/// `incr` counts once. Other errors (`bad_request`, `unauthorized`, ...)
/// return at once. Only writes are retried: reads go through
/// [`RetryingClient::client`].
///
/// ```no_run
/// # async fn demo() -> Result<(), rankd_client::ClientError> {
/// use std::time::Duration;
/// use rankd_client::{ConnectOptions, Mode, RetryPolicy, RetryingClient};
/// let policy = RetryPolicy { timeout: Duration::from_secs(2), retries: 5, ..RetryPolicy::default() };
/// let mut rankd = RetryingClient::new("127.0.0.1:7070", ConnectOptions::default(), policy);
/// let total = rankd.set("arena", "alice", 10, Mode::Incr).await?;
/// println!("alice has {} (a retry found it applied: {})", total.value, total.dup);
/// # Ok(()) }
/// ```
pub struct RetryingClient {
    /// Where to (re)connect.
    addr: String,
    /// How to connect.
    options: ConnectOptions,
    /// Timeouts and retries.
    policy: RetryPolicy,
    /// The current connection; `None` after a failure, until the next call.
    client: Option<Client>,
    /// Where each write's `wid` comes from.
    wids: WidSource,
    /// Attempts sent again so far.
    retried: u64,
    /// Connections opened so far.
    connects: u64,
}

impl RetryingClient {
    /// A client for `addr` (`host:port`); it connects on its first call.
    pub fn new(addr: impl Into<String>, options: ConnectOptions, policy: RetryPolicy) -> Self {
        Self { addr: addr.into(), options, policy, client: None, wids: WidSource::new(), retried: 0, connects: 0 }
    }

    /// A client for `addr`, connected now (within the policy's timeout), so
    /// a wrong address or token shows at once.
    pub async fn connect_with(addr: &str, options: &ConnectOptions, policy: RetryPolicy) -> Result<Self, ClientError> {
        let mut client = Self::new(addr, options.clone(), policy);
        client.client().await?;
        Ok(client)
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Attempts sent again so far (over all writes).
    pub fn retried(&self) -> u64 {
        self.retried
    }

    /// Connections opened so far (the first included).
    pub fn connects(&self) -> u64 {
        self.connects
    }

    /// A new `wid` from this client's source, for a write sent by hand.
    pub fn new_wid(&mut self) -> String {
        self.wids.next_wid()
    }

    /// The connection, opened (within the policy's timeout) if there is
    /// none: for reads and other calls, which are not retried.
    pub async fn client(&mut self) -> Result<&mut Client, ClientError> {
        // A read abandoned part way (a caller's timeout) left its replies
        // on the wire: that connection can answer nothing more.
        if self.client.as_ref().is_some_and(Client::is_out_of_step) {
            self.client = None;
        }
        if self.client.is_none() {
            let connect = Client::connect_with(&self.addr, &self.options);
            let client = tokio::time::timeout(self.policy.timeout, connect).await.map_err(|_| timed_out())??;
            self.connects += 1;
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    /// `set` with a new `wid`: the score stored after the write.
    pub async fn set(
        &mut self,
        board: &str,
        player: &str,
        score: i64,
        mode: Mode,
    ) -> Result<Written<i64>, ClientError> {
        self.write(set_call(board, player, score, mode)).await
    }

    /// `set_many` with a new `wid`: the scores stored, in entry order.
    pub async fn set_many(
        &mut self,
        board: &str,
        entries: &[(&str, i64)],
        mode: Mode,
    ) -> Result<Written<Vec<i64>>, ClientError> {
        self.write(Call::new(OpKind::SetMany).with("board", board).with("entries", entries).with("mode", mode)).await
    }

    /// `remove` with a new `wid`: `true` if the player was present (a
    /// repeat answers the first removal's `true`).
    pub async fn remove(&mut self, board: &str, player: &str) -> Result<Written<bool>, ClientError> {
        self.write(Call::new(OpKind::Remove).with("board", board).with("player", player)).await
    }

    /// Any write (`set`, `set_many`, `remove`; `call` must not have a
    /// `wid` yet), with a new `wid`, retried as the policy says.
    pub async fn write<T: DeserializeOwned>(&mut self, call: Call) -> Result<Written<T>, ClientError> {
        let wid = self.wids.next_wid();
        self.write_with_wid(call, &wid).await
    }

    /// A write with the caller's own `wid` (1 to 64 bytes, e.g. a
    /// transaction id, which must not repeat for different writes to the
    /// board), retried as the policy says.
    pub async fn write_with_wid<T: DeserializeOwned>(
        &mut self,
        call: Call,
        wid: &str,
    ) -> Result<Written<T>, ClientError> {
        if wid.is_empty() || wid.len() > MAX_WID {
            return Err(ClientError::Encode(format!("a wid is 1 to {MAX_WID} bytes, not {}", wid.len())));
        }
        let call = call.with("wid", wid);
        if let Some(why) = call.invalid() {
            return Err(ClientError::Encode(why.to_string()));
        }
        let mut pause = self.policy.backoff;
        let mut attempt = 0;
        loop {
            let (error, retry) = match self.attempt(&call).await {
                Ok(written) => return Ok(written),
                Err(failure) => failure,
            };
            if attempt >= self.policy.retries || !retry {
                return Err(error);
            }
            attempt += 1;
            self.retried += 1;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(self.policy.max_backoff);
        }
    }

    /// One attempt within the timeout, failing with the error and whether
    /// the write may be sent again. The connection is dropped when it
    /// failed or timed out (a late reply would be out of step).
    async fn attempt<T: DeserializeOwned>(&mut self, call: &Call) -> Result<Written<T>, (ClientError, bool)> {
        let deadline = tokio::time::Instant::now() + self.policy.timeout;
        let outcome = tokio::time::timeout_at(deadline, async {
            let client = self.client().await?;
            client.pipeline_written::<T>(std::slice::from_ref(call)).await
        })
        .await;
        match outcome {
            // The server answered: only a shed or failed request is sent
            // again (a result of the wrong shape was still applied).
            Ok(Ok(mut results)) => match results.pop() {
                Some(Ok(written)) => Ok(written),
                Some(Err(error)) => {
                    let retry = error.server_may_retry();
                    Err((error, retry))
                }
                None => Err((ClientError::Protocol("no reply".into()), true)),
            },
            Ok(Err(error)) => {
                self.client = None;
                let retry = match &error {
                    ClientError::Io(_) | ClientError::Protocol(_) => true,
                    ClientError::Server { .. } => error.server_may_retry(),
                    ClientError::Encode(_) | ClientError::Tls(_) => false,
                };
                Err((error, retry))
            }
            Err(_) => {
                self.client = None;
                Err((timed_out(), true))
            }
        }
    }
}

fn timed_out() -> ClientError {
    ClientError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within the retry policy's timeout"))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use rmpv::Value;

    use super::*;
    use crate::protocol::ErrorCode;
    use crate::testing::{field, id, map, serve, Peer};

    fn quick(retries: u32) -> RetryPolicy {
        RetryPolicy {
            timeout: Duration::from_millis(300),
            retries,
            backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
        }
    }

    /// Every request's connection number and wid, in arrival order.
    type Seen = Arc<Mutex<Vec<(usize, String)>>>;

    async fn note(seen: &Seen, n: usize, peer: &mut Peer) -> Option<Value> {
        let request = peer.request().await?;
        let wid = field(&request, "wid").as_str().unwrap_or("").to_string();
        seen.lock().unwrap().push((n, wid));
        Some(request)
    }

    #[tokio::test]
    async fn a_timed_out_write_is_sent_again_with_its_wid_and_counts_once() {
        let seen = Seen::default();
        let log = seen.clone();
        let addr = serve(move |n, mut peer| {
            let seen = log.clone();
            async move {
                let Some(request) = note(&seen, n, &mut peer).await else { return };
                if n == 0 {
                    // Applied, but the answer never comes.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    return;
                }
                peer.send(map(&[("id", id(&request).into()), ("ok", 15.into()), ("dup", true.into())])).await;
            }
        })
        .await;
        let mut rankd = RetryingClient::new(addr, ConnectOptions::default(), quick(3));
        let written = rankd.set("b", "p", 5, Mode::Incr).await.unwrap();
        assert_eq!(written, Written { value: 15, dup: true });
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        assert_eq!((seen[0].0, seen[1].0), (0, 1), "sent again on a new connection");
        assert_eq!(seen[0].1, seen[1].1, "with the same wid");
        assert_eq!(seen[0].1.len(), 32);
        assert_eq!((rankd.retried(), rankd.connects()), (1, 2));
    }

    #[tokio::test]
    async fn a_broken_connection_is_retried_and_each_write_has_its_own_wid() {
        let seen = Seen::default();
        let log = seen.clone();
        let addr = serve(move |n, mut peer| {
            let seen = log.clone();
            async move {
                while let Some(request) = note(&seen, n, &mut peer).await {
                    if n == 0 {
                        return; // closes mid-request
                    }
                    let ok = match field(&request, "op").as_str() {
                        Some("remove") => Value::from(true),
                        _ => Value::Array(vec![1.into(), 2.into()]),
                    };
                    peer.reply(id(&request), ok).await;
                }
            }
        })
        .await;
        let mut rankd = RetryingClient::new(addr, ConnectOptions::default(), quick(1));
        let written = rankd.set_many("b", &[("p", 1), ("q", 2)], Mode::Set).await.unwrap();
        assert_eq!(written, Written { value: vec![1, 2], dup: false });
        assert_eq!(rankd.remove("b", "p").await.unwrap(), Written { value: true, dup: false });
        let seen = seen.lock().unwrap().clone();
        let wids: Vec<&str> = seen.iter().map(|(_, wid)| wid.as_str()).collect();
        assert_eq!(wids.len(), 3);
        assert_eq!(wids[0], wids[1], "the retry");
        assert_ne!(wids[1], wids[2], "the next write");
        assert_eq!(rankd.connects(), 2, "the second write reused the connection");
    }

    #[tokio::test]
    async fn shed_writes_are_retried_refused_ones_are_not() {
        let seen = Seen::default();
        let log = seen.clone();
        let addr = serve(move |n, mut peer| {
            let seen = log.clone();
            async move {
                let mut k = 0;
                while let Some(request) = note(&seen, n, &mut peer).await {
                    k += 1;
                    let code = match k {
                        1 => "overloaded",
                        2 => {
                            peer.reply(id(&request), 3.into()).await;
                            continue;
                        }
                        _ => "bad_request",
                    };
                    let err = map(&[("code", code.into()), ("msg", "no".into())]);
                    peer.send(map(&[("id", id(&request).into()), ("err", err)])).await;
                }
            }
        })
        .await;
        let mut rankd = RetryingClient::connect_with(&addr, &ConnectOptions::default(), quick(2)).await.unwrap();
        assert_eq!(rankd.set("b", "p", 3, Mode::Set).await.unwrap().value, 3);
        let error = rankd.set("b", "p", 3, Mode::Set).await.unwrap_err();
        assert_eq!(error.error_code(), Some(ErrorCode::BadRequest));
        assert_eq!((seen.lock().unwrap().len(), rankd.retried(), rankd.connects()), (3, 1, 1));
    }

    #[tokio::test]
    async fn gives_up_after_its_retries() {
        let attempts = Arc::new(Mutex::new(0));
        let count = attempts.clone();
        let addr = serve(move |_, mut peer| {
            let count = count.clone();
            async move {
                if peer.request().await.is_some() {
                    *count.lock().unwrap() += 1;
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        })
        .await;
        let policy = RetryPolicy { timeout: Duration::from_millis(100), ..quick(2) };
        let mut rankd = RetryingClient::new(addr, ConnectOptions::default(), policy);
        let error = rankd.set("b", "p", 1, Mode::Incr).await.unwrap_err();
        assert!(matches!(&error, ClientError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut), "{error}");
        assert_eq!(*attempts.lock().unwrap(), 3);
        let bad = rankd.write_with_wid::<i64>(set_call("b", "p", 1, Mode::Set), &"x".repeat(MAX_WID + 1)).await;
        assert!(matches!(bad, Err(ClientError::Encode(_))));
    }

    #[tokio::test]
    async fn an_unreachable_server_is_retried_then_reported() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let mut rankd = RetryingClient::new(addr, ConnectOptions::default(), quick(2));
        assert!(matches!(rankd.set("b", "p", 1, Mode::Set).await, Err(ClientError::Io(_))));
        assert_eq!((rankd.retried(), rankd.connects()), (2, 0));
    }
}
