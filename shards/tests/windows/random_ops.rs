//! The property: random writes, removes, clock advances, expiry, reopens
//! and crashes leave every readable period as the oracle has it.

use proptest::prelude::*;

use crate::ops::{board_config, knobs, op, start, SLOTS};
use crate::run::run;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 150,
        // No regression files next to the sources: failures print their seed.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn windows_match_oracle(
        configs in proptest::collection::vec(board_config(), SLOTS),
        start in start(),
        knobs in knobs(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(configs, start, knobs, ops)?;
    }
}
