//! The I/O threads: each runs its own router and the client connections
//! handed to it, so reading, decoding, routing and writing replies are
//! spread over cores instead of all waiting for one thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::{Actor, Addr, Arbiter};

use crate::operations::metrics::Metrics;
use crate::request_path::router::{Router, RouterActor, RouterParts};
use crate::request_path::shard::link::Origin;
use crate::request_path::shard::{ReplyRelay, ShardLink};

/// One I/O thread: its arbiter and, once the shards run, its router (for
/// its connections) and the router's actor (for other threads).
struct IoThread {
    arbiter: Arbiter,
    router: Option<(Arc<Router>, Addr<RouterActor>)>,
}

/// Every I/O thread, and which one takes the next connection.
pub struct IoThreads {
    threads: Vec<IoThread>,
    /// Connections are dealt out in turn: they are long-lived, so turns
    /// spread them as well as the threads' load would.
    next: AtomicUsize,
}

impl IoThreads {
    /// Starts `count` threads, each with the relay its committed answers
    /// arrive on (returned, in thread order, for the shards' pipelines).
    pub fn start(count: usize, metrics: &Arc<Metrics>) -> (Self, Vec<ReplyRelay>) {
        let mut threads = Vec::with_capacity(count);
        let mut relays = Vec::with_capacity(count);
        for index in 0..count {
            let arbiter = Arbiter::new();
            let (relay, deliver) = ReplyRelay::new();
            let metrics = metrics.clone();
            arbiter.spawn_fn(move || {
                metrics.threads.register(&format!("io-{index}"));
                actix_rt::spawn(deliver);
            });
            threads.push(IoThread { arbiter, router: None });
            relays.push(relay);
        }
        (Self { threads, next: AtomicUsize::new(0) }, relays)
    }

    /// Starts each thread's router over the shards, reached from that
    /// thread, all sharing `parts`; `configure` may adjust each (tests).
    pub fn start_routers(&mut self, links: &[ShardLink], parts: &RouterParts, configure: impl Fn(Router) -> Router) {
        for (index, thread) in self.threads.iter_mut().enumerate() {
            let origin = Origin(u16::try_from(index).unwrap_or(u16::MAX));
            let links = links.iter().map(|link| link.from(origin)).collect();
            let router = Arc::new(configure(Router::new(links, parts.clone())));
            let shell = router.clone();
            let actor = RouterActor::start_in_arbiter(&thread.arbiter.handle(), move |_| RouterActor(shell));
            thread.router = Some((router, actor));
        }
    }

    /// Runs `serve` with the next thread's router on that thread; `false`
    /// if the thread has stopped.
    pub fn spawn(&self, serve: impl FnOnce(Arc<Router>) + Send + 'static) -> bool {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len();
        let thread = &self.threads[turn];
        match &thread.router {
            Some((router, _)) => {
                let router = router.clone();
                thread.arbiter.spawn_fn(move || serve(router))
            }
            None => false,
        }
    }

    /// The first thread's router's actor, for work that is not a connection's.
    pub fn any_router(&self) -> Option<Addr<RouterActor>> {
        self.threads.first().and_then(|thread| thread.router.as_ref().map(|(_, actor)| actor.clone()))
    }

    /// Stops the threads (their routers, and connections still open).
    pub fn stop(&self) {
        for thread in &self.threads {
            thread.arbiter.stop();
        }
    }
}
