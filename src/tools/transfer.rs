//! The files of `rankd import` and `rankd export`, and export itself:
//! boards dumped and loaded through the protocol of a running server.
//!
//! Import ([`crate::tools::import`]) reads `board,player,score` rows (CSV,
//! an optional header line) or a msgpack stream of `[board, player, score]`
//! arrays. Export pages through `top` in rank order and writes
//! `board,player,score,rank` CSV, which import reads back.
//!
//! A board with fields (composite scores) has one column per field instead
//! of `score`: export writes `board,player,<field>...,rank` with the fields
//! in the board's order, and import takes the field names from the header
//! line (required then; a last `rank` column is export's and not read). A
//! msgpack row's score is then a map `{field: value}`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use rankd_client::{Call, ClientError, Entry, FieldScores, OpKind, Score};

use crate::tools::cli::ClientArgs;

/// Input formats of `rankd import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `board,player,score` lines (RFC 4180 quoting).
    Csv,
    /// A stream of msgpack `[board, player, score]` arrays.
    Msgpack,
}

/// `rankd export` flags.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// Server to read from.
    #[command(flatten)]
    pub client: ClientArgs,
    /// Board to export.
    pub board: String,
    /// Window (default: the board's first).
    #[arg(long)]
    pub window: Option<String>,
    /// Period: 0 current, -1 previous, ...
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub period: i64,
    /// Output file (default: standard output).
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
}

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The server refused or the connection failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A row cannot be read.
    #[error("row {row}: {reason}")]
    Row {
        /// 1-based row number.
        row: u64,
        /// What is wrong.
        reason: String,
    },
    /// Reading or writing a file.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Bad flags.
    #[error("{0}")]
    Usage(String),
    /// An import gave up part way: how to go on once the cause is fixed.
    #[error(
        "{cause}\nrows up to {resume_after} are written; once the cause is fixed, go on from there with the same \
         file and flags and: --resume-after {resume_after} --run-id {run_id}\n(requests the server applied already \
         are then answered `dup`, not applied again, while it remembers them: 10 minutes by default)"
    )]
    Interrupted {
        /// Why it stopped.
        cause: Box<TransferError>,
        /// The last row written, with every row before it.
        resume_after: u64,
        /// The run's id, in every request's `wid`.
        run_id: String,
    },
}

/// One `board,player,score` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Its place in the input, from 1 (a CSV header is row 1), as error
    /// messages and `--resume-after` count.
    pub number: u64,
    /// The board it goes to: consecutive rows of one board share a `set_many`.
    pub board: String,
    /// The player whose score it sets.
    pub player: String,
    /// The score written (under the import's `--mode`): a map for a board
    /// with fields.
    pub score: Score,
}

/// What a CSV header says the columns after `board,player` hold.
#[derive(Debug, Clone, Default)]
enum ScoreColumns {
    /// One integer `score` (no header, or `score` third).
    #[default]
    Plain,
    /// One column per field, by these names.
    Fields(Vec<String>),
}

impl ScoreColumns {
    /// The columns a header line names, if `record` is one.
    fn of_header(record: &csv::StringRecord) -> Option<Self> {
        if record.get(0) != Some("board") || record.get(1) != Some("player") {
            return None;
        }
        let columns: Vec<&str> = record.iter().skip(2).collect();
        // `score` alone, or with export's rank after it; more columns are
        // the fields of a board whose first field is named score.
        if matches!(columns[..], ["score"] | ["score", "rank"]) {
            return Some(Self::Plain);
        }
        let mut names: Vec<String> = columns.into_iter().map(str::to_string).collect();
        // Export's rank follows the fields (a field may be named rank too).
        if names.len() > 1 && names.last().map(String::as_str) == Some("rank") {
            names.pop();
        }
        Some(Self::Fields(names))
    }

    /// The score in `record` (whose first two cells are board and player).
    fn score(&self, record: &csv::StringRecord) -> Result<Score, String> {
        let number = |n: usize, what: &str| {
            let cell = record.get(n).ok_or_else(|| format!("no {what} column"))?;
            cell.trim().parse::<i64>().map_err(|_| format!("{what} `{cell}` is not an i64"))
        };
        match self {
            Self::Plain => number(2, "score").map(Score::Int),
            Self::Fields(names) => names
                .iter()
                .enumerate()
                .map(|(i, name)| number(2 + i, name).map(|value| (name.clone(), value)))
                .collect::<Result<FieldScores, String>>()
                .map(Score::Fields),
        }
    }
}

/// Rows from a CSV or msgpack reader.
pub fn rows(format: Format, input: impl Read + 'static) -> Box<dyn Iterator<Item = Result<Row, TransferError>>> {
    match format {
        Format::Csv => {
            let reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(input);
            let mut columns = ScoreColumns::Plain;
            Box::new(reader.into_records().enumerate().filter_map(move |(i, record)| {
                let row = i as u64 + 1;
                let record = match record {
                    Ok(r) => r,
                    Err(e) => return Some(Err(TransferError::Row { row, reason: e.to_string() })),
                };
                if row == 1 {
                    if let Some(header) = ScoreColumns::of_header(&record) {
                        columns = header;
                        return None;
                    }
                }
                let (Some(board), Some(player)) = (record.get(0), record.get(1)) else {
                    return Some(Err(TransferError::Row { row, reason: "expected board,player,score".into() }));
                };
                Some(match columns.score(&record) {
                    Ok(score) => Ok(Row { number: row, board: board.into(), player: player.into(), score }),
                    Err(reason) => Err(TransferError::Row { row, reason }),
                })
            }))
        }
        Format::Msgpack => {
            let mut input = BufReader::new(input);
            let mut row = 0u64;
            Box::new(std::iter::from_fn(move || {
                match input.fill_buf() {
                    Ok([]) => return None,
                    Ok(_) => {}
                    Err(e) => return Some(Err(e.into())),
                }
                row += 1;
                let value = match rmpv::decode::read_value(&mut input) {
                    Ok(v) => v,
                    Err(e) => return Some(Err(TransferError::Row { row, reason: e.to_string() })),
                };
                let parsed = match value.as_array().map(Vec::as_slice) {
                    Some([board, player, score]) => match (board.as_str(), player.as_str(), msgpack_score(score)) {
                        (Some(b), Some(p), Some(s)) => {
                            Some(Row { number: row, board: b.into(), player: p.into(), score: s })
                        }
                        _ => None,
                    },
                    _ => None,
                };
                let reason = "expected [board, player, score], the score an i64 or a map of them";
                Some(parsed.ok_or(TransferError::Row { row, reason: reason.into() }))
            }))
        }
    }
}

/// A msgpack row's score: an integer, or a map of field names to integers.
fn msgpack_score(value: &rmpv::Value) -> Option<Score> {
    if let Some(score) = value.as_i64() {
        return Some(Score::Int(score));
    }
    let pairs = value.as_map()?.iter().map(|(name, value)| Some((name.as_str()?, value.as_i64()?)));
    pairs.collect::<Option<FieldScores>>().map(Score::Fields)
}

/// A progress bar over `len` (a spinner without), hidden if `quiet`.
pub(crate) fn progress(quiet: bool, len: Option<u64>, unit: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = match len {
        Some(len) => ProgressBar::new(len),
        None => ProgressBar::new_spinner(),
    };
    let template = format!("{{spinner}} {{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{per_sec}}) {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Exports a board in rank order as `board,player,score,rank` CSV (a
/// column per field instead of `score` on a board with fields); returns
/// the rows written. Pages through `top` (a deep offset costs O(log n)), so
/// a board changing meanwhile may show a player twice or not at all: stop
/// writes for an exact snapshot.
pub async fn export(args: &ExportArgs, out: &mut dyn Write) -> Result<u64, TransferError> {
    const PAGE: u64 = 1000;
    let mut client = args.client.connect().await?;
    let fields: Vec<String> = match client.board_fields(&args.board).await? {
        Some(fields) => fields.into_iter().map(|field| field.name).collect(),
        None => vec!["score".to_string()],
    };
    let mut writer = csv::Writer::from_writer(out);
    let header = ["board", "player"].into_iter().chain(fields.iter().map(String::as_str)).chain(["rank"]);
    writer.write_record(header).map_err(csv_error)?;
    let mut offset = 0u64;
    loop {
        let mut call =
            Call::new(OpKind::Top).with("board", args.board.as_str()).with("limit", PAGE).with("offset", offset);
        if let Some(window) = &args.window {
            call = call.with("window", window.as_str());
        }
        call = call.with("period", args.period);
        let page: Vec<Entry<Score>> = client.call(call).await?;
        for entry in &page {
            let scores: Vec<String> = match &entry.score {
                Score::Int(score) => vec![score.to_string()],
                Score::Fields(scores) => fields.iter().map(|name| scores.get(name).unwrap_or(0).to_string()).collect(),
            };
            let record = [args.board.as_str(), &entry.player].into_iter().chain(scores.iter().map(String::as_str));
            writer.write_record(record.chain([entry.rank.to_string().as_str()])).map_err(csv_error)?;
        }
        offset += page.len() as u64;
        if (page.len() as u64) < PAGE {
            break;
        }
    }
    writer.flush()?;
    Ok(offset)
}

fn csv_error(e: csv::Error) -> TransferError {
    TransferError::Io(std::io::Error::other(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    #[test]
    fn reads_csv_with_header_quotes_and_errors() {
        let text = "board,player,score\nb,\"a, b\",5\nb,c,-7,ignored\nb,d,x\n";
        let got: Vec<_> = rows(Format::Csv, std::io::Cursor::new(text.as_bytes().to_vec())).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0].as_ref().unwrap(),
            &Row { number: 2, board: "b".into(), player: "a, b".into(), score: Score::Int(5) }
        );
        assert_eq!(got[1].as_ref().unwrap().score, Score::Int(-7));
        assert!(matches!(got[2], Err(TransferError::Row { row: 4, .. })));
    }

    #[test]
    fn reads_a_msgpack_stream() {
        let mut bytes = Vec::new();
        for (p, s) in [("x", 1i64), ("y", i64::MIN)] {
            rmpv::encode::write_value(&mut bytes, &Value::Array(vec!["b".into(), p.into(), s.into()])).unwrap();
        }
        rmpv::encode::write_value(&mut bytes, &Value::from(3)).unwrap();
        let got: Vec<_> = rows(Format::Msgpack, std::io::Cursor::new(bytes)).collect();
        assert_eq!(
            got[1].as_ref().unwrap(),
            &Row { number: 2, board: "b".into(), player: "y".into(), score: Score::Int(i64::MIN) }
        );
        assert!(got[2].is_err());
    }

    #[test]
    fn reads_one_column_per_field_named_by_the_header() {
        let text = "board,player,trophies,retries,rank\ncup,alice,30,2,1\ncup,bob,20,x,2\ncup,carol,10\n";
        let got: Vec<_> = rows(Format::Csv, std::io::Cursor::new(text.as_bytes().to_vec())).collect();
        let alice = Score::Fields(FieldScores::from([("trophies", 30), ("retries", 2)]));
        assert_eq!(
            got[0].as_ref().unwrap(),
            &Row { number: 2, board: "cup".into(), player: "alice".into(), score: alice }
        );
        assert!(matches!(&got[1], Err(TransferError::Row { row: 3, reason }) if reason.contains("retries `x`")));
        assert!(matches!(&got[2], Err(TransferError::Row { row: 4, reason }) if reason.contains("no retries")));
        // A field named rank, then export's rank column.
        let text = "board,player,rank,rank\ncup,a,4,1\n";
        let got: Vec<_> = rows(Format::Csv, std::io::Cursor::new(text.as_bytes().to_vec())).collect();
        assert_eq!(got[0].as_ref().unwrap().score, Score::Fields(FieldScores::from([("rank", 4)])));
        // A first field named score: export's header for it reads back as
        // fields, not as a plain score (export's own header, `score,rank`,
        // stays plain).
        let text = "board,player,score,time,rank\ncup,a,4,90,1\n";
        let got: Vec<_> = rows(Format::Csv, std::io::Cursor::new(text.as_bytes().to_vec())).collect();
        assert_eq!(got[0].as_ref().unwrap().score, Score::Fields(FieldScores::from([("score", 4), ("time", 90)])));
        let text = "board,player,score,rank\ncup,a,4,1\n";
        let got: Vec<_> = rows(Format::Csv, std::io::Cursor::new(text.as_bytes().to_vec())).collect();
        assert_eq!(got[0].as_ref().unwrap().score, Score::Int(4));
    }

    #[test]
    fn reads_map_scores_from_msgpack() {
        let mut bytes = Vec::new();
        let score = Value::Map(vec![("trophies".into(), 3.into()), ("retries".into(), 1.into())]);
        rmpv::encode::write_value(&mut bytes, &Value::Array(vec!["cup".into(), "a".into(), score])).unwrap();
        let bad = Value::Map(vec![("trophies".into(), "many".into())]);
        rmpv::encode::write_value(&mut bytes, &Value::Array(vec!["cup".into(), "b".into(), bad])).unwrap();
        let got: Vec<_> = rows(Format::Msgpack, std::io::Cursor::new(bytes)).collect();
        assert_eq!(got[0].as_ref().unwrap().score, Score::Fields(FieldScores::from([("trophies", 3), ("retries", 1)])));
        assert!(got[1].is_err());
    }
}
