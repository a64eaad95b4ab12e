//! Hand-written JSON-schema fragments for fields whose Rust type would
//! otherwise produce a schema the apiserver refuses as non-structural
//! (`serde_json::Value` derives to the bare `true` schema).
//!
//! Used through `#[schemars(schema_with = "...")]` on fields.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

/// Any JSON value (object, array, string, number, bool, null): a node with no
/// `type` and `x-kubernetes-preserve-unknown-fields: true`, which is how a
/// structural schema spells "anything" (as `apiextensionsv1.JSON` does).
pub fn any_json(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

/// A JSON object with arbitrary keys and values.
pub fn json_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

/// A list of metav1 Conditions keyed by `type`, so that server-side apply
/// merges conditions by type instead of replacing the list.
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = <Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>::json_schema(generator);
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert("x-kubernetes-list-map-keys".into(), serde_json::json!(["type"]));
    schema
}

/// Removes `default` and `required` everywhere in a schema: used for profile
/// overlays, where the apiserver must neither fill in defaults (they would
/// override the base spec) nor demand fields the base already has.
pub fn strip_defaults_and_required(value: &mut serde_json::Value) {
    strip(value, false);
}

/// `in_properties`: `value` is a `properties` map, whose keys are field names
/// (a field may be called `default` or `required`), not schema keywords.
fn strip(value: &mut serde_json::Value, in_properties: bool) {
    match value {
        serde_json::Value::Object(map) => {
            if !in_properties {
                map.remove("default");
                map.remove("required");
            }
            for (key, child) in map.iter_mut() {
                strip(child, !in_properties && key == "properties");
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|item| strip(item, false)),
        _ => {}
    }
}
