//! Scripted servers for the tests: a loopback listener whose every
//! connection runs a script that reads requests and writes whatever frames
//! it likes (replies, pushes, nothing).

use std::future::Future;

use rmpv::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpListener;

use crate::frame::{write_frame, FrameReader};

/// The server's end of one connection.
pub(crate) struct Peer {
    reader: FrameReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Peer {
    /// The next request, `None` once the client has closed.
    pub async fn request(&mut self) -> Option<Value> {
        let body = self.reader.next_frame().await.ok()??;
        Some(rmpv::decode::read_value(&mut &body[..]).expect("a msgpack request"))
    }

    /// Writes one frame holding `value`.
    pub async fn send(&mut self, value: Value) {
        let mut body = Vec::new();
        rmpv::encode::write_value(&mut body, &value).unwrap();
        let mut frame = Vec::new();
        write_frame(&mut frame, &body);
        // The client may be gone already: some scripts outlive it.
        let _ = self.writer.write_all(&frame).await;
    }

    /// Answers request `id` with `ok`.
    pub async fn reply(&mut self, id: u64, ok: Value) {
        self.send(map(&[("id", id.into()), ("ok", ok)])).await;
    }

    /// Answers request `id` with the error `code`.
    pub async fn fail(&mut self, id: u64, code: &str) {
        let err = map(&[("code", code.into()), ("msg", format!("scripted {code}").into())]);
        self.send(map(&[("id", id.into()), ("err", err)])).await;
    }

    /// Pushes `event` of watch `watch`.
    pub async fn push(&mut self, watch: u64, event: Value) {
        self.send(map(&[("watch", watch.into()), ("event", event)])).await;
    }
}

/// A map with string keys.
pub(crate) fn map(entries: &[(&str, Value)]) -> Value {
    Value::Map(entries.iter().map(|(k, v)| (Value::from(*k), v.clone())).collect())
}

/// A request's field.
pub(crate) fn field<'a>(request: &'a Value, name: &str) -> &'a Value {
    request
        .as_map()
        .and_then(|entries| entries.iter().find(|(k, _)| k.as_str() == Some(name)))
        .map_or(&Value::Nil, |(_, v)| v)
}

/// A request's `id`.
pub(crate) fn id(request: &Value) -> u64 {
    field(request, "id").as_u64().expect("a request id")
}

/// A `top` row.
pub(crate) fn entry(player: &str, score: i64, rank: u64) -> Value {
    map(&[("player", player.into()), ("score", score.into()), ("rank", rank.into())])
}

/// Listens on loopback; connection `n` (from 0) runs `script(n, peer)`.
/// Returns the address to connect to.
pub(crate) async fn serve<F, Fut>(script: F) -> String
where
    F: Fn(usize, Peer) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((stream, _)) = listener.accept().await {
            let (read, writer) = stream.into_split();
            tokio::spawn(script(n, Peer { reader: FrameReader::new(read, 1 << 20), writer }));
            n += 1;
        }
    });
    addr
}
