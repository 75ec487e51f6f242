//! Scores on the wire: an integer, or on a board with `fields` a map of
//! field values (protocol 1.1). Which one a request must carry depends on
//! its board, so decoding keeps what the client sent ([`ScoreInput`]) and the
//! router turns it into the engine's packed score ([`whole`], [`amount`]),
//! and results back into maps ([`present`]).

use rankd_client::{ApproxRankInfo, Entry, RankInfo};
use rankd_shards::fields::{self, Field, FieldValues, MAX_FIELDS};
use rankd_shards::{Amount, BoardConfig, Mode, SharedBoard};
use rmpv::ValueRef;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

use super::response::Reply;
use crate::error::Error;

/// A score as a request carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScoreInput {
    /// A plain board's score.
    Int(i64),
    /// Field values by name, as sent (at most [`MAX_FIELDS`], no name twice).
    Map(Vec<(String, i64)>),
}

impl From<i64> for ScoreInput {
    fn from(score: i64) -> Self {
        Self::Int(score)
    }
}

/// Decodes a score field (`what` names it in errors).
pub fn decode(value: &ValueRef<'_>, what: &str) -> Result<ScoreInput, Error> {
    let bad = || Error::BadRequest(format!("{what} must be a signed 64-bit integer, or a map of field values"));
    match value {
        ValueRef::Integer(i) => i.as_i64().map(ScoreInput::Int).ok_or_else(bad),
        ValueRef::Map(pairs) => {
            if pairs.len() > MAX_FIELDS {
                return Err(Error::BadRequest(format!(
                    "{what} has {} fields; a board has at most {MAX_FIELDS}",
                    pairs.len()
                )));
            }
            let mut values: Vec<(String, i64)> = Vec::with_capacity(pairs.len());
            for (key, value) in pairs {
                let ValueRef::String(name) = key else { return Err(bad()) };
                let name = name.as_str().ok_or_else(bad)?;
                let ValueRef::Integer(v) = value else {
                    return Err(Error::BadRequest(format!("{what}: field `{}` must be an integer", clip(name))));
                };
                let v = v.as_i64().ok_or_else(|| {
                    Error::BadRequest(format!("{what}: field `{}` must be a signed 64-bit integer", clip(name)))
                })?;
                if values.iter().any(|(seen, _)| seen == name) {
                    return Err(Error::BadRequest(format!("{what}: field `{}` given twice", clip(name))));
                }
                values.push((name.to_string(), v));
            }
            Ok(ScoreInput::Map(values))
        }
        _ => Err(bad()),
    }
}

/// A whole score (for `set`, `best`, `rank_of_score`): the integer on a
/// plain board, or every field, each in its range, packed.
pub fn whole(config: &BoardConfig, input: ScoreInput) -> Result<i64, Error> {
    match (input, config.has_fields()) {
        (ScoreInput::Int(score), false) => Ok(score),
        (ScoreInput::Map(given), true) => {
            let values = by_field(&config.fields, given, true)?;
            fields::pack(&config.fields, &values[..config.fields.len()]).map_err(|e| Error::BadRequest(e.to_string()))
        }
        (input, _) => Err(mismatch(config, &input)),
    }
}

/// What a write in `mode` brings: a composite `incr` adds each given field
/// (missing ones add 0), anything else is a whole score.
pub fn amount(config: &BoardConfig, input: ScoreInput, mode: Mode) -> Result<Amount, Error> {
    match (mode, input) {
        (Mode::Incr, ScoreInput::Map(given)) if config.has_fields() => {
            Ok(Amount::Fields(by_field(&config.fields, given, false)?))
        }
        (_, input) => whole(config, input).map(Amount::Score),
    }
}

/// Orders given values by the board's fields; unknown names are refused,
/// and so are missing ones when `every` field is required.
fn by_field(fields: &[Field], given: Vec<(String, i64)>, every: bool) -> Result<FieldValues, Error> {
    let mut values = [0; MAX_FIELDS];
    for (name, value) in &given {
        let Some(at) = fields.iter().position(|f| f.name == *name) else {
            return Err(Error::BadRequest(format!(
                "unknown field `{}`; the board's fields are {}",
                clip(name),
                names(fields)
            )));
        };
        values[at] = *value;
    }
    if every {
        if let Some(missing) = fields.iter().find(|f| !given.iter().any(|(name, _)| *name == f.name)) {
            return Err(Error::BadRequest(format!(
                "score lacks field `{}`: a whole score needs every field",
                missing.name
            )));
        }
    }
    Ok(values)
}

fn mismatch(config: &BoardConfig, input: &ScoreInput) -> Error {
    match input {
        ScoreInput::Int(_) => Error::BadRequest(format!(
            "the board has fields ({}): a score is a map {{field: integer}}",
            names(&config.fields)
        )),
        ScoreInput::Map(_) => Error::BadRequest("the board has no fields: a score is an integer".into()),
    }
}

fn names(fields: &[Field]) -> String {
    fields.iter().map(|f| format!("`{}`", f.name)).collect::<Vec<_>>().join(", ")
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A packed score shown as its fields, encoded as a map in declared order.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldScore {
    /// The board, for its field names.
    board: SharedBoard,
    /// The values, in declared order.
    values: FieldValues,
}

impl FieldScore {
    /// Unpacks `packed` under `board`'s fields.
    pub fn new(board: &SharedBoard, packed: i64) -> Self {
        Self { board: board.clone(), values: fields::unpack(&board.config.fields, packed) }
    }
}

impl Serialize for FieldScore {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = &self.board.config.fields;
        let mut map = serializer.serialize_map(Some(fields.len()))?;
        for (field, value) in fields.iter().zip(self.values) {
            map.serialize_entry(&field.name, &value)?;
        }
        map.end()
    }
}

/// A reply of an op on `board` (which has fields) with its packed scores
/// shown as maps.
pub fn present(reply: Reply, board: &SharedBoard) -> Reply {
    let shown = |packed| FieldScore::new(board, packed);
    match reply {
        Reply::Score(packed) => Reply::FieldScore(shown(packed)),
        Reply::Scores(packed) => Reply::FieldScores(packed.into_iter().map(shown).collect()),
        Reply::MaybeScore(packed) => Reply::MaybeFieldScore(packed.map(shown)),
        Reply::ApproxRank(info) => Reply::FieldApproxRank(info.map(|info| ApproxRankInfo {
            rank: info.rank,
            score: shown(info.score),
            count: info.count,
            error: info.error,
        })),
        Reply::Rank(info) => {
            Reply::FieldRank(info.map(|info| RankInfo { rank: info.rank, score: shown(info.score), count: info.count }))
        }
        Reply::Entries(entries) => Reply::FieldEntries(
            entries.into_iter().map(|e| Entry { player: e.player, score: shown(e.score), rank: e.rank }).collect(),
        ),
        Reply::Replayed(first) => Reply::Replayed(Box::new(present(*first, board))),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankd_shards::{Board, Order};

    fn board() -> SharedBoard {
        let fields = vec![
            Field { name: "wins".into(), order: Order::Desc, min: 0, max: 100 },
            Field { name: "time".into(), order: Order::Asc, min: 0, max: 1000 },
        ];
        SharedBoard::new(Board {
            id: 1,
            name: "b".into(),
            config: BoardConfig { fields, ..BoardConfig::default() }.into(),
        })
    }

    fn map(pairs: &[(&str, i64)]) -> ScoreInput {
        ScoreInput::Map(pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect())
    }

    #[test]
    fn scores_must_match_the_board() {
        let board = board();
        let plain = BoardConfig::default();
        assert_eq!(whole(&plain, ScoreInput::Int(-4)), Ok(-4));
        assert!(whole(&plain, map(&[("wins", 1)])).unwrap_err().to_string().contains("no fields"));
        assert!(whole(&board.config, ScoreInput::Int(1)).unwrap_err().to_string().contains("`wins`, `time`"));
        assert!(whole(&board.config, map(&[("wins", 1)])).unwrap_err().to_string().contains("lacks field `time`"));
        assert!(whole(&board.config, map(&[("wins", 1), ("lives", 2)])).unwrap_err().to_string().contains("unknown"));
        assert!(whole(&board.config, map(&[("wins", 101), ("time", 2)])).unwrap_err().to_string().contains("[0, 100]"));
        let packed = whole(&board.config, map(&[("time", 7), ("wins", 3)])).unwrap();
        assert_eq!(fields::unpack(&board.config.fields, packed)[..2], [3, 7]);
        assert_eq!(amount(&board.config, map(&[("time", -2)]), Mode::Incr), Ok(Amount::Fields([0, -2, 0, 0])));
        assert_eq!(amount(&board.config, map(&[("time", 7), ("wins", 3)]), Mode::Best), Ok(Amount::Score(packed)));
    }

    #[test]
    fn results_show_every_field_in_declared_order() {
        let board = board();
        let packed = whole(&board.config, map(&[("time", 7), ("wins", 3)])).unwrap();
        let reply = present(Reply::Replayed(Box::new(Reply::Score(packed))), &board);
        let mut out = Vec::new();
        super::super::encode_reply(&mut out, 1, &reply);
        let v = rmpv::decode::read_value(&mut &out[4..]).unwrap();
        let shown: Vec<(String, i64)> = (v["ok"].as_map().unwrap().iter())
            .map(|(k, v)| (k.as_str().unwrap().to_string(), v.as_i64().unwrap()))
            .collect();
        assert_eq!(shown, vec![("wins".to_string(), 3), ("time".to_string(), 7)]);
        assert_eq!(v["dup"].as_bool(), Some(true));
    }
}
