//! A small pipelined RESP (Redis serialization protocol) client, just enough
//! for `rankd-bench --target redis://...`: commands are encoded as arrays of
//! bulk strings; replies are parsed incrementally from one read buffer
//! (simple strings, errors, integers, bulk strings, arrays and nulls, plus the
//! RESP3 null `_` for good measure).

use std::fmt;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, ToSocketAddrs};

/// Largest bulk string or array accepted in a reply.
const MAX_LEN: i64 = 512 << 20;

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`: the command failed.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nabc`.
    Bulk(Vec<u8>),
    /// `*2\r\n...`.
    Array(Vec<Reply>),
    /// `$-1`, `*-1` or RESP3 `_`.
    Nil,
}

impl Reply {
    /// Whether the server answered with an error.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Simple(s) => write!(f, "{s}"),
            Reply::Error(e) => write!(f, "(error) {e}"),
            Reply::Integer(i) => write!(f, "(integer) {i}"),
            Reply::Bulk(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Reply::Array(items) => {
                write!(f, "[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{item}")?;
                }
                write!(f, "]")
            }
            Reply::Nil => write!(f, "(nil)"),
        }
    }
}

/// A connection or framing failure (an error *reply* is a [`Reply::Error`]).
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// The bytes are not RESP.
    #[error("RESP protocol violation: {0}")]
    Protocol(String),
    /// The server closed the connection.
    #[error("connection closed by the server")]
    Closed,
    /// Connection failure.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Appends one command, an array of bulk strings, to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_decimal(out, args.len() as u64);
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        push_decimal(out, arg.len() as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Parses one reply from the front of `buf`: `Ok(None)` if `buf` does not
/// hold a whole reply yet, else the reply and how many bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, RespError> {
    let Some(end) = find_crlf(buf) else { return Ok(None) };
    let line = &buf[1..end];
    let mut used = end + 2;
    let reply = match buf[0] {
        b'+' => Reply::Simple(String::from_utf8_lossy(line).into_owned()),
        b'-' => Reply::Error(String::from_utf8_lossy(line).into_owned()),
        b':' => Reply::Integer(parse_int(line)?),
        b'_' => Reply::Nil,
        b'$' => {
            let len = parse_int(line)?;
            if len < 0 {
                Reply::Nil
            } else if len > MAX_LEN {
                return Err(RespError::Protocol(format!("bulk string of {len} bytes")));
            } else {
                let len = len as usize;
                if buf.len() < used + len + 2 {
                    return Ok(None);
                }
                if &buf[used + len..used + len + 2] != b"\r\n" {
                    return Err(RespError::Protocol("bulk string not followed by CRLF".into()));
                }
                let bytes = buf[used..used + len].to_vec();
                used += len + 2;
                Reply::Bulk(bytes)
            }
        }
        b'*' => {
            let n = parse_int(line)?;
            if n < 0 {
                Reply::Nil
            } else if n > MAX_LEN {
                return Err(RespError::Protocol(format!("array of {n} items")));
            } else {
                let mut items = Vec::with_capacity((n as usize).min(1024));
                for _ in 0..n {
                    match parse(&buf[used..])? {
                        Some((item, len)) => {
                            items.push(item);
                            used += len;
                        }
                        None => return Ok(None),
                    }
                }
                Reply::Array(items)
            }
        }
        other => return Err(RespError::Protocol(format!("unexpected reply type byte {other:#04x}"))),
    };
    Ok(Some((reply, used)))
}

/// Index of the first `\r\n` (of the `\r`), if the buffer holds one.
fn find_crlf(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = buf[from..].iter().position(|&b| b == b'\r') {
        let i = from + i;
        match buf.get(i + 1) {
            Some(b'\n') => return Some(i),
            Some(_) => from = i + 1,
            None => return None,
        }
    }
    None
}

fn parse_int(line: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| RespError::Protocol(format!("bad integer {:?}", String::from_utf8_lossy(line))))
}

/// A connection to a Redis server.
pub struct Connection {
    /// Replies, read while a pipeline is still being written.
    read: OwnedReadHalf,
    /// Commands, written a pipeline at a time.
    write: OwnedWriteHalf,
    /// Received bytes; `buf[start..]` is not parsed yet.
    buf: Vec<u8>,
    /// Where the unparsed bytes of `buf` begin.
    start: usize,
}

impl Connection {
    /// Connects to `addr`.
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Self, RespError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        Ok(Self { read, write, buf: Vec::with_capacity(64 << 10), start: 0 })
    }

    /// Sends one command and returns its reply.
    pub async fn command(&mut self, args: &[&[u8]]) -> Result<Reply, RespError> {
        let mut out = Vec::new();
        encode(&mut out, args);
        let mut replies = self.pipeline(&out, 1).await?;
        replies.pop().ok_or(RespError::Closed)
    }

    /// Writes `commands` (`count` encoded commands) while reading their
    /// `count` replies, so a long pipeline cannot deadlock on full socket
    /// buffers; returns the replies in order.
    pub async fn pipeline(&mut self, commands: &[u8], count: usize) -> Result<Vec<Reply>, RespError> {
        let Self { read, write, buf, start } = self;
        let send = async move { write.write_all(commands).await };
        let receive = async move {
            let mut replies = Vec::with_capacity(count);
            while replies.len() < count {
                match parse(&buf[*start..])? {
                    Some((reply, used)) => {
                        replies.push(reply);
                        *start += used;
                    }
                    None => {
                        // Keep the unparsed tail at the front, then read more.
                        buf.drain(..*start);
                        *start = 0;
                        if buf.capacity() - buf.len() < 16 << 10 {
                            buf.reserve(64 << 10);
                        }
                        if read.read_buf(buf).await? == 0 {
                            return Err(RespError::Closed);
                        }
                    }
                }
            }
            Ok::<_, RespError>(replies)
        };
        let (sent, replies) = tokio::join!(send, receive);
        let replies = replies?;
        sent?;
        Ok(replies)
    }
}

/// The `redis_version` field of an `INFO server` reply.
pub fn version_from_info(info: &Reply) -> Option<String> {
    let Reply::Bulk(text) = info else { return None };
    String::from_utf8_lossy(text)
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:").map(|v| v.trim().to_string()))
}

/// Whether version `v` ("7.2.4") is at least `major.minor`.
pub fn version_at_least(v: &str, major: u32, minor: u32) -> bool {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Reply {
        let (reply, used) = parse(bytes).unwrap().expect("a whole reply");
        assert_eq!(used, bytes.len());
        // Every strict prefix is incomplete, never an error.
        for cut in 0..bytes.len() {
            assert!(parse(&bytes[..cut]).unwrap().is_none(), "prefix {cut} of {bytes:?}");
        }
        reply
    }

    #[test]
    fn encodes_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(&mut out, &[b"ZADD", b"board", b"12", b"player:1"]);
        assert_eq!(out, b"*4\r\n$4\r\nZADD\r\n$5\r\nboard\r\n$2\r\n12\r\n$8\r\nplayer:1\r\n");
        out.clear();
        encode(&mut out, &[b""]);
        assert_eq!(out, b"*1\r\n$0\r\n\r\n");
    }

    #[test]
    fn parses_every_reply_type() {
        assert_eq!(parse_all(b"+OK\r\n"), Reply::Simple("OK".into()));
        assert_eq!(parse_all(b"-ERR syntax error\r\n"), Reply::Error("ERR syntax error".into()));
        assert_eq!(parse_all(b":-42\r\n"), Reply::Integer(-42));
        assert_eq!(parse_all(b"$5\r\nhe\r\no\r\n"), Reply::Bulk(b"he\r\no".to_vec()));
        assert_eq!(parse_all(b"$0\r\n\r\n"), Reply::Bulk(Vec::new()));
        assert_eq!(parse_all(b"$-1\r\n"), Reply::Nil);
        assert_eq!(parse_all(b"*-1\r\n"), Reply::Nil);
        assert_eq!(parse_all(b"_\r\n"), Reply::Nil);
        assert_eq!(parse_all(b"*0\r\n"), Reply::Array(vec![]));
        assert_eq!(
            parse_all(b"*3\r\n:3\r\n$4\r\n1200\r\n*2\r\n$-1\r\n+x\r\n"),
            Reply::Array(vec![
                Reply::Integer(3),
                Reply::Bulk(b"1200".to_vec()),
                Reply::Array(vec![Reply::Nil, Reply::Simple("x".into())]),
            ])
        );
    }

    #[test]
    fn parses_back_to_back_replies_and_rejects_garbage() {
        let bytes = b":1\r\n+OK\r\n";
        let (first, used) = parse(bytes).unwrap().unwrap();
        assert_eq!((first, used), (Reply::Integer(1), 4));
        assert_eq!(parse(&bytes[used..]).unwrap().unwrap().0, Reply::Simple("OK".into()));
        assert!(parse(b"?what\r\n").is_err());
        assert!(parse(b":12x\r\n").is_err());
        assert!(parse(b"$2\r\nabcd\r\n").is_err());
    }

    #[test]
    fn reads_the_version_from_info() {
        let info = Reply::Bulk(b"# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n".to_vec());
        let v = version_from_info(&info).unwrap();
        assert_eq!(v, "7.0.15");
        assert!(!version_at_least(&v, 7, 2));
        assert!(version_at_least("7.2.4", 7, 2));
        assert!(version_at_least("8.0.0", 7, 2));
    }
}
