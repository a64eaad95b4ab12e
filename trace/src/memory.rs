//! Agent memory as the sandbox sees it: a JSON object changed only through
//! patches, every change captured as a [`MemoryDelta`] with its source.
//!
//! The memory hash is the sha256 of the canonical JSON of the whole object,
//! so anyone can reproduce an `expected_memory` hash outside Basecamp.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::canonical::{Digest, canonical_json, hash_sorted_object};
use crate::pb::{self, MemorySource};

/// One change a patch asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum PatchOp {
    /// Sets `key` to `value` (which may be JSON `null`: the key stays, holding null).
    Set { key: String, value: Value },
    /// Removes `key`.
    Remove { key: String },
}

/// An ordered list of changes from one source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryPatch {
    pub ops: Vec<PatchOp>,
}

impl MemoryPatch {
    pub fn set(mut self, key: impl Into<String>, value: Value) -> Self {
        self.ops.push(PatchOp::Set { key: key.into(), value });
        self
    }

    pub fn remove(mut self, key: impl Into<String>) -> Self {
        self.ops.push(PatchOp::Remove { key: key.into() });
        self
    }

    /// A patch setting every key of a JSON object, in key order.
    pub fn from_object(object: &serde_json::Map<String, Value>) -> Self {
        Self { ops: object.iter().map(|(k, v)| PatchOp::Set { key: k.clone(), value: v.clone() }).collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A change of one key, with the values before and after (`None` = absent).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryDelta {
    pub key: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
    pub source: MemorySource,
    pub origin: String,
}

impl MemoryDelta {
    /// True when this delta wrote JSON `null` into its key.
    pub fn writes_null(&self) -> bool {
        matches!(self.after, Some(Value::Null))
    }

    pub fn to_record(&self) -> pb::MemoryDelta {
        pb::MemoryDelta {
            key: self.key.clone(),
            before_json: self.before.as_ref().map(canonical_json),
            after_json: self.after.as_ref().map(canonical_json),
            source: self.source as i32,
            origin: self.origin.clone(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Memory {
    entries: BTreeMap<String, Value>,
    hash: Option<Digest>,
}

impl PartialEq for Memory {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl Memory {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_object(object: &serde_json::Map<String, Value>) -> Self {
        Self { entries: object.iter().map(|(k, v)| (k.clone(), v.clone())).collect(), hash: None }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.get(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> impl Iterator<Item = (&String, &Value)> {
        self.entries.iter()
    }

    pub fn to_value(&self) -> Value {
        Value::Object(self.entries.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// Applies `patch` and returns one delta per op that changed something
    /// (setting a key to the value it already holds is not a change).
    pub fn apply(&mut self, patch: &MemoryPatch, source: MemorySource, origin: &str) -> Vec<MemoryDelta> {
        let mut deltas = Vec::with_capacity(patch.ops.len());
        for op in &patch.ops {
            let (key, before, after) = match op {
                PatchOp::Set { key, value } => {
                    if self.entries.get(key) == Some(value) {
                        continue;
                    }
                    (key, self.entries.insert(key.clone(), value.clone()), Some(value.clone()))
                }
                PatchOp::Remove { key } => match self.entries.remove(key) {
                    Some(before) => (key, Some(before), None),
                    None => continue,
                },
            };
            deltas.push(MemoryDelta { key: key.clone(), before, after, source, origin: origin.to_string() });
        }
        if !deltas.is_empty() {
            self.hash = None;
        }
        deltas
    }

    /// sha256 of the canonical JSON of the whole memory; cached until the next change.
    pub fn hash(&mut self) -> Digest {
        *self.hash.get_or_insert_with(|| hash_sorted_object(&self.entries))
    }

    /// Keys whose values differ between `self` and `other`, with (self, other) values.
    pub fn diff<'a>(&'a self, other: &'a Memory) -> Vec<(&'a str, Option<&'a Value>, Option<&'a Value>)> {
        let mut keys: Vec<&String> = self.entries.keys().chain(other.entries.keys()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .filter_map(|k| {
                let (a, b) = (self.entries.get(k), other.entries.get(k));
                (a != b).then_some((k.as_str(), a, b))
            })
            .collect()
    }

    /// The memory as a snapshot record.
    pub fn to_snapshot(&mut self) -> pb::MemorySnapshot {
        pb::MemorySnapshot {
            entries_json: self.entries.iter().map(|(k, v)| (k.clone(), canonical_json(v))).collect(),
            memory_hash: self.hash().0.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::hash_json;
    use serde_json::json;

    #[test]
    fn apply_records_before_after_and_source() {
        let mut m = Memory::new();
        let d = m.apply(&MemoryPatch::default().set("order", json!("A-1")), MemorySource::User, "input");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].before, None);
        let d = m.apply(
            &MemoryPatch::default().set("order", json!("A-2")).set("shipping_status", Value::Null),
            MemorySource::Fallback,
            "tracking_api",
        );
        assert_eq!(d[0].before, Some(json!("A-1")));
        assert_eq!(d[0].after, Some(json!("A-2")));
        assert!(d[1].writes_null());
        assert_eq!(d[1].origin, "tracking_api");
        assert_eq!(m.get("shipping_status"), Some(&Value::Null));
    }

    #[test]
    fn unchanged_sets_and_missing_removes_are_not_deltas() {
        let mut m = Memory::from_object(json!({"a": 1}).as_object().unwrap());
        let h = m.hash();
        assert!(m.apply(&MemoryPatch::default().set("a", json!(1)).remove("zz"), MemorySource::Tool, "t").is_empty());
        assert_eq!(m.hash(), h);
    }

    #[test]
    fn hash_follows_changes_and_matches_canonical_json() {
        let mut m = Memory::from_object(json!({"b": 2, "a": 1}).as_object().unwrap());
        assert_eq!(m.hash(), hash_json(&json!({"a": 1, "b": 2})));
        let before = m.hash();
        m.apply(&MemoryPatch::default().remove("b"), MemorySource::Policy, "p");
        assert_ne!(m.hash(), before);
        assert_eq!(m.hash(), hash_json(&json!({"a": 1})));
    }

    #[test]
    fn diff_names_changed_added_and_removed_keys() {
        let a = Memory::from_object(json!({"x": 1, "y": 2}).as_object().unwrap());
        let b = Memory::from_object(json!({"x": 1, "y": 3, "z": 0}).as_object().unwrap());
        let d = a.diff(&b);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0], ("y", Some(&json!(2)), Some(&json!(3))));
        assert_eq!(d[1], ("z", None, Some(&json!(0))));
    }

    #[test]
    fn delta_record_distinguishes_absent_from_null() {
        let d = MemoryDelta {
            key: "k".into(),
            before: None,
            after: Some(Value::Null),
            source: MemorySource::Fallback,
            origin: "t".into(),
        };
        let r = d.to_record();
        assert_eq!(r.before_json, None);
        assert_eq!(r.after_json.as_deref(), Some("null"));
    }
}
