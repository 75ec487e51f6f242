//! The I/O threads: each runs its own router and the client connections
//! handed to it, so reading, decoding, routing and writing replies are
//! spread over cores instead of all waiting for one thread. How many of
//! them serve, and which serves each connection: `io_balance`.

use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr, Arbiter};

use super::io_balance::{self, IoBalance};
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

/// How the threads in use follow the load (see `io_balance`).
#[derive(Debug, Clone, Copy)]
pub struct Balancing {
    /// Whether they do; else every thread serves.
    pub adaptive: bool,
    /// How often each thread samples its load.
    pub period: Duration,
    /// The busy share of a core past which one more thread serves.
    pub grow_above: f64,
}

impl Balancing {
    /// Following the load, or not, at the usual period and threshold.
    pub fn new(adaptive: bool) -> Self {
        Self { adaptive, period: io_balance::PERIOD, grow_above: io_balance::GROW_ABOVE }
    }
}

/// Every I/O thread, and which serve connections.
pub struct IoThreads {
    threads: Vec<IoThread>,
    balance: Arc<IoBalance>,
}

impl IoThreads {
    /// Starts `count` threads, each with the relay its committed answers
    /// arrive on (returned, in thread order, for the shards' pipelines).
    pub fn start(count: usize, balancing: Balancing, metrics: &Arc<Metrics>) -> (Self, Vec<ReplyRelay>) {
        let balance = Arc::new(IoBalance::new(
            count,
            balancing.adaptive,
            metrics.io_threads_active.clone(),
            metrics.connections_moved.clone(),
        ));
        let mut threads = Vec::with_capacity(count);
        let mut relays = Vec::with_capacity(count);
        for index in 0..count {
            let arbiter = Arbiter::new();
            let (relay, deliver) = ReplyRelay::new();
            let (metrics, balance) = (metrics.clone(), balance.clone());
            arbiter.spawn_fn(move || {
                metrics.threads.register(&format!("io-{index}"));
                actix_rt::spawn(deliver);
                actix_rt::spawn(io_balance::busy_sampler(balance, index, balancing.period, balancing.grow_above));
            });
            threads.push(IoThread { arbiter, router: None });
            relays.push(relay);
        }
        (Self { threads, balance }, relays)
    }

    /// Where connections are placed and moved.
    pub fn balance(&self) -> &Arc<IoBalance> {
        &self.balance
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

    /// Runs `serve` with thread `index`'s router on that thread; `false`
    /// if the thread has stopped.
    pub fn spawn_on(&self, index: usize, serve: impl FnOnce(Arc<Router>) + Send + 'static) -> bool {
        let Some(thread) = self.threads.get(index) else { return false };
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
