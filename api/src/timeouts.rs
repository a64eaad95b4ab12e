//! `toolTimeouts`: either one duration for every tool, or a map with a
//! `default` and per-tool entries.
//!
//! ```yaml
//! toolTimeouts: 800ms            # applies to EVERY tool (reported as a warning)
//! toolTimeouts:                  # what you usually want
//!   default: 800ms
//!   track_order: 2s
//!   db_query: 500ms
//! ```
//!
//! The bare form is accepted because configs in the wild use it, but it is
//! the pitfall where a slow tool and a fast tool share one limit, so
//! validation reports it.
//!
//! Schema: a structural schema cannot say "a number, a string or an
//! object", so the field is `x-kubernetes-preserve-unknown-fields: true`
//! with no `type` (the apiserver then accepts any JSON value there, as it
//! does for `apiextensionsv1.JSON`) and this type's deserializer and the
//! validator give the precise errors.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::duration::Duration;

/// The timeout of a tool call when nothing else is configured: 800 ms.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_millis(800);

/// The key of the map form that holds the default timeout.
pub const DEFAULT_KEY: &str = "default";

/// Per-tool call timeouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolTimeouts {
    /// A bare duration: every tool gets this timeout.
    Every(Duration),
    /// A map: `default` for tools not listed, and per-tool entries.
    PerTool {
        /// Timeout of tools without their own entry (800 ms when absent).
        default: Option<Duration>,
        /// Tool name -> timeout.
        tools: BTreeMap<String, Duration>,
    },
}

impl Default for ToolTimeouts {
    fn default() -> Self {
        ToolTimeouts::PerTool { default: None, tools: BTreeMap::new() }
    }
}

impl ToolTimeouts {
    /// The timeout for a call of `tool`.
    pub fn tool_timeout_for(&self, tool: &str) -> Duration {
        match self {
            ToolTimeouts::Every(timeout) => *timeout,
            ToolTimeouts::PerTool { default, tools } => {
                tools.get(tool).copied().or(*default).unwrap_or(DEFAULT_TOOL_TIMEOUT)
            }
        }
    }

    /// True for the bare-number form.
    pub fn is_bare(&self) -> bool {
        matches!(self, ToolTimeouts::Every(_))
    }

    /// The tool names with their own entry.
    pub fn named_tools(&self) -> impl Iterator<Item = &str> {
        let tools = match self {
            ToolTimeouts::Every(_) => None,
            ToolTimeouts::PerTool { tools, .. } => Some(tools.keys().map(String::as_str)),
        };
        tools.into_iter().flatten()
    }

    /// Every configured duration with its field path below `toolTimeouts`
    /// (`""` for the bare form, `.default`, `.track_order`).
    pub fn entries(&self) -> Vec<(String, Duration)> {
        match self {
            ToolTimeouts::Every(timeout) => vec![(String::new(), *timeout)],
            ToolTimeouts::PerTool { default, tools } => default
                .iter()
                .map(|d| (format!(".{DEFAULT_KEY}"), *d))
                .chain(tools.iter().map(|(name, d)| (format!(".{name}"), *d)))
                .collect(),
        }
    }
}

impl Serialize for ToolTimeouts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ToolTimeouts::Every(timeout) => timeout.serialize(serializer),
            ToolTimeouts::PerTool { default, tools } => {
                let mut map = serializer.serialize_map(Some(tools.len() + usize::from(default.is_some())))?;
                if let Some(default) = default {
                    map.serialize_entry(DEFAULT_KEY, default)?;
                }
                for (name, timeout) in tools {
                    map.serialize_entry(name, timeout)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for ToolTimeouts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ToolTimeoutsVisitor)
    }
}

struct ToolTimeoutsVisitor;

impl ToolTimeoutsVisitor {
    fn bare<E: de::Error>(value: impl de::IntoDeserializer<'static, E>) -> Result<ToolTimeouts, E> {
        Duration::deserialize(value.into_deserializer()).map(ToolTimeouts::Every)
    }
}

impl<'de> Visitor<'de> for ToolTimeoutsVisitor {
    type Value = ToolTimeouts;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of tool name -> duration with an optional `default` (e.g. {default: 800ms, track_order: 2s}), or one duration for every tool")
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<ToolTimeouts, E> {
        Self::bare(value)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<ToolTimeouts, E> {
        Self::bare(value)
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<ToolTimeouts, E> {
        Self::bare(value)
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<ToolTimeouts, E> {
        value.parse().map(ToolTimeouts::Every).map_err(E::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ToolTimeouts, A::Error> {
        let mut default = None;
        let mut tools = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let timeout: Duration = map.next_value()?;
            if key == DEFAULT_KEY {
                default = Some(timeout);
            } else if tools.insert(key.clone(), timeout).is_some() {
                return Err(de::Error::custom(format!("tool {key:?} has two timeouts")));
            }
        }
        Ok(ToolTimeouts::PerTool { default, tools })
    }
}

impl JsonSchema for ToolTimeouts {
    fn schema_name() -> Cow<'static, str> {
        "ToolTimeouts".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_number_applies_to_every_tool() {
        let t: ToolTimeouts = serde_json::from_str("800").expect("bare");
        assert!(t.is_bare());
        assert_eq!(t.tool_timeout_for("anything").as_millis(), 800);
        let t: ToolTimeouts = serde_json::from_str("\"2s\"").expect("bare string");
        assert_eq!(t.tool_timeout_for("x").as_millis(), 2_000);
    }

    #[test]
    fn map_has_default_and_per_tool_entries() {
        let t: ToolTimeouts =
            serde_json::from_value(serde_json::json!({"default": "500ms", "weather_api": 1200})).expect("map");
        assert_eq!(t.tool_timeout_for("weather_api").as_millis(), 1_200);
        assert_eq!(t.tool_timeout_for("db_query").as_millis(), 500);
        assert_eq!(t.named_tools().collect::<Vec<_>>(), ["weather_api"]);
        let t: ToolTimeouts = serde_json::from_value(serde_json::json!({"x": "1s"})).expect("no default");
        assert_eq!(t.tool_timeout_for("y"), DEFAULT_TOOL_TIMEOUT);
    }

    #[test]
    fn round_trips_both_forms() {
        for value in [serde_json::json!("800ms"), serde_json::json!({"default": "1s", "a": "1500ms"})] {
            let t: ToolTimeouts = serde_json::from_value(value.clone()).expect("parse");
            assert_eq!(serde_json::to_value(&t).expect("ser"), value);
        }
    }

    #[test]
    fn refuses_lists_and_bad_durations() {
        assert!(serde_json::from_str::<ToolTimeouts>("[1, 2]").is_err());
        let err = serde_json::from_str::<ToolTimeouts>("{\"a\": \"fast\"}").expect_err("bad duration");
        assert!(err.to_string().contains("invalid duration"), "{err}");
    }
}
