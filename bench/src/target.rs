//! What `rankd-bench` measures: rankd over its msgpack protocol, or Redis
//! with the equivalent sorted-set commands over [`crate::resp`].
//!
//! | load              | rankd                 | Redis                                        |
//! |-------------------|-----------------------|----------------------------------------------|
//! | write, mode set   | `set`                 | `ZADD board score player`                    |
//! | write, mode best  | `set` mode best       | `ZADD board GT score player`                 |
//! | write, mode incr  | `set` mode incr       | `ZINCRBY board score player`                 |
//! | rank              | `rank`                | `ZREVRANK board player WITHSCORE` (7.2+), else plain `ZREVRANK` |
//! | top               | `top` limit 10        | `ZREVRANGE board 0 9 WITHSCORES`             |
//! | around            | `around` 5/5          | `ZREVRANK`, then `ZREVRANGE board r-5 r+5 WITHSCORES` |
//! | count             | `count`               | `ZCARD board`                                |
//! | prefill           | `set_many` of 10 000  | `ZADD` of 1000 pairs                         |
//!
//! With `--boards`, each operation names its own board; a prefill request
//! never spans boards (a board of 5 players is one `set_many`, one `ZADD`).

use rankd_client::ConnectOptions;
use rankd_client::{set_call, Call, Client, Mode, OpKind, WidSource};
use serde::de::IgnoredAny;

use crate::args::Workload;
use crate::cpu::{self, ServerCpu, ServerSample};
use crate::error::BenchError;
use crate::load::{Names, Op};
use crate::resp::{self, Connection, Reply};

/// A server to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// rankd at `host:port`.
    Rankd(String),
    /// Redis at `host:port`, optionally a numbered database.
    Redis {
        /// `host:port`.
        addr: String,
        /// `SELECT`ed database.
        db: Option<u32>,
    },
}

impl Target {
    /// Parses `rankd://host:port` or `redis://host[:port][/db]`.
    pub fn parse(url: &str) -> Result<Self, BenchError> {
        let with_port = |hostport: &str, default_host: &str, default_port: u16| {
            if hostport.is_empty() {
                return format!("{default_host}:{default_port}");
            }
            let has_port = !hostport.ends_with(']')
                && hostport.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok());
            if has_port {
                hostport.to_string()
            } else {
                format!("{hostport}:{default_port}")
            }
        };
        if let Some(rest) = url.strip_prefix("redis://") {
            if rest.contains('@') {
                return Err(BenchError::Invalid("redis:// URLs with credentials are not supported".into()));
            }
            let (hostport, db) = match rest.split_once('/') {
                Some((hostport, "")) => (hostport, None),
                Some((hostport, db)) => (
                    hostport,
                    Some(db.parse().map_err(|_| BenchError::Invalid(format!("bad Redis database number in {url}")))?),
                ),
                None => (rest, None),
            };
            Ok(Target::Redis { addr: with_port(hostport, "127.0.0.1", 6379), db })
        } else if let Some(rest) = url.strip_prefix("rankd://") {
            Ok(Target::Rankd(with_port(rest.trim_end_matches('/'), "127.0.0.1", 7070)))
        } else {
            Err(BenchError::Invalid(format!("--target {url}: expected rankd://host:port or redis://host:port[/db]")))
        }
    }

    /// The target as a URL.
    pub fn url(&self) -> String {
        match self {
            Target::Rankd(addr) => format!("rankd://{addr}"),
            Target::Redis { addr, db: None } => format!("redis://{addr}"),
            Target::Redis { addr, db: Some(db) } => format!("redis://{addr}/{db}"),
        }
    }
}

/// A target after a first look at it: reachable, and for Redis its version,
/// persistence settings and whether `ZREVRANK ... WITHSCORE` works.
#[derive(Debug, Clone)]
pub(crate) enum Setup {
    Rankd { addr: String, connect: ConnectOptions },
    Redis { addr: String, db: Option<u32>, version: Option<String>, rank_withscore: bool, persistence: Option<String> },
}

impl Setup {
    /// Connects once to check the target answers and learn what it supports.
    pub async fn probe(target: &Target, board: &str, connect: &ConnectOptions) -> Result<Self, BenchError> {
        match target {
            Target::Rankd(addr) => {
                Client::connect_with(addr, connect).await?.ping().await?;
                Ok(Setup::Rankd { addr: addr.clone(), connect: connect.clone() })
            }
            Target::Redis { addr, db } => {
                let mut conn = redis_connect(addr, *db).await?;
                let version = resp::version_from_info(&conn.command(&[b"INFO", b"server"]).await?);
                // Authoritative whatever the version says (forks, renamed builds):
                // an error reply means no WITHSCORE.
                let probe = conn
                    .command(&[b"ZREVRANK", board.as_bytes(), b"rankd-bench:probe-absent-player", b"WITHSCORE"])
                    .await?;
                let rank_withscore = !probe.is_error();
                let persistence = match conn.command(&[b"CONFIG", b"GET", b"append*"]).await? {
                    Reply::Array(items) => {
                        let text: Vec<String> = items
                            .chunks(2)
                            .filter_map(|kv| match kv {
                                [Reply::Bulk(k), Reply::Bulk(v)] => {
                                    let k = String::from_utf8_lossy(k);
                                    (k == "appendonly" || k == "appendfsync")
                                        .then(|| format!("{k}={}", String::from_utf8_lossy(v)))
                                }
                                _ => None,
                            })
                            .collect();
                        (!text.is_empty()).then(|| text.join(" "))
                    }
                    _ => None,
                };
                Ok(Setup::Redis { addr: addr.clone(), db: *db, version, rank_withscore, persistence })
            }
        }
    }

    /// The target as a URL.
    pub fn url(&self) -> String {
        match self {
            Setup::Rankd { addr, connect } => {
                let url = Target::Rankd(addr.clone()).url();
                if connect.tls.is_some() {
                    format!("{url} (TLS)")
                } else {
                    url
                }
            }
            Setup::Redis { addr, db, .. } => Target::Redis { addr: addr.clone(), db: *db }.url(),
        }
    }

    /// The server's version, if known.
    pub fn version(&self) -> Option<String> {
        match self {
            Setup::Rankd { .. } => None,
            Setup::Redis { version, .. } => version.clone(),
        }
    }

    /// What a reader of the report should know about how the load mapped.
    pub fn notes(&self, workload: Workload) -> Vec<String> {
        let Setup::Redis { version, rank_withscore, persistence, .. } = self else { return Vec::new() };
        let mut notes = Vec::new();
        if matches!(workload, Workload::Rank | Workload::Mixed) {
            notes.push(if *rank_withscore {
                "rank = ZREVRANK ... WITHSCORE (rank and score; rankd's rank also carries the player count)".into()
            } else {
                format!(
                    "rank = plain ZREVRANK: Redis {} refused WITHSCORE (needs 7.2+), so its rank replies carry no \
                     score (rankd's carry rank, score and player count)",
                    version.as_deref().unwrap_or("(unknown version)")
                )
            });
        }
        if workload == Workload::Around {
            notes.push(
                "around = ZREVRANK, then ZREVRANGE r-5 r+5 WITHSCORES: two round trips per pipeline batch".into(),
            );
        }
        if let Some(p) = persistence {
            notes.push(format!("redis persistence: {p}"));
        }
        notes
    }

    /// What the server's counters say now: Redis its CPU seconds (`INFO
    /// cpu`); rankd its CPU and request latency, from its metrics endpoint
    /// at `metrics`, if given.
    pub async fn server_sample(&self, metrics: Option<&str>) -> Result<Option<ServerSample>, BenchError> {
        match self {
            Setup::Rankd { .. } => match metrics {
                Some(addr) => Ok(Some(cpu::scrape_rankd(addr).await?)),
                None => Ok(None),
            },
            Setup::Redis { addr, db, .. } => {
                let info = redis_connect(addr, *db).await?.command(&[b"INFO", b"cpu"]).await?;
                Ok(match info {
                    Reply::Bulk(text) => {
                        cpu::redis_cpu_seconds(&String::from_utf8_lossy(&text)).map(|total| ServerSample {
                            cpu: ServerCpu { total, by_thread: Default::default() },
                            latency: Default::default(),
                        })
                    }
                    _ => None,
                })
            }
        }
    }

    /// Empties the board.
    pub async fn reset(&self, board: &str) -> Result<(), BenchError> {
        match self {
            Setup::Rankd { addr, connect } => {
                Client::connect_with(addr, connect).await?.drop_board(board).await?;
            }
            Setup::Redis { addr, db, .. } => {
                let reply = redis_connect(addr, *db).await?.command(&[b"DEL", board.as_bytes()]).await?;
                if let Reply::Error(e) = reply {
                    return Err(BenchError::Redis(format!("DEL {board}: {e}")));
                }
            }
        }
        Ok(())
    }

    /// A new connection for one load task.
    pub async fn connect(&self) -> Result<Conn, BenchError> {
        Ok(match self {
            Setup::Rankd { addr, connect } => Conn::Rankd(Client::connect_with(addr, connect).await?),
            Setup::Redis { addr, db, rank_withscore, .. } => Conn::Redis(RedisConn {
                conn: redis_connect(addr, *db).await?,
                rank_withscore: *rank_withscore,
                out: Vec::with_capacity(16 << 10),
            }),
        })
    }
}

async fn redis_connect(addr: &str, db: Option<u32>) -> Result<Connection, BenchError> {
    let mut conn = Connection::connect(addr).await?;
    if let Some(db) = db {
        if let Reply::Error(e) = conn.command(&[b"SELECT", db.to_string().as_bytes()]).await? {
            return Err(BenchError::Redis(format!("SELECT {db}: {e}")));
        }
    }
    Ok(conn)
}

/// One load connection.
pub(crate) enum Conn {
    Rankd(Client),
    Redis(RedisConn),
}

pub(crate) struct RedisConn {
    /// The RESP connection the load goes through.
    conn: Connection,
    /// Whether ranks are asked `WITHSCORE` (Redis 7.2+), as rankd's carry
    /// the score.
    rank_withscore: bool,
    /// The pipeline being encoded, reused batch after batch.
    out: Vec<u8>,
}

impl Conn {
    /// Players per prefill request.
    pub fn prefill_chunk(&self) -> u64 {
        match self {
            Conn::Rankd(_) => 10_000,
            Conn::Redis(_) => 1000,
        }
    }

    /// Sends one request per `(board, (player, score) pairs)`, as one
    /// pipeline; any error fails.
    pub async fn prefill(&mut self, names: &Names, requests: &[(u64, Vec<(u64, i64)>)]) -> Result<(), BenchError> {
        match self {
            Conn::Rankd(client) => {
                let calls: Vec<Call> = requests
                    .iter()
                    .map(|(board, entries)| {
                        let entries: Vec<(String, i64)> = entries.iter().map(|&(p, s)| (names.player(p), s)).collect();
                        Call::new(OpKind::SetMany).with("board", names.board(*board)).with("entries", entries)
                    })
                    .collect();
                if let Some(e) = client.pipeline::<IgnoredAny>(&calls).await?.into_iter().find_map(Result::err) {
                    return Err(e.into());
                }
            }
            Conn::Redis(redis) => {
                redis.out.clear();
                for (board, entries) in requests {
                    let fields: Vec<(String, String)> =
                        entries.iter().map(|&(p, s)| (s.to_string(), names.player(p))).collect();
                    let board = names.board(*board);
                    let mut args: Vec<&[u8]> = Vec::with_capacity(2 + 2 * fields.len());
                    args.extend([b"ZADD".as_slice(), board.as_bytes()]);
                    for (score, name) in &fields {
                        args.extend([score.as_bytes(), name.as_bytes()]);
                    }
                    resp::encode(&mut redis.out, &args);
                }
                for reply in redis.conn.pipeline(&redis.out, requests.len()).await? {
                    if let Reply::Error(e) = reply {
                        return Err(BenchError::Redis(format!("prefill ZADD: {e}")));
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends `ops`, each `(board, op)`, as one pipeline and returns
    /// (answered ok, answered with an error). With `wids`, every rankd write
    /// carries a new `wid` from it.
    pub async fn execute(
        &mut self,
        names: &Names,
        mode: Mode,
        approx: bool,
        ops: &[(u64, Op)],
        mut wids: Option<&mut WidSource>,
    ) -> Result<(u64, u64), BenchError> {
        match self {
            Conn::Rankd(client) => {
                let calls: Vec<Call> = ops
                    .iter()
                    .map(|(board, op)| rankd_call(names, &names.board(*board), mode, approx, op, wids.as_deref_mut()))
                    .collect();
                Ok(client.pipeline_outcomes(&calls).await?)
            }
            Conn::Redis(redis) => redis.execute(names, mode, ops).await,
        }
    }
}

fn rankd_call(names: &Names, board: &str, mode: Mode, approx: bool, op: &Op, wids: Option<&mut WidSource>) -> Call {
    let player = |p| names.player(p);
    match *op {
        Op::Write { player: p, score } => {
            let call = set_call(board, &player(p), score, mode);
            match wids {
                Some(wids) => call.with("wid", wids.next_wid()),
                None => call,
            }
        }
        Op::Rank(p) => {
            let call = Call::new(OpKind::Rank).with("board", board).with("player", player(p));
            if approx {
                call.with("approx", true)
            } else {
                call
            }
        }
        Op::Top => Call::new(OpKind::Top).with("board", board).with("limit", 10),
        Op::Around(p) => {
            Call::new(OpKind::Around).with("board", board).with("player", player(p)).with("before", 5).with("after", 5)
        }
        Op::Count => Call::new(OpKind::Count).with("board", board),
    }
}

impl RedisConn {
    async fn execute(&mut self, names: &Names, mode: Mode, ops: &[(u64, Op)]) -> Result<(u64, u64), BenchError> {
        let player = |p| names.player(p);
        self.out.clear();
        for (board, op) in ops {
            let board = names.board(*board);
            let board = board.as_bytes();
            match *op {
                Op::Write { player: p, score } => {
                    let (score, name) = (score.to_string(), player(p));
                    let (score, name) = (score.as_bytes(), name.as_bytes());
                    match mode {
                        Mode::Set => resp::encode(&mut self.out, &[b"ZADD", board, score, name]),
                        Mode::Best => resp::encode(&mut self.out, &[b"ZADD", board, b"GT", score, name]),
                        Mode::Incr => resp::encode(&mut self.out, &[b"ZINCRBY", board, score, name]),
                    }
                }
                Op::Rank(p) => {
                    let name = player(p);
                    if self.rank_withscore {
                        resp::encode(&mut self.out, &[b"ZREVRANK", board, name.as_bytes(), b"WITHSCORE"]);
                    } else {
                        resp::encode(&mut self.out, &[b"ZREVRANK", board, name.as_bytes()]);
                    }
                }
                Op::Around(p) => resp::encode(&mut self.out, &[b"ZREVRANK", board, player(p).as_bytes()]),
                Op::Top => resp::encode(&mut self.out, &[b"ZREVRANGE", board, b"0", b"9", b"WITHSCORES"]),
                Op::Count => resp::encode(&mut self.out, &[b"ZCARD", board]),
            }
        }
        let replies = self.conn.pipeline(&self.out, ops.len()).await?;
        let (mut ok, mut err) = (0, 0);
        // `around`'s second step: the range around each rank found.
        self.out.clear();
        let mut second = 0;
        for ((board, op), reply) in ops.iter().zip(&replies) {
            match (op, reply) {
                (_, Reply::Error(_)) => err += 1,
                (Op::Around(_), Reply::Integer(rank)) => {
                    let (from, to) = ((rank - 5).max(0).to_string(), (rank + 5).to_string());
                    let board = names.board(*board);
                    let args: [&[u8]; 5] =
                        [b"ZREVRANGE", board.as_bytes(), from.as_bytes(), to.as_bytes(), b"WITHSCORES"];
                    resp::encode(&mut self.out, &args);
                    second += 1;
                }
                _ => ok += 1,
            }
        }
        if second > 0 {
            for reply in self.conn.pipeline(&self.out, second).await? {
                if reply.is_error() {
                    err += 1;
                } else {
                    ok += 1;
                }
            }
        }
        Ok((ok, err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        let redis = |addr: &str, db| Target::Redis { addr: addr.into(), db };
        assert_eq!(Target::parse("redis://127.0.0.1:6391").unwrap(), redis("127.0.0.1:6391", None));
        assert_eq!(Target::parse("redis://localhost").unwrap(), redis("localhost:6379", None));
        assert_eq!(Target::parse("redis://").unwrap(), redis("127.0.0.1:6379", None));
        assert_eq!(Target::parse("redis://h:1/2").unwrap(), redis("h:1", Some(2)));
        assert_eq!(Target::parse("redis://[::1]").unwrap(), redis("[::1]:6379", None));
        assert_eq!(Target::parse("rankd://10.0.0.1:7000").unwrap(), Target::Rankd("10.0.0.1:7000".into()));
        assert!(Target::parse("127.0.0.1:6379").is_err());
        assert!(Target::parse("redis://u:p@h:1").is_err());
        assert!(Target::parse("redis://h:1/x").is_err());
        assert_eq!(Target::parse("redis://h:1/2").unwrap().url(), "redis://h:1/2");
    }
}
