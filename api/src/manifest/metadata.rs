//! `metadata` as the API server reads it: a name and a namespace that are
//! Kubernetes names; only the keys of ObjectMeta — strict field validation
//! (`kubectl apply`'s default) refuses any other, such as a misspelt
//! `namespce`, which would otherwise put the object in the default
//! namespace without a word; and labels and annotations whose values are
//! strings (YAML reads `team: 1` as a number, `enabled: true` as a
//! boolean) and whose keys, and label values, have the label syntax.
//!
//! The keys the API server fills in (`uid`, `resourceVersion`,
//! `generation`, `creationTimestamp`, `managedFields`, ...) are accepted, as
//! `kubectl get -o yaml` writes them, and ignored.

use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::{Document, ManifestError, file_location, join_path, json_type, line_of_key};
use crate::problem::{Location, Problem, Report, Rule};
use crate::validate::{dns_subdomain_violation, is_dns_label, is_label_value, is_qualified_name, suggestion};

/// Every problem the API server would find in `metadata` of a `kind` document.
pub(super) fn check(file: &str, document: &Document, kind: &str, metadata: Option<&Value>, report: &mut Report) {
    // The line of the first of `keys` found once in the document.
    let at = |keys: &[&str]| {
        let line = keys.iter().find_map(|key| line_of_key(document, key));
        file_location(file, Some(line.unwrap_or(document.first_line)))
    };
    check_name(file, document, kind, metadata, report);
    if let Some(namespace) = metadata.and_then(|m| m.get("namespace")).and_then(Value::as_str)
        && !is_dns_label(namespace)
    {
        report.push(Problem::error_at(
            Rule::InvalidName,
            at(&["namespace"]),
            format!(
                "metadata.namespace {namespace:?} is not a Kubernetes namespace (1-63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
            ),
        ));
    }
    let Some(Value::Object(metadata)) = metadata else { return };
    for (field, noun) in [("labels", "a label"), ("annotations", "an annotation")] {
        if let Some(Value::Object(entries)) = metadata.get(field) {
            check_labels(field, noun, entries, &at, report);
        }
    }
    let known = object_meta_keys();
    for key in metadata.keys().filter(|key| !known.contains(key)) {
        let hint = suggestion(key, known.iter().map(String::as_str));
        report.push(Problem::error_at(
            Rule::UnknownField,
            at(&[key]),
            format!(
                "{}: unknown field {key:?} in {kind}; remove it or fix its name.{hint}",
                join_path("metadata", key)
            ),
        ));
    }
}

/// `metadata.<field>` (labels or annotations, `noun` "a label" or "an
/// annotation"): string values, keys that are qualified names, and label
/// values of the label syntax.
fn check_labels(
    field: &str,
    noun: &str,
    entries: &serde_json::Map<String, Value>,
    at: &dyn Fn(&[&str]) -> Location,
    report: &mut Report,
) {
    let field_path = format!("metadata.{field}");
    for (key, value) in entries {
        let path = join_path(&field_path, key);
        let at = || at(&[key, field]);
        if !is_qualified_name(key) {
            report.push(Problem::error_at(
                Rule::InvalidName,
                at(),
                format!(
                    "{path}: {key:?} is not {noun} key (an optional DNS-subdomain prefix and '/', then 1-63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit)"
                ),
            ));
        }
        let text = match value {
            Value::String(text) => text,
            // The type check says "null is not allowed here".
            Value::Null => continue,
            // The API server takes only strings here.
            other => {
                report.push(Problem::error_at(
                    Rule::InvalidManifest,
                    at(),
                    format!("{path} is the {} {other}, not a string; quote it: {key}: \"{other}\"", json_type(other)),
                ));
                continue;
            }
        };
        if field != "labels" {
            continue;
        }
        if text.len() > 63 {
            report.push(Problem::error_at(
                Rule::InvalidName,
                at(),
                format!("{path} is {} characters; label values are at most 63", text.chars().count()),
            ));
        } else if !is_label_value(text) {
            report.push(Problem::error_at(
                Rule::InvalidName,
                at(),
                format!(
                    "{path}: {text:?} is not a label value (letters, digits, '-', '_' and '.', starting and ending with a letter or digit; or empty)"
                ),
            ));
        }
    }
}

fn check_name(file: &str, document: &Document, kind: &str, metadata: Option<&Value>, report: &mut Report) {
    let name_value = metadata.and_then(|m| m.get("name")).filter(|v| !v.is_null());
    let name = name_value.and_then(Value::as_str);
    let name_problem = |message: String| {
        let line = line_of_key(document, "name").unwrap_or(document.first_line);
        Problem::error_at(Rule::InvalidName, file_location(file, Some(line)), message)
    };
    match (name_value, name) {
        (None, _) => report.push(
            ManifestError::Invalid {
                file: file.into(),
                line: document.first_line,
                path: "metadata.name".into(),
                message: format!("every {kind} needs metadata.name"),
            }
            .to_problem(),
        ),
        // The API server takes only a string; YAML reads 12345 or true as another type.
        (Some(value), None) => report.push(name_problem(format!(
            "metadata.name is the {} {value}, not a string; quote it: name: \"{}\"",
            json_type(value),
            value.as_str().map_or_else(|| value.to_string(), str::to_string)
        ))),
        (_, Some(name)) if name.len() > 253 => report.push(name_problem(format!(
            "metadata.name is {} characters; Kubernetes names are at most 253",
            name.chars().count()
        ))),
        (_, Some(name)) => {
            if let Some(why) = dns_subdomain_violation(name) {
                report.push(name_problem(format!("metadata.name {name:?} is not a Kubernetes name: {why}")));
            }
        }
    }
}

/// The keys of ObjectMeta, from k8s-openapi's schema of it: what the API
/// server accepts under `metadata`.
fn object_meta_keys() -> &'static [String] {
    static KEYS: OnceLock<Vec<String>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let schema = schemars::schema_for!(ObjectMeta);
        let properties = schema.get("properties").and_then(Value::as_object);
        properties.map(|p| p.keys().cloned().collect()).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_known_keys_are_those_of_object_meta() {
        let keys = object_meta_keys();
        for key in ["name", "namespace", "labels", "annotations", "generateName", "uid", "resourceVersion"] {
            assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
        }
        for key in ["generation", "creationTimestamp", "managedFields", "ownerReferences", "finalizers"] {
            assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
        }
        assert!(!keys.iter().any(|k| k == "spec"));
    }
}
