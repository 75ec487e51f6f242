//! Time windows: which period a moment falls in.
//!
//! A periodic window's period is a number counted from the Unix epoch in
//! UTC: days, Monday-based weeks, or calendar months. Each period of each
//! window is its own tree (its own key prefix), so a new period simply starts
//! empty — no stop-the-world clear — and the previous ones stay readable
//! until they fall out of `keep` and are deleted in the background.

use crate::board::{Board, BoardConfig, Window};
use crate::key::TreeId;

const SECONDS_PER_DAY: i64 = 86_400;

/// The period of `window` that contains `unix_seconds` (UTC). `all` has one
/// period, 0. Moments before 1970 clamp to period 0.
pub fn period_of(window: Window, unix_seconds: i64) -> u32 {
    let days = unix_seconds.div_euclid(SECONDS_PER_DAY).max(0);
    let period = match window {
        Window::All => 0,
        Window::Daily => days,
        // 1970-01-01 was a Thursday: shifting by 3 days makes weeks start on Monday.
        Window::Weekly => (days + 3) / 7,
        Window::Monthly => {
            let (year, month, _) = civil_from_days(days);
            (year - 1970) * 12 + i64::from(month) - 1
        }
    };
    u32::try_from(period).unwrap_or(u32::MAX)
}

/// The tree of `window` at `period_offset` (0 = current, -1 = previous, ...)
/// relative to the period containing `unix_seconds`.
pub fn tree_at(board: &Board, window: Window, unix_seconds: i64, period_offset: i64) -> Option<TreeId> {
    let current = i64::from(period_of(window, unix_seconds));
    let period = u32::try_from(current + period_offset).ok()?;
    Some(TreeId { board: board.id, window: window.code(), period })
}

/// The current period's tree of every window of `board`: what a write updates.
pub fn current_trees(board: &Board, unix_seconds: i64) -> Vec<TreeId> {
    board
        .config
        .windows
        .iter()
        .map(|&w| TreeId { board: board.id, window: w.code(), period: period_of(w, unix_seconds) })
        .collect()
}

/// Whether `tree` is older than its board keeps at `unix_seconds`: such a
/// period can no longer be read and its data is deleted.
pub fn expired(config: &BoardConfig, tree: TreeId, unix_seconds: i64) -> bool {
    match Window::from_code(tree.window) {
        None | Some(Window::All) => false,
        Some(window) => i64::from(tree.period) < i64::from(period_of(window, unix_seconds)) - i64::from(config.keep),
    }
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01: Howard
/// Hinnant's `civil_from_days`, exact for the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::BoardConfig;

    /// Seconds of a UTC date-time, computed independently of the code under test.
    fn at(year: i64, month: u32, day: u32, hour: i64) -> i64 {
        let mut days = 0i64;
        for y in 1970..year {
            days += if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 { 366 } else { 365 };
        }
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        let lengths = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        days += lengths[..(month - 1) as usize].iter().sum::<i64>();
        days += i64::from(day) - 1;
        days * SECONDS_PER_DAY + hour * 3600
    }

    #[test]
    fn days_roll_at_utc_midnight() {
        let before = at(2026, 11, 21, 0) - 1;
        assert_eq!(period_of(Window::Daily, before) + 1, period_of(Window::Daily, before + 1));
        assert_eq!(period_of(Window::All, before), 0);
    }

    #[test]
    fn weeks_start_on_monday() {
        // 2026-11-23 is a Monday.
        let sunday = period_of(Window::Weekly, at(2026, 11, 22, 23));
        let monday = period_of(Window::Weekly, at(2026, 11, 23, 0));
        let next_sunday = period_of(Window::Weekly, at(2026, 11, 29, 23));
        assert_eq!(sunday + 1, monday);
        assert_eq!(monday, next_sunday);
        // 1970-01-05 was the first Monday.
        assert_eq!(period_of(Window::Weekly, at(1970, 1, 4, 12)), 0);
        assert_eq!(period_of(Window::Weekly, at(1970, 1, 5, 0)), 1);
    }

    #[test]
    fn months_follow_the_calendar() {
        assert_eq!(period_of(Window::Monthly, at(1970, 1, 31, 23)), 0);
        assert_eq!(period_of(Window::Monthly, at(1970, 2, 1, 0)), 1);
        assert_eq!(period_of(Window::Monthly, at(2024, 2, 29, 23)), (2024 - 1970) * 12 + 1);
        assert_eq!(period_of(Window::Monthly, at(2024, 3, 1, 0)), (2024 - 1970) * 12 + 2);
        assert_eq!(period_of(Window::Monthly, at(2026, 12, 31, 23)) + 1, period_of(Window::Monthly, at(2027, 1, 1, 0)));
        for days in [0i64, 59, 365, 10_957, 20_000, 47_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(at(y, m, d, 0), days * SECONDS_PER_DAY);
        }
    }

    #[test]
    fn periods_expire_after_keep() {
        let board = Board {
            id: 1,
            name: "b".into(),
            config: BoardConfig { windows: vec![Window::Daily, Window::All], keep: 2, ..BoardConfig::default() }.into(),
        };
        let now = at(2026, 11, 21, 12);
        let today = tree_at(&board, Window::Daily, now, 0).unwrap();
        assert!(!expired(&board.config, today, now));
        assert!(!expired(&board.config, tree_at(&board, Window::Daily, now, -2).unwrap(), now));
        assert!(expired(&board.config, tree_at(&board, Window::Daily, now, -3).unwrap(), now));
        assert!(!expired(&board.config, tree_at(&board, Window::All, now, 0).unwrap(), now));
        assert_eq!(current_trees(&board, now).len(), 2);
    }
}
