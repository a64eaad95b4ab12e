//! One episode's trace as HTML: the header, a timeline of its steps
//! (duration bars, tool-call status, errors), and per step the memory
//! deltas, the policy turn with its token logits, injections; then the
//! reward components, the error contexts and how the episode ended.
//!
//! The one view of a trace: `basecamp serve`'s episode page, each drawer of
//! a `basecamp trace report`, and `basecamp trace parse FILE --output html`
//! (the page serve draws, without its navigation) all draw it here.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use basecamp_trace::metrics::{NO_FAILURE, measures_the_agent};
use basecamp_trace::pb::{self, record::Body};
use basecamp_trace::{LeftOut, TraceContents};

use super::catalog::EpisodeEntry;
use super::digest::{outcome_name, status_name};
use super::html::{esc, num};

/// Token logits drawn on a page of one episode (serve's episode page,
/// `trace parse --output html`); the rest are counted, not decoded.
pub const PAGE_TOKEN_CAP: usize = 20_000;

/// Everything recorded at one step.
#[derive(Default)]
struct StepRecords<'a> {
    plan: Vec<&'a pb::PlanStep>,
    deltas: Vec<&'a pb::MemoryDelta>,
    turns: Vec<&'a pb::PolicyTurn>,
    logits: Vec<&'a pb::TokenLogit>,
    injections: Vec<&'a pb::Injection>,
}

fn source_name(source: i32) -> &'static str {
    match pb::MemorySource::try_from(source).unwrap_or(pb::MemorySource::Unspecified) {
        pb::MemorySource::Tool => "tool",
        pb::MemorySource::User => "user",
        pb::MemorySource::Policy => "policy",
        pb::MemorySource::SystemInjection => "injection",
        pb::MemorySource::Fallback => "fallback",
        pb::MemorySource::Rollback => "rollback",
        pb::MemorySource::Initial => "initial",
        pb::MemorySource::Unspecified => "unknown",
    }
}

fn kind_name(kind: i32) -> &'static str {
    match pb::StepKind::try_from(kind).unwrap_or(pb::StepKind::Unspecified) {
        pb::StepKind::ToolCall => "tool call",
        pb::StepKind::FinalAnswer => "final answer",
        pb::StepKind::PolicyError => "policy error",
        pb::StepKind::Unspecified => "step",
    }
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}… ({} chars)", text.chars().count())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Background for a token by its probability: green when sure, red when not.
fn token_color(logprob: f32) -> String {
    let p = f64::from(logprob).exp().clamp(0.0, 1.0);
    let hue = (p * 120.0).round();
    format!("hsl({hue},70%,85%)")
}

/// How a view names its step panels and how its timeline links to them:
/// panel n's id is `{id_prefix}n`, the link `{href_prefix}n`.
pub struct StepAnchors {
    pub id_prefix: String,
    pub href_prefix: String,
}

impl StepAnchors {
    /// A page that holds this one view: `#s<n>`, which the browser follows itself.
    pub fn page() -> Self {
        StepAnchors { id_prefix: "s".into(), href_prefix: "#s".into() }
    }
}

/// The view's HTML (no page shell), for a page of its own (see [`render_with`]).
pub fn render(
    entry: &EpisodeEntry,
    trace: &TraceContents,
    undrawn: &LeftOut,
    token_cap: usize,
    raw: Option<&str>,
) -> String {
    render_with(entry, trace, undrawn, token_cap, raw, &StepAnchors::page())
}

/// The view's HTML (no page shell). At most `token_cap` token logits are
/// drawn; the rest are counted, with `undrawn`: those a capped read
/// ([`basecamp_trace::read_trace_at_most`]) left out of `trace`, per step.
/// `raw` links the trace bytes when given. `anchors` names the step panels:
/// a page holding many views (a report's drawers) gives each its own.
pub fn render_with(
    entry: &EpisodeEntry,
    trace: &TraceContents,
    undrawn: &LeftOut,
    token_cap: usize,
    raw: Option<&str>,
    anchors: &StepAnchors,
) -> String {
    let header = &trace.header;
    let mut steps: BTreeMap<u32, StepRecords<'_>> =
        undrawn.keys().map(|&step| (step, StepRecords::default())).collect();
    let mut rewards = Vec::new();
    let mut errors = Vec::new();
    let mut end = None;
    for record in &trace.records {
        let at = steps.entry(record.step).or_default();
        match &record.body {
            Some(Body::PlanStep(p)) => at.plan.push(p),
            Some(Body::MemoryDelta(d)) => at.deltas.push(d),
            Some(Body::PolicyTurn(t)) => at.turns.push(t),
            Some(Body::TokenLogit(t)) => at.logits.push(t),
            Some(Body::Injection(i)) => at.injections.push(i),
            Some(Body::RewardSignal(r)) => rewards.push((record.step, r)),
            Some(Body::ErrorContext(e)) => errors.push((record.step, e)),
            Some(Body::EpisodeEnd(e)) => end = Some(e),
            _ => {}
        }
    }
    let mut h = String::new();
    let _ = write!(
        h,
        "<h1>episode <code>{}</code></h1><p class=\"muted\">task <code>{}/{}</code>, variant <b>{}</b>, shard {} of {}, training step {}, top-k {}, config <code>{}</code>{}</p>",
        esc(&header.episode_id),
        esc(&entry.namespace),
        esc(&header.task),
        esc(&header.variant),
        header.shard,
        header.shard_count.max(1),
        header.training_step,
        header.top_k,
        esc(&hex(&header.config_hash).chars().take(12).collect::<String>()),
        raw.map_or(String::new(), |r| format!(" · <a href=\"{}\" class=\"raw\">raw .trace</a>", esc(r)))
    );
    let outcome = end.map_or("unfinished", |e| outcome_name(e.outcome));
    let _ = write!(
        h,
        "<p>outcome <b>{}</b> · failure class <span class=\"{}\">{}</span> · file <code>{}</code></p>",
        esc(outcome),
        if entry.failed() { "bad" } else { "good" },
        esc(&entry.failure_class),
        esc(&entry.relative)
    );
    if let Some(damage) = trace.damage() {
        let _ = write!(
            h,
            "<div class=\"hint bad damage\">damaged trace, showing the records before the damage: {}</div>",
            esc(&damage.to_string())
        );
    }
    if !entry.metrics.is_empty() {
        h.push_str("<div class=\"metrics\">");
        for (name, v) in &entry.metrics {
            let value = if name == "steps" || name == "tool_calls" { format!("{v:.0}") } else { num(Some(*v)) };
            let _ = write!(h, "<span><code>{}</code> <b>{value}</b></span>", esc(name));
        }
        let _ = write!(
            h,
            "</div><p class=\"muted\">metrics from {}</p>",
            if entry.from_summary {
                "the shard's summary.json (scored against the test set)"
            } else {
                "the trace alone"
            }
        );
    }

    // Timeline.
    let max_ms = steps
        .values()
        .flat_map(|s| s.plan.iter().map(|p| p.latency_micros as f64 / 1000.0))
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    h.push_str("<h2>Timeline</h2><table class=\"timeline-steps\"><tr><th>step</th><th>kind</th><th>tool</th><th>status</th><th>duration</th><th>timeout</th><th>error</th><th>memory</th></tr>");
    for (index, s) in steps.iter().filter(|(i, _)| **i > 0) {
        for p in &s.plan {
            let status = pb::StepStatus::try_from(p.status).unwrap_or(pb::StepStatus::Unspecified);
            let ms = p.latency_micros as f64 / 1000.0;
            let width = (ms / max_ms * 220.0).max(1.0);
            let nulls = s.deltas.iter().filter(|d| d.after_json.as_deref() == Some("null")).count();
            let _ = write!(
                h,
                "<tr class=\"step-row\" data-step=\"{index}\" data-status=\"{st}\"><td><a href=\"{href}{index}\">{index}</a></td><td>{}</td><td>{}</td><td><span class=\"status {st}\">{st}</span>{}</td>\
                 <td style=\"white-space:nowrap\"><svg width=\"226\" height=\"12\"><rect width=\"{width:.1}\" height=\"10\" y=\"1\" fill=\"{}\"/></svg> {ms:.1} ms</td><td>{}</td><td>{}</td><td>{} delta(s){}</td></tr>",
                kind_name(p.kind),
                if p.tool.is_empty() { "-".to_string() } else { format!("<code>{}</code>", esc(&p.tool)) },
                if p.fallback_used && status != pb::StepStatus::Fallback {
                    " <span class=\"warn\">fallback used</span>"
                } else {
                    ""
                },
                if status == pb::StepStatus::Ok { "#3b7dd8" } else { "#b00020" },
                if p.timeout_ms > 0 { format!("{} ms", p.timeout_ms) } else { "-".into() },
                if p.error_type.is_empty() {
                    String::new()
                } else {
                    format!("<b>{}</b> {}", esc(&p.error_type), esc(&p.error_message))
                },
                s.deltas.len(),
                if nulls > 0 { format!(" <span class=\"bad\">{nulls} null</span>") } else { String::new() },
                st = status_name(status),
                href = esc(&anchors.href_prefix),
            );
        }
    }
    h.push_str("</table>");

    // Per step.
    h.push_str("<h2>Steps</h2>");
    let mut tokens_drawn = 0usize;
    let mut tokens_left = 0usize;
    for (index, s) in &steps {
        let _ = write!(
            h,
            "<div class=\"panel\" id=\"{}{index}\"><b>{}</b>",
            esc(&anchors.id_prefix),
            if *index == 0 { "before the first step".to_string() } else { format!("step {index}") }
        );
        for p in &s.plan {
            // Writes the memory policy refused changed nothing, so no delta row shows them.
            let refused: String = p
                .refused_memory_json
                .iter()
                .map(|(key, value)| format!("\nrefused memory write: {key} = {}", clip(value, 200)))
                .collect();
            let _ = write!(
                h,
                " — {} <code>{}</code> <span class=\"status {}\">{}</span><div class=\"kv\">arguments: {}\nobservation: {}\nmemory hash {} → {}{}</div>",
                kind_name(p.kind),
                esc(&p.tool),
                status_name(pb::StepStatus::try_from(p.status).unwrap_or(pb::StepStatus::Unspecified)),
                status_name(pb::StepStatus::try_from(p.status).unwrap_or(pb::StepStatus::Unspecified)),
                esc(&clip(&p.arguments_json, 600)),
                esc(&clip(&p.observation_json, 600)),
                esc(&hex(&p.memory_hash_before).chars().take(12).collect::<String>()),
                esc(&hex(&p.memory_hash_after).chars().take(12).collect::<String>()),
                esc(&refused),
            );
        }
        for i in &s.injections {
            let _ = write!(
                h,
                "<div class=\"hint\">injection <code>{}</code>: {} <span class=\"kv\">{}</span></div>",
                esc(&i.id),
                esc(&i.description),
                esc(&clip(&i.observation_json, 400))
            );
        }
        if !s.deltas.is_empty() {
            h.push_str("<table class=\"memory\"><tr><th>memory key</th><th>before</th><th>after</th><th>source</th><th>origin</th></tr>");
            for d in &s.deltas {
                let null = d.after_json.as_deref() == Some("null");
                let _ = write!(
                    h,
                    "<tr{}><td><code>{}</code></td><td class=\"kv\">{}</td><td class=\"kv\">{}</td><td>{}</td><td>{}</td></tr>",
                    if null { " class=\"nullw\"" } else { "" },
                    esc(&d.key),
                    esc(&clip(d.before_json.as_deref().unwrap_or("(absent)"), 200)),
                    esc(&clip(d.after_json.as_deref().unwrap_or("(removed)"), 200)),
                    source_name(d.source),
                    esc(&d.origin)
                );
            }
            h.push_str("</table>");
        }
        for t in &s.turns {
            let _ = write!(
                h,
                "<div class=\"kv\">policy <code>{}</code> ({} ms, finish {}, {}+{} tokens){}: {}{}</div>",
                esc(&t.model),
                t.latency_micros as f64 / 1000.0,
                esc(&t.finish_reason),
                t.prompt_tokens,
                t.completion_tokens,
                if t.logprobs_missing { " <span class=\"bad\">logprobs missing</span>" } else { "" },
                esc(&clip(&t.content, 600)),
                if t.tool_calls_json.is_empty() {
                    String::new()
                } else {
                    format!("\ntool calls: {}", esc(&clip(&t.tool_calls_json, 600)))
                }
            );
        }
        let logits = s.logits.len() + undrawn.get(index).copied().unwrap_or(0);
        if logits > 0 {
            let room = token_cap.saturating_sub(tokens_drawn);
            let shown = s.logits.len().min(room);
            tokens_drawn += shown;
            tokens_left += logits - shown;
            let _ = write!(h, "<details class=\"logits\" open><summary>token logits ({logits} tokens)</summary><div>");
            // The alternatives are in the table below, not repeated in each title
            // (they were a quarter of a report's packed episode view).
            for t in &s.logits[..shown] {
                let _ = write!(
                    h,
                    "<span class=\"tok\" style=\"background:{}\" title=\"#{} id {} logprob {:.3}\">{}</span>",
                    token_color(t.logprob),
                    t.position,
                    t.token_id,
                    t.logprob,
                    esc(&t.token)
                );
            }
            h.push_str("</div>");
            if shown > 0 {
                // Records derived from raw logits also carry entropy and KL.
                let entropy = s.logits[..shown].iter().any(|t| t.entropy.is_some());
                let kl = s.logits[..shown].iter().any(|t| t.kl.is_some());
                h.push_str("<table class=\"topk\"><tr><th>#</th><th>token</th><th>logprob</th>");
                if entropy {
                    h.push_str("<th>entropy</th>");
                }
                if kl {
                    h.push_str("<th>KL</th>");
                }
                h.push_str("<th>top-k alternatives</th></tr>");
                for t in &s.logits[..shown] {
                    let alts: Vec<String> = t
                        .top_tokens
                        .iter()
                        .zip(&t.top_logprobs)
                        .zip(t.top_ids.iter().chain(std::iter::repeat(&-1)))
                        .map(|((tok, lp), id)| {
                            format!(
                                "<code>{}</code> {lp:.3}{}",
                                esc(tok),
                                if *id >= 0 { format!(" (id {id})") } else { String::new() }
                            )
                        })
                        .collect();
                    let _ = write!(
                        h,
                        "<tr><td>{}</td><td><code>{}</code></td><td>{:.3}</td>",
                        t.position,
                        esc(&t.token),
                        t.logprob
                    );
                    let nats = |v: Option<f32>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
                    if entropy {
                        let _ = write!(h, "<td>{}</td>", nats(t.entropy));
                    }
                    if kl {
                        let _ = write!(h, "<td>{}</td>", nats(t.kl));
                    }
                    let _ = write!(h, "<td>{}</td></tr>", alts.join(" · "));
                }
                h.push_str("</table>");
            }
            if shown < logits {
                let _ =
                    write!(h, "<p class=\"muted\">{} more token(s) of this step not drawn here</p>", logits - shown);
            }
            h.push_str("</details>");
        }
        h.push_str("</div>");
    }
    if tokens_left > 0 {
        let _ = write!(
            h,
            "<p class=\"muted\">{tokens_drawn} token logits drawn, {tokens_left} more in the trace (<code>basecamp trace parse FILE</code> prints them all as JSON)</p>"
        );
    }

    // Rewards.
    h.push_str("<h2>Reward</h2>");
    if rewards.is_empty() {
        h.push_str("<p class=\"muted\">no reward signal recorded</p>");
    }
    for (step, r) in &rewards {
        let _ = write!(
            h,
            "<table class=\"reward\"><tr><th>component (step {step})</th><th>score</th><th>weight</th><th>weight × score</th></tr>"
        );
        for c in &r.components {
            let _ = write!(
                h,
                "<tr><td><code>{}</code></td><td>{:.3}</td><td{}>{}</td><td>{:.3}</td></tr>",
                esc(&c.name),
                c.score,
                if c.weight < 0.0 { " class=\"warn\"" } else { "" },
                c.weight,
                c.score * c.weight
            );
        }
        let _ = write!(h, "<tr><th>weighted sum</th><th></th><th></th><th>{:.3}</th></tr></table>", r.weighted_sum);
        for d in &r.weight_deltas {
            let _ = write!(
                h,
                "<p>weight of <code>{}</code>: {} → {} at training step {}</p>",
                esc(&d.component),
                d.old_weight,
                d.new_weight,
                d.training_step
            );
        }
    }

    // Errors.
    h.push_str("<h2>Errors</h2>");
    if errors.is_empty() {
        h.push_str("<p class=\"good\">no error context recorded</p>");
    }
    for (step, e) in &errors {
        let _ = write!(
            h,
            "<div class=\"panel error\"><b class=\"bad\">{}</b> at step {step}: {}",
            esc(&e.error_type),
            esc(&e.message)
        );
        if !e.cause_chain.is_empty() {
            h.push_str("<ol class=\"causes\">");
            for c in &e.cause_chain {
                let _ = write!(h, "<li>{}</li>", esc(c));
            }
            h.push_str("</ol>");
        }
        if !e.stack.is_empty() {
            let _ = write!(h, "<pre class=\"kv\">{}</pre>", esc(&clip(&e.stack, 4000)));
        }
        if !e.memory_snapshot_json.is_empty() {
            h.push_str("<table><tr><th>memory at the error</th><th>value</th></tr>");
            let sorted: BTreeMap<_, _> = e.memory_snapshot_json.iter().collect();
            for (k, v) in sorted {
                let _ = write!(
                    h,
                    "<tr{}><td><code>{}</code></td><td class=\"kv\">{}</td></tr>",
                    if v == "null" { " class=\"nullw\"" } else { "" },
                    esc(k),
                    esc(&clip(v, 300))
                );
            }
            h.push_str("</table>");
        }
        if !e.omitted_memory_keys.is_empty() {
            let keys: Vec<String> = e.omitted_memory_keys.iter().map(|k| format!("<code>{}</code>", esc(k))).collect();
            let _ = write!(
                h,
                "<div class=\"kv\">left out of the memory at the error (too long; the memory changes above hold \
                 them): {}</div>",
                keys.join(", ")
            );
        }
        for p in &e.last_tool_payloads {
            let _ = write!(
                h,
                "<div class=\"kv\">payload <code>{}</code> [{}]: {} → {}</div>",
                esc(&p.tool),
                status_name(pb::StepStatus::try_from(p.status).unwrap_or(pb::StepStatus::Unspecified)),
                esc(&clip(&p.arguments_json, 300)),
                esc(&clip(&p.response_json, 300))
            );
        }
        h.push_str("</div>");
    }

    if let Some(e) = end {
        let seconds = e.end_time_unix_nanos.saturating_sub(header.start_time_unix_nanos).max(0) as f64 / 1e9;
        let _ = write!(
            h,
            "<h2>End</h2><p>{}{} after {} step(s) in {seconds:.3} s; final memory <code>{}</code></p><div class=\"kv\">{}</div>",
            outcome_name(e.outcome),
            failure_note(&e.failure_class),
            e.steps,
            esc(&hex(&e.final_memory_hash).chars().take(12).collect::<String>()),
            esc(&clip(&e.final_answer, 1000))
        );
    }
    h
}

/// The end's failure class as the page says it after the outcome: nothing
/// for a success or a trace written before the end carried one.
fn failure_note(class: &str) -> String {
    match class {
        "" | NO_FAILURE => String::new(),
        class if !measures_the_agent(class) => {
            format!(" (<b>{}</b>: the policy or a service failed, not the agent; not measured)", esc(class))
        }
        class => format!(" (<b>{}</b>)", esc(class)),
    }
}

/// `view` (from [`render`]) as a whole page in the shared shell, after
/// `before` (serve's navigation; nothing for a page read from a file). The
/// page fetches nothing, so it works as well from a file as from serve.
pub fn page(entry: &EpisodeEntry, before: &str, view: &str) -> String {
    let title = format!("{}/{} {}/{}", entry.namespace, entry.task, entry.variant, entry.id);
    super::html::page(&title, &format!("{before}<section class=\"episode-view page\">{view}</section>"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use basecamp_trace::pb::{
        EpisodeEnd, ErrorContext, Header, Injection, MemoryDelta, PlanStep, PolicyTurn, Record, RewardComponent,
        RewardSignal, TokenLogit, ToolPayload, WeightDelta,
    };
    use basecamp_trace::synthetic::{EpisodeShape, generate};
    use basecamp_trace::{RecordKind, Tail, TraceError, TraceReader};
    use proptest::prelude::*;

    use super::*;
    use crate::serve::catalog::{LazyDigest, episode_entry, lone_entry};

    #[test]
    fn a_capped_read_draws_the_view_a_full_read_draws() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ep.trace");
        let episode = generate(&EpisodeShape { steps: 8, tokens_per_step: 30, ..Default::default() });
        episode.write_to(std::fs::File::create(&file).unwrap(), 3).unwrap();
        let entry = episode_entry(dir.path(), &file, None, LazyDigest::default()).unwrap();
        let full = basecamp_trace::read_trace(&file).unwrap();
        for cap in [0, 1, 29, 30, 100, 240, 1000] {
            let (capped, undrawn) = basecamp_trace::read_trace_at_most(&file, RecordKind::TokenLogit, cap).unwrap();
            let view = render(&entry, &capped, &undrawn, cap, None);
            assert_eq!(view, render(&entry, &full, &LeftOut::new(), cap, None), "cap {cap}");
        }
    }

    /// Markup, quotes and an entity: what must reach the page as text.
    fn hostile(field: &str) -> String {
        format!("<x y='1'>\"&amp;{field}")
    }

    /// One record of every kind the view draws, every string in it hostile
    /// and naming its field.
    fn hostile_trace() -> TraceContents {
        let h = hostile;
        let record = |step, body| Record { step, body: Some(body) };
        let header = Header {
            namespace: h("namespace"),
            task: h("task"),
            variant: h("variant"),
            episode_id: h("episode_id"),
            shard_count: 1,
            top_k: 2,
            ..Default::default()
        };
        let records = vec![
            record(
                0,
                Body::MemoryDelta(MemoryDelta {
                    key: h("delta.key"),
                    before_json: Some(h("delta.before")),
                    after_json: Some(h("delta.after")),
                    source: 1,
                    origin: h("delta.origin"),
                }),
            ),
            record(
                1,
                Body::PolicyTurn(PolicyTurn {
                    model: h("turn.model"),
                    content: h("turn.content"),
                    tool_calls_json: h("turn.tool_calls"),
                    finish_reason: h("turn.finish_reason"),
                    ..Default::default()
                }),
            ),
            record(
                1,
                Body::TokenLogit(TokenLogit {
                    token: h("token").into(),
                    top_tokens: vec![h("top_token").into()].into(),
                    top_logprobs: vec![-0.5].into(),
                    top_ids: vec![7].into(),
                    ..Default::default()
                }),
            ),
            record(
                1,
                Body::PlanStep(Box::new(PlanStep {
                    index: 1,
                    tool: h("plan.tool"),
                    arguments_json: h("plan.arguments"),
                    observation_json: h("plan.observation"),
                    error_type: h("plan.error_type"),
                    error_message: h("plan.error_message"),
                    status: pb::StepStatus::Error as i32,
                    refused_memory_json: [(h("plan.refused_key"), h("plan.refused_value"))].into(),
                    ..Default::default()
                })),
            ),
            record(
                1,
                Body::Injection(Injection {
                    id: h("injection.id"),
                    observation_json: h("injection.observation"),
                    description: h("injection.description"),
                    ..Default::default()
                }),
            ),
            record(
                1,
                Body::ErrorContext(Box::new(ErrorContext {
                    error_type: h("error.type"),
                    message: h("error.message"),
                    cause_chain: vec![h("error.cause")],
                    stack: h("error.stack"),
                    memory_snapshot_json: [(h("error.memory_key"), h("error.memory_value"))].into(),
                    last_tool_payloads: vec![ToolPayload {
                        tool: h("payload.tool"),
                        arguments_json: h("payload.arguments"),
                        response_json: h("payload.response"),
                        status: 2,
                    }],
                    omitted_memory_keys: vec![h("error.omitted_key")],
                })),
            ),
            record(
                1,
                Body::RewardSignal(RewardSignal {
                    components: vec![RewardComponent { name: h("reward.component"), score: 1.0, weight: 1.0 }],
                    weighted_sum: 1.0,
                    weight_deltas: vec![WeightDelta { component: h("reward.delta"), ..Default::default() }],
                }),
            ),
            record(
                1,
                Body::EpisodeEnd(EpisodeEnd {
                    steps: 1,
                    final_answer: h("final_answer"),
                    failure_class: h("failure_class"),
                    ..Default::default()
                }),
            ),
        ];
        let damage = TraceError::Truncated { file: h("damage.file"), offset: 9, steps_recovered: 1 };
        TraceContents { header, records, tail: Tail::Damaged(damage) }
    }

    #[test]
    fn every_string_from_the_trace_is_drawn_as_text() {
        let trace = hostile_trace();
        let entry = lone_entry(Path::new(&hostile("file")), &trace, None);
        let page = page(&entry, "", &render(&entry, &trace, &LeftOut::new(), PAGE_TOKEN_CAP, None));
        assert!(!page.contains("<x"), "trace contents became markup");
        let fields = [
            "namespace",
            "task",
            "variant",
            "episode_id",
            "file",
            "delta.key",
            "delta.before",
            "delta.after",
            "delta.origin",
            "turn.model",
            "turn.content",
            "turn.tool_calls",
            "turn.finish_reason",
            "token",
            "top_token",
            "plan.tool",
            "plan.arguments",
            "plan.observation",
            "plan.error_type",
            "plan.error_message",
            "plan.refused_key",
            "plan.refused_value",
            "injection.id",
            "injection.observation",
            "injection.description",
            "error.type",
            "error.message",
            "error.cause",
            "error.stack",
            "error.memory_key",
            "error.memory_value",
            "error.omitted_key",
            "payload.tool",
            "payload.arguments",
            "payload.response",
            "failure_class",
            "reward.component",
            "reward.delta",
            "final_answer",
            "damage.file",
        ];
        for field in fields {
            assert!(page.contains(&esc(&hostile(field))), "{field} is not drawn");
        }
        assert!(page.contains("damaged trace"), "the damage is said");
    }

    fn trace_bytes() -> Vec<u8> {
        generate(&EpisodeShape { seed: 9, steps: 6, tokens_per_step: 3, ..Default::default() })
            .write_to(Vec::new(), 3)
            .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// Whatever the bytes, the view of what could be read is a whole
        /// page, and a damaged trace's page says so.
        #[test]
        fn damaged_traces_draw_a_page_never_a_panic(
            cut in 0.0f64..1.0,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..3),
            cap in 0usize..20,
        ) {
            let mut bytes = trace_bytes();
            for (at, x) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= x;
            }
            bytes.truncate(((bytes.len() as f64) * (0.5 + cut / 2.0)) as usize);
            if let Ok(reader) = TraceReader::new(bytes.as_slice(), "d.trace") {
                let (trace, undrawn) = reader.at_most(RecordKind::TokenLogit, cap).into_contents_and_left_out();
                let entry = lone_entry(Path::new("d.trace"), &trace, None);
                let page = page(&entry, "", &render(&entry, &trace, &undrawn, cap, None));
                prop_assert!(page.ends_with("</html>\n"));
                prop_assert!(trace.damage().is_some(), "a cut trace is damaged");
                prop_assert!(page.contains("<div class=\"hint bad damage\">damaged trace"));
            }
        }
    }
}
