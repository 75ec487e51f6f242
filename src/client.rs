//! A Rust client for the rankd protocol, with pipelining. The CLI and the
//! integration tests use it; it is also the reference for other languages.

use std::time::Duration;

use rmpv::{Value, ValueRef};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, ToSocketAddrs};

use crate::protocol::frame::write_frame_with;
use crate::protocol::{BoardInfo, Entry, FrameReader, RankInfo};

/// Replies can be as large as requests; the server's default `max_frame`.
const MAX_REPLY: usize = 64 << 20;

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error.
    #[error("{code}: {msg}")]
    Server {
        /// Protocol error code.
        code: String,
        /// Human message.
        msg: String,
    },
    /// The reply is not what the protocol promises.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// Connection failure.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl ClientError {
    /// The server's error code, if the server answered with an error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Server { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// One request: an op and its fields (the client adds `id`).
#[derive(Debug, Clone)]
pub struct Call {
    op: &'static str,
    fields: Vec<(&'static str, Value)>,
}

impl Call {
    /// A request for `op`.
    pub fn new(op: &'static str) -> Self {
        Self { op, fields: Vec::with_capacity(4) }
    }

    /// Adds a field.
    pub fn with(mut self, name: &'static str, value: impl Into<Value>) -> Self {
        self.fields.push((name, value.into()));
        self
    }

    /// Appends the framed request: written field by field, as building an
    /// `rmpv` map first cloned every value and allocated every key (the
    /// load generator's largest cost after the kernel's). Public for tests
    /// that time each frame themselves ([`Client::send_raw`]).
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        let fields = u32::try_from(self.fields.len() + 2).unwrap_or(u32::MAX);
        // Writing into a Vec cannot fail.
        write_frame_with(out, |out| {
            rmp::encode::write_map_len(out, fields).is_ok()
                && rmp::encode::write_str(out, "id").is_ok()
                && rmp::encode::write_uint(out, id).is_ok()
                && rmp::encode::write_str(out, "op").is_ok()
                && rmp::encode::write_str(out, self.op).is_ok()
                && self.fields.iter().all(|(name, value)| {
                    rmp::encode::write_str(out, name).is_ok() && rmpv::encode::write_value(out, value).is_ok()
                })
        });
    }
}

/// A connection to a rankd server.
pub struct Client {
    reader: FrameReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    next_id: u64,
}

impl Client {
    /// Connects to `addr`.
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Self, ClientError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, writer) = stream.into_split();
        Ok(Self { reader: FrameReader::new(read, MAX_REPLY), writer, next_id: 1 })
    }

    /// Connects, retrying until `timeout` (for a server that is starting).
    pub async fn connect_retry(addr: &str, timeout: Duration) -> Result<Self, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match Self::connect(addr).await {
                Ok(client) => return Ok(client),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Sends one request and returns its result.
    pub async fn call(&mut self, call: Call) -> Result<Value, ClientError> {
        self.pipeline(std::slice::from_ref(&call))
            .await?
            .pop()
            .unwrap_or_else(|| Err(ClientError::Protocol("no reply".into())))
    }

    /// Sends every request before reading any reply (writing and reading at
    /// once, so a long pipeline cannot deadlock on full socket buffers), and
    /// returns each result in order.
    pub async fn pipeline(&mut self, calls: &[Call]) -> Result<Vec<Result<Value, ClientError>>, ClientError> {
        let first = self.next_id;
        let mut out = Vec::with_capacity(calls.len() * 48);
        for (i, call) in calls.iter().enumerate() {
            call.encode(first + i as u64, &mut out);
        }
        self.next_id += calls.len() as u64;
        let writer = &mut self.writer;
        let reader = &mut self.reader;
        let write = async move { writer.write_all(&out).await };
        let read = async move {
            let mut results = Vec::with_capacity(calls.len());
            for i in 0..calls.len() {
                let body = reader.next_frame().await.map_err(|e| ClientError::Protocol(e.to_string()))?;
                let body = body.ok_or_else(|| ClientError::Protocol("connection closed".into()))?;
                results.push(decode_reply(&body, first + i as u64)?);
            }
            Ok::<_, ClientError>(results)
        };
        let (written, results) = tokio::join!(write, read);
        let results = results?;
        written?;
        Ok(results)
    }

    /// Sends raw bytes (tests use this for malformed input).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.writer.write_all(bytes).await?;
        Ok(())
    }

    /// Reads one raw reply map (tests use this after `send_raw`).
    pub async fn read_raw(&mut self) -> Result<Option<Value>, ClientError> {
        match self.reader.next_frame().await {
            Ok(Some(body)) => {
                Ok(Some(rmpv::decode::read_value(&mut &body[..]).map_err(|e| ClientError::Protocol(e.to_string()))?))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(ClientError::Protocol(e.to_string())),
        }
    }

    /// `ping`.
    pub async fn ping(&mut self) -> Result<String, ClientError> {
        string(self.call(Call::new("ping")).await?)
    }

    /// `create_board` with `order` and `ties`.
    pub async fn create_board(&mut self, board: &str, order: &str, ties: &str) -> Result<bool, ClientError> {
        boolean(
            self.call(Call::new("create_board").with("board", board).with("order", order).with("ties", ties)).await?,
        )
    }

    /// `drop_board`.
    pub async fn drop_board(&mut self, board: &str) -> Result<bool, ClientError> {
        boolean(self.call(Call::new("drop_board").with("board", board)).await?)
    }

    /// `set` with a mode (`set`, `best`, `incr`).
    pub async fn set(&mut self, board: &str, player: &str, score: i64, mode: &str) -> Result<i64, ClientError> {
        integer(self.call(set_call(board, player, score, mode)).await?)
    }

    /// `get`.
    pub async fn get(&mut self, board: &str, player: &str) -> Result<Option<i64>, ClientError> {
        let v = self.call(Call::new("get").with("board", board).with("player", player)).await?;
        if v.is_nil() {
            Ok(None)
        } else {
            integer(v).map(Some)
        }
    }

    /// `remove`.
    pub async fn remove(&mut self, board: &str, player: &str) -> Result<bool, ClientError> {
        boolean(self.call(Call::new("remove").with("board", board).with("player", player)).await?)
    }

    /// `count`.
    pub async fn count(&mut self, board: &str) -> Result<u64, ClientError> {
        unsigned(self.call(Call::new("count").with("board", board)).await?)
    }

    /// `rank`.
    pub async fn rank(&mut self, board: &str, player: &str) -> Result<Option<RankInfo>, ClientError> {
        typed(self.call(Call::new("rank").with("board", board).with("player", player)).await?)
    }

    /// `rank_of_score`.
    pub async fn rank_of_score(&mut self, board: &str, score: i64) -> Result<u64, ClientError> {
        unsigned(self.call(Call::new("rank_of_score").with("board", board).with("score", score)).await?)
    }

    /// `top`.
    pub async fn top(&mut self, board: &str, limit: u64, offset: u64) -> Result<Vec<Entry>, ClientError> {
        typed(self.call(Call::new("top").with("board", board).with("limit", limit).with("offset", offset)).await?)
    }

    /// `around`.
    pub async fn around(
        &mut self,
        board: &str,
        player: &str,
        before: u64,
        after: u64,
    ) -> Result<Vec<Entry>, ClientError> {
        typed(
            self.call(
                Call::new("around")
                    .with("board", board)
                    .with("player", player)
                    .with("before", before)
                    .with("after", after),
            )
            .await?,
        )
    }

    /// `boards`.
    pub async fn boards(&mut self) -> Result<Vec<BoardInfo>, ClientError> {
        typed(self.call(Call::new("boards")).await?)
    }
}

/// The `set` request, for pipelines.
pub fn set_call(board: &str, player: &str, score: i64, mode: &str) -> Call {
    Call::new("set").with("board", board).with("player", player).with("score", score).with("mode", mode)
}

/// Reads one reply, borrowing from `body` (an owned `rmpv` tree allocated
/// every map key) and owning only the result handed back.
fn decode_reply(body: &[u8], expected_id: u64) -> Result<Result<Value, ClientError>, ClientError> {
    let reply =
        rmpv::decode::read_value_ref(&mut &body[..]).map_err(|e| ClientError::Protocol(format!("bad reply: {e}")))?;
    let field = |name: &str| match &reply {
        ValueRef::Map(pairs) => {
            pairs.iter().find(|(k, _)| matches!(k, ValueRef::String(s) if s.as_str() == Some(name))).map(|(_, v)| v)
        }
        _ => None,
    };
    let id = field("id").and_then(|v| v.as_u64()).ok_or_else(|| ClientError::Protocol("reply without id".into()))?;
    if let Some(err) = field("err") {
        let err = err.to_owned();
        let text = |k: &str| err[k].as_str().unwrap_or_default().to_string();
        // id 0 answers a frame the server could not read an id from.
        if id != expected_id && id != 0 {
            return Err(ClientError::Protocol(format!("reply id {id}, expected {expected_id}")));
        }
        return Ok(Err(ClientError::Server { code: text("code"), msg: text("msg") }));
    }
    if id != expected_id {
        return Err(ClientError::Protocol(format!("reply id {id}, expected {expected_id}")));
    }
    field("ok").map(|ok| Ok(ok.to_owned())).ok_or_else(|| ClientError::Protocol("reply has neither ok nor err".into()))
}

fn typed<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ClientError> {
    rmpv::ext::from_value(value).map_err(|e| ClientError::Protocol(format!("unexpected result shape: {e}")))
}

fn integer(value: Value) -> Result<i64, ClientError> {
    value.as_i64().ok_or_else(|| ClientError::Protocol(format!("expected an integer, got {value}")))
}

fn unsigned(value: Value) -> Result<u64, ClientError> {
    value.as_u64().ok_or_else(|| ClientError::Protocol(format!("expected an unsigned integer, got {value}")))
}

fn boolean(value: Value) -> Result<bool, ClientError> {
    value.as_bool().ok_or_else(|| ClientError::Protocol(format!("expected a bool, got {value}")))
}

fn string(value: Value) -> Result<String, ClientError> {
    value.as_str().map(str::to_string).ok_or_else(|| ClientError::Protocol(format!("expected a string, got {value}")))
}
