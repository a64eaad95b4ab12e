//! The CustomResourceDefinitions generated from the Rust types, for
//! `basecamp-operator crdgen` (which writes `crds/`), and a check that
//! their schemas are structural — the apiserver refuses a CRD whose schema
//! is not, and a CRD generated at build time is only caught at install time
//! without this check.

use std::sync::OnceLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::sandbox::SandboxConfig;
use crate::task::HarnessTask;

/// Both CRDs: HarnessTask, then SandboxConfig.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![with_kubernetes_formats(HarnessTask::crd()), with_kubernetes_formats(SandboxConfig::crd())]
}

/// The CRD with schemars' unsigned integer formats (`uint32`, ...), which the
/// apiserver does not know and warns about on every apply, replaced by the
/// OpenAPI ones (`int32` for 8/16 bits, `int64` for 32/64 bits; the
/// `minimum: 0` schemars adds keeps them unsigned), and a `maximum` where
/// none is set: the type's own. Without it the apiserver stored
/// `shards: 5000000000`, and the operator's watch, which reads every task
/// of the cluster, failed to read that one and stopped for all of them.
pub fn with_kubernetes_formats(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let Some(schema) = version.schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut()) else { continue };
        let Ok(mut value) = serde_json::to_value(&*schema) else { continue };
        replace_formats(&mut value);
        if let Ok(fixed) = serde_json::from_value(value) {
            *schema = fixed;
        }
    }
    crd
}

fn replace_formats(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let replacement = match map.get("format").and_then(serde_json::Value::as_str) {
                Some("uint8") => Some(("int32", Some(u64::from(u8::MAX)))),
                Some("uint16") => Some(("int32", Some(u64::from(u16::MAX)))),
                Some("uint32") => Some(("int64", Some(u64::from(u32::MAX)))),
                // Bounded by the apiserver's int64 already.
                Some("uint64" | "uint") => Some(("int64", None)),
                _ => None,
            }
            .map(|(format, maximum)| (format, maximum.map(serde_json::Value::from)));
            if let Some((format, maximum)) = replacement {
                map.insert("format".into(), format.into());
                if let Some(maximum) = maximum {
                    map.entry("maximum").or_insert(maximum);
                }
            }
            map.values_mut().for_each(replace_formats);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(replace_formats),
        _ => {}
    }
}

/// A CRD as YAML.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(crd)
}

/// The `openAPIV3Schema` of a kind (`HarnessTask` or `SandboxConfig`) as JSON.
pub fn schema_of(kind: &str) -> Option<&'static serde_json::Value> {
    static TASK: OnceLock<serde_json::Value> = OnceLock::new();
    static SANDBOX: OnceLock<serde_json::Value> = OnceLock::new();
    let (cell, make): (_, fn() -> CustomResourceDefinition) = match kind {
        "HarnessTask" => (&TASK, HarnessTask::crd),
        "SandboxConfig" => (&SANDBOX, SandboxConfig::crd),
        _ => return None,
    };
    Some(cell.get_or_init(|| {
        let crd = with_kubernetes_formats(make());
        let schema =
            crd.spec.versions.first().and_then(|v| v.schema.as_ref()).and_then(|s| s.open_api_v3_schema.as_ref());
        serde_json::to_value(schema).unwrap_or(serde_json::Value::Null)
    }))
}

/// Every way `schema` breaks the structural-schema rules the apiserver
/// enforces (as `path: problem`); empty when it is structural.
///
/// Checked: every node has a `type` unless it is
/// `x-kubernetes-int-or-string` or `x-kubernetes-preserve-unknown-fields`;
/// no `$ref`; `anyOf`/`oneOf`/`allOf`/`not` only hold value validations
/// (no `type`, `properties`, `items`, `additionalProperties`, `description`,
/// `default`, `nullable`, and no empty `{}` branch), except the `anyOf: [{type: integer}, {type:
/// string}]` that int-or-string allows; `additionalProperties` and
/// `properties` not both set; no `default`s at all (Basecamp applies
/// defaults in code so profile overlays stay partial).
pub fn structural_violations(schema: &serde_json::Value) -> Vec<String> {
    let mut problems = Vec::new();
    check_node(schema, "openAPIV3Schema", &mut problems);
    problems
}

fn check_node(node: &serde_json::Value, path: &str, problems: &mut Vec<String>) {
    let Some(map) = node.as_object() else {
        problems.push(format!("{path}: a schema must be an object, found {node}"));
        return;
    };
    let flag = |key: &str| map.get(key).and_then(serde_json::Value::as_bool) == Some(true);
    let int_or_string = flag("x-kubernetes-int-or-string");
    let preserve = flag("x-kubernetes-preserve-unknown-fields");
    if !map.contains_key("type") && !int_or_string && !preserve {
        problems.push(format!("{path}: no type"));
    }
    if map.contains_key("$ref") {
        problems.push(format!("{path}: $ref is not allowed"));
    }
    if map.contains_key("default") {
        problems.push(format!("{path}: has a default"));
    }
    if map.contains_key("properties") && map.contains_key("additionalProperties") {
        problems.push(format!("{path}: both properties and additionalProperties"));
    }
    for junction in ["anyOf", "oneOf", "allOf"] {
        let Some(branches) = map.get(junction) else { continue };
        let int_or_string_pattern = serde_json::json!([{ "type": "integer" }, { "type": "string" }]);
        if junction == "anyOf" && int_or_string && branches == &int_or_string_pattern {
            continue;
        }
        for (index, branch) in branches.as_array().into_iter().flatten().enumerate() {
            if branch.as_object().is_some_and(serde_json::Map::is_empty) {
                problems.push(format!("{path}.{junction}[{index}]: empty schema inside {junction}"));
            }
            for forbidden in
                ["type", "properties", "items", "additionalProperties", "description", "default", "nullable"]
            {
                if branch.get(forbidden).is_some() {
                    problems.push(format!("{path}.{junction}[{index}]: {forbidden} inside {junction}"));
                }
            }
        }
    }
    if let Some(properties) = map.get("properties").and_then(serde_json::Value::as_object) {
        for (name, child) in properties {
            check_node(child, &format!("{path}.{name}"), problems);
        }
    }
    if let Some(items) = map.get("items") {
        check_node(items, &format!("{path}[]"), problems);
    }
    if let Some(additional) = map.get("additionalProperties")
        && additional.is_object()
    {
        check_node(additional, &format!("{path}.*"), problems);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd_json(crd: &CustomResourceDefinition) -> serde_json::Value {
        serde_json::to_value(crd).expect("a CRD serializes")
    }

    #[test]
    fn both_crds_serialize_with_group_version_scope_and_status() {
        let task = crd_json(&HarnessTask::crd());
        assert_eq!(task["spec"]["group"], "basecamp.dev");
        assert_eq!(task["spec"]["scope"], "Namespaced");
        assert_eq!(task["spec"]["names"]["kind"], "HarnessTask");
        assert_eq!(task["spec"]["versions"][0]["name"], "v1alpha1");
        assert!(task["spec"]["versions"][0]["subresources"]["status"].is_object());
        let sandbox = crd_json(&SandboxConfig::crd());
        assert_eq!(sandbox["spec"]["names"]["kind"], "SandboxConfig");
        for crd in all() {
            let yaml = to_yaml(&crd).expect("yaml");
            assert!(yaml.contains("openAPIV3Schema"), "{yaml}");
        }
    }

    #[test]
    fn printer_columns_are_what_users_check_first() {
        let columns = |crd: serde_json::Value| -> Vec<(String, String)> {
            crd["spec"]["versions"][0]["additionalPrinterColumns"]
                .as_array()
                .expect("columns")
                .iter()
                .map(|c| {
                    (c["name"].as_str().unwrap_or("").to_string(), c["jsonPath"].as_str().unwrap_or("").to_string())
                })
                .collect()
        };
        let task = columns(crd_json(&HarnessTask::crd()));
        let names: Vec<&str> = task.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Phase", "Variants", "Shards", "Accuracy", "Age"]);
        assert!(task.contains(&("Shards".into(), ".status.shardsSummary".into())));
        let sandbox = columns(crd_json(&SandboxConfig::crd()));
        let names: Vec<&str> = sandbox.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["GPU", "MinCC", "Age"]);
    }

    #[test]
    fn integer_formats_are_ones_the_apiserver_knows() {
        for crd in all() {
            let yaml = to_yaml(&crd).expect("yaml");
            assert!(!yaml.contains("format: uint"), "{yaml}");
        }
        let task = schema_of("HarnessTask").expect("schema");
        assert_eq!(task["properties"]["spec"]["properties"]["shards"]["format"], "int64");
    }

    #[test]
    fn unsigned_integers_are_bounded_by_their_type_or_tighter() {
        // Before: no maximum, so the apiserver stored `shards: 5000000000`, which no
        // reader of u32 could read: the operator's watch failed for every task.
        let spec = |kind: &str| schema_of(kind).expect("schema")["properties"]["spec"]["properties"].clone();
        let (task, sandbox) = (spec("HarnessTask"), spec("SandboxConfig"));
        assert_eq!(task["parallelism"]["maximum"], f64::from(u32::MAX));
        assert_eq!(task["shards"]["maximum"], 100_000.0, "the tighter bound stays");
        assert_eq!(sandbox["maxSteps"]["maximum"], f64::from(u32::MAX));
        // An empty sandbox name is refused by the schema, not read as an API error.
        assert_eq!(task["sandboxRef"]["properties"]["name"]["minLength"], 1);
    }

    #[test]
    fn schemas_are_structural() {
        for kind in ["HarnessTask", "SandboxConfig"] {
            let schema = schema_of(kind).expect("schema");
            let problems = structural_violations(schema);
            assert!(problems.is_empty(), "{kind}:\n{}", problems.join("\n"));
        }
    }

    #[test]
    fn duration_and_tool_timeouts_use_the_structural_escape_hatches() {
        let sandbox = schema_of("SandboxConfig").expect("schema");
        let spec = &sandbox["properties"]["spec"]["properties"];
        assert_eq!(spec["planStepTimeout"]["x-kubernetes-int-or-string"], true);
        assert_eq!(spec["toolTimeouts"]["x-kubernetes-preserve-unknown-fields"], true);
        assert!(spec["toolTimeouts"].get("type").is_none());
        assert!(spec["toolTimeouts"]["description"].as_str().is_some_and(|d| d.contains("EVERY tool")));
        // Profiles are typed overlays: the spec's fields, without nesting or defaults.
        let profile = &spec["profiles"]["additionalProperties"];
        assert!(profile["properties"]["tools"].is_object());
        assert!(profile["properties"].get("profiles").is_none());
        assert!(profile.get("required").is_none());
        let task = schema_of("HarnessTask").expect("schema");
        let conditions = &task["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(
            task["properties"]["spec"]["properties"]["policy"]["properties"]["requestTimeout"]["x-kubernetes-int-or-string"],
            true
        );
    }

    /// `(path, description)` of every duration field under `schema`: an
    /// int-or-string that is not a resource quantity, and `toolTimeouts`.
    fn duration_fields(schema: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
        let Some(map) = schema.as_object() else { return };
        let description = map.get("description").and_then(serde_json::Value::as_str).unwrap_or("");
        let is_duration = map.get("x-kubernetes-int-or-string").is_some() && !description.starts_with("Quantity is");
        if is_duration || path.ends_with(".toolTimeouts") {
            out.push((path.to_string(), description.to_string()));
        }
        for (key, child) in map.get("properties").and_then(serde_json::Value::as_object).into_iter().flatten() {
            duration_fields(child, &format!("{path}.{key}"), out);
        }
        for (key, child) in [("*", map.get("additionalProperties")), ("[]", map.get("items"))] {
            if let Some(child) = child {
                duration_fields(child, &format!("{path}.{key}"), out);
            }
        }
    }

    #[test]
    fn every_duration_field_says_how_long_it_may_be() {
        let cap = format!(
            "At most {} days ({})",
            crate::duration::MAX_SPEC_DURATION.as_whole_days(),
            crate::duration::MAX_SPEC_DURATION
        );
        let mut fields = Vec::new();
        for kind in ["HarnessTask", "SandboxConfig"] {
            duration_fields(schema_of(kind).expect("schema"), kind, &mut fields);
        }
        let names: std::collections::BTreeSet<&str> =
            fields.iter().filter_map(|(path, _)| path.rsplit('.').next()).collect();
        let expected = [
            "backoff",
            "outageTimeout",
            "planStepTimeout",
            "readyTimeout",
            "recordTimeout",
            "requestTimeout",
            "startupTimeout",
            "toolTimeouts",
        ];
        assert_eq!(names.into_iter().collect::<Vec<_>>(), expected, "{fields:#?}");
        // Before: the cap was documented only in api/src/duration.rs.
        let silent: Vec<&String> = fields.iter().filter(|(_, d)| !d.contains(&cap)).map(|(path, _)| path).collect();
        assert!(silent.is_empty(), "no {cap:?} in the descriptions of {silent:#?}");
    }

    #[test]
    fn field_docs_become_descriptions() {
        let task = schema_of("HarnessTask").expect("schema");
        let source = &task["properties"]["spec"]["properties"]["dataPipeline"]["properties"]["source"]["description"];
        assert!(source.as_str().is_some_and(|d| d.contains("dataPipeline") || d.contains("version")), "{source}");
    }

    #[test]
    fn the_checker_catches_non_structural_schemas() {
        let bad = serde_json::json!({
            "type": "object",
            "properties": {
                "anything": true,
                "untyped": {"description": "x"},
                "mixed": {"anyOf": [{"type": "string"}, {"type": "object"}]},
                "hoisted": {"x-kubernetes-int-or-string": true, "anyOf": [{}, {}]},
                "defaulted": {"type": "string", "default": "x"}
            }
        });
        let problems = structural_violations(&bad);
        assert_eq!(problems.len(), 8, "{problems:?}");
    }
}
