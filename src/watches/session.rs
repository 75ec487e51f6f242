//! One connection's watches, as a plain struct: the ids it handed out, the
//! limit on how many may be open, and which may be pushed yet (a watch's
//! pushes follow its `watch` response on the wire).

use std::collections::HashSet;
use std::sync::Arc;

use rankd_client::protocol::MAX_WATCHES;

use super::pushes::{PushBox, Taken};
use super::{WatchHub, WatchKey};
use crate::error::Error;
use crate::protocol::request::WatchSpec;

/// A connection's watches. See the module docs.
pub struct WatchSession {
    hub: Arc<WatchHub>,
    /// The connection's number at the hub.
    conn: u64,
    /// The id the next watch gets.
    next_id: u64,
    /// Watches open.
    open: HashSet<u64>,
    /// Open watches whose `watch` response has been written: their pushes
    /// may go.
    announced: HashSet<u64>,
    /// Where the hub puts this connection's pushes.
    pushes: Arc<PushBox>,
}

impl WatchSession {
    /// A connection's watches, none open yet.
    pub fn new(hub: Arc<WatchHub>) -> Self {
        let conn = hub.connection();
        Self {
            hub,
            conn,
            next_id: 1,
            open: HashSet::new(),
            announced: HashSet::new(),
            pushes: Arc::new(PushBox::default()),
        }
    }

    /// Where this connection's pushes wait.
    pub fn pushes(&self) -> Arc<PushBox> {
        self.pushes.clone()
    }

    /// Whether any watch is open.
    pub fn is_watching(&self) -> bool {
        !self.open.is_empty()
    }

    /// Opens a watch; its id, or `too_large` past the limit.
    pub fn open(&mut self, spec: WatchSpec) -> Result<u64, Error> {
        if self.open.len() >= MAX_WATCHES {
            return Err(Error::TooLarge(format!("a connection may hold at most {MAX_WATCHES} watches")));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.open.insert(id);
        self.hub.add(self.key(id), spec, self.pushes.clone());
        Ok(id)
    }

    /// Ends a watch; whether it was open. Nothing more is pushed for it.
    pub fn close(&mut self, id: u64) -> bool {
        let was_open = self.open.remove(&id);
        self.announced.remove(&id);
        if was_open {
            self.hub.remove(self.key(id));
            self.pushes.forget(id);
        }
        was_open
    }

    /// The `watch` response of `id` is written: its pushes may follow.
    pub fn announce(&mut self, id: u64) {
        if self.open.contains(&id) {
            self.announced.insert(id);
        }
    }

    /// Takes the pushes that may be written now; watches they end are
    /// closed.
    pub fn take_pushes(&mut self) -> Taken {
        let taken = self.pushes.take(|id| self.announced.contains(&id));
        for id in &taken.ended {
            // The hub ended it already.
            self.open.remove(id);
            self.announced.remove(id);
        }
        taken
    }

    fn key(&self, watch: u64) -> WatchKey {
        WatchKey { conn: self.conn, watch }
    }
}

impl Drop for WatchSession {
    /// Closing the connection ends its watches.
    fn drop(&mut self) {
        for id in std::mem::take(&mut self.open) {
            self.hub.remove(self.key(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::operations::metrics::Metrics;
    use crate::protocol::request::WatchTarget;

    fn spec() -> WatchSpec {
        WatchSpec {
            board: "b".into(),
            target: WatchTarget::Top(3),
            view: Default::default(),
            interval: Duration::from_millis(100),
        }
    }

    #[test]
    fn watches_are_limited_numbered_and_ended_with_the_connection() {
        let hub = WatchHub::new(Metrics::new(1).unwrap());
        let mut session = WatchSession::new(hub.clone());
        let ids: Vec<u64> = (0..MAX_WATCHES).map(|_| session.open(spec()).unwrap()).collect();
        assert_eq!(ids.first(), Some(&1));
        assert!(matches!(session.open(spec()), Err(Error::TooLarge(_))));
        assert!(session.close(1) && !session.close(1));
        assert!(session.open(spec()).is_ok(), "a closed watch frees its place");
        assert!(hub.is_watched("b"));
        drop(session);
        assert!(!hub.is_watched("b"));
    }

    #[test]
    fn pushes_wait_for_their_watch_response_and_end_with_the_board() {
        let hub = WatchHub::new(Metrics::new(1).unwrap());
        let mut session = WatchSession::new(hub.clone());
        let id = session.open(spec()).unwrap();
        session.pushes().put(id, b"first".to_vec(), false);
        assert_eq!(session.take_pushes().frames, 0, "not announced yet");
        session.announce(id);
        assert_eq!(session.take_pushes().bytes, b"first");
        hub.dropped("b");
        let taken = session.take_pushes();
        assert_eq!((taken.frames, taken.ended), (1, vec![id]));
        assert!(!session.is_watching());
    }
}
