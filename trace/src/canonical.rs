//! Canonical JSON and its hash: the identity of tool arguments, observations
//! and memory across runs, machines and languages.
//!
//! Rules (a subset of RFC 8785 that is easy to reproduce): object keys
//! sorted by their UTF-8 bytes, no whitespace, strings escaped as serde_json
//! does, integers printed as integers, and a float with an integral value
//! below 2^53 printed as that integer (so `1.0` and `1` hash alike), other
//! floats in shortest round-trip form. `-0.0` is `0`.

use std::fmt;

use serde_json::{Number, Value};
use sha2::{Digest as _, Sha256};

/// A sha256 digest of canonical JSON.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Reads a digest stored in a trace (`bytes` fields); `None` unless 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The first 12 hex digits, for messages meant for people.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

/// The canonical JSON text of `value`.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

/// sha256 of [`canonical_json`].
pub fn hash_json(value: &Value) -> Digest {
    let mut hasher = HashWriter(Sha256::new());
    write_value(value, &mut hasher);
    Digest(hasher.0.finalize().into())
}

/// sha256 of text already in canonical form (what [`canonical_json`]
/// returned): the same digest as [`hash_json`] of the value, without walking it again.
pub fn hash_canonical_text(canonical: &str) -> Digest {
    Digest(Sha256::digest(canonical.as_bytes()).into())
}

/// sha256 of the canonical JSON of an object given as a sorted map, without
/// building a `Value` first (`String`'s order is byte order, as canonical JSON needs).
pub fn hash_sorted_object(entries: &std::collections::BTreeMap<String, Value>) -> Digest {
    let mut hasher = HashWriter(Sha256::new());
    hasher.put("{");
    for (i, (key, item)) in entries.iter().enumerate() {
        if i > 0 {
            hasher.put(",");
        }
        write_string(key, &mut hasher);
        hasher.put(":");
        write_value(item, &mut hasher);
    }
    hasher.put("}");
    Digest(hasher.0.finalize().into())
}

/// Appends the canonical JSON text of `value` to `out`.
pub fn write_canonical(value: &Value, out: &mut String) {
    let mut sink = StringSink(out);
    write_value(value, &mut sink);
}

trait Sink {
    fn put(&mut self, s: &str);
}

struct StringSink<'a>(&'a mut String);

impl Sink for StringSink<'_> {
    fn put(&mut self, s: &str) {
        self.0.push_str(s);
    }
}

/// Hashes without building the string first.
struct HashWriter(Sha256);

impl Sink for HashWriter {
    fn put(&mut self, s: &str) {
        self.0.update(s.as_bytes());
    }
}

fn write_value(value: &Value, out: &mut impl Sink) {
    match value {
        Value::Null => out.put("null"),
        Value::Bool(true) => out.put("true"),
        Value::Bool(false) => out.put("false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.put("[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.put(",");
                }
                write_value(item, out);
            }
            out.put("]");
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.put("{");
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.put(",");
                }
                write_string(key, out);
                out.put(":");
                write_value(item, out);
            }
            out.put("}");
        }
    }
}

fn write_string(s: &str, out: &mut impl Sink) {
    // serde_json's escaping is deterministic and minimal (only what JSON requires).
    out.put(&serde_json::to_string(s).expect("serializing a str cannot fail"));
}

const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0; // 2^53

fn write_number(n: &Number, out: &mut impl Sink) {
    if let Some(i) = n.as_i64() {
        out.put(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.put(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        if f.fract() == 0.0 && f.abs() < MAX_SAFE_INTEGER {
            out.put(&(f as i64).to_string());
        } else {
            // serde_json prints finite floats in shortest round-trip form.
            out.put(&n.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_at_every_depth() {
        let v = json!({"b": 1, "a": {"d": [1, {"z": 0, "y": 1}], "c": null}});
        assert_eq!(canonical_json(&v), r#"{"a":{"c":null,"d":[1,{"y":1,"z":0}]},"b":1}"#);
    }

    #[test]
    fn equal_values_in_different_spellings_hash_alike() {
        let a: Value = serde_json::from_str(r#"{"x": 1.0, "y": -0.0, "s": "\u00e9"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"s":"é","y":0,"x":1}"#).unwrap();
        assert_eq!(hash_json(&a), hash_json(&b));
        assert_eq!(canonical_json(&a), r#"{"s":"é","x":1,"y":0}"#);
    }

    #[test]
    fn floats_keep_their_shortest_form() {
        assert_eq!(canonical_json(&json!(0.1)), "0.1");
        assert_eq!(canonical_json(&json!(1e300)), "1e+300");
        assert_eq!(canonical_json(&json!(-2.5)), "-2.5");
        assert_eq!(canonical_json(&json!(u64::MAX)), u64::MAX.to_string());
    }

    #[test]
    fn hash_matches_the_hash_of_the_canonical_text() {
        let v = json!({"order_id": "A-1", "items": [3, 2.5, true, "x\n"]});
        let direct: [u8; 32] = Sha256::digest(canonical_json(&v).as_bytes()).into();
        assert_eq!(hash_json(&v).0, direct);
        assert_eq!(hash_canonical_text(&canonical_json(&v)), hash_json(&v));
    }

    #[test]
    fn a_different_value_changes_the_hash() {
        assert_ne!(hash_json(&json!({"a": 1})), hash_json(&json!({"a": 2})));
        assert_ne!(hash_json(&json!({"a": null})), hash_json(&json!({})));
    }
}
