//! Counters and the report of a cut, as the daemon sends them (`ok {json}`)
//! and as the client reads them back.

use crate::json::{read_object, write_object, Fields, Value};

/// How much a cut keeps of the writes made since each file's last fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CutMode {
    /// `cut`: nothing; every file reverts to its last fsync.
    #[default]
    All,
    /// `cut prefix`: per file, a random prefix of its unsynced writes (and
    /// truncates), in the order they were made.
    Prefix,
    /// `cut torn`: like `Prefix`, but the last kept write is torn at a
    /// random 512-byte-aligned file offset (a sector is all or nothing).
    Torn,
}

impl CutMode {
    /// The word for this mode in commands and reports (`all` is written as
    /// a bare `cut` in commands).
    pub fn word(self) -> &'static str {
        match self {
            CutMode::All => "all",
            CutMode::Prefix => "prefix",
            CutMode::Torn => "torn",
        }
    }

    /// The mode named by `word`.
    pub fn from_word(word: &str) -> Option<CutMode> {
        match word {
            "all" => Some(CutMode::All),
            "prefix" => Some(CutMode::Prefix),
            "torn" => Some(CutMode::Torn),
            _ => None,
        }
    }
}

/// What one cut did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CutReport {
    /// The mode of the cut.
    pub mode: CutMode,
    /// The seed that chose the prefixes: `cut prefix SEED` replays the cut.
    pub seed: u64,
    /// Bytes of written data that were dropped.
    pub bytes_dropped: u64,
    /// Files that had changes since their last fsync.
    pub files_reverted: u64,
    /// Directory entries that differed from their durable state.
    pub entries_reverted: u64,
    /// Inodes freed because no durable entry reached them.
    pub inodes_freed: u64,
}

impl CutReport {
    /// The JSON object sent in reply to `cut`.
    pub fn to_json(&self) -> String {
        write_object(&self.fields(""))
    }

    /// Reads the reply to `cut`.
    pub fn from_json(text: &str) -> Result<CutReport, String> {
        let map = read_object(text)?;
        CutReport::from_fields(&map, "")
    }

    fn fields(&self, prefix: &str) -> Vec<(String, Value)> {
        vec![
            (format!("{prefix}mode"), Value::Word(self.mode.word().into())),
            (format!("{prefix}seed"), Value::Number(self.seed)),
            (format!("{prefix}bytes_dropped"), Value::Number(self.bytes_dropped)),
            (format!("{prefix}files_reverted"), Value::Number(self.files_reverted)),
            (format!("{prefix}entries_reverted"), Value::Number(self.entries_reverted)),
            (format!("{prefix}inodes_freed"), Value::Number(self.inodes_freed)),
        ]
    }

    fn from_fields(map: &std::collections::BTreeMap<String, Value>, prefix: &str) -> Result<CutReport, String> {
        let word = map.word(&format!("{prefix}mode"))?;
        Ok(CutReport {
            mode: CutMode::from_word(word).ok_or_else(|| format!("unknown cut mode {word}"))?,
            seed: map.number(&format!("{prefix}seed"))?,
            bytes_dropped: map.number(&format!("{prefix}bytes_dropped"))?,
            files_reverted: map.number(&format!("{prefix}files_reverted"))?,
            entries_reverted: map.number(&format!("{prefix}entries_reverted"))?,
            inodes_freed: map.number(&format!("{prefix}inodes_freed"))?,
        })
    }
}

/// The daemon's counters since it mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// fsync/fdatasync calls that succeeded.
    pub fsyncs: u64,
    /// fsyncdir calls that succeeded.
    pub fsyncdirs: u64,
    /// fsync and fsyncdir calls failed by the `fsync-fail` fault.
    pub failed_fsyncs: u64,
    /// Writes that succeeded.
    pub writes: u64,
    /// Bytes those writes carried.
    pub bytes_written: u64,
    /// Cuts so far.
    pub cuts: u64,
    /// Whether the filesystem is dead (cut and not resumed).
    pub dead: bool,
    /// The seed of the daemon's generator (`--seed-rng`, or the clock's).
    pub rng_seed: u64,
    /// Live inodes.
    pub inodes: u64,
    /// The last cut, if any.
    pub last_cut: Option<CutReport>,
}

impl Stats {
    /// The JSON object sent in reply to `stats`. The last cut's fields are
    /// `last_cut_*` (zero, with mode `none`, before the first cut).
    pub fn to_json(&self) -> String {
        let mut fields: Vec<(String, Value)> = vec![
            ("fsyncs".into(), Value::Number(self.fsyncs)),
            ("fsyncdirs".into(), Value::Number(self.fsyncdirs)),
            ("failed_fsyncs".into(), Value::Number(self.failed_fsyncs)),
            ("writes".into(), Value::Number(self.writes)),
            ("bytes_written".into(), Value::Number(self.bytes_written)),
            ("cuts".into(), Value::Number(self.cuts)),
            ("dead".into(), Value::Bool(self.dead)),
            ("rng_seed".into(), Value::Number(self.rng_seed)),
            ("inodes".into(), Value::Number(self.inodes)),
        ];
        let mut last = self.last_cut.unwrap_or_default().fields("last_cut_");
        if self.last_cut.is_none() {
            last[0].1 = Value::Word("none".into());
        }
        fields.extend(last);
        write_object(&fields)
    }

    /// Reads the reply to `stats`.
    pub fn from_json(text: &str) -> Result<Stats, String> {
        let map = read_object(text)?;
        let last_cut = match map.word("last_cut_mode")? {
            "none" => None,
            _ => Some(CutReport::from_fields(&map, "last_cut_")?),
        };
        Ok(Stats {
            fsyncs: map.number("fsyncs")?,
            fsyncdirs: map.number("fsyncdirs")?,
            failed_fsyncs: map.number("failed_fsyncs")?,
            writes: map.number("writes")?,
            bytes_written: map.number("bytes_written")?,
            cuts: map.number("cuts")?,
            dead: map.boolean("dead")?,
            rng_seed: map.number("rng_seed")?,
            inodes: map.number("inodes")?,
            last_cut,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_round_trip() {
        let mut stats = Stats { fsyncs: 3, dead: true, rng_seed: u64::MAX, ..Stats::default() };
        assert_eq!(Stats::from_json(&stats.to_json()), Ok(stats));
        stats.last_cut = Some(CutReport { mode: CutMode::Torn, seed: 9, bytes_dropped: 4096, ..CutReport::default() });
        assert_eq!(Stats::from_json(&stats.to_json()), Ok(stats));
        let report = stats.last_cut.unwrap();
        assert_eq!(CutReport::from_json(&report.to_json()), Ok(report));
    }
}
