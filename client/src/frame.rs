//! Framing: a 4-byte big-endian length, then that many bytes, both ways.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Why no frame could be read.
#[derive(Debug)]
pub enum FrameError {
    /// The length prefix exceeds `max_frame`; the connection must close.
    TooLarge {
        /// Announced length.
        len: usize,
        /// The reader's limit.
        max: usize,
    },
    /// A zero length prefix: no msgpack value at all.
    Empty,
    /// The peer closed in the middle of a frame.
    Truncated,
    /// Socket error.
    Io(std::io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge { len, max } => write!(f, "frame of {len} bytes exceeds the limit of {max} bytes"),
            Self::Empty => f.write_str("empty frame"),
            Self::Truncated => f.write_str("connection closed mid-frame"),
            Self::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for FrameError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for FrameError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Reads frames from a byte stream. Cancel-safe: everything read so far stays
/// in the buffer, so it can sit in a `select!`.
pub struct FrameReader<R> {
    /// The stream the frames come from.
    inner: R,
    /// Bytes read and not yet handed out: kept across cancelled reads.
    buf: BytesMut,
    /// Frames announced longer are refused before their body is read.
    max_frame: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Wraps a stream; frames over `max_frame` are refused before any of their
    /// body is buffered, which bounds memory per connection.
    pub fn new(inner: R, max_frame: usize) -> Self {
        Self { inner, buf: BytesMut::with_capacity(16 * 1024), max_frame }
    }

    /// The next frame's body, or `None` at a clean end of stream.
    pub async fn next_frame(&mut self) -> Result<Option<BytesMut>, FrameError> {
        loop {
            if let Some(frame) = self.parse()? {
                return Ok(Some(frame));
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(FrameError::Truncated) };
            }
        }
    }

    /// The poll form of [`FrameReader::next_frame`], for `Stream`s and
    /// hand-written futures: the next frame's body, `None` at a clean end of
    /// stream, or `Pending` (with the waker registered) until more bytes
    /// come. Mixes freely with `next_frame` on the same reader.
    pub fn poll_next_frame(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<BytesMut>, FrameError>> {
        loop {
            if let Some(frame) = self.parse()? {
                return Poll::Ready(Ok(Some(frame)));
            }
            if ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.inner), cx, &mut self.buf))? == 0 {
                return Poll::Ready(if self.buf.is_empty() { Ok(None) } else { Err(FrameError::Truncated) });
            }
        }
    }

    /// Whether a complete frame is already buffered (no read needed).
    pub fn has_buffered_frame(&self) -> bool {
        self.buf.len() >= 4 && {
            let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
            len == 0 || len > self.max_frame || self.buf.len() >= 4 + len
        }
    }

    fn parse(&mut self) -> Result<Option<BytesMut>, FrameError> {
        let Some(header) = self.buf.first_chunk::<4>() else { return Ok(None) };
        let len = u32::from_be_bytes(*header) as usize;
        if len > self.max_frame {
            return Err(FrameError::TooLarge { len, max: self.max_frame });
        }
        if len == 0 {
            self.buf.advance(4);
            return Err(FrameError::Empty);
        }
        if self.buf.len() < 4 + len {
            self.buf.reserve(4 + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(4);
        Ok(Some(self.buf.split_to(len)))
    }
}

/// Appends one frame holding `body` to `out`.
pub fn write_frame(out: &mut Vec<u8>, body: &[u8]) {
    write_frame_with(out, |out| {
        out.extend_from_slice(body);
        true
    });
}

/// Appends one frame whose body `write_body` appends to `out` (returning
/// whether it could): the length goes in afterwards, so the body is written
/// in place rather than built apart and copied. A body that could not be
/// written leaves `out` as it was.
pub fn write_frame_with(out: &mut Vec<u8>, write_body: impl FnOnce(&mut Vec<u8>) -> bool) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    if !write_body(out) {
        out.truncate(start);
        return;
    }
    let len = u32::try_from(out.len() - start - 4).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn frames(bytes: &[u8], max: usize) -> Vec<Result<Option<Vec<u8>>, String>> {
        let mut reader = FrameReader::new(bytes, max);
        let mut out = Vec::new();
        loop {
            let item = reader.next_frame().await.map(|f| f.map(|b| b.to_vec())).map_err(|e| e.to_string());
            let stop = matches!(item, Ok(None)) || matches!(&item, Err(e) if !e.contains("empty"));
            out.push(item);
            if stop {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn splits_frames_and_reports_bad_lengths() {
        let mut bytes = Vec::new();
        write_frame(&mut bytes, b"ab");
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        write_frame(&mut bytes, b"c");
        let got = frames(&bytes, 16).await;
        assert_eq!(got[0], Ok(Some(b"ab".to_vec())));
        assert!(got[1].as_ref().is_err_and(|e| e.contains("empty")));
        assert_eq!(got[2], Ok(Some(b"c".to_vec())));
        assert_eq!(got[3], Ok(None));

        let huge = [0xFF, 0xFF, 0xFF, 0xFF, 1];
        assert!(frames(&huge, 16).await[0].as_ref().is_err_and(|e| e.contains("exceeds")));
        assert!(frames(&[0, 0, 0, 9, 1], 16).await[0].as_ref().is_err_and(|e| e.contains("mid-frame")));
    }

    #[tokio::test]
    async fn polling_reads_the_same_frames_as_awaiting() {
        let mut bytes = Vec::new();
        for body in [&b"one"[..], b"two", b"three"] {
            write_frame(&mut bytes, body);
        }
        // Bytes trickle in one at a time: every frame still comes out whole.
        let (mut tx, rx) = tokio::io::duplex(1);
        let feed = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            tx.write_all(&bytes).await.unwrap();
        });
        let mut reader = FrameReader::new(rx, 16);
        let first = std::future::poll_fn(|cx| reader.poll_next_frame(cx)).await.unwrap().unwrap();
        assert_eq!(&first[..], b"one");
        assert_eq!(&reader.next_frame().await.unwrap().unwrap()[..], b"two");
        let third = std::future::poll_fn(|cx| reader.poll_next_frame(cx)).await.unwrap().unwrap();
        assert_eq!(&third[..], b"three");
        feed.await.unwrap();
        assert!(std::future::poll_fn(|cx| reader.poll_next_frame(cx)).await.unwrap().is_none());
    }
}
