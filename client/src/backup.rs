//! `backup`: a consistent point-in-time copy of a server's data, streamed
//! over one connection (an operator's op, not part of protocol.md).
//!
//! The server answers with frames that all carry the request's `id`:
//! first `{"backup": {"format", "shards", "branching"}}`, then any number
//! of `{"backup": {"shard", "keyspace", "entries": [[key, value], ...]}}`
//! (each shard's keyspaces in turn, keys ascending within a keyspace),
//! and last an ordinary reply: `{"ok": {"shards", "entries", "bytes"}}`,
//! or `{"err": ...}` if the copy failed part way. It then closes the
//! connection, so a backup gets a connection of its own.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use tokio::io::AsyncWriteExt;

use crate::call::Call;
use crate::protocol::OpKind;
use crate::reply::ErrBody;
use crate::{Client, ClientError};

/// The first frame of a backup: what the data dir it copies was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    /// The data dir's on-disk format.
    pub format: u32,
    /// Its shard count.
    pub shards: usize,
    /// Its count-tree branching factor.
    pub branching: u32,
}

/// Stored entries of one keyspace of one shard, in ascending key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupChunk {
    /// The shard they belong to.
    pub shard: usize,
    /// The keyspace they belong to.
    pub keyspace: String,
    /// Keys and values, raw.
    pub entries: Vec<(ByteBuf, ByteBuf)>,
}

/// The last frame of a complete backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupSummary {
    /// Shards copied.
    pub shards: usize,
    /// Entries copied, all keyspaces of all shards.
    pub entries: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
}

/// One part of a backup stream, as [`BackupStream::next`] reads them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BackupPart {
    /// Stored data (tried first: a chunk's fields are not a header's).
    Chunk(BackupChunk),
    /// The first frame.
    Header(BackupHeader),
}

/// What one backup frame holds: a part, the end, or the error that ended it.
#[derive(Debug, Deserialize)]
struct BackupFrame {
    id: u64,
    #[serde(default)]
    backup: Option<BackupPart>,
    #[serde(default)]
    ok: Option<BackupSummary>,
    #[serde(default)]
    err: Option<ErrBody>,
}

/// A backup being received: call [`BackupStream::next`] until it returns
/// `Ok(None)`; [`BackupStream::summary`] then says what was copied.
pub struct BackupStream<'a> {
    client: &'a mut Client,
    id: u64,
    summary: Option<BackupSummary>,
}

impl Client {
    /// Asks for a backup (a `write` token's op on a server with tokens).
    /// The server closes the connection once it is streamed.
    pub async fn backup(&mut self) -> Result<BackupStream<'_>, ClientError> {
        let id = self.take_id();
        let mut out = Vec::new();
        Call::new(OpKind::Backup).encode(id, &mut out);
        self.writer.write_all(&out).await?;
        self.writer.flush().await?;
        Ok(BackupStream { client: self, id, summary: None })
    }
}

impl BackupStream<'_> {
    /// The next part: the header first, then chunks; `None` once the
    /// server said the backup is complete. An error frame is the server's
    /// error; a frame for another request is a protocol error.
    pub async fn next(&mut self) -> Result<Option<BackupPart>, ClientError> {
        if self.summary.is_some() {
            return Ok(None);
        }
        let body = match self.client.reader.next_frame().await {
            Ok(Some(body)) => body,
            Ok(None) => {
                let why = "the server closed the connection mid-backup";
                return Err(ClientError::Io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why)));
            }
            Err(e) => return Err(e.into()),
        };
        let frame: BackupFrame =
            rmp_serde::from_slice(&body).map_err(|e| ClientError::Protocol(format!("bad backup frame: {e}")))?;
        if frame.id != self.id {
            return Err(ClientError::Protocol(format!("frame of request {} during backup {}", frame.id, self.id)));
        }
        match frame {
            BackupFrame { err: Some(ErrBody { code, msg }), .. } => Err(ClientError::Server { code, msg }),
            BackupFrame { ok: Some(summary), .. } => {
                self.summary = Some(summary);
                Ok(None)
            }
            BackupFrame { backup: Some(part), .. } => Ok(Some(part)),
            _ => Err(ClientError::Protocol("a backup frame with neither part, ok nor err".into())),
        }
    }

    /// What the server says it sent, once [`BackupStream::next`] returned `None`.
    pub fn summary(&self) -> Option<BackupSummary> {
        self.summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_decode_by_shape() {
        let header = BackupPart::Header(BackupHeader { format: 1, shards: 3, branching: 32 });
        let chunk = BackupPart::Chunk(BackupChunk {
            shard: 2,
            keyspace: "players".into(),
            entries: vec![(ByteBuf::from(vec![1, 2]), ByteBuf::from(vec![]))],
        });
        for part in [header, chunk] {
            let bytes = rmp_serde::to_vec_named(&part).unwrap();
            assert_eq!(rmp_serde::from_slice::<BackupPart>(&bytes).unwrap(), part);
        }
    }
}
