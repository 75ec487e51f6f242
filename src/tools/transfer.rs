//! `rankd import` and `rankd export`: bulk loading and dumping boards through
//! the protocol of a running server (so imports are durable and acknowledged
//! like any write, and work against a live, sharded server).
//!
//! Import reads `board,player,score` rows (CSV, an optional header line) or
//! a msgpack stream of `[board, player, score]` arrays, groups consecutive
//! rows of one board into `set_many` requests of up to 10 000 entries, and
//! keeps several of them in flight. Export pages through `top` in rank order
//! and writes `board,player,score,rank` CSV, which import reads back.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use rankd_client::protocol::MAX_SET_MANY;
use rankd_client::{Call, Client, ClientError, Entry, OpKind};

use crate::tools::cli::ClientArgs;

/// Input formats of `rankd import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// `board,player,score` lines (RFC 4180 quoting).
    Csv,
    /// A stream of msgpack `[board, player, score]` arrays.
    Msgpack,
}

/// `rankd import` flags.
#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// Server to load into.
    #[command(flatten)]
    pub client: ClientArgs,
    /// File to read (`-` for standard input).
    pub file: PathBuf,
    /// Input format.
    #[arg(long, value_enum, default_value = "csv")]
    pub format: Format,
    /// Write mode: set, best or incr.
    #[arg(long, default_value = "set")]
    pub mode: String,
    /// Entries per `set_many` (at most 10 000).
    #[arg(long, default_value_t = 10_000)]
    pub batch: usize,
    /// `set_many` requests in flight.
    #[arg(long, default_value_t = 4)]
    pub pipeline: usize,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
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
}

/// One `board,player,score` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The board it goes to: consecutive rows of one board share a `set_many`.
    pub board: String,
    /// The player whose score it sets.
    pub player: String,
    /// The score written (under the import's `--mode`).
    pub score: i64,
}

/// Rows from a CSV or msgpack reader.
pub fn rows(format: Format, input: impl Read + 'static) -> Box<dyn Iterator<Item = Result<Row, TransferError>>> {
    match format {
        Format::Csv => {
            let reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(input);
            let mut first = true;
            Box::new(reader.into_records().enumerate().filter_map(move |(i, record)| {
                let row = i as u64 + 1;
                let record = match record {
                    Ok(r) => r,
                    Err(e) => return Some(Err(TransferError::Row { row, reason: e.to_string() })),
                };
                let is_header = first && record.get(0) == Some("board") && record.get(2) == Some("score");
                first = false;
                if is_header {
                    return None;
                }
                let field = |n: usize| record.get(n).map(str::to_string);
                Some(match (field(0), field(1), record.get(2).map(|s| s.trim().parse::<i64>())) {
                    (Some(board), Some(player), Some(Ok(score))) => Ok(Row { board, player, score }),
                    _ => Err(TransferError::Row { row, reason: "expected board,player,score (score an i64)".into() }),
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
                    Some([board, player, score]) => match (board.as_str(), player.as_str(), score.as_i64()) {
                        (Some(b), Some(p), Some(s)) => Some(Row { board: b.into(), player: p.into(), score: s }),
                        _ => None,
                    },
                    _ => None,
                };
                Some(parsed.ok_or(TransferError::Row { row, reason: "expected [board, player, score]".into() }))
            }))
        }
    }
}

fn progress(quiet: bool, len: Option<u64>, unit: &str) -> ProgressBar {
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

/// Summary of an import.
#[derive(Debug, Clone, Copy)]
pub struct ImportReport {
    /// Rows written.
    pub rows: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Imports `args.file` into the server.
pub async fn import(args: &ImportArgs) -> Result<ImportReport, TransferError> {
    if !(1..=MAX_SET_MANY).contains(&args.batch) {
        return Err(TransferError::Usage(format!("--batch must be 1 to {MAX_SET_MANY}")));
    }
    let (input, len): (Box<dyn Read>, Option<u64>) = if args.file.as_os_str() == "-" {
        (Box::new(std::io::stdin()), None)
    } else {
        let file = std::fs::File::open(&args.file)?;
        let len = file.metadata().ok().map(|m| m.len());
        (Box::new(file), len)
    };
    let bar = progress(args.quiet || len.is_none(), len, "bytes");
    let counted = CountingReader { inner: input, bar: bar.clone() };
    let mut client = args.client.connect().await?;
    let started = Instant::now();
    let mut written = 0u64;
    let mut calls: Vec<Call> = Vec::with_capacity(args.pipeline);
    let mut board = String::new();
    let mut entries: Vec<(String, i64)> = Vec::with_capacity(args.batch);
    for row in rows(args.format, counted) {
        let row = row?;
        if (row.board != board || entries.len() == args.batch) && !entries.is_empty() {
            calls.push(set_many(&board, std::mem::take(&mut entries), &args.mode));
            if calls.len() == args.pipeline {
                written += send(&mut client, &mut calls).await?;
            }
        }
        board = row.board;
        entries.push((row.player, row.score));
    }
    if !entries.is_empty() {
        calls.push(set_many(&board, entries, &args.mode));
    }
    written += send(&mut client, &mut calls).await?;
    bar.finish_and_clear();
    Ok(ImportReport { rows: written, seconds: started.elapsed().as_secs_f64() })
}

fn set_many(board: &str, entries: Vec<(String, i64)>, mode: &str) -> Call {
    Call::new(OpKind::SetMany).with("board", board).with("entries", entries).with("mode", mode)
}

/// Sends the queued `set_many`s as one pipeline; returns the rows they wrote.
async fn send(client: &mut Client, calls: &mut Vec<Call>) -> Result<u64, TransferError> {
    let mut rows = 0;
    for scores in client.pipeline::<Vec<i64>>(calls).await? {
        rows += scores?.len() as u64;
    }
    calls.clear();
    Ok(rows)
}

struct CountingReader<R> {
    /// The input file or standard input.
    inner: R,
    /// Advanced by every byte read: the import's progress.
    bar: ProgressBar,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

/// Exports a board in rank order as `board,player,score,rank` CSV; returns
/// the rows written. Pages through `top` (a deep offset costs O(log n)), so
/// a board changing meanwhile may show a player twice or not at all: stop
/// writes for an exact snapshot.
pub async fn export(args: &ExportArgs, out: &mut dyn Write) -> Result<u64, TransferError> {
    const PAGE: u64 = 1000;
    let mut client = args.client.connect().await?;
    let mut writer = csv::Writer::from_writer(out);
    writer.write_record(["board", "player", "score", "rank"]).map_err(csv_error)?;
    let mut offset = 0u64;
    loop {
        let mut call =
            Call::new(OpKind::Top).with("board", args.board.as_str()).with("limit", PAGE).with("offset", offset);
        if let Some(window) = &args.window {
            call = call.with("window", window.as_str());
        }
        call = call.with("period", args.period);
        let page: Vec<Entry> = client.call(call).await?;
        for entry in &page {
            writer
                .write_record([args.board.as_str(), &entry.player, &entry.score.to_string(), &entry.rank.to_string()])
                .map_err(csv_error)?;
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
        assert_eq!(got[0].as_ref().unwrap(), &Row { board: "b".into(), player: "a, b".into(), score: 5 });
        assert_eq!(got[1].as_ref().unwrap().score, -7);
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
        assert_eq!(got[1].as_ref().unwrap(), &Row { board: "b".into(), player: "y".into(), score: i64::MIN });
        assert!(got[2].is_err());
    }
}
