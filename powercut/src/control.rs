//! The control protocol between a test and the daemon: one command a line
//! on the daemon's stdin, one reply a line on its stdout.
//!
//! Commands: `cut [prefix|torn] [SEED]`, `resume`, `sync`, `fsync-delay MS`,
//! `fsync-fail on|off`, `write-fail on|enospc|off`, `stats`, `quit`.
//! Replies: `ok`, `ok {json}` (for `cut` and `stats`) or `error MESSAGE`.
//! Both halves live here so the parser and the printer cannot drift apart.

use std::time::Duration;

use crate::stats::CutMode;

/// What `write-fail` makes writes return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteFail {
    /// Writes work.
    #[default]
    Off,
    /// `write-fail on`: EIO, a failing disk.
    Eio,
    /// `write-fail enospc`: ENOSPC, a full disk.
    Enospc,
}

/// One control command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `cut [prefix|torn] [SEED]`: cut the power.
    Cut {
        /// What survives of unsynced writes.
        mode: CutMode,
        /// The seed for the prefixes (default: the daemon's generator).
        seed: Option<u64>,
    },
    /// `resume`: power back on, with the durable state.
    Resume,
    /// `sync`: make everything durable now, every file and every directory
    /// (a baseline after a test's setup: programs that skip an fsync, such
    /// as a directory fsync after a mkdir, would otherwise lose it).
    Sync,
    /// `fsync-delay MS`: every fsync/fsyncdir sleeps this long (0: off).
    FsyncDelay(Duration),
    /// `fsync-fail on|off`.
    FsyncFail(bool),
    /// `write-fail on|enospc|off`.
    WriteFail(WriteFail),
    /// `stats`: the counters as JSON.
    Stats,
    /// `quit`: unmount and exit (EOF on stdin does the same).
    Quit,
}

fn on_off(word: Option<&str>) -> Result<bool, String> {
    match word {
        Some("on") => Ok(true),
        Some("off") => Ok(false),
        other => Err(format!("expected on or off, got {other:?}")),
    }
}

impl Command {
    /// Parses one line.
    pub fn parse(line: &str) -> Result<Command, String> {
        let mut words = line.split_whitespace();
        let verb = words.next().ok_or("empty command")?;
        let args: Vec<&str> = words.collect();
        let arg = args.first().copied();
        let command = match verb {
            "cut" => {
                let (mode, rest) = match arg.and_then(CutMode::from_word) {
                    Some(mode) => (mode, &args[1..]),
                    None => (CutMode::All, &args[..]),
                };
                let seed = match rest {
                    [] => None,
                    [seed] => Some(seed.parse().map_err(|_| format!("bad seed {seed:?}"))?),
                    _ => return Err("usage: cut [prefix|torn] [SEED]".into()),
                };
                return Ok(Command::Cut { mode, seed });
            }
            "resume" => Command::Resume,
            "sync" => Command::Sync,
            "fsync-delay" => {
                let ms: u64 = arg.and_then(|a| a.parse().ok()).ok_or("usage: fsync-delay MS")?;
                Command::FsyncDelay(Duration::from_millis(ms))
            }
            "fsync-fail" => Command::FsyncFail(on_off(arg)?),
            "write-fail" => Command::WriteFail(match arg {
                Some("enospc") => WriteFail::Enospc,
                other => {
                    if on_off(other)? {
                        WriteFail::Eio
                    } else {
                        WriteFail::Off
                    }
                }
            }),
            "stats" => Command::Stats,
            "quit" => Command::Quit,
            other => return Err(format!("unknown command {other:?}")),
        };
        let arity = match command {
            Command::Resume | Command::Sync | Command::Stats | Command::Quit => 0,
            _ => 1,
        };
        if args.len() > arity {
            return Err(format!("too many arguments to {verb}"));
        }
        Ok(command)
    }

    /// The line that [`Command::parse`] reads back as this command.
    pub fn to_line(&self) -> String {
        let on = |b: bool| if b { "on" } else { "off" };
        match self {
            Command::Cut { mode, seed } => {
                let mut line = String::from("cut");
                if *mode != CutMode::All {
                    line = format!("{line} {}", mode.word());
                }
                if let Some(seed) = seed {
                    line = format!("{line} {seed}");
                }
                line
            }
            Command::Resume => "resume".into(),
            Command::Sync => "sync".into(),
            Command::FsyncDelay(d) => format!("fsync-delay {}", d.as_millis()),
            Command::FsyncFail(b) => format!("fsync-fail {}", on(*b)),
            Command::WriteFail(WriteFail::Off) => "write-fail off".into(),
            Command::WriteFail(WriteFail::Eio) => "write-fail on".into(),
            Command::WriteFail(WriteFail::Enospc) => "write-fail enospc".into(),
            Command::Stats => "stats".into(),
            Command::Quit => "quit".into(),
        }
    }
}

/// A reply line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `ok`, with the JSON object if there was one.
    Ok(Option<String>),
    /// `error MESSAGE`.
    Error(String),
}

impl Reply {
    /// The line for this reply (no newline).
    pub fn to_line(&self) -> String {
        match self {
            Reply::Ok(None) => "ok".into(),
            Reply::Ok(Some(json)) => format!("ok {json}"),
            Reply::Error(message) => format!("error {}", message.replace('\n', " ")),
        }
    }

    /// Parses a reply line.
    pub fn parse(line: &str) -> Result<Reply, String> {
        let line = line.trim_end();
        if line == "ok" {
            Ok(Reply::Ok(None))
        } else if let Some(json) = line.strip_prefix("ok ") {
            Ok(Reply::Ok(Some(json.to_owned())))
        } else if let Some(message) = line.strip_prefix("error") {
            Ok(Reply::Error(message.trim().to_owned()))
        } else {
            Err(format!("not a reply: {line:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        let commands = [
            Command::Cut { mode: CutMode::All, seed: None },
            Command::Cut { mode: CutMode::Prefix, seed: Some(7) },
            Command::Cut { mode: CutMode::Torn, seed: None },
            Command::Cut { mode: CutMode::All, seed: Some(1) },
            Command::Resume,
            Command::Sync,
            Command::FsyncDelay(Duration::from_millis(25)),
            Command::FsyncFail(true),
            Command::WriteFail(WriteFail::Enospc),
            Command::WriteFail(WriteFail::Eio),
            Command::WriteFail(WriteFail::Off),
            Command::Stats,
            Command::Quit,
        ];
        for command in commands {
            assert_eq!(Command::parse(&command.to_line()), Ok(command));
        }
        assert!(Command::parse("cut sideways").is_err());
        assert!(Command::parse("resume now").is_err());
        assert!(Command::parse("fsync-fail maybe").is_err());
        assert!(Command::parse("").is_err());
    }

    #[test]
    fn replies_round_trip() {
        for reply in [Reply::Ok(None), Reply::Ok(Some("{\"a\":1}".into())), Reply::Error("no".into())] {
            assert_eq!(Reply::parse(&reply.to_line()), Ok(reply));
        }
    }
}
