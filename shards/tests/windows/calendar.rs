//! The oracle's calendar, written independently of `window.rs`: dates,
//! period numbers, boundaries, and which trees are readable or expired.

use rankd_shards::{Board, TreeId, Window};

use crate::DAY;

pub fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

pub fn month_len(year: i64, month: u32) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date (year >= 1970), by counting.
pub fn days_of(year: i64, month: u32, day: u32) -> i64 {
    let mut days = 0;
    for y in 1970..year {
        days += if is_leap(y) { 366 } else { 365 };
    }
    for m in 1..month {
        days += month_len(year, m);
    }
    days + i64::from(day) - 1
}

/// (year, month, day) of a day count since 1970-01-01 (>= 0), by counting.
pub fn date_of(mut days: i64) -> (i64, u32, u32) {
    let mut year = 1970;
    loop {
        let len = if is_leap(year) { 366 } else { 365 };
        if days < len {
            break;
        }
        days -= len;
        year += 1;
    }
    let mut month = 1;
    while days >= month_len(year, month) {
        days -= month_len(year, month);
        month += 1;
    }
    (year, month, days as u32 + 1)
}

/// Unix seconds of a UTC date-time.
pub fn at(year: i64, month: u32, day: u32, hour: i64, minute: i64, second: i64) -> i64 {
    days_of(year, month, day) * DAY + hour * 3600 + minute * 60 + second
}

/// Monday = 0 .. Sunday = 6 (1970-01-01 was a Thursday).
pub fn weekday(days: i64) -> i64 {
    (days + 3).rem_euclid(7)
}

/// The oracle's period numbering: days since the epoch, Mondays since
/// 1970-01-05 (the first one), months since January 1970.
pub fn period(w: Window, t: i64) -> u32 {
    let days = t.div_euclid(DAY);
    let p = match w {
        Window::All => 0,
        Window::Daily => days,
        Window::Weekly => (days - 4).div_euclid(7) + 1,
        Window::Monthly => {
            let (y, m, _) = date_of(days);
            (y - 1970) * 12 + i64::from(m) - 1
        }
    };
    u32::try_from(p).expect("times after 1970")
}

pub fn next_midnight(t: i64) -> i64 {
    (t.div_euclid(DAY) + 1) * DAY
}

pub fn next_monday(t: i64) -> i64 {
    let days = t.div_euclid(DAY);
    (days + 7 - weekday(days)) * DAY
}

pub fn next_month(t: i64) -> i64 {
    let (y, m, _) = date_of(t.div_euclid(DAY));
    let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    days_of(y, m, 1) * DAY
}

pub fn tid(board: &Board, w: Window, period: u32) -> TreeId {
    TreeId { board: board.id, window: w.code(), period }
}

/// Whether `tree` is out of its board's `keep` at `now` (oracle's view).
pub fn is_expired(board: &Board, tree: TreeId, now: i64) -> bool {
    match Window::from_code(tree.window) {
        None | Some(Window::All) => false,
        Some(w) => i64::from(tree.period) < i64::from(period(w, now)) - i64::from(board.config.keep),
    }
}

/// The readable trees of a window at `now`: current, then up to `keep` back.
pub fn readable(board: &Board, w: Window, now: i64) -> Vec<(i64, TreeId)> {
    let current = period(w, now);
    let back = if w == Window::All { 0 } else { board.config.keep };
    (0..=back).filter(|k| *k <= current).map(|k| (-i64::from(k), tid(board, w, current - k))).collect()
}
