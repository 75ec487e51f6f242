//! `rankd import`: bulk loading through the protocol of a running server, so
//! imports are durable and acknowledged like any write and work against a
//! live, sharded server.
//!
//! Rows ([`rows`]) are grouped, consecutive rows of one board at a time,
//! into `set_many` requests of up to 10 000 entries, several of them in
//! flight. Every request carries a `wid` naming the import's run and the
//! rows it holds, which makes an import resumable without counting twice:
//! after a broken connection or a shed request the same requests are sent
//! again, and after a failure the import gives up with the row to go on
//! from and its run id; a run resumed with both sends its requests with the
//! same `wid`s, so one the server applied already (within its dedup
//! horizon) is answered `dup` and changes nothing, even under `--mode incr`.

use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde::de::IgnoredAny;

use rankd_client::protocol::MAX_SET_MANY;
use rankd_client::{Call, Client, ClientError, OpKind, Score, WidSource, Written};

use crate::tools::cli::ClientArgs;
use crate::tools::transfer::{progress, rows, Format, TransferError};

/// The longest a run id may be: a `wid` is at most 64 bytes, and an
/// import's is `i:<run>:<first row>-<last row>`, each row up to 20 digits.
const MAX_RUN_ID: usize = 16;

/// How long one pipeline of requests may go unanswered before its
/// connection is taken as lost (and the requests sent again on a new one).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);

/// The first pause after a failed attempt; it doubles up to
/// [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(5);

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
    /// Go on after this row (numbered as in error messages, a CSV header
    /// being row 1): what a failed import printed. Keep `--batch` as it was.
    #[arg(long, default_value_t = 0)]
    pub resume_after: u64,
    /// The run a resumed import continues (printed when an import fails),
    /// so that requests the server applied already are not applied again.
    /// Default: a new random id.
    #[arg(long)]
    pub run_id: Option<String>,
    /// How long to keep reconnecting and sending again after the server
    /// went away or shed a request, before giving up.
    #[arg(long, default_value_t = 60)]
    pub retry_secs: u64,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Summary of an import.
#[derive(Debug, Clone, Copy)]
pub struct ImportReport {
    /// Rows written by this run (a resumed run's skipped rows not counted).
    pub rows: u64,
    /// Requests sent more than once (after a broken connection or a shed
    /// request).
    pub resent: u64,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Imports `args.file` into the server.
pub async fn import(args: &ImportArgs) -> Result<ImportReport, TransferError> {
    if !(1..=MAX_SET_MANY).contains(&args.batch) {
        return Err(TransferError::Usage(format!("--batch must be 1 to {MAX_SET_MANY}")));
    }
    // 0 would never fill a pipeline: the whole file held, then sent at once.
    if args.pipeline == 0 {
        return Err(TransferError::Usage("--pipeline must be at least 1".into()));
    }
    let run = match &args.run_id {
        Some(run) => valid_run_id(run)?.to_string(),
        None => format!("{:016x}", WidSource::new().prefix()),
    };
    let (input, len): (Box<dyn Read>, Option<u64>) = if args.file.as_os_str() == "-" {
        (Box::new(std::io::stdin()), None)
    } else {
        let file = std::fs::File::open(&args.file)?;
        let len = file.metadata().ok().map(|m| m.len());
        (Box::new(file), len)
    };
    let bar = progress(args.quiet || len.is_none(), len, "bytes");
    let counted = CountingReader { inner: input, bar: bar.clone() };
    // The first connection fails at once: a wrong address or token shows
    // now, not after the retries.
    let client = args.client.connect().await?;
    let started = Instant::now();
    let mut sender = Sender::new(args, run, client);
    let mut board = String::new();
    let mut entries: Vec<(String, Score)> = Vec::with_capacity(args.batch);
    let mut first_row = 0;
    let mut last_row = 0;
    for row in rows(args.format, counted) {
        let row = row.map_err(|e| sender.interrupted(e))?;
        if row.number <= args.resume_after {
            continue;
        }
        if (row.board != board || entries.len() == args.batch) && !entries.is_empty() {
            sender.queue(&board, std::mem::take(&mut entries), first_row, last_row);
            if sender.queued.len() == args.pipeline {
                sender.flush().await?;
            }
        }
        if entries.is_empty() {
            first_row = row.number;
        }
        (board, last_row) = (row.board, row.number);
        entries.push((row.player, row.score));
    }
    if !entries.is_empty() {
        sender.queue(&board, entries, first_row, last_row);
    }
    sender.flush().await?;
    bar.finish_and_clear();
    Ok(ImportReport { rows: sender.written, resent: sender.resent, seconds: started.elapsed().as_secs_f64() })
}

/// A run id is part of every `wid`: short, and plain enough to retype.
fn valid_run_id(run: &str) -> Result<&str, TransferError> {
    let plain = run.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    match (1..=MAX_RUN_ID).contains(&run.len()) && plain {
        true => Ok(run),
        false => Err(TransferError::Usage(format!("--run-id is 1 to {MAX_RUN_ID} of [A-Za-z0-9_-], not `{run}`"))),
    }
}

/// The rows a queued `set_many` holds.
struct Rows {
    /// How many.
    count: u64,
    /// The last one's number.
    last: u64,
}

/// Sends requests a pipeline at a time, again after a failure that allows
/// it, and keeps count of how far the input is written.
struct Sender<'a> {
    args: &'a ImportArgs,
    run: String,
    /// The connection; `None` after a failure, until the next attempt.
    client: Option<Client>,
    /// Requests waiting for the next pipeline, in row order, and the rows
    /// each holds (kept apart, so a pipeline sends the calls themselves).
    queued: Vec<Call>,
    queued_rows: Vec<Rows>,
    /// Rows written by this run.
    written: u64,
    /// Every row up to this one is written (or was skipped).
    written_through: u64,
    /// Requests sent again.
    resent: u64,
}

impl<'a> Sender<'a> {
    fn new(args: &'a ImportArgs, run: String, client: Client) -> Self {
        let (queued, queued_rows) = (Vec::with_capacity(args.pipeline), Vec::with_capacity(args.pipeline));
        let written_through = args.resume_after;
        Self { args, run, client: Some(client), queued, queued_rows, written: 0, written_through, resent: 0 }
    }

    /// Queues a `set_many` of rows `first..=last`, whose `wid` names them:
    /// a resumed run cutting its requests at the same rows sends the same.
    fn queue(&mut self, board: &str, entries: Vec<(String, Score)>, first: u64, last: u64) {
        self.queued_rows.push(Rows { count: entries.len() as u64, last });
        let call = Call::new(OpKind::SetMany)
            .with("board", board)
            .with("entries", entries)
            .with("mode", self.args.mode.as_str())
            .with("wid", format!("i:{}:{first}-{last}", self.run));
        self.queued.push(call);
    }

    /// Sends every queued request until each is answered, reconnecting and
    /// sending again what a broken connection or a shed request left
    /// unanswered, for up to `--retry-secs`.
    async fn flush(&mut self) -> Result<(), TransferError> {
        let deadline = Instant::now() + Duration::from_secs(self.args.retry_secs);
        let mut pause = FIRST_PAUSE;
        while !self.queued.is_empty() {
            let failure = match self.attempt().await {
                Ok(results) => match self.settle(results) {
                    None => continue,
                    Some(error) if error.server_may_retry() => error,
                    Some(error) => return Err(self.interrupted(error.into())),
                },
                Err(error) => {
                    self.client = None;
                    error
                }
            };
            if Instant::now() + pause > deadline {
                return Err(self.interrupted(failure.into()));
            }
            tracing::warn!(error = %failure, "import: sending {} requests again in {pause:?}", self.queued.len());
            self.resent += self.queued.len() as u64;
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
        Ok(())
    }

    /// One pipeline of every queued request, on the connection or a new one.
    async fn attempt(&mut self) -> Result<Vec<Result<Written<IgnoredAny>, ClientError>>, ClientError> {
        let (client, calls) = (&mut self.client, &self.queued);
        let sent = tokio::time::timeout(ATTEMPT_TIMEOUT, async {
            if client.is_none() {
                *client = Some(self.args.client.connect().await?);
            }
            let client = client.as_mut().expect("connected above");
            client.pipeline_written::<IgnoredAny>(calls).await
        });
        sent.await.unwrap_or_else(|_| {
            let why = format!("no answer within {ATTEMPT_TIMEOUT:?}");
            Err(ClientError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, why)))
        })
    }

    /// Takes the answered requests off the queue, up to the first that
    /// failed, whose error it returns: it and every request after it stay
    /// queued (one after it that did apply answers `dup` when sent again).
    fn settle(&mut self, results: Vec<Result<Written<IgnoredAny>, ClientError>>) -> Option<ClientError> {
        let mut answered = 0;
        let mut failure = None;
        for result in results {
            if let Err(error) = result {
                failure = Some(error);
                break;
            }
            answered += 1;
        }
        self.queued.drain(..answered);
        for rows in self.queued_rows.drain(..answered) {
            self.written += rows.count;
            self.written_through = rows.last;
        }
        failure
    }

    /// `cause`, with where to go on from once it is fixed.
    fn interrupted(&self, cause: TransferError) -> TransferError {
        TransferError::Interrupted {
            cause: Box::new(cause),
            resume_after: self.written_through,
            run_id: self.run.clone(),
        }
    }
}

struct CountingReader<R> {
    /// The input file or standard input.
    inner: R,
    /// Advanced by every byte read: the import's progress.
    bar: indicatif::ProgressBar,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_id_fits_every_wid_it_makes() {
        assert!(valid_run_id("0123456789abcdef").is_ok());
        assert!(valid_run_id("night-load_2").is_ok());
        for bad in ["", "0123456789abcdef0", "a:b", "a b", "é"] {
            assert!(valid_run_id(bad).is_err(), "{bad:?}");
        }
        let longest = format!("i:{}:{}-{}", "r".repeat(MAX_RUN_ID), u64::MAX, u64::MAX);
        assert!(longest.len() <= rankd_client::protocol::MAX_WID, "{}", longest.len());
    }
}
