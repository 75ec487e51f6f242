//! The property: random operations over random boards and storage knobs
//! leave the shard answering exactly as the oracle.

use proptest::prelude::*;

use crate::ops::{knobs, op, order, ties};
use crate::run::run;
use crate::SLOTS;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        // No regression files next to the sources: failures print their seed.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn shard_matches_oracle(
        configs in proptest::collection::vec((order(), ties()), SLOTS),
        knobs in knobs(),
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        run(configs, knobs, ops)?;
    }
}
