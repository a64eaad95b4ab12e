//! OTLP export of a real (synthetic) episode: the span tree, timeouts,
//! evaluation events, and stable ids.

use basecamp_trace::TraceReader;
use basecamp_trace::otlp::{export, export_request};
use basecamp_trace::pb::{StepStatus, record::Body};
use basecamp_trace::synthetic::{EpisodeShape, generate};
use serde_json::Value;

fn attr<'a>(item: &'a Value, key: &str) -> Option<&'a Value> {
    item["attributes"].as_array()?.iter().find(|a| a["key"] == key).map(|a| &a["value"])
}

#[test]
fn an_episode_becomes_an_agent_span_with_tool_spans_and_evaluations() {
    let ep = generate(&EpisodeShape { seed: 4, steps: 40, tokens_per_step: 2, ..Default::default() });
    let bytes = ep.write_to(Vec::new(), 3).unwrap();
    let (doc, damage) = export(TraceReader::new(bytes.as_slice(), "ep.trace").unwrap());
    assert!(damage.is_none());
    let spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap();
    let root = &spans[0];
    assert_eq!(root["name"], "invoke_agent shipping-delay");
    assert_eq!(attr(root, "gen_ai.operation.name").unwrap()["stringValue"], "invoke_agent");
    assert_eq!(attr(root, "gen_ai.conversation.id").unwrap()["stringValue"], "ep-0004");
    assert_eq!(attr(root, "gen_ai.request.model").unwrap()["stringValue"], "policy-under-test");

    // One execute_tool span per plan step, children of the agent span, timeouts marked.
    let plan_steps: Vec<_> = ep
        .steps
        .iter()
        .flatten()
        .filter_map(|r| match &r.body {
            Some(Body::PlanStep(p)) => Some(p.clone()),
            _ => None,
        })
        .collect();
    let tools = &spans[1..];
    assert_eq!(tools.len(), plan_steps.len());
    let mut timeouts = 0;
    for (span, p) in tools.iter().zip(&plan_steps) {
        assert_eq!(span["name"], format!("execute_tool {}", p.tool));
        assert_eq!(span["traceId"], root["traceId"]);
        assert_eq!(span["parentSpanId"], root["spanId"]);
        assert_eq!(attr(span, "gen_ai.tool.name").unwrap()["stringValue"], p.tool.as_str());
        let start: u64 = span["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u64 = span["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert_eq!(end - start, p.latency_micros * 1000);
        let exceptions: Vec<&Value> = span["events"]
            .as_array()
            .map(|e| e.iter().filter(|e| e["name"] == "exception").collect())
            .unwrap_or_default();
        if p.status == StepStatus::Fallback as i32 {
            timeouts += 1;
            assert_eq!(attr(span, "error.type").unwrap()["stringValue"], "timeout");
            assert_eq!(span["status"]["code"], 2);
            // The step's error context is on the call that failed, at its end.
            assert_eq!(exceptions.len(), 1, "{span}");
            assert_eq!(exceptions[0]["timeUnixNano"], span["endTimeUnixNano"]);
        } else {
            assert!(attr(span, "error.type").is_none());
            assert_eq!(span["status"]["code"], 1);
            assert!(exceptions.is_empty(), "{span}");
        }
    }
    assert!(timeouts > 0, "seed 4 should hold a timeout");

    let events = root["events"].as_array().unwrap();
    let evaluations: Vec<&Value> = events.iter().filter(|e| e["name"] == "gen_ai.evaluation.result").collect();
    let named =
        |n: &str| evaluations.iter().filter(|e| attr(e, "gen_ai.evaluation.name").unwrap()["stringValue"] == n).count();
    assert_eq!(named("tool_call_accuracy"), 40);
    assert_eq!(named("reward.weighted_sum"), 40);
    assert_eq!(named("error_rate"), 1);
    let error_rate =
        evaluations.iter().find(|e| attr(e, "gen_ai.evaluation.name").unwrap()["stringValue"] == "error_rate").unwrap();
    let rate = attr(error_rate, "gen_ai.evaluation.score.value").unwrap()["doubleValue"].as_f64().unwrap();
    assert!((rate - timeouts as f64 / 40.0).abs() < 1e-12);
    assert_eq!(events.iter().filter(|e| e["name"] == "exception").count(), 0, "none left on the root");
    // Events are dated inside the episode, never before the step they are of.
    let root_start: u64 = root["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
    let root_end: u64 = root["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
    for e in events {
        let t: u64 = e["timeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!((root_start..=root_end).contains(&t), "{e}");
    }

    // Same trace, same ids.
    let (again, _) = export(TraceReader::new(bytes.as_slice(), "ep.trace").unwrap());
    assert_eq!(again, doc);
}

#[test]
fn a_truncated_trace_exports_its_prefix_and_says_so() {
    let bytes = generate(&EpisodeShape { seed: 2, steps: 10, tokens_per_step: 2, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap();
    let cut = &bytes[..bytes.len() / 2];
    let (doc, damage) = export(TraceReader::new(cut, "cut.trace").unwrap());
    let damage = damage.expect("the cut is reported");
    assert!(damage.to_string().starts_with("cut.trace: truncated at byte "));
    let root = &doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    assert_eq!(root["status"]["code"], 2);
}

/// The CLI writes the typed request as it serializes; its text must be the
/// text of the `Value` document (sorted keys), for a whole episode and a
/// damaged one, with errors, exceptions and every attribute kind.
#[test]
fn the_typed_request_writes_the_text_of_the_value_document() {
    let bytes = generate(&EpisodeShape { seed: 4, steps: 40, tokens_per_step: 2, ..Default::default() })
        .write_to(Vec::new(), 3)
        .unwrap();
    for (name, input) in [("ep.trace", &bytes[..]), ("cut.trace", &bytes[..bytes.len() / 2])] {
        let (request, damage) = export_request(TraceReader::new(input, name).unwrap());
        let (doc, damage_again) = export(TraceReader::new(input, name).unwrap());
        assert_eq!(damage.map(|e| e.to_string()), damage_again.map(|e| e.to_string()));
        let text = serde_json::to_string(&request).unwrap();
        assert_eq!(text, doc.to_string(), "{name}");
        assert!(text.contains(r#""error.type","value":{"stringValue":"timeout"}"#), "{name}");
        assert!(text.contains(r#"{"key":"basecamp.tool.fallback_used","value":{"boolValue":true}}"#), "{name}");
    }
}
