//! Sandbox profiles: named overlays (`dev`, `prod`) on a `SandboxConfigSpec`,
//! selected by a HarnessTask's `sandboxRef.profile`, and [`resolve_profile`],
//! which applies one.
//!
//! An overlay is kept as the JSON the user wrote, not as a typed spec: a
//! typed spec would serialize every unset field and overwrite the base. It
//! is applied as a JSON merge patch (RFC 7386) on the serialized base spec:
//! objects merge key by key, lists and scalars replace, and `null` removes a
//! key. The result is deserialized again, so a type error in an overlay is
//! reported with its path. The resolved spec has no `profiles` (it is what
//! the sandbox runs and what the operator writes into the ConfigMap).
//!
//! In the CRD, an overlay's schema is the SandboxConfigSpec schema without
//! `profiles`, `default`s and `required`, so `kubectl explain` and the
//! apiserver's unknown-field checks work inside profiles too.

use std::borrow::Cow;
use std::cell::Cell;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::sandbox::SandboxConfigSpec;

/// A partial `SandboxConfigSpec`, as written (a JSON object).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SandboxProfile(pub serde_json::Map<String, serde_json::Value>);

/// Why a profile cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// The SandboxConfig has no profile of that name.
    #[error("profile {profile:?} is not defined in spec.profiles ({})", available_text(.available))]
    NotFound {
        /// The profile asked for.
        profile: String,
        /// The profiles that exist.
        available: Vec<String>,
    },
    /// The overlay sets `profiles` itself.
    #[error("profile {profile:?} sets `profiles`; profiles cannot nest — move those settings into the profile itself")]
    Nested {
        /// The profile.
        profile: String,
    },
    /// The merged spec does not deserialize.
    #[error("profile {profile:?}: {path}: {message}")]
    Invalid {
        /// The profile.
        profile: String,
        /// Field path in the resolved spec, e.g. `spec.toolTimeouts.track_order`.
        path: String,
        /// What is wrong.
        message: String,
    },
}

fn available_text(available: &[String]) -> String {
    if available.is_empty() { "it defines none".to_string() } else { format!("defined: {}", available.join(", ")) }
}

impl ProfileError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            ProfileError::NotFound { .. } => "UnknownProfile",
            ProfileError::Nested { .. } | ProfileError::Invalid { .. } => "InvalidProfile",
        }
    }
}

/// The spec with `profile` applied (or the base spec for `None`), without
/// `profiles`.
pub fn resolve_profile(spec: &SandboxConfigSpec, profile: Option<&str>) -> Result<SandboxConfigSpec, ProfileError> {
    let mut base = spec.clone();
    let profiles = std::mem::take(&mut base.profiles);
    let Some(name) = profile else {
        return Ok(base);
    };
    let overlay = profiles.get(name).ok_or_else(|| ProfileError::NotFound {
        profile: name.to_string(),
        available: profiles.keys().cloned().collect(),
    })?;
    if overlay.0.contains_key("profiles") {
        return Err(ProfileError::Nested { profile: name.to_string() });
    }
    let invalid = |path: String, message: String| ProfileError::Invalid { profile: name.to_string(), path, message };
    let mut merged = serde_json::to_value(&base).map_err(|e| invalid("spec".into(), e.to_string()))?;
    merge_patch(&mut merged, &serde_json::Value::Object(overlay.0.clone()));
    serde_path_to_error::deserialize::<_, SandboxConfigSpec>(merged).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
        invalid(path, e.into_inner().to_string())
    })
}

/// Applies a JSON merge patch (RFC 7386) to `target`.
pub fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let serde_json::Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(serde_json::Map::new());
    }
    if let serde_json::Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(serde_json::Value::Null), value);
            }
        }
    }
}

thread_local! {
    /// Set while the overlay schema is being generated: the spec contains
    /// `profiles`, whose schema is the spec's, so generation must stop there.
    static GENERATING_OVERLAY: Cell<bool> = const { Cell::new(false) };
}

impl JsonSchema for SandboxProfile {
    fn schema_name() -> Cow<'static, str> {
        "SandboxProfile".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        if GENERATING_OVERLAY.get() {
            return schemars::json_schema!({ "type": "object" });
        }
        GENERATING_OVERLAY.set(true);
        let spec = SandboxConfigSpec::json_schema(generator);
        GENERATING_OVERLAY.set(false);
        let mut value = spec.to_value();
        if let Some(properties) = value.get_mut("properties").and_then(serde_json::Value::as_object_mut) {
            properties.remove("profiles");
        }
        crate::schema::strip_defaults_and_required(&mut value);
        if let Some(map) = value.as_object_mut() {
            map.insert(
                "description".into(),
                "An overlay on this SandboxConfig's spec: any of its fields except `profiles`, merged as a JSON merge patch."
                    .into(),
            );
        }
        Schema::try_from(value).unwrap_or_else(|_| schemars::json_schema!({ "type": "object" }))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(value: serde_json::Value) -> SandboxConfigSpec {
        serde_json::from_value(value).expect("spec")
    }

    #[test]
    fn overlay_overrides_only_what_it_names() {
        let base = spec(json!({
            "toolTimeouts": {"default": "800ms", "track_order": "1s"},
            "maxSteps": 10,
            "trace": {"level": "minimal", "topK": 5},
            "profiles": {"dev": {"trace": {"level": "full"}, "toolTimeouts": {"track_order": "5s"}}}
        }));
        let dev = resolve_profile(&base, Some("dev")).expect("dev");
        assert_eq!(dev.trace.level, Some(crate::sandbox::TraceLevel::Full));
        assert_eq!(dev.trace.top_k, Some(5));
        assert_eq!(dev.tool_timeout_for("track_order").as_millis(), 5_000);
        assert_eq!(dev.tool_timeout_for("other").as_millis(), 800);
        assert_eq!(dev.max_steps, Some(10));
        assert!(dev.profiles.is_empty());
        let plain = resolve_profile(&base, None).expect("none");
        assert_eq!(plain.tool_timeout_for("track_order").as_millis(), 1_000);
        assert!(plain.profiles.is_empty());
    }

    #[test]
    fn null_in_an_overlay_removes_the_key() {
        let base = spec(json!({"maxSteps": 10, "profiles": {"p": {"maxSteps": null}}}));
        assert_eq!(resolve_profile(&base, Some("p")).expect("p").max_steps, None);
    }

    #[test]
    fn unknown_profile_names_the_ones_that_exist() {
        let base = spec(json!({"profiles": {"dev": {}, "prod": {}}}));
        let err = resolve_profile(&base, Some("staging")).expect_err("missing");
        assert_eq!(err.category(), "UnknownProfile");
        assert!(err.to_string().contains("defined: dev, prod"), "{err}");
    }

    #[test]
    fn a_type_error_in_an_overlay_has_its_path() {
        let base = spec(json!({"profiles": {"prod": {"planStepTimeout": "soon"}}}));
        let err = resolve_profile(&base, Some("prod")).expect_err("bad");
        let ProfileError::Invalid { path, .. } = &err else { panic!("{err}") };
        assert_eq!(path, "spec.planStepTimeout");
        assert_eq!(err.category(), "InvalidProfile");
        let base = spec(json!({"profiles": {"p": {"profiles": {}}}}));
        assert!(matches!(resolve_profile(&base, Some("p")), Err(ProfileError::Nested { .. })));
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut target = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut target, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(target, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }
}
