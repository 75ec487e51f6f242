//! Fixed dates across period boundaries: one write reaching every window,
//! new periods starting empty beside the previous ones, a leap day and a new year.

use rankd_shards::window;
use rankd_shards::{Amount, Mode, Shard, ShardError, Ties, TreeId, Window};

use crate::calendar::{at, period, tid};
use crate::{board, l, listed, open, rec, scratch_dir, WINDOWS};

#[test]
fn one_write_updates_every_window_atomically() {
    let dir = scratch_dir();
    let sunday = at(2026, 5, 31, 23, 59, 58);
    let monday = at(2026, 6, 1, 0, 0, 1);
    let b = board(1, vec![Window::Weekly, Window::All, Window::Daily, Window::Monthly], 1, Ties::Competition);
    let trees = |now: i64| -> Vec<TreeId> { WINDOWS.iter().map(|&w| tid(&b, w, period(w, now))).collect() };

    let mut shard = open(dir.path(), sunday);
    // Staged: visible to in-memory reads of every window at once. (With
    // competition ties a small tree gives a short name's record from the
    // tree itself, with no sequence: it orders nothing here.)
    assert_eq!(shard.write(&b, "ann", 10, Mode::Incr, 1).unwrap(), 10);
    for t in trees(sunday) {
        assert_eq!(shard.get(t, "ann").unwrap(), rec(10, 0), "{t:?}");
        assert_eq!(shard.count(t), 1, "{t:?}");
    }
    // A crash before the commit loses it in every window.
    drop(shard);
    let mut shard = open(dir.path(), sunday);
    for t in trees(sunday) {
        assert_eq!(shard.get(t, "ann").unwrap(), None, "{t:?}");
        assert_eq!(shard.count(t), 0, "{t:?}");
    }
    shard.check().unwrap();

    assert_eq!(shard.write(&b, "ann", 10, Mode::Incr, 2).unwrap(), 10);
    assert_eq!(shard.write(&b, "bob", 7, Mode::Set, 3).unwrap(), 7);
    assert_eq!(shard.write(&b, "ann", i64::MAX - 10, Mode::Incr, 4).unwrap(), i64::MAX);
    shard.commit().unwrap();
    drop(shard);
    let mut shard = open(dir.path(), sunday);
    for t in trees(sunday) {
        assert_eq!(shard.get(t, "ann").unwrap(), rec(i64::MAX, 0), "{t:?}");
        assert_eq!(shard.get(t, "bob").unwrap(), rec(7, 0), "{t:?}");
        assert_eq!(listed(&shard, &b, t), l(&[("ann", i64::MAX), ("bob", 7)]), "{t:?}");
    }

    // Monday: day, week and month roll together; `all` does not. An incr
    // that fits the new periods (0 + 1) but overflows all-time changes nothing.
    shard.set_time(monday);
    let new = trees(monday);
    let old = trees(sunday);
    for i in 1..4 {
        assert_eq!(new[i].period, old[i].period + 1, "{:?} rolls", WINDOWS[i]);
    }
    assert_eq!(new[0], old[0]);
    assert!(matches!(shard.write(&b, "ann", 1, Mode::Incr, 5), Err(ShardError::Overflow)));
    assert!(!shard.has_staged());
    assert!(matches!(
        shard.write_many(&b, &[("bob".into(), Amount::Score(1), 6), ("ann".into(), Amount::Score(1), 7)], Mode::Incr),
        Err(ShardError::Overflow)
    ));
    assert!(!shard.has_staged());
    for t in &new[1..] {
        assert_eq!(shard.count(*t), 0, "{t:?}");
        assert_eq!(shard.get(*t, "ann").unwrap(), None);
        assert_eq!(shard.get(*t, "bob").unwrap(), None);
    }
    assert_eq!(shard.get(new[0], "bob").unwrap(), rec(7, 0));

    // The first window's score is what a write returns.
    assert_eq!(shard.write(&b, "bob", 2, Mode::Incr, 8).unwrap(), 2);
    shard.commit().unwrap();
    assert_eq!(shard.get(new[0], "bob").unwrap(), rec(9, 0));
    for t in &new[1..] {
        assert_eq!(shard.get(*t, "bob").unwrap(), rec(2, 0), "{t:?}");
        assert_eq!(listed(&shard, &b, *t), l(&[("bob", 2)]), "{t:?}");
    }
    shard.check().unwrap();
}

#[test]
fn rollover_starts_empty_and_keeps_previous_period() {
    let dir = scratch_dir();
    let sunday = at(2026, 5, 31, 23, 59, 58);
    let monday = at(2026, 6, 1, 0, 0, 1);
    let tuesday = at(2026, 6, 2, 0, 0, 0);
    let b = board(1, vec![Window::Daily, Window::Weekly, Window::Monthly, Window::All], 1, Ties::Ordinal);
    let [daily, weekly, monthly, all] = [Window::Daily, Window::Weekly, Window::Monthly, Window::All];
    let cur = |w: Window, now: i64| window::tree_at(&b, w, now, 0).unwrap();
    let prev = |w: Window, now: i64| window::tree_at(&b, w, now, -1).unwrap();

    let mut shard = open(dir.path(), sunday);
    shard.write(&b, "ann", 5, Mode::Incr, 1).unwrap();
    shard.write(&b, "bob", 3, Mode::Best, 2).unwrap();
    assert_eq!(shard.write(&b, "bob", 1, Mode::Best, 3).unwrap(), 3); // today's best stays 3
    shard.commit().unwrap();

    shard.set_time(monday);
    for w in [daily, weekly, monthly] {
        assert_eq!(prev(w, monday), cur(w, sunday), "{w:?}: the previous period is Sunday's");
        assert_eq!(shard.count(cur(w, monday)), 0, "{w:?}: a new period starts empty");
        assert_eq!(listed(&shard, &b, prev(w, monday)), l(&[("ann", 5), ("bob", 3)]), "{w:?}");
    }
    assert_eq!(window::tree_at(&b, all, monday, -1), None);
    assert_eq!(cur(all, monday), cur(all, sunday));

    // incr starts from 0 in the new period; best keeps the period's best.
    assert_eq!(shard.write(&b, "ann", 2, Mode::Incr, 4).unwrap(), 2);
    assert_eq!(shard.write(&b, "bob", 1, Mode::Best, 5).unwrap(), 1);
    assert_eq!(shard.write(&b, "cat", 2, Mode::Set, 6).unwrap(), 2);
    shard.commit().unwrap();
    for w in [daily, weekly, monthly] {
        // Ordinal: ann reached 2 before cat.
        assert_eq!(listed(&shard, &b, cur(w, monday)), l(&[("ann", 2), ("cat", 2), ("bob", 1)]), "{w:?}");
        assert_eq!(shard.get(prev(w, monday), "ann").unwrap(), rec(5, 1));
        assert_eq!(shard.get(prev(w, monday), "bob").unwrap(), rec(3, 2));
    }
    assert_eq!(listed(&shard, &b, cur(all, monday)), l(&[("ann", 7), ("bob", 3), ("cat", 2)]));
    assert_eq!(shard.get(cur(all, monday), "bob").unwrap(), rec(3, 2), "unchanged: keeps its reach seq");

    // Remove takes the player out of every current period, not the previous ones.
    assert!(shard.remove(&b, "ann").unwrap());
    shard.commit().unwrap();
    for w in [daily, weekly, monthly, all] {
        assert_eq!(shard.get(cur(w, monday), "ann").unwrap(), None, "{w:?}");
    }
    for w in [daily, weekly, monthly] {
        assert_eq!(shard.get(prev(w, monday), "ann").unwrap(), rec(5, 1), "{w:?}");
    }

    // Tuesday: Sunday's daily period falls out of keep = 1; Sunday's week and
    // month are still the previous ones.
    shard.set_time(tuesday);
    let gone = cur(daily, sunday);
    assert_eq!(window::tree_at(&b, daily, tuesday, -2), Some(gone));
    assert!(window::expired(&b.config, gone, tuesday));
    let mut newly = Vec::new();
    for _ in 0..10 {
        newly.extend(shard.expire(1).unwrap());
    }
    assert_eq!(newly, vec![gone]);
    assert!(!shard.tree_ids().any(|t| t == gone));
    assert_eq!(shard.count(gone), 0);
    assert_eq!(shard.get(gone, "ann").unwrap(), None);
    assert!(listed(&shard, &b, gone).is_empty());
    assert_eq!(listed(&shard, &b, prev(daily, tuesday)), l(&[("cat", 2), ("bob", 1)]));
    assert_eq!(listed(&shard, &b, prev(weekly, tuesday)), l(&[("ann", 5), ("bob", 3)]));
    assert_eq!(listed(&shard, &b, cur(weekly, tuesday)), l(&[("cat", 2), ("bob", 1)]));
    assert_eq!(listed(&shard, &b, prev(monthly, tuesday)), l(&[("ann", 5), ("bob", 3)]));
    assert_eq!(listed(&shard, &b, cur(all, tuesday)), l(&[("bob", 3), ("cat", 2)]));
    shard.check().unwrap();
}

#[test]
fn leap_day_and_new_year_roll_the_right_windows() {
    let dir = scratch_dir();
    let b = board(1, vec![Window::Monthly, Window::Daily, Window::Weekly], 2, Ties::Dense);
    let mut shard = open(dir.path(), at(2024, 2, 28, 23, 59, 59));
    let mut seq = 0;
    let mut incr = |shard: &mut Shard, now: i64, by: i64| {
        seq += 1;
        shard.set_time(now);
        let stored = shard.write(&b, "ann", by, Mode::Incr, seq).unwrap();
        shard.commit().unwrap();
        stored
    };
    let month = |now: i64| window::tree_at(&b, Window::Monthly, now, 0).unwrap();
    let day = |now: i64| window::tree_at(&b, Window::Daily, now, 0).unwrap();
    let week = |now: i64| window::tree_at(&b, Window::Weekly, now, 0).unwrap();

    // Wed Feb 28 -> Thu Feb 29 -> Fri Mar 1 2024: the month rolls only at March.
    assert_eq!(incr(&mut shard, at(2024, 2, 28, 23, 59, 59), 1), 1);
    assert_eq!(incr(&mut shard, at(2024, 2, 29, 0, 0, 0), 2), 3);
    assert_eq!(incr(&mut shard, at(2024, 2, 29, 23, 59, 59), 4), 7);
    assert_eq!(incr(&mut shard, at(2024, 3, 1, 0, 0, 0), 8), 8);
    let feb = month(at(2024, 2, 1, 0, 0, 0));
    assert_eq!(shard.get(feb, "ann").unwrap().map(|r| r.score), Some(7));
    assert_eq!(shard.get(day(at(2024, 2, 29, 5, 0, 0)), "ann").unwrap().map(|r| r.score), Some(6));
    assert_eq!(shard.get(day(at(2024, 2, 28, 5, 0, 0)), "ann").unwrap().map(|r| r.score), Some(1));
    assert_eq!(shard.get(week(at(2024, 3, 1, 0, 0, 0)), "ann").unwrap().map(|r| r.score), Some(15));
    assert_eq!(window::tree_at(&b, Window::Monthly, at(2024, 3, 1, 0, 0, 0), -1), Some(feb));

    // Tue Dec 31 2024 -> Wed Jan 1 2025: day and month roll, the week does not.
    let eve = at(2024, 12, 31, 23, 59, 59);
    let new_year = at(2025, 1, 1, 0, 0, 0);
    assert_eq!(incr(&mut shard, eve, 100), 100);
    assert_eq!(incr(&mut shard, new_year, 1), 1);
    assert_eq!(month(new_year).period, month(eve).period + 1);
    assert_eq!(day(new_year).period, day(eve).period + 1);
    assert_eq!(week(new_year), week(eve));
    assert_eq!(shard.get(week(new_year), "ann").unwrap().map(|r| r.score), Some(101));
    assert_eq!(shard.get(month(eve), "ann").unwrap().map(|r| r.score), Some(100));
    assert_eq!(shard.get(month(new_year), "ann").unwrap().map(|r| r.score), Some(1));

    // Everything from 2024 except December (keep = 2 months back from
    // January: December and November) is expired by now.
    shard.set_time(new_year);
    for _ in 0..50 {
        shard.expire(3).unwrap();
    }
    assert_eq!(shard.count(feb), 0);
    assert_eq!(shard.get(feb, "ann").unwrap(), None);
    assert_eq!(shard.count(month(eve)), 1);
    let mut left: Vec<TreeId> = shard.tree_ids().collect();
    left.sort();
    let mut want = vec![month(eve), month(new_year), day(eve), day(new_year), week(new_year)];
    want.sort();
    assert_eq!(left, want);
    shard.check().unwrap();
}
