//! One client connection: reads pipelined frames, dispatches each request to
//! the router as soon as it is decoded, and writes the replies back in
//! request order as they complete.
//!
//! Ordering: requests reach the router in the order sent. Multi-step reads
//! (`rank`, `top`, `around`) send later rounds after earlier ones return, so a
//! write sent *after* such a read is held back until the read is done; that
//! keeps "requests on one connection take effect in the order they were sent"
//! without serialising ordinary pipelines.
//!
//! Bounds: at most `max_inflight` requests per connection are in flight; past
//! that the server stops reading and TCP pushes back on the client. A frame
//! over `max_frame` is refused before its body is read.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use actix::Addr;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::error::Error;
use crate::metrics::Metrics;
use crate::protocol::request::{parse, Request};
use crate::protocol::{encode_error, encode_reply, FrameError, FrameReader, Op};
use crate::router::{Dispatch, Router};

/// Per-connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest frame body accepted.
    pub max_frame: usize,
    /// Requests in flight before reading pauses.
    pub max_inflight: usize,
}

/// An encoded reply, and whether it finished a multi-step read.
type Done = (Vec<u8>, bool);
type InFlight = Pin<Box<dyn Future<Output = Done>>>;

/// Reads that take several rounds of shard messages.
fn is_multi_step(op: &Op) -> bool {
    matches!(op, Op::Rank { .. } | Op::Top { .. } | Op::Around { .. })
}

fn ready_error(id: u64, error: Error, metrics: &Metrics) -> InFlight {
    metrics.undecodable.finish(error.code(), std::time::Duration::ZERO);
    let mut out = Vec::new();
    encode_error(&mut out, id, &error);
    Box::pin(std::future::ready((out, false)))
}

struct Connection {
    router: Addr<Router>,
    metrics: Arc<Metrics>,
    inflight: FuturesOrdered<InFlight>,
    multi_outstanding: usize,
    /// A write waiting for earlier multi-step reads to finish.
    held: Option<Request>,
}

impl Connection {
    fn dispatch(&mut self, request: Request) {
        let Request { id, op } = request;
        let multi = is_multi_step(&op);
        let (started, metrics, name) = (Instant::now(), self.metrics.clone(), op.name());
        // `send` enqueues into the router's mailbox now, preserving order.
        let reply = self.router.send(Dispatch(op));
        if multi {
            self.multi_outstanding += 1;
        }
        self.inflight.push_back(Box::pin(async move {
            let result = reply.await.unwrap_or_else(|_| Err(Error::Internal("router stopped".into())));
            let mut out = Vec::with_capacity(64);
            let outcome = match result {
                Ok(reply) => {
                    encode_reply(&mut out, id, &reply);
                    "ok"
                }
                Err(error) => {
                    encode_error(&mut out, id, &error);
                    error.code()
                }
            };
            metrics.op(name).finish(outcome, started.elapsed());
            (out, multi)
        }));
    }

    fn accept(&mut self, request: Request) {
        if request.op.is_write() && self.multi_outstanding > 0 {
            self.held = Some(request);
        } else {
            self.dispatch(request);
        }
    }

    fn finished(&mut self, multi: bool) {
        if multi {
            self.multi_outstanding -= 1;
        }
        if self.multi_outstanding == 0 {
            if let Some(request) = self.held.take() {
                self.dispatch(request);
            }
        }
    }
}

/// Serves one connection until the client closes it, a fatal frame error,
/// or shutdown (which stops reading but still answers what was read).
pub async fn serve(
    stream: TcpStream,
    router: Addr<Router>,
    limits: Limits,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    metrics.connections_accepted.inc();
    metrics.connections_open.inc();
    serve_inner(stream, router, limits, metrics.clone(), &mut shutdown).await;
    metrics.connections_open.dec();
}

async fn serve_inner(
    stream: TcpStream,
    router: Addr<Router>,
    limits: Limits,
    metrics: Arc<Metrics>,
    shutdown: &mut watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let (read_half, mut write_half) = stream.into_split();
    let mut frames = FrameReader::new(read_half, limits.max_frame);
    let mut conn = Connection {
        router,
        metrics: metrics.clone(),
        inflight: FuturesOrdered::new(),
        multi_outstanding: 0,
        held: None,
    };
    // Received bytes are added to the metric once per reply write, not per frame.
    let mut received = 0u64;
    let mut closing = *shutdown.borrow();
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        if closing && conn.inflight.is_empty() && conn.held.is_none() {
            break;
        }
        let can_read = !closing && conn.held.is_none() && conn.inflight.len() < limits.max_inflight;
        tokio::select! {
            biased;
            Some((bytes, multi)) = conn.inflight.next(), if !conn.inflight.is_empty() => {
                out.extend_from_slice(&bytes);
                conn.finished(multi);
                // Batch every reply that is already done into one write.
                while let Some(Some((bytes, multi))) = conn.inflight.next().now_or_never() {
                    out.extend_from_slice(&bytes);
                    conn.finished(multi);
                }
                metrics.received_bytes.inc_by(std::mem::take(&mut received));
                metrics.sent_bytes.inc_by(out.len() as u64);
                if write_half.write_all(&out).await.is_err() {
                    return;
                }
                out.clear();
            }
            frame = frames.next_frame(), if can_read => match frame {
                Ok(Some(body)) => {
                    received += body.len() as u64 + 4;
                    match parse(&body) {
                        Ok(request) => conn.accept(request),
                        Err((id, error)) => conn.inflight.push_back(ready_error(id, error, &metrics)),
                    }
                }
                Ok(None) => closing = true,
                Err(FrameError::Empty) => {
                    conn.inflight.push_back(ready_error(0, Error::BadFrame("empty frame".into()), &metrics));
                }
                Err(error @ FrameError::TooLarge { .. }) => {
                    conn.inflight.push_back(ready_error(0, Error::TooLarge(error.to_string()), &metrics));
                    closing = true;
                }
                Err(FrameError::Truncated | FrameError::Io(_)) => return,
            },
            _ = shutdown.changed(), if !closing => closing = true,
            else => break,
        }
    }
    let _ = write_half.shutdown().await;
}
