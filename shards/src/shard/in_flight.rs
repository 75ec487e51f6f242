//! Sealed batches not yet reported done, and the overlays some of them
//! froze for their runs: until those runs are written, a read that misses
//! the current overlay must look in them before storage.
//!
//! Batches are counted, not listed one by one: nearly all carry no runs
//! (a run is written every `run_every` players), so a shard whose owner
//! hears of finished batches late still walks only the frozen overlays on
//! a read, not an entry per batch.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::overlay::Overlay;

/// See the module docs.
#[derive(Default)]
pub(super) struct InFlight {
    /// Oldest first. Only the newest stretch may end without an overlay.
    stretches: VecDeque<Stretch>,
    /// Batches in all the stretches.
    batches: usize,
}

/// Consecutive sealed batches, the last of which froze `overlay`, if any.
struct Stretch {
    batches: usize,
    overlay: Option<Arc<Overlay>>,
}

impl InFlight {
    /// A batch sealed, with the overlay it froze for its runs, if any.
    pub fn push(&mut self, overlay: Option<Arc<Overlay>>) {
        self.batches += 1;
        match self.stretches.back_mut() {
            Some(last) if last.overlay.is_none() => {
                last.batches += 1;
                last.overlay = overlay;
            }
            _ => self.stretches.push_back(Stretch { batches: 1, overlay }),
        }
    }

    /// The `count` oldest batches are done (at most all of them).
    pub fn land(&mut self, count: usize) {
        let mut count = count.min(self.batches);
        self.batches -= count;
        while count > 0 {
            let Some(oldest) = self.stretches.front_mut() else { break };
            if oldest.batches <= count {
                count -= oldest.batches;
                self.stretches.pop_front();
            } else {
                // Its overlay, if any, belongs to its last batch: kept.
                oldest.batches -= count;
                count = 0;
            }
        }
    }

    /// The frozen overlays, oldest first.
    pub fn overlays(&self) -> impl DoubleEndedIterator<Item = &Overlay> {
        self.stretches.iter().filter_map(|stretch| stretch.overlay.as_deref())
    }

    /// Batches carrying runs not yet written.
    pub fn unwritten_runs(&self) -> usize {
        self.stretches.iter().filter(|stretch| stretch.overlay.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against one entry per batch: the same overlays in the same
        /// order, the same count of unwritten runs, the same emptiness.
        #[test]
        fn matches_a_list_of_every_batch(steps in prop::collection::vec((any::<bool>(), 0usize..6), 1..80)) {
            let overlays: Vec<Arc<Overlay>> = (0..steps.len()).map(|_| Arc::new(Overlay::new(4))).collect();
            let mut counted = InFlight::default();
            let mut listed: VecDeque<Option<Arc<Overlay>>> = VecDeque::new();
            for (i, (with_runs, land)) in steps.into_iter().enumerate() {
                // Mostly pushes, a landing every few steps.
                if land < 4 {
                    let overlay = with_runs.then(|| overlays[i].clone());
                    counted.push(overlay.clone());
                    listed.push_back(overlay);
                } else {
                    let count = land + i % 3;
                    counted.land(count);
                    listed.drain(..count.min(listed.len()));
                }
                let expected: Vec<*const Overlay> = listed.iter().flatten().map(Arc::as_ptr).collect();
                let got: Vec<*const Overlay> = counted.overlays().map(|o| o as *const Overlay).collect();
                prop_assert_eq!(got, expected);
                prop_assert_eq!(counted.unwritten_runs(), listed.iter().filter(|o| o.is_some()).count());
                prop_assert_eq!(counted.is_empty(), listed.is_empty());
                prop_assert_eq!(counted.batches, listed.len());
            }
        }
    }
}
