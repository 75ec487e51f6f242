//! Requests as bytes on the wire, for tests that write frames themselves
//! (hostile input, floods, replies in the order sent) rather than through
//! the client.

use rmpv::Value;

/// A frame: 4-byte big-endian length, then `body`.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The body of a request `{id, op, ...fields}`.
pub fn req(id: u64, op: &str, fields: &[(&str, Value)]) -> Vec<u8> {
    let mut pairs = vec![(Value::from("id"), Value::from(id)), (Value::from("op"), Value::from(op))];
    pairs.extend(fields.iter().map(|(key, value)| (Value::from(*key), value.clone())));
    let mut body = Vec::new();
    rmpv::encode::write_value(&mut body, &Value::Map(pairs)).expect("encoding into a Vec cannot fail");
    body
}
