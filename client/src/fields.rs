//! Composite scores (protocol 1.1): a board created with 2 to 4 `fields`
//! ranks by each in turn (most trophies, then fewest retries), and every
//! score it takes or answers is a map `{field: i64}` instead of an integer.
//!
//! [`FieldSpec`] declares a field, [`BoardSpec`] carries them (and the rest
//! of a board's config) to [`Client::create_board_with`], and
//! [`FieldScores`] is a score on such a board. [`Score`] reads either kind,
//! for code that serves both (a CLI, an export).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::call::Call;
use crate::client::Client;
use crate::error::ClientError;
use crate::protocol::{Mode, OpKind, Order, Ties, Window};
use crate::reply::{ApproxRankInfo, ApproxRankOfScore, Entry, RankInfo};

/// How many fields a board may declare.
pub const FIELDS: std::ops::RangeInclusive<usize> = 2..=4;
/// Longest field name, in bytes.
pub const MAX_FIELD_NAME: usize = 32;

/// One field of a composite board: its name, which way is better, and its
/// range (inclusive). The server packs the fields into one key, so the
/// product of the range sizes must fit in 2^63.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FieldSpec {
    /// 1 to 32 bytes of `a`–`z`, `0`–`9`, `_`; unique on the board.
    pub name: String,
    /// `Desc`: higher is better; `Asc`: lower is better.
    pub order: Order,
    /// The lowest value the field may hold (the protocol's default is 0).
    #[serde(default)]
    pub min: i64,
    /// The highest value the field may hold.
    pub max: i64,
}

impl FieldSpec {
    /// A field where higher is better, from `min` to `max`.
    pub fn desc(name: impl Into<String>, min: i64, max: i64) -> Self {
        Self { name: name.into(), order: Order::Desc, min, max }
    }

    /// A field where lower is better, from `min` to `max`.
    pub fn asc(name: impl Into<String>, min: i64, max: i64) -> Self {
        Self { name: name.into(), order: Order::Asc, min, max }
    }
}

/// `name:order:min:max`, or `name:order:max` with `min` 0: the CLI's
/// `--field trophies:desc:0:1000000`.
impl FromStr for FieldSpec {
    type Err = FieldsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = || FieldsError::Syntax(format!("`{text}`: expected name:order:min:max or name:order:max"));
        let parts: Vec<&str> = text.split(':').collect();
        let (name, order, min, max) = match parts.as_slice() {
            [name, order, max] => (*name, *order, "0", *max),
            [name, order, min, max] => (*name, *order, *min, *max),
            _ => return Err(syntax()),
        };
        let order = Order::from_name(order)
            .ok_or_else(|| FieldsError::Syntax(format!("`{text}`: order is desc or asc, not `{order}`")))?;
        let number = |n: &str| n.trim().parse::<i64>().map_err(|_| syntax());
        Ok(Self { name: name.to_string(), order, min: number(min)?, max: number(max)? })
    }
}

impl fmt::Display for FieldSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}:{}", self.name, self.order, self.min, self.max)
    }
}

/// Why fields (or a score's text) are not what the protocol accepts: found
/// before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldsError {
    /// Fewer than 2 or more than 4 fields.
    Count(usize),
    /// A name that is empty, longer than 32 bytes or not `[a-z0-9_]`.
    Name(String),
    /// Two fields with one name.
    Duplicate(String),
    /// A field whose `min` is above its `max`.
    Range(String),
    /// The ranges' sizes multiply past 2^63: the server cannot pack them.
    TooWide,
    /// Text that does not parse (a `--field` flag, a `name=value` list).
    Syntax(String),
}

impl fmt::Display for FieldsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(n) => write!(f, "a board has {} to {} fields, not {n}", FIELDS.start(), FIELDS.end()),
            Self::Name(name) => {
                write!(f, "field name `{name}`: 1 to {MAX_FIELD_NAME} bytes of a-z, 0-9 and _")
            }
            Self::Duplicate(name) => write!(f, "field `{name}` is declared twice"),
            Self::Range(name) => write!(f, "field `{name}`: min is above max"),
            Self::TooWide => f.write_str("the fields' ranges multiply past 2^63 values"),
            Self::Syntax(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for FieldsError {}

/// Checks `fields` as the server would (count, names, ranges, packed size),
/// so a mistake is reported before `create_board` is sent.
pub fn validate_fields(fields: &[FieldSpec]) -> Result<(), FieldsError> {
    if !FIELDS.contains(&fields.len()) {
        return Err(FieldsError::Count(fields.len()));
    }
    let mut values: u128 = 1;
    for (i, field) in fields.iter().enumerate() {
        let name_ok = (1..=MAX_FIELD_NAME).contains(&field.name.len())
            && field.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !name_ok {
            return Err(FieldsError::Name(field.name.clone()));
        }
        if fields[..i].iter().any(|earlier| earlier.name == field.name) {
            return Err(FieldsError::Duplicate(field.name.clone()));
        }
        if field.min > field.max {
            return Err(FieldsError::Range(field.name.clone()));
        }
        // At most 2^64 per field and 2^63 in all: u128 cannot overflow.
        values *= (i128::from(field.max) - i128::from(field.min) + 1) as u128;
        if values > 1 << 63 {
            return Err(FieldsError::TooWide);
        }
    }
    Ok(())
}

/// A score on a board with fields: one value per field, by name. Results
/// carry every field; an `incr` may leave some out (they add 0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FieldScores(pub BTreeMap<String, i64>);

impl FieldScores {
    /// No fields yet: add them with [`FieldScores::with`].
    pub fn new() -> Self {
        Self::default()
    }

    /// These scores with `name` set to `value`.
    pub fn with(mut self, name: impl Into<String>, value: i64) -> Self {
        self.0.insert(name.into(), value);
        self
    }

    /// The value of field `name`, if present.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.0.get(name).copied()
    }

    /// The fields and their values, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.0.iter().map(|(name, value)| (name.as_str(), *value))
    }
}

impl<N: Into<String>> FromIterator<(N, i64)> for FieldScores {
    fn from_iter<I: IntoIterator<Item = (N, i64)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(name, value)| (name.into(), value)).collect())
    }
}

impl<N: Into<String>, const K: usize> From<[(N, i64); K]> for FieldScores {
    fn from(pairs: [(N, i64); K]) -> Self {
        pairs.into_iter().collect()
    }
}

/// `trophies=5,retries=2` (the CLI's form), in name order.
/// Padded as a whole, so it lines up in tables.
impl fmt::Display for FieldScores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self.iter().map(|(name, value)| format!("{name}={value}")).collect();
        f.pad(&pairs.join(","))
    }
}

/// Parses `trophies=5,retries=2`; a name given twice is an error.
impl FromStr for FieldScores {
    type Err = FieldsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut scores = Self::new();
        for pair in text.split(',') {
            let syntax = || FieldsError::Syntax(format!("`{pair}`: expected name=value, the value an i64"));
            let (name, value) = pair.split_once('=').ok_or_else(syntax)?;
            let value = value.trim().parse::<i64>().map_err(|_| syntax())?;
            if scores.0.insert(name.trim().to_string(), value).is_some() {
                return Err(FieldsError::Duplicate(name.trim().to_string()));
            }
        }
        Ok(scores)
    }
}

/// A score of either kind of board, as a result carries it: for code that
/// reads boards without knowing which kind they are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Score {
    /// A plain board's score.
    Int(i64),
    /// A composite board's score.
    Fields(FieldScores),
}

impl fmt::Display for Score {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(score) => score.fmt(f),
            Self::Fields(scores) => scores.fmt(f),
        }
    }
}

/// `1200` or `trophies=5,retries=2`: what a command line takes for either
/// kind of board.
impl FromStr for Score {
    type Err = FieldsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.contains('=') {
            return text.parse().map(Self::Fields);
        }
        let score = text.trim().parse().map_err(|_| {
            FieldsError::Syntax(format!("`{text}`: a score is an i64, or name=value pairs on a board with fields"))
        })?;
        Ok(Self::Int(score))
    }
}

/// A board's config for [`Client::create_board_with`]: every setting is
/// optional (`None` or empty leaves the server's default), and `fields`
/// makes it a composite board (whose `order` is then ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoardSpec {
    /// Which scores are better [default: desc].
    pub order: Option<Order>,
    /// How equal scores rank [default: competition].
    pub ties: Option<Ties>,
    /// Windows kept, 1 to 4 different ones [default: all].
    pub windows: Vec<Window>,
    /// Past periods kept of each periodic window, 1 to 1000 [default: 1].
    pub keep: Option<u32>,
    /// 2 to 4 fields for composite scores; empty for a plain board.
    pub fields: Vec<FieldSpec>,
}

impl BoardSpec {
    /// A composite board ranking by `fields` in turn.
    pub fn with_fields(fields: Vec<FieldSpec>) -> Self {
        Self { fields, ..Self::default() }
    }

    /// The `create_board` request for `board`, or why `fields` are wrong.
    pub fn call(&self, board: &str) -> Result<Call, FieldsError> {
        if !self.fields.is_empty() {
            validate_fields(&self.fields)?;
        }
        let windows = (!self.windows.is_empty()).then_some(&self.windows);
        let fields = (!self.fields.is_empty()).then_some(&self.fields);
        Ok(Call::new(OpKind::CreateBoard)
            .with("board", board)
            .with_opt("order", self.order)
            .with_opt("ties", self.ties)
            .with_opt("windows", windows)
            .with_opt("keep", self.keep)
            .with_opt("fields", fields))
    }
}

/// The `set` request on a board with fields (for [`crate::RetryingClient::write`]
/// and pipelines; [`Client::set_fields`] sends one).
pub fn set_fields_call(board: &str, player: &str, score: &FieldScores, mode: Mode) -> Call {
    let call = Call::new(OpKind::Set).with("board", board).with("player", player).with("score", score);
    match mode {
        Mode::Set => call,
        mode => call.with("mode", mode),
    }
}

/// The ops of a board with fields, scores as [`FieldScores`]. The plain
/// methods ([`Client::set`], [`Client::top`], ...) are for boards without:
/// the server answers `bad_request` to a score of the other kind.
impl Client {
    /// `create_board` with any config, `fields` included: `true` if created,
    /// `false` if it existed with this config. Fields that cannot be right
    /// fail here ([`ClientError::Encode`]), before anything is sent.
    ///
    /// ```no_run
    /// # async fn demo(rankd: &mut rankd_client::Client) -> Result<(), rankd_client::ClientError> {
    /// use rankd_client::{BoardSpec, FieldScores, FieldSpec, Mode};
    /// let fields = vec![FieldSpec::desc("trophies", 0, 1_000_000), FieldSpec::asc("retries", 0, 1000)];
    /// rankd.create_board_with("cup", &BoardSpec::with_fields(fields)).await?;
    /// let score = FieldScores::from([("trophies", 30), ("retries", 2)]);
    /// rankd.set_fields("cup", "alice", &score, Mode::Set).await?;
    /// for entry in rankd.top_fields("cup", 10, 0).await? {
    ///     println!("#{} {} {}", entry.rank, entry.player, entry.score);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn create_board_with(&mut self, board: &str, spec: &BoardSpec) -> Result<bool, ClientError> {
        let call = spec.call(board).map_err(|e| ClientError::Encode(e.to_string()))?;
        self.call(call).await
    }

    /// The fields of `board`, as `boards` lists them (min and max always
    /// present); `None` for a plain board or one that does not exist. One
    /// `boards` page of one row: the board itself sorts first among the
    /// names it prefixes.
    pub async fn board_fields(&mut self, board: &str) -> Result<Option<Vec<FieldSpec>>, ClientError> {
        /// A `boards` row, only what says whether it has fields.
        #[derive(Deserialize)]
        struct Listed {
            board: String,
            #[serde(default)]
            fields: Option<Vec<FieldSpec>>,
        }
        let call = Call::new(OpKind::Boards).with("prefix", board).with("limit", 1);
        let rows: Vec<Listed> = self.call(call).await?;
        Ok(rows.into_iter().find(|row| row.board == board).and_then(|row| row.fields))
    }

    /// `set` on a board with fields: the score stored after the write
    /// (every field). `Set` and `Best` need every field; `Incr` adds those
    /// given.
    pub async fn set_fields(
        &mut self,
        board: &str,
        player: &str,
        score: &FieldScores,
        mode: Mode,
    ) -> Result<FieldScores, ClientError> {
        self.call(set_fields_call(board, player, score, mode)).await
    }

    /// `set_many` on a board with fields: the scores stored, in entry order;
    /// all or none apply.
    pub async fn set_many_fields(
        &mut self,
        board: &str,
        entries: &[(&str, FieldScores)],
        mode: Mode,
    ) -> Result<Vec<FieldScores>, ClientError> {
        self.call(Call::new(OpKind::SetMany).with("board", board).with("entries", entries).with("mode", mode)).await
    }

    /// `get` on a board with fields: the player's score, if present.
    pub async fn get_fields(&mut self, board: &str, player: &str) -> Result<Option<FieldScores>, ClientError> {
        self.call(Call::new(OpKind::Get).with("board", board).with("player", player)).await
    }

    /// `rank` on a board with fields.
    pub async fn rank_fields(
        &mut self,
        board: &str,
        player: &str,
    ) -> Result<Option<RankInfo<FieldScores>>, ClientError> {
        self.call(Call::new(OpKind::Rank).with("board", board).with("player", player)).await
    }

    /// `rank_of_score` on a board with fields (every field required).
    pub async fn rank_of_fields(&mut self, board: &str, score: &FieldScores) -> Result<u64, ClientError> {
        self.call(Call::new(OpKind::RankOfScore).with("board", board).with("score", score)).await
    }

    /// `rank` with `approx: true` on a board with fields.
    pub async fn rank_approx_fields(
        &mut self,
        board: &str,
        player: &str,
    ) -> Result<Option<ApproxRankInfo<FieldScores>>, ClientError> {
        self.call(Call::new(OpKind::Rank).with("board", board).with("player", player).with("approx", true)).await
    }

    /// `rank_of_score` with `approx: true` on a board with fields (every
    /// field required).
    pub async fn rank_of_fields_approx(
        &mut self,
        board: &str,
        score: &FieldScores,
    ) -> Result<ApproxRankOfScore, ClientError> {
        self.call(Call::new(OpKind::RankOfScore).with("board", board).with("score", score).with("approx", true)).await
    }

    /// `top` on a board with fields.
    pub async fn top_fields(
        &mut self,
        board: &str,
        limit: u64,
        offset: u64,
    ) -> Result<Vec<Entry<FieldScores>>, ClientError> {
        self.call(Call::new(OpKind::Top).with("board", board).with("limit", limit).with("offset", offset)).await
    }

    /// `around` on a board with fields.
    pub async fn around_fields(
        &mut self,
        board: &str,
        player: &str,
        before: u64,
        after: u64,
    ) -> Result<Vec<Entry<FieldScores>>, ClientError> {
        let call = Call::new(OpKind::Around).with("board", board).with("player", player);
        self.call(call.with("before", before).with("after", after)).await
    }

    /// `ranks` on a board with fields.
    pub async fn ranks_fields(
        &mut self,
        board: &str,
        players: &[&str],
    ) -> Result<Vec<Entry<FieldScores>>, ClientError> {
        self.call(Call::new(OpKind::Ranks).with("board", board).with("players", players)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trophies_retries() -> Vec<FieldSpec> {
        vec![FieldSpec::desc("trophies", 0, 1_000_000), FieldSpec::asc("retries", 0, 1000)]
    }

    #[test]
    fn field_flags_parse_with_or_without_min() {
        assert_eq!("trophies:desc:0:1000000".parse::<FieldSpec>().unwrap(), FieldSpec::desc("trophies", 0, 1_000_000));
        assert_eq!("t:asc:-5:5".parse::<FieldSpec>().unwrap(), FieldSpec::asc("t", -5, 5));
        assert_eq!("retries:asc:1000".parse::<FieldSpec>().unwrap(), FieldSpec::asc("retries", 0, 1000));
        for bad in ["t", "t:desc", "t:up:5", "t:desc:x", "t:desc:1:2:3"] {
            assert!(matches!(bad.parse::<FieldSpec>(), Err(FieldsError::Syntax(_))), "{bad}");
        }
        let spec = FieldSpec::asc("t", -5, 5);
        assert_eq!(spec.to_string().parse::<FieldSpec>().unwrap(), spec);
    }

    #[test]
    fn fields_are_checked_as_the_server_does() {
        assert_eq!(validate_fields(&trophies_retries()), Ok(()));
        assert_eq!(validate_fields(&trophies_retries()[..1]), Err(FieldsError::Count(1)));
        let five = vec![FieldSpec::desc("a", 0, 1); 5];
        assert_eq!(validate_fields(&five), Err(FieldsError::Count(5)));
        let named = |name: &str| vec![FieldSpec::desc(name, 0, 1), FieldSpec::desc("b", 0, 1)];
        for bad in ["", "Caps", "with-dash", &"x".repeat(33)] {
            assert_eq!(validate_fields(&named(bad)), Err(FieldsError::Name(bad.to_string())));
        }
        assert_eq!(validate_fields(&named(&"x".repeat(32))), Ok(()));
        assert_eq!(validate_fields(&named("b")), Err(FieldsError::Duplicate("b".into())));
        let upside_down = vec![FieldSpec::desc("a", 2, 1), FieldSpec::desc("b", 0, 1)];
        assert_eq!(validate_fields(&upside_down), Err(FieldsError::Range("a".into())));
        // 2^62 * 2 values fit exactly; one more value does not.
        let fits = vec![FieldSpec::desc("a", 0, (1 << 62) - 1), FieldSpec::desc("b", 0, 1)];
        assert_eq!(validate_fields(&fits), Ok(()));
        let wide = vec![FieldSpec::desc("a", 0, 1 << 62), FieldSpec::desc("b", 0, 1)];
        assert_eq!(validate_fields(&wide), Err(FieldsError::TooWide));
        let full = vec![FieldSpec::desc("a", i64::MIN, i64::MAX), FieldSpec::desc("b", 0, 0)];
        assert_eq!(validate_fields(&full), Err(FieldsError::TooWide), "2^64 values");
    }

    #[test]
    fn scores_parse_print_and_read_from_the_wire() {
        let scores: FieldScores = "trophies=5, retries=-2".parse().unwrap();
        assert_eq!(scores, FieldScores::from([("trophies", 5), ("retries", -2)]));
        assert_eq!((scores.get("retries"), scores.get("time")), (Some(-2), None));
        assert_eq!(scores.to_string(), "retries=-2,trophies=5");
        assert_eq!("a=1,a=2".parse::<FieldScores>(), Err(FieldsError::Duplicate("a".into())));
        for bad in ["a", "a=x", "a=1,", ""] {
            assert!(bad.parse::<FieldScores>().is_err(), "{bad}");
        }
        let bytes = rmp_serde::to_vec_named(&scores).unwrap();
        assert_eq!(rmp_serde::from_slice::<Score>(&bytes).unwrap(), Score::Fields(scores.clone()));
        let int = rmp_serde::to_vec(&-7i64).unwrap();
        assert_eq!(rmp_serde::from_slice::<Score>(&int).unwrap(), Score::Int(-7));
        assert_eq!(Score::Fields(scores.clone()).to_string(), "retries=-2,trophies=5");
        assert_eq!("-3".parse::<Score>(), Ok(Score::Int(-3)));
        assert_eq!("trophies=5,retries=-2".parse::<Score>(), Ok(Score::Fields(scores)));
        assert!("x".parse::<Score>().is_err());
    }

    #[test]
    fn board_specs_send_only_what_is_set() {
        let request = |call: Call| {
            let mut out = Vec::new();
            call.encode(1, &mut out);
            rmpv::decode::read_value(&mut &out[4..]).unwrap()
        };
        let plain = request(BoardSpec::default().call("b").unwrap());
        assert_eq!(plain.as_map().unwrap().len(), 3, "id, op and board: {plain}");
        let spec = BoardSpec { ties: Some(Ties::Dense), ..BoardSpec::with_fields(trophies_retries()) };
        let composite = request(spec.call("b").unwrap());
        assert_eq!(composite["ties"].as_str(), Some("dense"));
        assert_eq!(composite["fields"][0]["name"].as_str(), Some("trophies"));
        assert_eq!(composite["fields"][1]["order"].as_str(), Some("asc"));
        assert_eq!(composite["fields"][1]["max"].as_i64(), Some(1000));
        assert!(composite["order"].is_nil());
        let bad = BoardSpec::with_fields(trophies_retries()[..1].to_vec());
        assert_eq!(bad.call("b").unwrap_err(), FieldsError::Count(1));
        let set = request(set_fields_call("b", "p", &FieldScores::from([("retries", 1)]), Mode::Incr));
        assert_eq!((set["score"]["retries"].as_i64(), set["mode"].as_str()), (Some(1), Some("incr")));
    }

    #[tokio::test]
    async fn composite_ops_send_maps_and_read_maps() {
        use crate::testing::{field, id, map, serve};
        use rmpv::Value;
        let addr = serve(|_, mut peer| async move {
            let score = |t: i64, r: i64| map(&[("trophies", t.into()), ("retries", r.into())]);
            while let Some(request) = peer.request().await {
                let ok = match field(&request, "op").as_str().unwrap() {
                    "create_board" => Value::from(field(&request, "fields").as_array().map(Vec::len) == Some(2)),
                    "set" => {
                        let given = field(&request, "score");
                        score(given["trophies"].as_i64().unwrap_or(0), given["retries"].as_i64().unwrap_or(0))
                    }
                    "get" => score(3, 1),
                    "boards" => {
                        let fields = Value::Array(vec![
                            map(&[
                                ("name", "trophies".into()),
                                ("order", "desc".into()),
                                ("min", 0.into()),
                                ("max", 9.into()),
                            ]),
                            map(&[
                                ("name", "retries".into()),
                                ("order", "asc".into()),
                                ("min", 0.into()),
                                ("max", 9.into()),
                            ]),
                        ]);
                        let row = match field(&request, "prefix").as_str() {
                            Some("cup") => map(&[("board", "cup".into()), ("count", 1.into()), ("fields", fields)]),
                            _ => map(&[("board", "plainer".into()), ("count", 1.into())]),
                        };
                        Value::Array(vec![row])
                    }
                    "rank" => map(&[("rank", 2.into()), ("score", score(3, 1)), ("count", 5.into())]),
                    "rank_of_score" => Value::from(field(&request, "score")["trophies"].as_i64().unwrap_or(0)),
                    "top" => {
                        Value::Array(vec![map(&[("player", "a".into()), ("score", score(9, 0)), ("rank", 1.into())])])
                    }
                    op => panic!("unexpected {op}"),
                };
                peer.reply(id(&request), ok).await;
            }
        })
        .await;
        let mut client = Client::connect(&addr).await.unwrap();
        assert!(client.create_board_with("cup", &BoardSpec::with_fields(trophies_retries())).await.unwrap());
        let bad = client.create_board_with("cup", &BoardSpec::with_fields(vec![])).await.unwrap();
        assert!(!bad, "no fields: a plain board");
        let one = BoardSpec::with_fields(trophies_retries()[..1].to_vec());
        assert!(matches!(client.create_board_with("cup", &one).await, Err(ClientError::Encode(_))));
        let stored = client.set_fields("cup", "a", &FieldScores::new().with("trophies", 4), Mode::Incr).await.unwrap();
        assert_eq!(stored, FieldScores::from([("trophies", 4), ("retries", 0)]));
        assert_eq!(client.get_fields("cup", "a").await.unwrap().unwrap().get("retries"), Some(1));
        let rank = client.rank_fields("cup", "a").await.unwrap().unwrap();
        assert_eq!((rank.rank, rank.score.get("trophies"), rank.count), (2, Some(3), 5));
        assert_eq!(
            client.rank_of_fields("cup", &FieldScores::from([("trophies", 7), ("retries", 0)])).await.unwrap(),
            7
        );
        let top = client.top_fields("cup", 10, 0).await.unwrap();
        assert_eq!(
            top,
            vec![Entry { player: "a".into(), score: FieldScores::from([("trophies", 9), ("retries", 0)]), rank: 1 }]
        );
        let fields = vec![FieldSpec::desc("trophies", 0, 9), FieldSpec::asc("retries", 0, 9)];
        assert_eq!(client.board_fields("cup").await.unwrap(), Some(fields));
        assert_eq!(client.board_fields("plain").await.unwrap(), None, "another board's row");
        // An integer reply where a map is expected fails the call, not the connection.
        assert!(client.get("cup", "a").await.is_err());
    }
}
