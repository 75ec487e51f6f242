//! Criterion micro-benchmarks of the watch registry (see `benches/README.md`).
//!
//! - `take_due/spread/<W>`: W watches, each on a board of its own (players
//!   watching their own small boards), all looked at once; then one board
//!   changes and `take_due` finds its watch. What the evaluator pays a look
//!   when few boards change among many watched.
//! - `take_due/one_board/<W>`: W watches of players on one board, which
//!   changes: every watch is due, so this is the floor a look costs.
//!
//! No env var: the largest registry (100k watches) builds in well under a
//! second, outside the timed code.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rankd::protocol::request::{WatchSpec, WatchTarget};
use rankd::protocol::View;
use rankd::watches::{PushBox, Registry, WatchKey};

/// The server's allocator.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const SIZES: [u64; 2] = [1_000, 100_000];

/// A registry of `watches` player watches, on `boards` boards (round robin),
/// each looked at once so none is due.
fn registry(watches: u64, boards: u64) -> (Registry, Instant) {
    let (mut registry, now, pushes) = (Registry::default(), Instant::now(), Arc::new(PushBox::default()));
    for i in 0..watches {
        let spec = WatchSpec {
            board: format!("board-{}", i % boards),
            target: WatchTarget::Player(format!("player-{i}")),
            view: View::default(),
            interval: Duration::ZERO,
        };
        registry.add(WatchKey { conn: i, watch: 1 }, spec, pushes.clone(), now);
    }
    let (due, _) = registry.take_due(now);
    assert_eq!(due.iter().map(|group| group.watches.len() as u64).sum::<u64>(), watches);
    (registry, now)
}

fn take_due(c: &mut Criterion) {
    let mut group = c.benchmark_group("take_due");
    for watches in SIZES {
        group.throughput(Throughput::Elements(1));
        let (mut spread, now) = registry(watches, watches);
        let watched = spread.watched();
        group.bench_with_input(BenchmarkId::new("spread", watches), &watches, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 7919) % watches;
                watched.changed(&format!("board-{i}"));
                let (due, _) = spread.take_due(now);
                assert_eq!(due.len(), 1);
                black_box(due)
            })
        });
        let (mut one, now) = registry(watches, 1);
        let watched = one.watched();
        group.bench_with_input(BenchmarkId::new("one_board", watches), &watches, |b, _| {
            b.iter(|| {
                watched.changed("board-0");
                let (due, _) = one.take_due(now);
                assert_eq!(due[0].watches.len() as u64, watches);
                black_box(due)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, take_due);
criterion_main!(benches);
