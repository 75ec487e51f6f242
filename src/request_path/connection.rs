//! One client connection: reads pipelined frames, hands everything decoded
//! so far to the router as ONE batch, and writes the replies back in request
//! order as batches complete.
//!
//! Batching: a client that pipelines sends many frames per TCP read; the
//! connection decodes all of them and dispatches them together, so routing,
//! the shard mailboxes and thread wake-ups are paid per batch, not per
//! request.
//!
//! Ordering: requests reach the router in the order sent. Multi-step reads
//! (`rank`, `ranks`, `top`, `around`; `rank_of_score`, which on a dense
//! board reads after a round) send later rounds after earlier ones return, so a
//! write sent *after* such a read waits until the read is answered; that
//! keeps "requests on one connection take effect in the order they were sent"
//! without serialising ordinary pipelines.
//!
//! Bounds: at most `max_inflight` requests per connection are in flight, and
//! at most [`REPLY_ROWS_PER_REQUEST`] times as many reply rows (list
//! entries); past either the server stops reading and TCP pushes back on
//! the client, so a client that pipelines without reading replies holds at
//! most that many requests and their replies. A frame over `max_frame` is
//! refused before its body is read. A connection idle (nothing in flight,
//! nothing sent) or not reading its replies for `idle_timeout` is closed.
//!
//! Auth: with tokens configured, every op but `ping` and `auth` is answered
//! `unauthorized` until `auth` succeeds on the connection, and writes too
//! under a `read` token; the third failed `auth` is answered and the
//! connection closed (the rules: `security::access`). Tokens are compared in
//! constant time and never logged.
//!
//! Watches: `watch` and `unwatch` are answered here (`watches::WatchSession`);
//! pushes are written between replies, each only after its watch's response,
//! and a connection with watches open is never closed as idle.
//!
//! Backups: `backup` ends the connection's reading; once everything before
//! it is answered, the connection streams the backup (`super::backup`) and
//! closes.
//!
//! Transport: plain TCP or TLS; the connection only sees a reader and a
//! writer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::error::Error;
use crate::operations::metrics::Metrics;
use crate::protocol::request::{parse, Rejected, Request, WatchSpec};
use crate::protocol::{encode_error, encode_reply, Op, Reply};
use crate::request_path::router::{BatchReplies, Router};
use crate::request_path::transmit;
use crate::security::access::Denied;
use crate::security::{Access, AuthOutcome, Tokens};
use crate::watches::{PushBox, WatchHub, WatchSession};
use rankd_client::frame::{FrameError, FrameReader};
use rankd_client::OpKind;

/// Reply rows (list entries) a connection's requests in flight may hold on
/// average, per request of `max_inflight`: 4096 pipelined `rank`s still
/// fit, 4096 `top`s of 1000 rows (a thousand from each shard, each, until
/// read) do not, and wait for the client to read.
pub const REPLY_ROWS_PER_REQUEST: usize = 16;

/// The longest a connection's close (over TLS, its close_notify) may wait
/// for the client to make room in the socket.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Per-connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest frame body accepted.
    pub max_frame: usize,
    /// Requests in flight before reading pauses.
    pub max_inflight: usize,
    /// A connection with nothing in flight that sends nothing this long is
    /// closed (half-open and abandoned clients).
    pub idle_timeout: Duration,
}

/// What every connection shares with the rest of the server.
pub struct Shared {
    /// The tokens clients may present.
    pub tokens: Arc<Tokens>,
    /// Where each request's outcome and latency are counted.
    pub metrics: Arc<Metrics>,
    /// Where watches are opened.
    pub watches: Arc<WatchHub>,
}

/// A dispatched batch once answered: its encoded replies, how many
/// requests it held, and whether it held a multi-step read.
struct Done {
    /// The framed replies, in request order, to append to the next write.
    bytes: Vec<u8>,
    /// Requests the batch held, to take off `Connection::inflight_requests`.
    requests: usize,
    /// Reply rows they may hold, to take off `Connection::held_rows`.
    rows: usize,
    /// Whether it held a multi-step read, to take off
    /// `Connection::multi_outstanding`.
    multi: bool,
    /// Watches opened by the batch: once its replies are written, their
    /// pushes may follow.
    opened: Vec<u64>,
}
type InFlight = Pin<Box<dyn Future<Output = Done>>>;

/// A dispatched batch waiting for its replies: what encoding them needs.
struct Answering {
    /// Each request's id and how its reply comes, in order.
    slots: Vec<(u64, Slot)>,
    /// When the batch was dispatched, for the latency histograms.
    started: Instant,
    /// Reply rows its requests may hold.
    rows: usize,
    /// Whether it held a multi-step read.
    multi: bool,
    metrics: Arc<Metrics>,
}

impl Answering {
    /// The batch answered: `replies` are the router's, in order, one for
    /// each routed slot.
    fn done(self, replies: Vec<Result<Reply, Error>>) -> Done {
        let Self { slots, started, rows, multi, metrics } = self;
        let mut replies = replies.into_iter();
        let elapsed = started.elapsed();
        let requests = slots.len();
        let mut out = Vec::with_capacity(requests * 48);
        let mut opened = Vec::new();
        for (id, slot) in slots {
            let (op, result) = match slot {
                Slot::Routed(op) => {
                    (Some(op), replies.next().unwrap_or_else(|| Err(Error::Internal("router stopped".into()))))
                }
                Slot::Rejected(Rejected { op, error, .. }) => (op, Err(error)),
                Slot::Answered(op, result) => (Some(op), result),
            };
            let outcome = match result {
                Ok(reply) => {
                    match &reply {
                        Reply::Watch { watch } => opened.push(*watch),
                        Reply::Replayed(_) => metrics.watches.dedup_hits.inc(),
                        _ => {}
                    }
                    encode_reply(&mut out, id, &reply);
                    Ok(())
                }
                Err(error) => {
                    encode_error(&mut out, id, &error);
                    Err(error.code())
                }
            };
            if metrics.hot_path {
                metrics.op(op).finish(outcome, elapsed);
            }
        }
        Done { bytes: out, requests, rows, multi, opened }
    }
}

/// The answer to an op the connection's standing does not allow.
fn unauthorized(denied: Denied) -> Error {
    Error::Unauthorized(match denied {
        Denied::NotAuthenticated => "authenticate with `auth` first",
        Denied::ReadOnly => "this token may only read",
    })
}

/// Reads that take several rounds of shard messages, or (`rank_of_score`
/// on a dense board, which the connection cannot tell apart) read the
/// shared distinct-score index after a round: a write sent after them must
/// not be routed before they are answered, or they could see it.
fn is_multi_step(op: &Op) -> bool {
    matches!(op, Op::Rank { .. } | Op::Ranks { .. } | Op::Top { .. } | Op::Around { .. } | Op::RankOfScore { .. })
}

/// One decoded frame: a request, the error to answer in its place, or an
/// answer the connection gives itself (`auth`, `unauthorized`).
enum Decoded {
    Request(Request),
    Invalid(Rejected),
    Answered(u64, OpKind, Result<Reply, Error>),
    /// A permitted `backup`, streamed once all before it is answered.
    Backup(u64),
    /// A permitted `watch` or `unwatch`, which takes effect once everything
    /// sent before it is routed: a watch's first look then sees a write
    /// pipelined ahead of it that waited behind a multi-step read.
    Watching(u64, WatchChange),
}

/// What a `watch` or `unwatch` does to the connection's watches.
enum WatchChange {
    Open(WatchSpec),
    Close(u64),
}

/// How one slot of a dispatched batch gets its reply.
enum Slot {
    /// From the router, in order.
    Routed(OpKind),
    /// Rejected while decoding.
    Rejected(Rejected),
    /// Answered by the connection.
    Answered(OpKind, Result<Reply, Error>),
}

struct Connection {
    /// Where every decoded request goes, in the order sent: this I/O
    /// thread's router.
    router: Arc<Router>,
    /// Where each request's outcome and latency are counted.
    metrics: Arc<Metrics>,
    /// Dispatched batches, answered in the order they were sent.
    inflight: FuturesOrdered<InFlight>,
    /// Batches answered when they were routed, in order, to be written
    /// before anything in `inflight` (they only come while it is empty).
    answered: Vec<Done>,
    /// Requests dispatched and not yet answered.
    inflight_requests: usize,
    /// Reply rows the requests read and not yet answered may hold (see
    /// [`REPLY_ROWS_PER_REQUEST`]).
    held_rows: usize,
    /// Dispatched batches holding a multi-step read, not yet answered.
    multi_outstanding: usize,
    /// Decoded but not dispatched yet, in order.
    pending: Vec<Decoded>,
    /// What this connection may do, as its `auth`s decided.
    access: Access,
    /// An `auth` failed once too often: answer what was read, then close.
    locked_out: bool,
    /// A request that counts as activity ([`Access::keeps_alive`]) was read
    /// since the idle deadline was last moved.
    heard: bool,
    /// Where watches are opened.
    hub: Arc<WatchHub>,
    /// The connection's watches, from its first `watch` on.
    watching: Option<WatchSession>,
}

impl Connection {
    /// Keeps `decoded` until it is dispatched, its reply rows counted from
    /// now.
    fn hold(&mut self, decoded: Decoded) {
        if let Decoded::Request(request) = &decoded {
            self.held_rows += request.op.reply_rows();
        }
        self.pending.push(decoded);
    }

    /// Whether more requests may be read: fewer than `max_inflight` read
    /// and unanswered, holding fewer reply rows than their bound.
    fn has_room(&self, limits: &Limits) -> bool {
        self.inflight_requests + self.pending.len() < limits.max_inflight
            && self.held_rows < limits.max_inflight.saturating_mul(REPLY_ROWS_PER_REQUEST)
    }

    /// Admits a decoded request: `auth` is answered here, and ops the
    /// connection's standing does not allow are answered `unauthorized`.
    fn admit(&mut self, request: Request) -> Decoded {
        if let Op::Auth { token } = &request.op {
            let result = match self.access.auth(&token.0) {
                AuthOutcome::Accepted => Ok(Reply::Bool(true)),
                AuthOutcome::AcceptedAs(role) => Ok(Reply::Role { role }),
                AuthOutcome::Refused { close } => {
                    self.metrics.security.auth_failures.inc();
                    self.locked_out |= close;
                    Err(Error::Unauthorized(if close {
                        "wrong token; too many failed `auth`s, closing the connection"
                    } else {
                        "wrong token"
                    }))
                }
            };
            return Decoded::Answered(request.id, OpKind::Auth, result);
        }
        match self.access.permits(request.op.kind()) {
            Ok(()) => match request.op {
                Op::Watch(spec) => Decoded::Watching(request.id, WatchChange::Open(spec)),
                Op::Unwatch { watch } => Decoded::Watching(request.id, WatchChange::Close(watch)),
                Op::Backup => Decoded::Backup(request.id),
                _ => Decoded::Request(request),
            },
            Err(denied) => Decoded::Answered(request.id, request.op.kind(), Err(unauthorized(denied))),
        }
    }

    /// A frame that is not a valid request, answered as far as the
    /// connection's standing allows (see [`Access::explains_unreadable`]).
    fn reject(&self, rejected: Rejected) -> Decoded {
        match self.access.explains_unreadable(rejected.op) {
            Ok(()) => Decoded::Invalid(rejected),
            Err(denied) => Decoded::Invalid(Rejected { error: unauthorized(denied), ..rejected }),
        }
    }

    /// Sends the decoded requests to the router as batches. A batch ends
    /// before a write that follows a multi-step read (in the batch or still
    /// in flight); that write stays pending until those reads are answered.
    fn dispatch_pending(&mut self) {
        // Called after every write of replies, nearly always with nothing
        // held back: the buffer is kept rather than taken and dropped.
        if self.pending.is_empty() {
            return;
        }
        let mut rest = std::mem::take(&mut self.pending).into_iter().peekable();
        loop {
            let mut batch: Vec<Decoded> = Vec::new();
            let mut has_multi = false;
            while let Some(next) = rest.peek() {
                if let Decoded::Request(request) = next {
                    if request.op.is_write() && (has_multi || self.multi_outstanding > 0) {
                        break;
                    }
                    has_multi |= is_multi_step(&request.op);
                }
                batch.extend(rest.next());
            }
            if batch.is_empty() {
                break;
            }
            self.dispatch(batch, has_multi);
        }
        self.pending = rest.collect();
    }

    fn dispatch(&mut self, batch: Vec<Decoded>, has_multi: bool) {
        let started = Instant::now();
        let count = batch.len();
        let mut slots: Vec<(u64, Slot)> = Vec::with_capacity(count);
        let mut ops = Vec::with_capacity(count);
        let mut rows = 0;
        let mut watch_changes = Vec::new();
        for decoded in batch {
            match decoded {
                Decoded::Request(Request { id, op }) => {
                    slots.push((id, Slot::Routed(op.kind())));
                    rows += op.reply_rows();
                    ops.push(op);
                }
                Decoded::Invalid(rejected) => slots.push((rejected.id, Slot::Rejected(rejected))),
                Decoded::Answered(id, name, result) => slots.push((id, Slot::Answered(name, result))),
                Decoded::Backup(id) => {
                    let refused = Err(Error::Internal("a backup was queued as a request".into()));
                    slots.push((id, Slot::Answered(OpKind::Backup, refused)));
                }
                Decoded::Watching(id, change) => {
                    // Its answer is set once the batch is routed.
                    watch_changes.push((slots.len(), change));
                    slots.push((id, Slot::Answered(OpKind::Watch, Err(Error::Internal("unanswered".into())))));
                }
            }
        }
        let alone = self.inflight_requests == 0;
        // Routed, and queued for the shards, now: in the order sent.
        let replies =
            if ops.is_empty() { BatchReplies::Ready(Vec::new()) } else { self.router.dispatch_batch(ops, alone) };
        // Then the watches change, behind every request routed before them.
        for (at, change) in watch_changes {
            slots[at].1 = self.change_watches(change);
        }
        if has_multi {
            self.multi_outstanding += 1;
        }
        self.inflight_requests += count;
        let batch = Answering { slots, started, rows, multi: has_multi, metrics: self.metrics.clone() };
        match replies {
            // Nothing before it still to come: written with what is
            // answered already, without a future to poll.
            BatchReplies::Ready(replies) if self.inflight.is_empty() => self.answered.push(batch.done(replies)),
            replies => self.inflight.push_back(Box::pin(async move { batch.done(replies.all().await) })),
        }
    }

    /// Opens or closes a watch; its answer.
    fn change_watches(&mut self, change: WatchChange) -> Slot {
        match change {
            WatchChange::Open(spec) => {
                let hub = &self.hub;
                let session = self.watching.get_or_insert_with(|| WatchSession::new(hub.clone()));
                Slot::Answered(OpKind::Watch, session.open(spec).map(|watch| Reply::Watch { watch }))
            }
            WatchChange::Close(watch) => {
                let closed = self.watching.as_mut().is_some_and(|session| session.close(watch));
                Slot::Answered(OpKind::Unwatch, Ok(Reply::Bool(closed)))
            }
        }
    }

    /// Appends the replies of every batch answered so far to `out`, in
    /// order, and dispatches what they held back, until nothing more is
    /// answered at once.
    fn collect_answered(&mut self, out: &mut Vec<u8>) {
        loop {
            for done in std::mem::take(&mut self.answered) {
                out.extend_from_slice(&done.bytes);
                self.finished(&done);
            }
            // Batch every reply that is already done into one write (a lone
            // request answered while routed has none in flight: the poll,
            // which registers a waker, is skipped).
            while !self.inflight.is_empty() {
                let Some(Some(done)) = self.inflight.next().now_or_never() else { break };
                out.extend_from_slice(&done.bytes);
                self.finished(&done);
            }
            self.dispatch_pending();
            if self.answered.is_empty() {
                return;
            }
        }
    }

    /// Takes an answered batch off the books (its replies are about to be
    /// written: pushes of the watches it opened may follow them).
    fn finished(&mut self, done: &Done) {
        self.inflight_requests -= done.requests;
        self.held_rows -= done.rows;
        if done.multi {
            self.multi_outstanding -= 1;
        }
        if let Some(session) = &mut self.watching {
            done.opened.iter().for_each(|watch| session.announce(*watch));
        }
    }

    /// The connection ends with requests unanswered (its client left, or
    /// stopped reading): they are counted as abandoned, not lost from the
    /// metrics, and so are the bytes read since the last reply.
    fn abandon(&self, received: u64) {
        let unanswered = self.inflight_requests + self.pending.len();
        self.metrics.requests_abandoned.inc_by(unanswered as u64);
        self.metrics.received_bytes.inc_by(received);
    }

    /// Appends the pushes that may be written now to `out`.
    fn take_pushes(&mut self, out: &mut Vec<u8>) {
        if let Some(session) = &mut self.watching {
            out.extend_from_slice(&session.take_pushes().bytes);
        }
    }

    /// Whether the connection has watches open: it waits for pushes then,
    /// and is never closed as idle.
    fn is_watching(&self) -> bool {
        self.watching.as_ref().is_some_and(WatchSession::is_watching)
    }
}

/// Serves one connection (the two halves of its stream, plain or TLS)
/// until the client closes it, a fatal frame error, a lock-out, or shutdown
/// (which stops reading but still answers what was read).
pub async fn serve<R, W>(
    (read_half, write_half): (R, W),
    router: Arc<Router>,
    limits: Limits,
    shared: Shared,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let metrics = shared.metrics.clone();
    metrics.connections_accepted.inc();
    metrics.connections_open.inc();
    serve_inner(read_half, write_half, router, limits, shared, &mut shutdown).await;
    metrics.connections_open.dec();
}

/// Writes every answered batch's replies (see
/// [`Connection::collect_answered`]) and the pushes that may follow them,
/// counting the bytes both ways; false if the client stopped reading.
async fn write_answered<W: AsyncWrite + Unpin>(
    conn: &mut Connection,
    out: &mut Vec<u8>,
    write_half: &mut W,
    received: &mut u64,
    timeout: Duration,
) -> bool {
    conn.collect_answered(out);
    conn.take_pushes(out);
    conn.metrics.received_bytes.inc_by(std::mem::take(received));
    conn.metrics.sent_bytes.inc_by(out.len() as u64);
    // A client that stops reading cannot hold the task forever.
    let sent = transmit::send(write_half, out, timeout).await;
    out.clear();
    sent
}

/// Resolves when `pushes` has something new; never without a box.
async fn pushed(pushes: Option<&PushBox>) {
    match pushes {
        Some(pushes) => pushes.ready().await,
        None => std::future::pending().await,
    }
}

/// Answers a connection over the limit with one `overloaded` error, then
/// closes it.
pub async fn refuse<S: AsyncWrite + Unpin>(mut stream: S, metrics: Arc<Metrics>) {
    metrics.connections_refused.inc();
    let mut out = Vec::new();
    encode_error(&mut out, 0, &Error::Overloaded("too many connections; retry later".into()));
    transmit::send(&mut stream, &out, Duration::from_secs(1)).await;
    let _ = stream.shutdown().await;
}

async fn serve_inner<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    read_half: R,
    mut write_half: W,
    router: Arc<Router>,
    limits: Limits,
    Shared { tokens, metrics, watches }: Shared,
    shutdown: &mut watch::Receiver<bool>,
) {
    let mut frames = FrameReader::new(read_half, limits.max_frame);
    let mut conn = Connection {
        router,
        metrics: metrics.clone(),
        inflight: FuturesOrdered::new(),
        answered: Vec::new(),
        inflight_requests: 0,
        held_rows: 0,
        multi_outstanding: 0,
        pending: Vec::new(),
        access: Access::new(tokens),
        locked_out: false,
        heard: false,
        hub: watches,
        watching: None,
    };
    let mut backup = None;
    let mut closing = *shutdown.borrow();
    // The idle timer and the shutdown signal live across the loop's turns:
    // made anew each turn, they were a timer registration and a waiter
    // queued and dropped per request. The timer is armed for the deadline
    // at the time; when it fires, a deadline moved on by reads re-arms it.
    let mut idle_deadline = tokio::time::Instant::now() + limits.idle_timeout;
    let mut idle = std::pin::pin!(tokio::time::sleep_until(idle_deadline));
    let mut signal = shutdown.clone();
    let mut shutdown_signal = std::pin::pin!(async move { signal.changed().await });
    // Received bytes are added to the metric once per reply write, not per frame.
    let mut received = 0u64;
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        if closing && conn.inflight.is_empty() && conn.pending.is_empty() {
            break;
        }
        let can_read = !closing && conn.pending.is_empty() && conn.has_room(&limits);
        let pushes = conn.watching.as_ref().map(WatchSession::pushes);
        let watching = conn.is_watching() && !closing;
        tokio::select! {
            biased;
            Some(done) = conn.inflight.next(), if !conn.inflight.is_empty() => {
                conn.answered.push(done);
                if !write_answered(&mut conn, &mut out, &mut write_half, &mut received, limits.idle_timeout).await {
                    return conn.abandon(received);
                }
            }
            frame = frames.next_frame(), if can_read => {
                // Decode this frame and every complete one already buffered.
                let mut frame = frame;
                loop {
                    match frame {
                        Ok(Some(body)) => {
                            received += body.len() as u64 + 4;
                            let parsed = parse(&body);
                            let op = parsed.as_ref().map_or_else(|rejected| rejected.op, |request| Some(request.op.kind()));
                            conn.heard |= conn.access.keeps_alive(op);
                            match parsed.map(|request| conn.admit(request)) {
                                // Nothing after it is read.
                                Ok(Decoded::Backup(id)) => (backup, closing) = (Some(id), true),
                                Ok(decoded) => conn.hold(decoded),
                                Err(rejected) => conn.pending.push(conn.reject(rejected)),
                            }
                        }
                        Ok(None) => closing = true,
                        Err(FrameError::Empty) => {
                            conn.pending.push(Decoded::Invalid(Rejected {
                                id: 0,
                                op: None,
                                error: Error::BadFrame("empty frame".into()),
                            }));
                        }
                        Err(error @ FrameError::TooLarge { .. }) => {
                            conn.pending.push(Decoded::Invalid(Rejected {
                                id: 0,
                                op: None,
                                error: Error::TooLarge(error.to_string()),
                            }));
                            closing = true;
                        }
                        Err(FrameError::Truncated | FrameError::Io(_)) => return conn.abandon(received),
                    }
                    // Nothing after the last permitted failed `auth` is read.
                    closing |= conn.locked_out;
                    if closing || !conn.has_room(&limits) || !frames.has_buffered_frame() {
                        break;
                    }
                    frame = frames.next_frame().await;
                }
                conn.dispatch_pending();
                if std::mem::take(&mut conn.heard) {
                    idle_deadline = tokio::time::Instant::now() + limits.idle_timeout;
                }
                // Answered while routed (a lone rank, in place): written now.
                if !conn.answered.is_empty()
                    && !write_answered(&mut conn, &mut out, &mut write_half, &mut received, limits.idle_timeout).await
                {
                    return conn.abandon(received);
                }
            },
            () = pushed(pushes.as_deref()), if watching => {
                conn.take_pushes(&mut out);
                if !out.is_empty() {
                    metrics.sent_bytes.inc_by(out.len() as u64);
                    if !transmit::send(&mut write_half, &out, limits.idle_timeout).await {
                        return conn.abandon(received);
                    }
                    out.clear();
                }
            }
            _ = &mut shutdown_signal, if !closing => closing = true,
            () = &mut idle, if conn.inflight.is_empty() && conn.pending.is_empty() && !watching => {
                if tokio::time::Instant::now() < idle_deadline {
                    idle.as_mut().reset(idle_deadline);
                    continue;
                }
                // Nothing owed to the client and nothing heard from it.
                break;
            }
            else => break,
        }
    }
    if let Some(id) = backup {
        if *shutdown.borrow() {
            let mut out = Vec::new();
            encode_error(
                &mut out,
                id,
                &Error::Overloaded("the server is shutting down; back up again after it restarts".into()),
            );
            transmit::send(&mut write_half, &out, limits.idle_timeout).await;
        } else {
            super::backup::stream(&mut write_half, id, &conn.router, metrics, limits.idle_timeout, shutdown).await;
        }
    }
    // A client that stopped reading (a stalled backup, say) leaves the socket
    // full, and TLS's close_notify would wait for it forever, holding the
    // connection's slot.
    let _ = tokio::time::timeout(limits.idle_timeout.min(CLOSE_TIMEOUT), write_half.shutdown()).await;
}
