//! Composite scores: a board's 2–4 fields, each with its own order and
//! range, packed exactly into one engine score.
//!
//! Each field becomes a digit in a mixed-radix number whose radices are the
//! fields' range sizes, first field most significant. A field's digit grows
//! as its value gets better (`value - min` for `desc`, `max - value` for
//! `asc`), so a higher packed number is a better player, field by field:
//! the engine ranks a board with fields as a plain `desc` board. The product
//! of the range sizes is at most 2^63, so every packed score is a
//! non-negative `i64`, and packing is exact (no floating point anywhere).

use crate::board::Order;

/// At most this many fields per board.
pub const MAX_FIELDS: usize = 4;

/// At least this many (one field is a plain score).
pub const MIN_FIELDS: usize = 2;

/// One criterion of a composite score.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Field {
    /// 1–32 bytes of `[a-z0-9_]`, unique on its board.
    pub name: String,
    /// Which end of this field's range is better.
    pub order: Order,
    /// Smallest value allowed.
    pub min: i64,
    /// Largest value allowed.
    pub max: i64,
}

/// Per-field amounts of one write, in the board's field order (unused
/// slots are 0).
pub type FieldValues = [i64; MAX_FIELDS];

/// Why fields or a composite score are not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldsError {
    /// Fewer than 2 or more than 4 fields.
    #[error("`fields` must list {MIN_FIELDS} to {MAX_FIELDS} fields")]
    Count,
    /// A name that is not 1–32 bytes of `[a-z0-9_]`.
    #[error("field name `{0}` must be 1-32 bytes of [a-z0-9_]")]
    BadName(String),
    /// The same name twice.
    #[error("field `{0}` is declared twice")]
    Duplicate(String),
    /// `max < min`.
    #[error("field `{0}`: max is below min")]
    EmptyRange(String),
    /// The product of the range sizes exceeds 2^63.
    #[error("the product of the fields' range sizes (max - min + 1) must be at most 2^63")]
    TooWide,
    /// A value, or a write's result, outside its field's range.
    #[error("field `{name}` would be {value}, outside [{min}, {max}]")]
    OutOfRange {
        /// The field.
        name: String,
        /// The value it would take (saturated if it overflowed i64).
        value: i128,
        /// Its range.
        min: i64,
        /// Its range.
        max: i64,
    },
    /// A score that is not the board's kind (a map on a plain board, a
    /// delta where a whole score is needed): a caller's bug.
    #[error("{0}")]
    Mismatch(&'static str),
}

/// Checks a declaration: 2–4 fields, valid unique names, non-empty ranges
/// whose sizes multiply to at most 2^63.
pub fn check(fields: &[Field]) -> Result<(), FieldsError> {
    if !(MIN_FIELDS..=MAX_FIELDS).contains(&fields.len()) {
        return Err(FieldsError::Count);
    }
    let mut product: u128 = 1;
    for (i, field) in fields.iter().enumerate() {
        let name = &field.name;
        if !(1..=32).contains(&name.len())
            || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(FieldsError::BadName(name.chars().take(40).collect()));
        }
        if fields[..i].iter().any(|earlier| earlier.name == *name) {
            return Err(FieldsError::Duplicate(name.clone()));
        }
        if field.max < field.min {
            return Err(FieldsError::EmptyRange(name.clone()));
        }
        product = product.checked_mul(size(field)).filter(|p| *p <= 1 << 63).ok_or(FieldsError::TooWide)?;
    }
    Ok(())
}

/// How many values a field allows (at most 2^64).
fn size(field: &Field) -> u128 {
    (i128::from(field.max) - i128::from(field.min) + 1) as u128
}

/// Each field's place value: the product of the sizes after it.
fn weights(fields: &[Field]) -> FieldValuesU128 {
    let mut weights = [0u128; MAX_FIELDS];
    let mut weight = 1u128;
    for (i, field) in fields.iter().enumerate().rev() {
        weights[i] = weight;
        weight *= size(field);
    }
    weights
}

type FieldValuesU128 = [u128; MAX_FIELDS];

fn out_of_range(field: &Field, value: i128) -> FieldsError {
    FieldsError::OutOfRange { name: field.name.clone(), value, min: field.min, max: field.max }
}

/// Packs one value per field (in declared order) into the engine score;
/// a value outside its range is refused. `fields` must pass [`check`].
pub fn pack(fields: &[Field], values: &[i64]) -> Result<i64, FieldsError> {
    let weights = weights(fields);
    let mut packed = 0u128;
    for ((field, &value), weight) in fields.iter().zip(values).zip(weights) {
        if !(field.min..=field.max).contains(&value) {
            return Err(out_of_range(field, i128::from(value)));
        }
        let digit = match field.order {
            Order::Desc => i128::from(value) - i128::from(field.min),
            Order::Asc => i128::from(field.max) - i128::from(value),
        } as u128;
        packed += digit * weight;
    }
    i64::try_from(packed).map_err(|_| FieldsError::TooWide)
}

/// Inverse of [`pack`]: each field's value, in declared order.
pub fn unpack(fields: &[Field], packed: i64) -> FieldValues {
    let weights = weights(fields);
    let mut values = [0; MAX_FIELDS];
    let packed = u128::from(packed.max(0) as u64);
    for (i, field) in fields.iter().enumerate() {
        let digit = (packed / weights[i]) % size(field);
        let value = match field.order {
            Order::Desc => i128::from(field.min) + digit as i128,
            Order::Asc => i128::from(field.max) - digit as i128,
        };
        values[i] = value as i64;
    }
    values
}

/// An `incr` on a composite score: adds each field's delta to `old` (an
/// absent player counts as 0 in every field), or refuses if any field would
/// leave its range.
pub fn add(fields: &[Field], old: Option<i64>, deltas: &FieldValues) -> Result<i64, FieldsError> {
    let current = old.map_or([0; MAX_FIELDS], |packed| unpack(fields, packed));
    let mut next = [0i64; MAX_FIELDS];
    for (i, field) in fields.iter().enumerate() {
        let sum = i128::from(current[i]) + i128::from(deltas[i]);
        if sum < i128::from(field.min) || sum > i128::from(field.max) {
            return Err(out_of_range(field, sum));
        }
        next[i] = sum as i64;
    }
    pack(fields, &next[..fields.len()])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn field(name: &str, order: Order, min: i64, max: i64) -> Field {
        Field { name: name.into(), order, min, max }
    }

    #[test]
    fn checks_declarations() {
        let ok = [field("trophies", Order::Desc, 0, 1000), field("time_ms", Order::Asc, 0, 3_600_000)];
        assert_eq!(check(&ok), Ok(()));
        assert_eq!(check(&ok[..1]), Err(FieldsError::Count));
        assert_eq!(check(&[ok[0].clone(), ok[0].clone()]), Err(FieldsError::Duplicate("trophies".into())));
        assert!(matches!(check(&[field("Bad", Order::Desc, 0, 1), ok[1].clone()]), Err(FieldsError::BadName(_))));
        assert!(matches!(check(&[field("a", Order::Desc, 2, 1), ok[1].clone()]), Err(FieldsError::EmptyRange(_))));
        // 2^32 * 2^31 = 2^63 fits; one more value does not.
        let exact = [field("a", Order::Desc, 0, (1 << 32) - 1), field("b", Order::Asc, 0, (1 << 31) - 1)];
        assert_eq!(check(&exact), Ok(()));
        let wide = [field("a", Order::Desc, 0, 1 << 32), field("b", Order::Asc, 0, (1 << 31) - 1)];
        assert_eq!(check(&wide), Err(FieldsError::TooWide));
        let whole_range = [field("a", Order::Desc, i64::MIN, i64::MAX), field("b", Order::Asc, 0, 0)];
        assert_eq!(check(&whole_range), Err(FieldsError::TooWide));
    }

    #[test]
    fn extreme_ranges_pack_exactly() {
        let fields = [field("a", Order::Asc, i64::MIN, i64::MIN + (1 << 62) - 1), field("b", Order::Desc, -1, 0)];
        check(&fields).unwrap();
        for values in [[i64::MIN, -1], [i64::MIN + (1 << 62) - 1, 0], [i64::MIN + 5, 0]] {
            let packed = pack(&fields, &values).unwrap();
            assert!(packed >= 0);
            assert_eq!(unpack(&fields, packed)[..2], values);
        }
    }

    #[test]
    fn incr_refuses_to_leave_a_range() {
        let fields = [field("wins", Order::Desc, 0, 9), field("losses", Order::Asc, 0, 9)];
        let start = add(&fields, None, &[3, 1, 0, 0]).unwrap();
        assert_eq!(unpack(&fields, start)[..2], [3, 1]);
        assert_eq!(unpack(&fields, add(&fields, Some(start), &[6, 0, 0, 0]).unwrap())[..2], [9, 1]);
        // A carry into the next field would hide this in plain arithmetic.
        assert!(matches!(add(&fields, Some(start), &[7, 0, 0, 0]), Err(FieldsError::OutOfRange { value: 10, .. })));
        assert!(matches!(add(&fields, Some(start), &[0, -2, 0, 0]), Err(FieldsError::OutOfRange { value: -1, .. })));
        let positive = [field("level", Order::Desc, 1, 99), field("xp", Order::Desc, 0, 1000)];
        assert!(add(&positive, None, &[0, 5, 0, 0]).is_err(), "absent counts as 0, below level's min");
        assert!(add(&positive, None, &[1, 5, 0, 0]).is_ok());
    }

    fn fields_strategy() -> impl Strategy<Value = Vec<Field>> {
        let one = (any::<bool>(), -1000i64..1000, 0i64..2000)
            .prop_map(|(asc, min, span)| (if asc { Order::Asc } else { Order::Desc }, min, min + span));
        proptest::collection::vec(one, MIN_FIELDS..=MAX_FIELDS).prop_map(|specs| {
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (order, min, max))| field(&format!("f{i}"), order, min, max))
                .collect()
        })
    }

    proptest! {
        /// Packed order is exactly field-by-field order, each field under its
        /// own order, and unpacking inverts packing.
        #[test]
        fn packing_preserves_order(fields in fields_strategy(), seeds in proptest::collection::vec(any::<[u64; 4]>(), 2)) {
            let values: Vec<Vec<i64>> = seeds
                .iter()
                .map(|s| fields.iter().zip(s).map(|(f, r)| f.min + (r % (f.max - f.min + 1) as u64) as i64).collect())
                .collect();
            let packed: Vec<i64> = values.iter().map(|v| pack(&fields, v).unwrap()).collect();
            for (v, p) in values.iter().zip(&packed) {
                prop_assert_eq!(&unpack(&fields, *p)[..fields.len()], &v[..]);
            }
            let better = |a: &[i64], b: &[i64]| {
                for (f, (x, y)) in fields.iter().zip(a.iter().zip(b)) {
                    if x != y {
                        return if f.order == Order::Desc { x > y } else { x < y };
                    }
                }
                false
            };
            prop_assert_eq!(better(&values[0], &values[1]), packed[0] > packed[1]);
            prop_assert_eq!(values[0] == values[1], packed[0] == packed[1]);
        }
    }
}
