//! Fixed dates of expiry across restarts: a deleted period stays deleted
//! after a reopen, and a deletion cut short by a restart still finishes.

use std::path::Path;

use rankd_shards::window;
use rankd_shards::{Board, Mode, Shard, Ties, TreeId, Window};

use crate::calendar::at;
use crate::{board, listed, open, scratch_dir};

/// A deleted period must not come back when the shard is reopened.
#[test]
fn expired_period_stays_deleted_after_reopen() {
    let dir = scratch_dir();
    let day3 = at(2024, 3, 1, 0, 0, 0);
    let (mut shard, b, gone) = expired_day(dir.path(), at(2024, 2, 28, 12, 0, 0), day3);
    for _ in 0..10 {
        shard.expire(3).unwrap();
    }
    assert_eq!(shard.count(gone), 0);
    assert!(listed(&shard, &b, gone).is_empty());
    assert_eq!(shard.get(gone, "ann").unwrap(), None);
    drop(shard);

    let shard = open(dir.path(), day3);
    // Storage really is clean ...
    assert_eq!(shard.get(gone, "ann").unwrap(), None);
    assert_eq!(shard.get(gone, "bob").unwrap(), None);
    assert!(listed(&shard, &b, gone).is_empty());
    // ... so the count trees must not hold the period either.
    let in_trees = shard.tree_ids().any(|t| t == gone);
    let (count, check) = (shard.count(gone), shard.check());
    assert!(
        !in_trees && count == 0 && check.is_ok(),
        "reopened shard holds the expired {gone:?} again: in tree_ids {in_trees}, count {count}, check {check:?}"
    );
}

/// Deleting an expired period a little at a time must survive a restart:
/// the keys not yet deleted must still be deleted afterwards.
#[test]
fn restart_during_expiry_does_not_leak_keys() {
    let dir = scratch_dir();
    let day3 = at(2026, 6, 2, 0, 0, 0);
    let (mut shard, b, gone) = expired_day(dir.path(), at(2026, 5, 31, 12, 0, 0), day3);
    assert_eq!(shard.expire(1).unwrap(), vec![gone]); // deletes one key of four
    shard.prepare_shutdown(std::time::Duration::from_secs(60)).unwrap(); // a clean shutdown checkpoints the trees
    drop(shard);

    let mut shard = open(dir.path(), day3);
    for _ in 0..10 {
        shard.expire(3).unwrap();
    }
    let left: Vec<_> =
        [shard.get(gone, "ann").unwrap(), shard.get(gone, "bob").unwrap()].into_iter().flatten().collect();
    assert!(left.is_empty(), "expired {gone:?} still stores players {left:?}");
    assert!(listed(&shard, &b, gone).is_empty(), "expired {gone:?} still indexed: {:?}", listed(&shard, &b, gone));
    shard.check().unwrap();
}

/// A shard in `dir` whose daily board (keeping one period) got two players
/// on `day1`, committed, with its clock then moved on to `day3`: the board,
/// and `day1`'s tree, now expired.
fn expired_day(dir: &Path, day1: i64, day3: i64) -> (Shard, Board, TreeId) {
    let b = board(1, vec![Window::Daily], 1, Ties::Competition);
    let gone = window::tree_at(&b, Window::Daily, day1, 0).unwrap();
    let mut shard = open(dir, day1);
    shard.write(&b, "ann", 5, Mode::Set, 1).unwrap();
    shard.write(&b, "bob", 6, Mode::Set, 2).unwrap();
    shard.commit().unwrap();
    shard.set_time(day3);
    (shard, b, gone)
}
