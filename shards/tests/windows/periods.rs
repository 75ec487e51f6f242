//! Period arithmetic: the test calendar itself, and `window::period_of` and
//! `window::tree_at` against it.

use proptest::prelude::*;
use rankd_shards::window;
use rankd_shards::{Board, BoardConfig};

use crate::calendar::{at, date_of, days_of, next_midnight, next_monday, next_month, period, tid, weekday};
use crate::WINDOWS;

#[test]
fn calendar_helpers_know_the_dates() {
    // 2026-06-01 and 2024-01-01 are Mondays; 2024 is a leap year.
    assert_eq!(weekday(days_of(2026, 6, 1)), 0);
    assert_eq!(weekday(days_of(2024, 1, 1)), 0);
    assert_eq!(weekday(days_of(1970, 1, 5)), 0);
    assert_eq!(date_of(days_of(2024, 2, 29)), (2024, 2, 29));
    assert_eq!(date_of(days_of(2024, 2, 29) + 1), (2024, 3, 1));
    assert_eq!(date_of(days_of(2025, 12, 31) + 1), (2026, 1, 1));
    assert_eq!(next_month(at(2024, 2, 29, 23, 59, 59)), at(2024, 3, 1, 0, 0, 0));
    assert_eq!(next_month(at(2025, 12, 31, 0, 0, 0)), at(2026, 1, 1, 0, 0, 0));
    assert_eq!(next_monday(at(2026, 5, 31, 23, 59, 58)), at(2026, 6, 1, 0, 0, 0));
    assert_eq!(next_monday(at(2026, 6, 1, 0, 0, 0)), at(2026, 6, 8, 0, 0, 0));
    assert_eq!(next_midnight(at(2026, 6, 1, 0, 0, 0)), at(2026, 6, 2, 0, 0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    /// `window::period_of` agrees with the independent calendar, and
    /// `tree_at` counts back from it.
    #[test]
    fn periods_match_an_independent_calendar(t in 0i64..4_102_444_800, k in 0i64..5) {
        let board = Board { id: 9, name: "b".into(), config: BoardConfig { windows: WINDOWS.to_vec(), keep: 3, ..BoardConfig::default() }.into() };
        for w in WINDOWS {
            prop_assert_eq!(window::period_of(w, t), period(w, t), "{:?} at {}", w, t);
            let expected = u32::try_from(i64::from(period(w, t)) - k).ok().map(|p| tid(&board, w, p));
            prop_assert_eq!(window::tree_at(&board, w, t, -k), expected);
        }
    }
}
