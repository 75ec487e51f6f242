//! Flat JSON objects of numbers, booleans and plain words: the payload of
//! `ok {...}` replies.
//!
//! Hand-rolled so that the client half of the library stays std-only; the
//! objects are flat and their strings are fixed words (cut modes), so the
//! writer never needs escapes and the reader rejects anything fancier.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A value in a flat object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// An unsigned integer.
    Number(u64),
    /// `true` or `false`.
    Bool(bool),
    /// A word made of ASCII letters, digits, `-` and `_`.
    Word(String),
}

/// Writes `{"key":value,...}` in the given order.
pub fn write_object<K: AsRef<str>>(fields: &[(K, Value)]) -> String {
    let mut out = String::from("{");
    for (i, (key, value)) in fields.iter().enumerate() {
        let key = key.as_ref();
        if i > 0 {
            out.push(',');
        }
        let _ = match value {
            Value::Number(n) => write!(out, "\"{key}\":{n}"),
            Value::Bool(b) => write!(out, "\"{key}\":{b}"),
            Value::Word(w) => write!(out, "\"{key}\":\"{w}\""),
        };
    }
    out.push('}');
    out
}

/// Reads a flat object written by [`write_object`].
pub fn read_object(text: &str) -> Result<BTreeMap<String, Value>, String> {
    let inner = text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| format!("not a JSON object: {text}"))?;
    let mut map = BTreeMap::new();
    for field in inner.split(',').filter(|f| !f.trim().is_empty()) {
        let (key, value) = field.split_once(':').ok_or_else(|| format!("bad field {field:?}"))?;
        let key = unquote(key).ok_or_else(|| format!("bad key {key:?}"))?;
        let value = value.trim();
        let value = match value {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => match unquote(value) {
                Some(word) => Value::Word(word.to_owned()),
                None => Value::Number(value.parse().map_err(|_| format!("bad value {value:?}"))?),
            },
        };
        map.insert(key.to_owned(), value);
    }
    Ok(map)
}

fn unquote(text: &str) -> Option<&str> {
    text.trim().strip_prefix('"').and_then(|t| t.strip_suffix('"'))
}

/// Typed getters over a parsed object, with errors that name the field.
pub trait Fields {
    /// The number under `key`.
    fn number(&self, key: &str) -> Result<u64, String>;
    /// The boolean under `key`.
    fn boolean(&self, key: &str) -> Result<bool, String>;
    /// The word under `key`.
    fn word(&self, key: &str) -> Result<&str, String>;
}

impl Fields for BTreeMap<String, Value> {
    fn number(&self, key: &str) -> Result<u64, String> {
        match self.get(key) {
            Some(Value::Number(n)) => Ok(*n),
            other => Err(format!("field {key}: expected a number, got {other:?}")),
        }
    }

    fn boolean(&self, key: &str) -> Result<bool, String> {
        match self.get(key) {
            Some(Value::Bool(b)) => Ok(*b),
            other => Err(format!("field {key}: expected a boolean, got {other:?}")),
        }
    }

    fn word(&self, key: &str) -> Result<&str, String> {
        match self.get(key) {
            Some(Value::Word(w)) => Ok(w),
            other => Err(format!("field {key}: expected a word, got {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let text =
            write_object(&[("a", Value::Number(12)), ("b", Value::Bool(true)), ("c", Value::Word("torn".into()))]);
        assert_eq!(text, r#"{"a":12,"b":true,"c":"torn"}"#);
        let map = read_object(&text).unwrap();
        assert_eq!(map.number("a"), Ok(12));
        assert_eq!(map.boolean("b"), Ok(true));
        assert_eq!(map.word("c"), Ok("torn"));
        assert!(map.number("c").is_err());
        assert!(read_object("[1]").is_err());
        assert_eq!(read_object("{}").unwrap().len(), 0);
    }
}
