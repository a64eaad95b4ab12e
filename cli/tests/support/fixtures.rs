//! Test data for `basecamp serve` and `basecamp trace report`: a small A/B
//! run laid out as the operator uploads it, written with the real trace
//! writer, with a failure story the reports must find:
//!
//! - variant `a`: every third episode's `track_order` times out and its
//!   fallback writes `shipping_status: null`; the policy then skips the
//!   second tool call (2 steps, tool_call_accuracy 0.5). The reward has an
//!   `efficiency` component with weight -0.2 and score = steps, so its
//!   weighted contribution is highest exactly where accuracy is lowest.
//! - variant `b`: every episode completes its 3 steps.
//! - a second task with traces only (no summary.json): metrics come from the traces.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use basecamp_trace::TraceWriter;
use basecamp_trace::pb::{
    EpisodeEnd, ErrorContext, Header, MemoryDelta, MemorySource, Outcome, PlanStep, PolicyTurn, RewardComponent,
    RewardSignal, StepKind, StepStatus, TokenLogit, ToolPayload, record::Body,
};
use serde_json::json;

pub const NAMESPACE: &str = "team-a";
pub const TASK: &str = "shop";
pub const TRACE_ONLY_TASK: &str = "shop-replay";
pub const EPISODES: u32 = 12;

/// Where variant `v`'s shard 0 lives under `root`.
pub fn shard_dir(root: &Path, task: &str, variant: &str) -> PathBuf {
    root.join("2026/11/30").join(NAMESPACE).join(task).join(variant).join("shard-0")
}

/// Is episode `i` of variant `variant` one of the failing ones?
pub fn fails(variant: &str, i: u32) -> bool {
    variant == "a" && i.is_multiple_of(3)
}

fn header(namespace: &str, task: &str, variant: &str, id: &str, start: i64) -> Header {
    Header {
        namespace: namespace.into(),
        task: task.into(),
        variant: variant.into(),
        shard: 0,
        shard_count: 1,
        episode_id: id.into(),
        start_time_unix_nanos: start,
        top_k: 2,
        ..Default::default()
    }
}

fn token(position: u32, text: &str, logprob: f32) -> Body {
    Body::TokenLogit(TokenLogit {
        position,
        token_id: 100 + position as i32,
        token: text.into(),
        logprob,
        top_ids: vec![100 + position as i32, 7].into(),
        top_tokens: vec![text.into(), "other".into()].into(),
        top_logprobs: vec![logprob, -3.5].into(),
        // The second token reads as derived from raw logits with a reference.
        entropy: (position == 1).then_some(1.25),
        kl: (position == 1).then_some(0.0625),
    })
}

fn tool_step(index: u32, tool: &str, ok: bool, start: i64) -> Body {
    Body::PlanStep(Box::new(PlanStep {
        index,
        kind: StepKind::ToolCall as i32,
        tool: tool.into(),
        call_id: format!("call_{index}"),
        arguments_json: r#"{"order_id":"ORD-1"}"#.into(),
        observation_json: if ok { r#"{"status":"delayed"}"#.into() } else { r#"{"status":"unknown"}"#.into() },
        status: if ok { StepStatus::Ok as i32 } else { StepStatus::Fallback as i32 },
        error_type: if ok { String::new() } else { "timeout".into() },
        error_message: if ok { String::new() } else { format!("tool {tool} timed out after 800 ms") },
        fallback_used: !ok,
        start_unix_nanos: start,
        latency_micros: if ok { 40_000 + u64::from(index) * 1000 } else { 800_000 },
        timeout_ms: 800,
        ..Default::default()
    }))
}

/// Writes one episode; returns (steps, tool_call_accuracy, reward, failed).
fn write_episode(path: &Path, task: &str, variant: &str, i: u32) -> (u32, f64, f64, bool) {
    write_episode_as(path, NAMESPACE, task, variant, &format!("ep-{i:03}"), i)
}

/// Episode `i`'s story as [`write_episode`] tells it, under another
/// namespace or episode id (the trace's header says which).
pub fn write_episode_as(
    path: &Path,
    namespace: &str,
    task: &str,
    variant: &str,
    id: &str,
    i: u32,
) -> (u32, f64, f64, bool) {
    let start = 1_796_000_000_000_000_000 + i64::from(i) * 10_000_000_000;
    let failed = fails(variant, i);
    let mut w = TraceWriter::create(path, header(namespace, task, variant, id, start)).unwrap();
    w.append(
        0,
        Body::MemoryDelta(MemoryDelta {
            key: "order_id".into(),
            after_json: Some("\"ORD-1\"".into()),
            source: MemorySource::Initial as i32,
            origin: "test_set".into(),
            ..Default::default()
        }),
    )
    .unwrap();
    w.end_step().unwrap();
    // Step 1: track_order.
    w.append(1, Body::PolicyTurn(PolicyTurn { model: "scripted".into(), latency_micros: 2000, ..Default::default() }))
        .unwrap();
    w.append(1, token(0, "track", -0.05)).unwrap();
    w.append(1, token(1, "_order", -0.9)).unwrap();
    w.append(1, tool_step(1, "track_order", !failed, start)).unwrap();
    w.append(
        1,
        Body::MemoryDelta(MemoryDelta {
            key: "shipping_status".into(),
            after_json: Some(if failed { "null".into() } else { "\"delayed\"".into() }),
            source: if failed { MemorySource::Fallback as i32 } else { MemorySource::Tool as i32 },
            origin: "track_order".into(),
            ..Default::default()
        }),
    )
    .unwrap();
    if failed {
        w.append(
            1,
            Body::ErrorContext(Box::new(ErrorContext {
                error_type: "timeout".into(),
                message: "tool track_order timed out after 800 ms".into(),
                cause_chain: vec!["tool track_order timed out after 800 ms".into(), "deadline elapsed".into()],
                memory_snapshot_json: [("shipping_status".to_string(), "null".to_string())].into(),
                last_tool_payloads: vec![ToolPayload {
                    tool: "track_order".into(),
                    arguments_json: r#"{"order_id":"ORD-1"}"#.into(),
                    response_json: r#"{"status":"unknown"}"#.into(),
                    status: StepStatus::Fallback as i32,
                }],
                ..Default::default()
            })),
        )
        .unwrap();
    }
    w.end_step().unwrap();
    let mut steps = 1;
    if !failed {
        w.append(2, tool_step(2, "issue_credit", true, start + 1_000_000)).unwrap();
        w.end_step().unwrap();
        steps += 1;
    }
    steps += 1;
    let last = steps;
    w.append(
        last,
        Body::PlanStep(Box::new(PlanStep {
            index: last,
            kind: StepKind::FinalAnswer as i32,
            observation_json: json!("Your order is on its way").to_string(),
            status: StepStatus::Ok as i32,
            ..Default::default()
        })),
    )
    .unwrap();
    let accuracy = if failed { 0.5 } else { 1.0 };
    let components = [("correctness", accuracy, 1.0), ("efficiency", f64::from(steps), -0.2)];
    let reward: f64 = components.iter().map(|(_, s, w)| s * w).sum();
    w.append(
        last,
        Body::RewardSignal(RewardSignal {
            components: components
                .iter()
                .map(|(name, score, weight)| RewardComponent { name: (*name).into(), score: *score, weight: *weight })
                .collect(),
            weighted_sum: reward,
            ..Default::default()
        }),
    )
    .unwrap();
    w.finish(EpisodeEnd {
        outcome: Outcome::Completed as i32,
        end_time_unix_nanos: start + 1_500_000_000 + i64::from(i) * 10_000_000,
        steps,
        final_answer: "Your order is on its way".into(),
        ..Default::default()
    })
    .unwrap();
    (steps, accuracy, reward, failed)
}

/// Writes the whole tree under `root`.
pub fn write_run(root: &Path) {
    for variant in ["a", "b"] {
        let dir = shard_dir(root, TASK, variant);
        std::fs::create_dir_all(&dir).unwrap();
        let mut episodes = Vec::new();
        for i in 0..EPISODES {
            let file = format!("ep-{i:03}.trace");
            let (steps, accuracy, reward, failed) = write_episode(&dir.join(&file), TASK, variant, i);
            episodes.push(json!({
                "id": format!("ep-{i:03}"),
                "outcome": "completed",
                "metrics": {
                    "tool_call_accuracy": accuracy,
                    "tool_call_accuracy_lenient": accuracy,
                    "plan_step_f1": if failed { 0.667 } else { 1.0 },
                    "memory_consistency": if failed { 0.5 } else { 1.0 },
                    "error_rate": if failed { 1.0 } else { 0.0 },
                    "resolution_time_s": 1.5 + f64::from(i) * 0.01,
                    "reward": reward,
                    "tool_calls": steps - 1,
                    "steps": steps
                },
                "failure_class": if failed { "timeout" } else { "ok" },
                "trace_file": file,
                "rollbacks": 0,
                "warnings": []
            }));
        }
        let summary = json!({
            "namespace": NAMESPACE, "task": TASK, "variant": variant, "shard": 0, "shard_count": 1,
            "started_unix_nanos": 1_796_000_000_000_000_000_i64, "wall_seconds": 3.0,
            "aggregate": {"episodes": EPISODES, "means": {}, "resolution_time_p50_s": 1.5,
                          "resolution_time_p95_s": 1.6, "outcomes": {"completed": EPISODES}},
            "episodes": episodes, "lost": []
        });
        std::fs::write(dir.join("summary.json"), serde_json::to_vec_pretty(&summary).unwrap()).unwrap();
    }
    // Traces only: no summary next to them.
    let dir = shard_dir(root, TRACE_ONLY_TASK, "a");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..6 {
        write_episode(&dir.join(format!("ep-{i:03}.trace")), TRACE_ONLY_TASK, "a", i);
    }
}

/// Writes `n` episodes of `task` variant `variant` without a summary (the
/// server reads them from their traces); a third of variant a's fail.
pub fn write_traces(root: &Path, task: &str, variant: &str, n: u32) {
    let dir = shard_dir(root, task, variant);
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..n {
        write_episode(&dir.join(format!("ep-{i:03}.trace")), task, variant, i);
    }
}

/// Pearson's r, computed here independently of the code under test.
pub fn pearson(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let vx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
    let vy: f64 = ys.iter().map(|y| (y - my).powi(2)).sum();
    cov / (vx.sqrt() * vy.sqrt())
}

/// A `trace report` page with every episode drawer's packed view inflated in
/// place, as the page script does when a drawer is opened.
pub fn unpacked_report(html: &str) -> String {
    use base64::Engine as _;
    use std::io::Read as _;
    let open = "<script type=\"text/x-gzip-base64\">";
    let mut out = String::with_capacity(html.len() * 8);
    let mut rest = html;
    while let Some(at) = rest.find(open) {
        out.push_str(&rest[..at]);
        let body = &rest[at + open.len()..];
        let end = body.find("</script>").expect("a packed view ends");
        let gz = base64::engine::general_purpose::STANDARD.decode(&body[..end]).expect("a packed view is base64");
        flate2::read::GzDecoder::new(gz.as_slice()).read_to_string(&mut out).expect("a packed view is gzip");
        rest = &body[end + "</script>".len()..];
    }
    out.push_str(rest);
    out
}
