//! Writes that survive timeouts and broken connections without counting
//! twice: each write gets a `wid` (protocol 1.1), and a write whose answer
//! did not come is sent again, on a new connection, with the same `wid`, so
//! the server applies it at most once. The rules (what is sent again, the
//! backoff, the bounds, what giving up reports) are those every rankd
//! client follows: `clients/conformance/transport.md` in the repository.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::call::{set_call, Call};
use crate::client::{too_large, Client, Written};
use crate::connect::ConnectOptions;
use crate::error::ClientError;
use crate::protocol::{ErrorCode, Mode, OpKind, MAX_WID};
use crate::wid::WidSource;

/// How [`RetryingClient`] retries.
///
/// Before its n-th re-send a write waits a random time between half and
/// all of min(`backoff` × 2ⁿ⁻¹, `max_backoff`): 100, 200, 400 ms, ... with
/// the defaults (the random half keeps clients that lost the same server
/// from coming back in step). It gives up after `retries` re-sends, or
/// when the next one would start more than `deadline` after the write's
/// first attempt, whichever comes first: with the defaults, at most 4
/// sends within about a minute.
///
/// The `deadline` is at most [`RetryPolicy::MAX_DEADLINE`] (5 minutes), and
/// [`RetryingClient::new`] refuses a policy with a longer one: the server
/// remembers a `wid` for its dedup horizon (`--dedup-horizon-secs`, 10
/// minutes by default), and a write sent again after that may apply twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How long one attempt, connecting included, may wait for its reply
    /// before it is abandoned (and its connection closed). 5 s by default.
    pub timeout: Duration,
    /// Re-sends after the first send, at most. 3 by default.
    pub retries: u32,
    /// The pause before the first re-send, doubling with each re-send (a
    /// random time between half and all of it is waited). 100 ms by
    /// default.
    pub backoff: Duration,
    /// The longest pause before a re-send (before the random half). 2 s
    /// by default.
    pub max_backoff: Duration,
    /// No re-send starts later than this after the write's first attempt.
    /// 60 s by default; at most [`RetryPolicy::MAX_DEADLINE`].
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            retries: 3,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            deadline: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The longest `deadline` allowed: half the server's default dedup
    /// horizon (10 minutes), which leaves room for a last attempt's
    /// timeout and for clocks and queues.
    pub const MAX_DEADLINE: Duration = Duration::from_secs(5 * 60);

    /// Refuses a policy whose `deadline` is over
    /// [`RetryPolicy::MAX_DEADLINE`] ([`ClientError::Config`]).
    pub fn validate(&self) -> Result<(), ClientError> {
        if self.deadline > Self::MAX_DEADLINE {
            return Err(ClientError::Config(format!(
                "a retry deadline of {:?} is over {:?}: a wid is remembered by the server for its dedup horizon (10 \
                 minutes by default), and a write sent again after that may apply twice",
                self.deadline,
                Self::MAX_DEADLINE
            )));
        }
        Ok(())
    }

    /// The pause before re-send `n` (from 1), before the random half:
    /// `backoff` × 2ⁿ⁻¹, at most `max_backoff`.
    pub(crate) fn pause(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// A random time between half and all of `pause`. The randomness is
/// std's per-process hash keys (each `RandomState` differs): enough to keep
/// clients apart, and no dependency.
pub(crate) fn jittered(pause: Duration) -> Duration {
    let half = pause / 2;
    let spread = u64::try_from((pause - half).as_nanos()).unwrap_or(u64::MAX);
    let random = RandomState::new().build_hasher().finish();
    half + Duration::from_nanos(random % spread.saturating_add(1))
}

/// A connection whose writes carry a `wid` and are retried until answered.
///
/// A write is sent again with the same `wid`:
///
/// - when its reply did not come within the policy's `timeout`, or its
///   connection broke or was closed: on a new connection;
/// - when the server answered `overloaded` (shed, never applied) or
///   `internal` (it may or may not have applied): on the same connection.
///
/// A re-send the server had already applied answers the first result with
/// [`Written::dup`] set: an `incr` counts once. Other errors return at once
/// (`bad_request`, `unauthorized`, ..., a `too_large` refused by the client
/// before sending, see [`ConnectOptions::max_frame`]); so does a protocol
/// violation (a reply that does not decode, or answers another request):
/// sending again to a server that breaks the protocol would not help.
///
/// When the policy's bounds run out (or a final error comes after a send
/// left the write in doubt), the error is [`ClientError::MaybeApplied`]:
/// the write's `wid`, how many times it was sent, and the last error, so
/// the caller can send it again later with that `wid` and still count it
/// at most once. A write that was never sent (no connection could be
/// opened) fails with the connection's error alone.
///
/// A read goes through [`RetryingClient::read`], which sends it once more
/// on a new connection if its connection broke before the reply came (not
/// after its own timeout, nor after an error answer); other calls go
/// through [`RetryingClient::client`], sent once.
///
/// ```no_run
/// # async fn demo() -> Result<(), rankd_client::ClientError> {
/// use std::time::Duration;
/// use rankd_client::{ConnectOptions, Mode, RetryPolicy, RetryingClient};
/// let policy = RetryPolicy { timeout: Duration::from_secs(2), retries: 5, ..RetryPolicy::default() };
/// let mut rankd = RetryingClient::new("127.0.0.1:7070", ConnectOptions::default(), policy)?;
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

/// Why an attempt failed, and what that says about the write.
struct Failed {
    /// The error.
    error: ClientError,
    /// The request was handed to a connection (it may have reached the
    /// server).
    sent: bool,
    /// The rules allow sending it again.
    retry: bool,
    /// It may have applied: sent and unanswered, or answered `internal`.
    in_doubt: bool,
}

impl RetryingClient {
    /// A client for `addr` (`host:port`); it connects on its first call.
    /// Refuses a policy whose `deadline` is over
    /// [`RetryPolicy::MAX_DEADLINE`] ([`ClientError::Config`]).
    pub fn new(addr: impl Into<String>, options: ConnectOptions, policy: RetryPolicy) -> Result<Self, ClientError> {
        policy.validate()?;
        Ok(Self { addr: addr.into(), options, policy, client: None, wids: WidSource::new(), retried: 0, connects: 0 })
    }

    /// A client for `addr`, connected now (within the policy's timeout), so
    /// a wrong address or token shows at once.
    pub async fn connect_with(addr: &str, options: &ConnectOptions, policy: RetryPolicy) -> Result<Self, ClientError> {
        let mut client = Self::new(addr, options.clone(), policy)?;
        client.client().await?;
        Ok(client)
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Attempts sent again so far (over all writes and reads).
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
    /// none: for calls sent once (reads go through
    /// [`RetryingClient::read`]).
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

    /// A read, any of [`Client`]'s, within the policy's `timeout`, sent once
    /// more on a new connection if its connection broke or was closed
    /// before the reply came: `rankd.read(async |c| c.rank("arena",
    /// "alice").await).await?`. Not sent again after its own timeout (the
    /// server may be overloaded: the caller decides), nor after an error
    /// answer (`overloaded` and `internal` come back as they are). `read`
    /// may be called twice: it should only read.
    pub async fn read<T>(
        &mut self,
        read: impl AsyncFn(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let mut resent = false;
        loop {
            let outcome = tokio::time::timeout(self.policy.timeout, async { read(self.client().await?).await }).await;
            let error = match outcome {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error @ ClientError::Server { .. })) => return Err(error),
                Ok(Err(error)) => error,
                Err(_) => {
                    self.client = None;
                    return Err(timed_out());
                }
            };
            // The connection is of no more use: lost, or out of step.
            self.client = None;
            if resent || !matches!(error, ClientError::Io(_)) {
                return Err(error);
            }
            resent = true;
            self.retried += 1;
        }
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
    /// `wid` yet), with a new `wid`, retried as the policy says. A write
    /// given up in doubt names its `wid` in [`ClientError::MaybeApplied`].
    pub async fn write<T: DeserializeOwned>(&mut self, call: Call) -> Result<Written<T>, ClientError> {
        let wid = self.wids.next_wid();
        self.write_with_wid(call, &wid).await
    }

    /// A write with the caller's own `wid` (1 to 64 bytes, e.g. a
    /// transaction id, which must not repeat for different writes to the
    /// board), retried as the policy says; also how to send again, later,
    /// a write given up as [`ClientError::MaybeApplied`].
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
        // Sized once, with the longest id a send may carry: a re-send after
        // a send that may have applied is never refused for its longer id.
        let len = call.longest_body_len();
        if len > self.options.max_frame {
            return Err(too_large(len, self.options.max_frame));
        }
        let deadline = Instant::now() + self.policy.deadline;
        let (mut sends, mut in_doubt, mut resends) = (0u32, false, 0u32);
        loop {
            let failed = match self.attempt(&call).await {
                Ok(written) => return Ok(written),
                Err(failed) => failed,
            };
            sends += u32::from(failed.sent);
            in_doubt |= failed.in_doubt;
            let pause = jittered(self.policy.pause(resends + 1));
            let bounded = resends >= self.policy.retries || Instant::now() + pause > deadline;
            if !failed.retry || bounded {
                // A write never sent (no connection) is in no doubt; one
                // sent and given up on is reported with its wid.
                return Err(match sends > 0 && (in_doubt || failed.retry) {
                    true => ClientError::MaybeApplied { wid: wid.to_string(), sends, last: Box::new(failed.error) },
                    false => failed.error,
                });
            }
            resends += 1;
            self.retried += 1;
            tokio::time::sleep(pause).await;
        }
    }

    /// One attempt within the timeout: the result, or why it failed. The
    /// connection is dropped when it failed or timed out (a late reply
    /// would be out of step); it is kept after an error answer.
    async fn attempt<T: DeserializeOwned>(&mut self, call: &Call) -> Result<Written<T>, Failed> {
        let deadline = Instant::now() + self.policy.timeout;
        let mut sent = false;
        let outcome = tokio::time::timeout_at(deadline, async {
            let client = self.client().await?;
            sent = true;
            client.pipeline_written::<T>(std::slice::from_ref(call)).await
        })
        .await;
        match outcome {
            // The server answered: only a shed or failed request is sent
            // again (a `too_large` from the client was never sent). A result
            // of the wrong shape was applied: it is final, and reported with
            // the write's wid like a write in doubt.
            Ok(Ok(mut results)) => match results.pop() {
                Some(Ok(written)) => Ok(written),
                Some(Err(error)) => {
                    let in_doubt = match &error {
                        ClientError::Server { .. } => error.error_code() == Some(ErrorCode::Internal),
                        _ => true,
                    };
                    Err(Failed { retry: error.server_may_retry(), error, sent, in_doubt })
                }
                None => {
                    Err(Failed { error: ClientError::Protocol("no reply".into()), sent, retry: false, in_doubt: true })
                }
            },
            // No answer: a lost connection (closed by the server included)
            // is tried again on a new one; a protocol violation is not.
            // Before the request was handed over (connecting, `auth`), only
            // a lost connection or a shed one is tried again.
            Ok(Err(error)) => {
                self.client = None;
                let retry = matches!(error, ClientError::Io(_)) || (!sent && error.server_may_retry());
                Err(Failed { in_doubt: sent, error, sent, retry })
            }
            Err(_) => {
                self.client = None;
                Err(Failed { error: timed_out(), sent, retry: true, in_doubt: sent })
            }
        }
    }
}

/// A try that got no answer within its timeout (a retry policy's, or a
/// resuming watcher's attempt timeout).
pub(crate) fn timed_out() -> ClientError {
    ClientError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within the timeout"))
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
            deadline: Duration::from_secs(10),
        }
    }

    fn retrying(addr: String, policy: RetryPolicy) -> RetryingClient {
        RetryingClient::new(addr, ConnectOptions::default(), policy).expect("a valid policy")
    }

    /// Every request's connection number and wid, in arrival order.
    type Seen = Arc<Mutex<Vec<(usize, String)>>>;

    async fn note(seen: &Seen, n: usize, peer: &mut Peer) -> Option<Value> {
        let request = peer.request().await?;
        let wid = field(&request, "wid").as_str().unwrap_or("").to_string();
        seen.lock().unwrap().push((n, wid));
        Some(request)
    }

    /// What a scripted server does with a request.
    enum Answer {
        /// Answers it `ok`.
        Ok(Value),
        /// Answers it `ok`, flagged `dup` (a re-send found applied).
        Dup(Value),
        /// Answers it with the error `code`.
        Fail(&'static str),
        /// Answers `ok` under another request's id.
        WrongId(Value),
        /// Never answers; holds the connection open 5 s.
        Hang,
        /// Closes the connection.
        Close,
    }

    /// A server that notes each request in `seen` and answers it as
    /// `script` says, given its connection's number and its own number on
    /// that connection (both from 0).
    async fn scripted<S>(seen: &Seen, script: S) -> String
    where
        S: Fn(usize, usize, &Value) -> Answer + Clone + Send + Sync + 'static,
    {
        let log = seen.clone();
        serve(move |n, mut peer| {
            let (seen, script) = (log.clone(), script.clone());
            async move {
                let mut k = 0;
                while let Some(request) = note(&seen, n, &mut peer).await {
                    let id = id(&request);
                    match script(n, k, &request) {
                        Answer::Ok(ok) => peer.reply(id, ok).await,
                        Answer::Dup(ok) => peer.send(map(&[("id", id.into()), ("ok", ok), ("dup", true.into())])).await,
                        Answer::Fail(code) => peer.fail(id, code).await,
                        Answer::WrongId(ok) => peer.reply(id + 7, ok).await,
                        Answer::Hang => return tokio::time::sleep(Duration::from_secs(5)).await,
                        Answer::Close => return,
                    }
                    k += 1;
                }
            }
        })
        .await
    }

    /// A server answering every request of every connection `code`.
    async fn always(code: &'static str, seen: &Seen) -> String {
        scripted(seen, move |_, _, _| Answer::Fail(code)).await
    }

    #[test]
    fn the_default_policy_is_the_shared_one() {
        let policy = RetryPolicy::default();
        assert_eq!((policy.timeout, policy.retries), (Duration::from_secs(5), 3));
        assert_eq!((policy.backoff, policy.max_backoff), (Duration::from_millis(100), Duration::from_secs(2)));
        assert_eq!(policy.deadline, Duration::from_secs(60));
        assert!(policy.validate().is_ok());
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_waits_a_random_half_to_all_of_it() {
        let policy = RetryPolicy::default();
        let ms = |n| policy.pause(n).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(4), ms(5), ms(6), ms(40)], [100, 200, 400, 800, 1600, 2000, 2000]);
        let waits: Vec<Duration> = (0..1000).map(|_| jittered(Duration::from_millis(100))).collect();
        assert!(waits.iter().all(|w| (Duration::from_millis(50)..=Duration::from_millis(100)).contains(w)));
        let below = waits.iter().filter(|w| **w < Duration::from_millis(75)).count();
        assert!((300..700).contains(&below), "{below} of 1000 waits in the lower half");
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_deadline_over_five_minutes_is_refused() {
        let over = RetryPolicy { deadline: RetryPolicy::MAX_DEADLINE + Duration::from_millis(1), ..quick(3) };
        let error = RetryingClient::new("127.0.0.1:1", ConnectOptions::default(), over.clone()).err().unwrap();
        assert!(matches!(&error, ClientError::Config(why) if why.contains("dedup horizon")), "{error}");
        // Refused before any connection is tried (port 1 refuses: that would be Io).
        let error = RetryingClient::connect_with("127.0.0.1:1", &ConnectOptions::default(), over).await.err().unwrap();
        assert!(matches!(error, ClientError::Config(_)), "{error}");
        let most = RetryPolicy { deadline: Duration::from_secs(300), ..quick(3) };
        assert!(RetryingClient::new("127.0.0.1:1", ConnectOptions::default(), most).is_ok());
    }

    #[tokio::test]
    async fn a_timed_out_write_is_sent_again_with_its_wid_and_counts_once() {
        let seen = Seen::default();
        // The first send applied, but its answer never comes.
        let addr = scripted(&seen, |n, _, _| if n == 0 { Answer::Hang } else { Answer::Dup(15.into()) }).await;
        let mut rankd = retrying(addr, quick(3));
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
        let addr = scripted(&seen, |n, _, request| match (n, field(request, "op").as_str()) {
            (0, _) => Answer::Close, // mid-request
            (_, Some("remove")) => Answer::Ok(true.into()),
            _ => Answer::Ok(Value::Array(vec![1.into(), 2.into()])),
        })
        .await;
        let mut rankd = retrying(addr, quick(1));
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
    async fn a_server_that_closes_after_reading_a_write_is_a_broken_connection() {
        let seen = Seen::default();
        // Reads the write, then closes without a word.
        let addr = scripted(&seen, |_, _, _| Answer::Close).await;
        // The plain client reports a lost connection, not a protocol error.
        let mut client = Client::connect(&addr).await.unwrap();
        let error = client.set("b", "p", 1, Mode::Incr).await.unwrap_err();
        assert!(matches!(&error, ClientError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof), "{error:?}");
        // The retrying one sends it again on a new connection each time,
        // then gives up with its wid.
        let mut rankd = retrying(addr, quick(2));
        let error = rankd.set("b", "p", 1, Mode::Incr).await.unwrap_err();
        let ClientError::MaybeApplied { wid, sends, last } = &error else { panic!("{error:?}") };
        assert!(matches!(&**last, ClientError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof), "{last:?}");
        assert_eq!(*sends, 3);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 1, 2, 3], "each on a new connection");
        assert!(seen[1..].iter().all(|(_, w)| w == wid), "{seen:?}");
        assert_eq!((rankd.retried(), rankd.connects()), (2, 3));
        assert!(error.to_string().contains("may have applied (sent 3 times)"), "{error}");
    }

    #[tokio::test]
    async fn internal_then_an_answer_returns_the_answer_with_its_dup_flag() {
        let seen = Seen::default();
        // The first send applied, but the server failed before answering;
        // the re-send finds it applied.
        let addr = scripted(&seen, |_, k, _| match k {
            0 => Answer::Fail("internal"),
            1 => Answer::Dup(15.into()),
            _ => Answer::Ok(20.into()),
        })
        .await;
        let mut rankd = retrying(addr, quick(3));
        assert_eq!(rankd.set("b", "p", 5, Mode::Incr).await.unwrap(), Written { value: 15, dup: true });
        assert_eq!(rankd.set("b", "p", 5, Mode::Incr).await.unwrap(), Written { value: 20, dup: false });
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 0, 0], "on the same connection");
        assert_eq!(seen[0].1, seen[1].1, "with the same wid");
        assert_ne!(seen[1].1, seen[2].1);
        assert_eq!((rankd.retried(), rankd.connects()), (1, 1));
    }

    #[tokio::test]
    async fn shed_writes_are_retried_refused_ones_are_not() {
        let seen = Seen::default();
        let addr = scripted(&seen, |_, k, _| match k {
            0 => Answer::Fail("overloaded"),
            1 => Answer::Ok(3.into()),
            _ => Answer::Fail("bad_request"),
        })
        .await;
        let mut rankd = RetryingClient::connect_with(&addr, &ConnectOptions::default(), quick(2)).await.unwrap();
        assert_eq!(rankd.set("b", "p", 3, Mode::Set).await.unwrap().value, 3);
        let error = rankd.set("b", "p", 3, Mode::Set).await.unwrap_err();
        assert!(
            matches!(&error, ClientError::Server { code, .. } if code == "bad_request"),
            "final, as it is: {error}"
        );
        assert_eq!((seen.lock().unwrap().len(), rankd.retried(), rankd.connects()), (3, 1, 1));
    }

    #[tokio::test]
    async fn overloaded_forever_gives_up_within_its_retries_with_the_wid() {
        let seen = Seen::default();
        let addr = always("overloaded", &seen).await;
        let mut rankd = retrying(addr, quick(2));
        let error = rankd.set("b", "p", 1, Mode::Incr).await.unwrap_err();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "the first send and 2 re-sends");
        assert!(seen.iter().all(|(n, wid)| *n == 0 && *wid == seen[0].1), "{seen:?}");
        let ClientError::MaybeApplied { wid, sends, last } = &error else { panic!("{error:?}") };
        assert_eq!((wid.as_str(), *sends), (seen[0].1.as_str(), 3));
        assert_eq!(last.error_code(), Some(ErrorCode::Overloaded));
        assert_eq!((error.wid(), error.error_code()), (Some(wid.as_str()), Some(ErrorCode::Overloaded)));
        assert_eq!(rankd.retried(), 2);
    }

    #[tokio::test]
    async fn the_deadline_stops_retries_with_retries_left() {
        let seen = Seen::default();
        let addr = always("overloaded", &seen).await;
        let deadline = Duration::from_millis(200);
        let policy = RetryPolicy {
            retries: 1000,
            backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(20),
            deadline,
            ..quick(0)
        };
        let mut rankd = retrying(addr, policy);
        let started = std::time::Instant::now();
        let error = rankd.set("b", "p", 1, Mode::Incr).await.unwrap_err();
        let took = started.elapsed();
        let sends = seen.lock().unwrap().len();
        // Each pause is 10 to 20 ms: at most 20 re-sends fit in 200 ms.
        assert!((2..=21).contains(&sends), "{sends} sends");
        assert!(matches!(error, ClientError::MaybeApplied { sends: s, .. } if s as usize == sends));
        assert_eq!(rankd.retried() as usize, sends - 1);
        assert!(took < deadline + Duration::from_secs(1), "took {took:?}");
    }

    #[tokio::test]
    async fn a_result_of_the_wrong_shape_is_not_sent_again_but_names_the_wid() {
        let seen = Seen::default();
        let addr = scripted(&seen, |_, _, _| Answer::Ok(5.into())).await; // applied: the new score
        let mut rankd = retrying(addr, quick(3));
        let error = rankd.write::<bool>(set_call("b", "p", 5, Mode::Incr)).await.unwrap_err();
        let ClientError::MaybeApplied { sends: 1, last, wid } = &error else { panic!("{error:?}") };
        assert!(matches!(&**last, ClientError::Protocol(_)), "{last:?}");
        let seen = seen.lock().unwrap().clone();
        assert_eq!((seen.len(), &seen[0].1), (1, wid), "sent once, with the wid reported");
    }

    #[tokio::test]
    async fn a_protocol_violation_is_not_sent_again_but_names_the_wid() {
        let seen = Seen::default();
        let addr = scripted(&seen, |_, _, _| Answer::WrongId(1.into())).await;
        let mut rankd = retrying(addr, quick(3));
        let error = rankd.set("b", "p", 1, Mode::Incr).await.unwrap_err();
        let ClientError::MaybeApplied { sends: 1, last, .. } = &error else { panic!("{error:?}") };
        assert!(matches!(&**last, ClientError::Protocol(why) if why.contains("reply id")), "{last:?}");
        assert_eq!((seen.lock().unwrap().len(), rankd.retried()), (1, 0));
    }

    #[tokio::test]
    async fn a_write_over_max_frame_is_refused_unsent_and_the_connection_stays_usable() {
        let seen = Seen::default();
        let addr = scripted(&seen, |_, _, _| Answer::Ok(Value::Array(vec![7.into()]))).await;
        let mut rankd = retrying(addr, quick(3));
        // 2 MiB of entries: twice the default max frame.
        let names: Vec<String> = (0..2048).map(|i| format!("{i:04}{}", "x".repeat(1020))).collect();
        let entries: Vec<(&str, i64)> = names.iter().map(|name| (name.as_str(), 1)).collect();
        let error = rankd.set_many("b", &entries, Mode::Set).await.unwrap_err();
        assert_eq!(error.error_code(), Some(ErrorCode::TooLarge), "{error:?}");
        assert!(error.to_string().contains("not sent"), "{error}");
        assert!(seen.lock().unwrap().is_empty(), "nothing reached the server");
        assert_eq!(rankd.retried(), 0);
        let written = rankd.set_many("b", &[("p", 7)], Mode::Set).await.unwrap();
        assert_eq!(written.value, [7]);
        assert_eq!((seen.lock().unwrap().len(), rankd.connects()), (1, 1), "on the same connection");
    }

    /// A write that fits with its first send's short id, but not with the
    /// longest id a re-send may carry, is refused before it is sent: a
    /// re-send after a send that may have applied must never be refused.
    #[tokio::test]
    async fn a_write_that_fits_only_with_a_short_id_is_refused_before_it_is_sent() {
        let seen = Seen::default();
        let addr = always("internal", &seen).await;
        let call = set_call("b", "p", 1, Mode::Incr).with("wid", "w");
        let size = |id| {
            let mut out = Vec::new();
            call.encode(id, &mut out);
            out.len() - 4
        };
        assert_eq!(size(u64::MAX) - size(1), 8);
        let options = ConnectOptions { max_frame: size(1), ..ConnectOptions::default() };
        let mut rankd = RetryingClient::new(addr.clone(), options, quick(3)).unwrap();
        let error = rankd.write_with_wid::<i64>(set_call("b", "p", 1, Mode::Incr), "w").await.unwrap_err();
        assert_eq!(error.error_code(), Some(ErrorCode::TooLarge), "{error:?}");
        assert!(seen.lock().unwrap().is_empty(), "nothing reached the server");
        let options = ConnectOptions { max_frame: size(u64::MAX), ..ConnectOptions::default() };
        let mut rankd = RetryingClient::new(addr, options, quick(1)).unwrap();
        let error = rankd.write_with_wid::<i64>(set_call("b", "p", 1, Mode::Incr), "w").await.unwrap_err();
        assert!(matches!(&error, ClientError::MaybeApplied { sends: 2, .. }), "sent, then sent again: {error:?}");
    }

    #[tokio::test]
    async fn a_read_goes_once_more_after_its_connection_broke() {
        let seen = Seen::default();
        // The first connection closes on the read; the second answers.
        let addr = scripted(&seen, |n, _, _| if n == 0 { Answer::Close } else { Answer::Ok(3.into()) }).await;
        let mut rankd = retrying(addr, quick(3));
        assert_eq!(rankd.read(async |c| c.count("b").await).await.unwrap(), 3);
        assert_eq!((seen.lock().unwrap().len(), rankd.retried(), rankd.connects()), (2, 1, 2));
        assert_eq!(rankd.read(async |c| c.count("b").await).await.unwrap(), 3, "on the same connection");
        assert_eq!(rankd.connects(), 2);
    }

    #[tokio::test]
    async fn a_read_goes_once_more_only() {
        let seen = Seen::default();
        let addr = scripted(&seen, |_, _, _| Answer::Close).await;
        let mut rankd = retrying(addr, quick(3));
        let error = rankd.read(async |c| c.count("b").await).await.unwrap_err();
        assert!(matches!(&error, ClientError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof), "{error:?}");
        assert_eq!((seen.lock().unwrap().len(), rankd.retried()), (2, 1));
    }

    #[tokio::test]
    async fn a_read_is_not_sent_again_after_its_own_timeout_or_an_error_answer() {
        let seen = Seen::default();
        let addr = scripted(&seen, |_, _, _| Answer::Hang).await;
        let mut rankd = retrying(addr, RetryPolicy { timeout: Duration::from_millis(100), ..quick(3) });
        let error = rankd.read(async |c| c.count("b").await).await.unwrap_err();
        assert!(matches!(&error, ClientError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut), "{error:?}");
        assert_eq!((seen.lock().unwrap().len(), rankd.retried()), (1, 0));
        for code in ["overloaded", "internal"] {
            let seen = Seen::default();
            let mut rankd = retrying(always(code, &seen).await, quick(3));
            let error = rankd.read(async |c| c.count("b").await).await.unwrap_err();
            assert_eq!(error.code(), Some(code));
            assert_eq!((seen.lock().unwrap().len(), rankd.retried(), rankd.connects()), (1, 0, 1), "kept: {code}");
        }
    }

    #[tokio::test]
    async fn gives_up_after_its_retries() {
        let seen = Seen::default();
        let addr = scripted(&seen, |_, _, _| Answer::Hang).await;
        let policy = RetryPolicy { timeout: Duration::from_millis(100), ..quick(2) };
        let mut rankd = retrying(addr, policy);
        let error = rankd.set("b", "p", 1, Mode::Incr).await.unwrap_err();
        let ClientError::MaybeApplied { sends: 3, last, .. } = &error else { panic!("{error:?}") };
        assert!(matches!(&**last, ClientError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut), "{error}");
        assert_eq!(seen.lock().unwrap().len(), 3);
        let bad = rankd.write_with_wid::<i64>(set_call("b", "p", 1, Mode::Set), &"x".repeat(MAX_WID + 1)).await;
        assert!(matches!(bad, Err(ClientError::Encode(_))));
    }

    #[tokio::test]
    async fn an_unreachable_server_is_retried_then_reported() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let mut rankd = retrying(addr, quick(2));
        // Never sent: no wid to carry, the connection's error alone.
        assert!(matches!(rankd.set("b", "p", 1, Mode::Set).await, Err(ClientError::Io(_))));
        assert_eq!((rankd.retried(), rankd.connects()), (2, 0));
    }
}
