//! The JSON harness form — `{"task_definition", "data_pipeline",
//! "training_config", "evaluation"}` with snake_case keys, as harness files
//! are often written — converted to a HarnessTask manifest, so it gets
//! exactly the checks (and words) of a YAML manifest.
//!
//! Conversion is mechanical: each snake_case key becomes the camelCase field
//! of the HarnessTask spec (`batch_size` -> `batchSize`), `task_definition.goal`
//! becomes its `description`, and `metadata.name` is derived from
//! `task_definition.name` (`e_commerce_support_v4` -> `e-commerce-support-v4`).
//! Keys Basecamp adds to the form — `sandbox` (a SandboxConfig name, or
//! `{name, profile}`), `policy`, `variants`, `shards`, `traces` — convert
//! the same way. Unknown keys are not dropped: they reach the manifest and
//! are reported as unknown fields, with the original (snake_case) path.
//!
//! One value changes spelling: `data_pipeline.preprocessor` written as a
//! bare dotted Python path (`pkg.module.function`, as harness files name
//! it) becomes `python:pkg.module.function`, the manifest's form for it,
//! and the conversion says so in a note. Any other preprocessor is kept as
//! written, for validation to accept or refuse.

use serde_json::{Map, Value};

use crate::preprocessor::Preprocessor;
use crate::problem::{Location, Problem, Report, Rule};

/// JSON keys whose values are user data, copied as they are (no renaming inside).
const VERBATIM: [&str; 4] = ["lr_schedule", "compare_args", "success_criteria", "metrics"];

/// The result of converting one JSON harness file.
#[derive(Debug, Clone)]
pub struct Converted {
    /// The HarnessTask manifest as a JSON value (`apiVersion`, `kind`, `metadata`, `spec`).
    pub manifest: Value,
    /// Problems found while converting (not the validation problems).
    pub report: Report,
    /// Values the conversion rewrote, one sentence each, for the user to read.
    pub notes: Vec<String>,
}

/// Whether `text` looks like the JSON harness form (an object with `task_definition`).
pub fn is_harness_json(text: &str) -> bool {
    let text = without_bom(text);
    text.trim_start().starts_with('{')
        && serde_json::from_str::<Value>(text).is_ok_and(|v| v.get("task_definition").is_some())
}

/// JSON text as a value, refusing a key given twice in one object, which
/// serde_json would let the last one win silently (`"batch_size": 64, ...,
/// "batch_size": 0`); YAML manifests refuse it too. The error names the
/// key's path in the form's spelling, at the key's line and column.
fn parse_refusing_duplicates(text: &str) -> Result<Value, serde_json::Error> {
    use serde::de::DeserializeSeed;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = UniqueKeys { path: "" }.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// A JSON value at `path` (`data_pipeline.batch_size`, `evaluation.metrics[0]`;
/// empty for the document) whose objects have each key once.
struct UniqueKeys<'p> {
    path: &'p str,
}

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON text has no NaN or infinity, so every f64 read is a number.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(UniqueKeys { path: &format!("{}[{}]", self.path, items.len()) })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() { key.clone() } else { format!("{}.{key}", self.path) };
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("{path} is given twice in the same object; keep one")));
            }
            let value = map.next_value_seed(UniqueKeys { path: &path })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// `text` without a leading UTF-8 byte order mark, which editors on Windows
/// write and JSON parsers refuse (the YAML reader and the JSONL files skip it).
fn without_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Plain snake_case: lower-case words of letters and digits joined by
/// single `_`s, each after the first starting with a letter.
fn is_snake(key: &str) -> bool {
    key.split('_').enumerate().all(|(i, word)| {
        word.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || (i == 0 && b.is_ascii_digit()))
            && word.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// An object's keys, those in the form's own spelling (snake_case) first:
/// of two keys that are one field, the snake_case one is kept.
fn form_keys_first(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_by_key(|(key, _)| !is_snake(key));
    entries
}

/// The manifest's camelCase for a snake_case key (`batch_size` ->
/// `batchSize`). A key that is not plain snake_case (`batch__size`,
/// `batch_size_`, `testSet`) is kept as it is, so the schema reports it as
/// unknown in the user's own spelling instead of it quietly becoming a
/// field (or replacing the one the user meant).
fn camel(key: &str) -> String {
    if !is_snake(key) {
        return key.to_string();
    }
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// `spec.dataPipeline.batchSize` -> `data_pipeline.batch_size`: a manifest
/// field path as the JSON form spells it.
pub fn json_path(manifest_path: &str) -> String {
    let path = manifest_path.strip_prefix("spec.").unwrap_or(manifest_path);
    let path =
        if path.starts_with("sandboxRef") { path.replacen("sandboxRef", "sandbox", 1) } else { path.to_string() };
    // The whole manifest is the harness: its top level has no name of its own.
    if path == "spec" {
        return "(the harness)".to_string();
    }
    let mut out = String::with_capacity(path.len() + 8);
    let mut previous = ' ';
    for c in path.chars() {
        // A hump of camelCase (`batchSize`); a key kept as the user wrote
        // it (`Model_ID`, see `camel`) is not one and stays as written.
        if c.is_ascii_uppercase() && (previous.is_ascii_lowercase() || previous.is_ascii_digit()) {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
        previous = c;
    }
    out
}

/// `value` with its keys in the manifest's spelling (not below a
/// [`VERBATIM`] key); two keys that would become one (`batch_size` and
/// `batchSize`) are an error at `path` rather than one silently replacing
/// the other.
fn rename(value: &Value, verbatim: bool, path: &str, problems: &mut Vec<Problem>) -> Value {
    match value {
        Value::Object(map) if !verbatim => {
            let mut out = Map::new();
            let mut from: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
            for (key, v) in form_keys_first(map) {
                let inner = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                let name = camel(key);
                if let Some(kept) = from.get(&name) {
                    problems.push(Problem::error(
                        Rule::InvalidManifest,
                        inner,
                        format!("{key:?} is the field {name:?} too, which {kept:?} sets; keep one"),
                    ));
                    continue;
                }
                from.insert(name.clone(), key);
                out.insert(name, rename(v, VERBATIM.contains(&key.as_str()), &inner, problems));
            }
            Value::Object(out)
        }
        Value::Array(items) if !verbatim => Value::Array(
            items.iter().enumerate().map(|(i, v)| rename(v, false, &format!("{path}[{i}]"), problems)).collect(),
        ),
        other => other.clone(),
    }
}

/// Rewrites a bare dotted Python path in `dataPipeline.preprocessor` as
/// the manifest writes it (`python:pkg.module.function`); returns the note
/// that says so. A value that already parses, or that is not a dotted
/// Python path, is left for validation (which names the accepted forms).
fn python_preprocessor(spec: &mut Map<String, Value>) -> Option<String> {
    let slot = spec.get_mut("dataPipeline")?.get_mut("preprocessor")?;
    let written = slot.as_str()?;
    if written.parse::<Preprocessor>().is_ok() {
        return None;
    }
    let python = Preprocessor::from_python_path(written)?.to_string();
    let note = format!(
        "data_pipeline.preprocessor {written:?} is the Python function {python} in the manifest \
         (imported from the trainer image's working directory by `basecamp data preprocess`)"
    );
    *slot = Value::String(python);
    Some(note)
}

/// A DNS-1123 name from a display name: lowercase, `_`/spaces to `-`.
fn object_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .split('-')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    out.truncate(63);
    out.trim_end_matches('-').to_string()
}

/// Converts the JSON harness `text` (from `file`) into a HarnessTask
/// manifest. `sandbox` overrides (or supplies) the SandboxConfig reference.
pub fn convert(file: &str, text: &str, sandbox: Option<&str>) -> Converted {
    let mut report = Report::new();
    let value: Value = match parse_refusing_duplicates(without_bom(text)) {
        Ok(v) => v,
        Err(e) => {
            let location =
                Location::File { file: file.to_string(), line: Some(e.line() as u64), column: Some(e.column() as u64) };
            // The location says where; serde_json's text says it again at its end.
            let text = e.to_string();
            let text = text.strip_suffix(&format!(" at line {} column {}", e.line(), e.column())).unwrap_or(&text);
            report.push(Problem::error_at(Rule::InvalidManifest, location, format!("invalid JSON: {text}")));
            return Converted { manifest: Value::Null, report, notes: Vec::new() };
        }
    };
    let Some(object) = value.as_object() else {
        report.push(Problem::error_at(
            Rule::InvalidManifest,
            Location::line(file, 1),
            "a harness file holds one JSON object with task_definition, data_pipeline, training_config and evaluation",
        ));
        return Converted { manifest: Value::Null, report, notes: Vec::new() };
    };
    let mut spec = Map::new();
    let mut renamed = Vec::new();
    for (key, value) in form_keys_first(object) {
        match key.as_str() {
            "sandbox" => {
                let reference = match value {
                    Value::String(name) => serde_json::json!({ "name": name }),
                    other => rename(other, false, key, &mut renamed),
                };
                spec.insert("sandboxRef".into(), reference);
            }
            "task_definition" => {
                let mut definition = rename(value, false, key, &mut renamed);
                if let Some(map) = definition.as_object_mut()
                    && let Some(goal) = map.remove("goal")
                {
                    map.entry("description").or_insert(goal);
                }
                spec.insert("taskDefinition".into(), definition);
            }
            other => {
                let field = camel(other);
                if let Some(kept) = object.keys().find(|k| *k != other && camel(k) == field && is_snake(k)) {
                    renamed.push(Problem::error(
                        Rule::InvalidManifest,
                        other,
                        format!("{other:?} is the field {field:?} too, which {kept:?} sets; keep one"),
                    ));
                    continue;
                }
                spec.insert(field, rename(value, VERBATIM.contains(&other), key, &mut renamed));
            }
        }
    }
    for problem in renamed {
        report.push(problem.in_object(file));
    }
    if let Some(name) = sandbox {
        spec.insert("sandboxRef".into(), serde_json::json!({ "name": name }));
    }
    let notes: Vec<String> = python_preprocessor(&mut spec).into_iter().collect();
    // The form has no policy section; an empty one lets validation say what
    // a policy needs instead of stopping at "missing field".
    spec.entry("policy").or_insert_with(|| Value::Object(Map::new()));
    let display_name = object.get("task_definition").and_then(|d| d.get("name")).and_then(Value::as_str).unwrap_or("");
    let name = object_name(display_name);
    if name.is_empty() {
        report.push(
            Problem::error(
                Rule::InvalidName,
                "task_definition.name",
                "task_definition.name is missing or has no letters or digits; it names the HarnessTask",
            )
            .in_object(file),
        );
    }
    let manifest = serde_json::json!({
        "apiVersion": crate::API_VERSION,
        "kind": "HarnessTask",
        "metadata": { "name": name },
        "spec": Value::Object(spec),
    });
    Converted { manifest, report, notes }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARTICLE: &str = r#"{ "task_definition": { "name": "e_commerce_support_v4", "goal": "resolve user complaints about delayed shipping", "success_criteria": ["user_satisfaction_score > 0.85", "avg_resolution_time < 90s"] }, "data_pipeline": { "source": "s3://ds-logs/ecommerce-v3/", "preprocessor": "deepseek.harness.preprocess.shipping_delay_filter", "batch_size": 64 }, "training_config": { "model_id": "deepseek-v4.1-agent-base", "optimizer": "paged_adamw_32bit", "lr_schedule": {"type": "cosine", "warmup_steps": 200} }, "evaluation": { "metrics": ["tool_call_accuracy", "plan_step_f1", "memory_consistency"], "test_set": "s3://ds-eval/ecommerce-delay-test.jsonl" } }"#;

    #[test]
    fn keys_that_are_not_snake_case_stay_as_written_and_two_keys_for_one_field_are_an_error() {
        let text = r#"{"task_definition": {"name": "t1"},
            "data_pipeline": {"source": "s3://b/x/", "batch_size": 64, "batch__size": 8, "batchSize": 9},
            "evaluation": {"test_set": "a.jsonl", "testSet": "b.jsonl", "top_k_": 1}}"#;
        let converted = convert("h.json", text, None);
        let said: Vec<String> = converted.report.problems().iter().map(|p| p.to_string()).collect();
        let spec = &converted.manifest["spec"];
        // Kept as written, for the schema to name as unknown fields.
        assert_eq!(spec["dataPipeline"]["batchSize"], 64, "{said:#?}");
        assert_eq!(spec["dataPipeline"]["batch__size"], 8);
        assert_eq!(spec["evaluation"]["top_k_"], 1);
        assert_eq!(spec["evaluation"]["testSet"], "a.jsonl");
        for expected in [
            "data_pipeline.batchSize: \"batchSize\" is the field \"batchSize\" too, which \"batch_size\" sets; keep one",
            "evaluation.testSet: \"testSet\" is the field \"testSet\" too, which \"test_set\" sets; keep one",
        ] {
            assert!(said.iter().any(|s| s.contains(expected)), "{expected}\n{said:#?}");
        }
        assert_eq!(said.len(), 2, "{said:#?}");
        // A section spelt both ways.
        let twice =
            convert("h.json", r#"{"task_definition": {"name": "t1"}, "data_pipeline": {}, "dataPipeline": {}}"#, None);
        let said: Vec<String> = twice.report.problems().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            said,
            [
                "error: h.json: dataPipeline: \"dataPipeline\" is the field \"dataPipeline\" too, which \"data_pipeline\" sets; keep one"
            ]
        );
    }

    #[test]
    fn the_articles_harness_converts_field_by_field() {
        assert!(is_harness_json(ARTICLE));
        let converted = convert("harness.json", ARTICLE, Some("shipping-tools"));
        assert!(converted.report.problems().is_empty(), "{:?}", converted.report);
        let m = &converted.manifest;
        assert_eq!(m["metadata"]["name"], "e-commerce-support-v4");
        assert_eq!(m["spec"]["taskDefinition"]["description"], "resolve user complaints about delayed shipping");
        assert_eq!(m["spec"]["dataPipeline"]["batchSize"], 64);
        assert_eq!(m["spec"]["trainingConfig"]["modelId"], "deepseek-v4.1-agent-base");
        // User data inside lrSchedule keeps its keys.
        assert_eq!(m["spec"]["trainingConfig"]["lrSchedule"]["warmup_steps"], 200);
        assert_eq!(m["spec"]["evaluation"]["testSet"], "s3://ds-eval/ecommerce-delay-test.jsonl");
        assert_eq!(m["spec"]["sandboxRef"]["name"], "shipping-tools");
        // The article's dotted Python path, in the manifest's form, and said so.
        assert_eq!(
            m["spec"]["dataPipeline"]["preprocessor"],
            "python:deepseek.harness.preprocess.shipping_delay_filter"
        );
        assert_eq!(converted.notes.len(), 1, "{:?}", converted.notes);
        assert!(
            converted.notes[0].starts_with(
                "data_pipeline.preprocessor \"deepseek.harness.preprocess.shipping_delay_filter\" is the Python function \
                 python:deepseek.harness.preprocess.shipping_delay_filter in the manifest"
            ),
            "{:?}",
            converted.notes
        );
    }

    #[test]
    fn a_preprocessor_in_the_manifests_form_or_not_a_python_path_is_kept_as_written() {
        for written in ["builtin:trajectory", "exec:python3 prep.py", "python:prep.f", "shipping_delay_filter", "a.b-c"]
        {
            let harness = format!(
                r#"{{"task_definition": {{"name": "t"}}, "data_pipeline": {{"source": "s3://b/x/", "preprocessor": {written:?}}}}}"#
            );
            let converted = convert("h.json", &harness, None);
            assert_eq!(converted.manifest["spec"]["dataPipeline"]["preprocessor"], written);
            assert!(converted.notes.is_empty(), "{:?}", converted.notes);
        }
    }

    #[test]
    fn paths_map_back_to_the_json_spelling() {
        assert_eq!(json_path("spec.dataPipeline.batchSize"), "data_pipeline.batch_size");
        assert_eq!(json_path("spec.sandboxRef.name"), "sandbox.name");
        assert_eq!(json_path("spec.taskDefinition.successCriteria[1]"), "task_definition.success_criteria[1]");
        // Keys not in snake_case reach the manifest as written, and are named so.
        assert_eq!(json_path("spec.trainingConfig.Model_ID"), "training_config.Model_ID");
        assert_eq!(json_path("spec"), "(the harness)");
    }

    #[test]
    fn a_byte_order_mark_is_skipped() {
        // Before: "invalid JSON: expected value at line 1 column 1".
        let text = format!("\u{feff}{ARTICLE}");
        assert!(is_harness_json(&text));
        let converted = convert("harness.json", &text, Some("shipping-tools"));
        assert!(converted.report.problems().is_empty(), "{:?}", converted.report);
        assert_eq!(converted.manifest["metadata"]["name"], "e-commerce-support-v4");
    }

    /// Before: the last one won silently (a batch size of 0 that validation
    /// then refused, or worse, a valid value the user never meant).
    #[test]
    fn a_key_given_twice_in_one_object_is_refused_at_its_line() {
        let text = "{\"task_definition\": {\"name\": \"t\"},\n \"data_pipeline\": {\"source\": \"s3://b/x/\",\n   \"batch_size\": 64, \"batch_size\": 0}}";
        let converted = convert("h.json", text, None);
        let said: Vec<String> = converted.report.problems().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            said,
            ["error: h.json:3:33: invalid JSON: data_pipeline.batch_size is given twice in the same object; keep one"]
        );
        assert!(converted.manifest.is_null());
        // Inside lists too; the same key in two objects is fine.
        let text = r#"{"task_definition": {"name": "t", "success_criteria": ["a"]}, "variants": [{"name": "a"}, {"name": "b", "name": "c"}]}"#;
        let said = convert("h.json", text, None).report.problems()[0].to_string();
        assert!(said.contains("invalid JSON: variants[1].name is given twice in the same object; keep one"), "{said}");
        // Values still read as serde_json reads them.
        let text = r#"{"a": [1, -2, 2.5, 18446744073709551615, "x", null, true, {}]}"#;
        assert_eq!(parse_refusing_duplicates(text).unwrap(), serde_json::from_str::<Value>(text).unwrap());
    }

    #[test]
    fn invalid_json_names_line_and_column() {
        let converted = convert("h.json", "{\n  \"task_definition\": {,\n}", None);
        let text = converted.report.problems()[0].to_string();
        assert!(text.contains("h.json:2") && text.contains("invalid JSON"), "{text}");
    }
}
