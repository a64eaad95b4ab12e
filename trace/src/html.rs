//! One trace as a single self-contained HTML page (inline CSS, no scripts,
//! nothing fetched): the header, a step timeline with durations and
//! statuses, memory deltas, generated tokens with their top-k
//! alternatives, reward signals and error contexts. Every value from the
//! trace is HTML-escaped.

use std::fmt::Write as _;

use crate::pb::{MemorySource, Outcome, Record, StepKind, StepStatus, record::Body};
use crate::reader::{Tail, TraceContents};

/// Tokens shown per page; the rest are counted, not drawn (a page must stay openable).
pub const MAX_TOKENS_SHOWN: usize = 5000;

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn status_name(status: i32) -> &'static str {
    match StepStatus::try_from(status) {
        Ok(StepStatus::Ok) => "ok",
        Ok(StepStatus::Error) => "error",
        Ok(StepStatus::Timeout) => "timeout",
        Ok(StepStatus::Fallback) => "fallback",
        Ok(StepStatus::RolledBack) => "rolled_back",
        Ok(StepStatus::Refused) => "refused",
        _ => "unknown",
    }
}

fn source_name(source: i32) -> String {
    MemorySource::try_from(source)
        .map(|s| s.as_str_name().trim_start_matches("MEMORY_SOURCE_").to_lowercase())
        .unwrap_or_else(|_| format!("unknown ({source})"))
}

const STYLE: &str = "
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2430;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #dde;padding-bottom:4px}
table{border-collapse:collapse;width:100%}td,th{padding:4px 8px;border-bottom:1px solid #eef;text-align:left;vertical-align:top}
th{background:#f5f7fb;font-weight:600}code,pre{font:12px/1.4 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}
.meta span{margin-right:18px}.badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:12px;color:#fff}
.ok{background:#2f8a4c}.error,.refused{background:#c0392b}.timeout{background:#d35400}.fallback{background:#b7950b}
.rolled_back{background:#8e44ad}.unknown{background:#7f8c8d}
.bar{height:10px;background:#3b7dd8;border-radius:2px;min-width:1px}.bar.slow{background:#d35400}
.tok{display:inline-block;margin:1px;padding:0 3px;border-radius:3px;font:12px ui-monospace,monospace;white-space:pre}
.damage{background:#fdecea;border:1px solid #c0392b;padding:8px;border-radius:4px}
details{margin:4px 0}summary{cursor:pointer}
";

/// The whole page.
pub fn trace_to_html(file: &str, trace: &TraceContents) -> String {
    let mut h = String::with_capacity(64 << 10);
    let header = &trace.header;
    let end = trace.records.iter().find_map(|r| match &r.body {
        Some(Body::EpisodeEnd(e)) => Some(e),
        _ => None,
    });
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} — basecamp trace</title><style>{STYLE}</style></head><body>",
        esc(&header.episode_id)
    );
    let _ = write!(h, "<h1>Episode {}</h1><div class=\"meta\">", esc(&header.episode_id));
    for (k, v) in [
        ("file", file.to_string()),
        ("task", format!("{}/{}", header.namespace, header.task)),
        ("variant", header.variant.clone()),
        ("shard", format!("{}/{}", header.shard, header.shard_count)),
        ("training step", header.training_step.to_string()),
        ("top-k", header.top_k.to_string()),
    ] {
        let _ = write!(h, "<span><b>{k}</b> {}</span>", esc(&v));
    }
    if let Some(e) = end {
        let outcome = Outcome::try_from(e.outcome).map_or("unknown", |o| o.as_str_name());
        let secs = e.end_time_unix_nanos.saturating_sub(header.start_time_unix_nanos) as f64 / 1e9;
        let _ = write!(
            h,
            "<span><b>outcome</b> {}</span><span><b>steps</b> {}</span><span><b>duration</b> {secs:.3} s</span>",
            esc(outcome.trim_start_matches("OUTCOME_")),
            e.steps
        );
    }
    h.push_str("</div>");
    if let Tail::Damaged(e) = &trace.tail {
        let _ = write!(
            h,
            "<p class=\"damage\"><b>Damaged trace:</b> {} — showing the records before it.</p>",
            esc(&e.to_string())
        );
    }
    if let Some(e) = end
        && !e.final_answer.is_empty()
    {
        let _ = write!(h, "<p><b>Final answer:</b> {}</p>", esc(&e.final_answer));
    }
    timeline(&mut h, &trace.records);
    memory(&mut h, &trace.records);
    rewards(&mut h, &trace.records);
    errors(&mut h, &trace.records);
    tokens(&mut h, &trace.records);
    h.push_str("</body></html>\n");
    h
}

fn timeline(h: &mut String, records: &[Record]) {
    let steps: Vec<(u32, &crate::pb::PlanStep)> = records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::PlanStep(p)) => Some((r.step, p)),
            _ => None,
        })
        .collect();
    let max = steps.iter().map(|(_, p)| p.latency_micros).max().unwrap_or(0).max(1);
    let _ = write!(
        h,
        "<h2>Step timeline ({} calls)</h2><table><tr><th>step</th><th>tool</th><th>status</th><th>latency</th><th style=\"width:30%\"></th><th>arguments</th><th>observation / error</th></tr>",
        steps.len()
    );
    for (step, p) in steps {
        let status = status_name(p.status);
        let kind = if p.kind == StepKind::FinalAnswer as i32 { "final answer".to_string() } else { p.tool.clone() };
        let width = p.latency_micros as f64 / max as f64 * 100.0;
        let slow = if p.timeout_ms > 0 && p.latency_micros >= p.timeout_ms * 1000 { " slow" } else { "" };
        let detail = if p.error_type.is_empty() {
            format!("<code>{}</code>", esc(&p.observation_json))
        } else {
            format!(
                "<b>{}</b>: {}<br><code>{}</code>",
                esc(&p.error_type),
                esc(&p.error_message),
                esc(&p.observation_json)
            )
        };
        let _ = write!(
            h,
            "<tr><td>{step}</td><td>{}</td><td><span class=\"badge {status}\">{status}</span>{}</td><td>{:.1} ms</td><td><div class=\"bar{slow}\" style=\"width:{width:.1}%\"></div></td><td><code>{}</code></td><td>{detail}</td></tr>",
            esc(&kind),
            if p.fallback_used { " (fallback)" } else { "" },
            p.latency_micros as f64 / 1000.0,
            esc(&p.arguments_json),
        );
    }
    h.push_str("</table>");
}

fn memory(h: &mut String, records: &[Record]) {
    let deltas: Vec<(u32, &crate::pb::MemoryDelta)> = records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::MemoryDelta(d)) => Some((r.step, d)),
            _ => None,
        })
        .collect();
    let _ = write!(
        h,
        "<h2>Memory deltas ({})</h2><table><tr><th>step</th><th>key</th><th>before</th><th>after</th><th>source</th><th>origin</th></tr>",
        deltas.len()
    );
    for (step, d) in deltas {
        let show = |v: &Option<String>| {
            v.as_deref().map_or("<i>absent</i>".to_string(), |t| format!("<code>{}</code>", esc(t)))
        };
        let _ = write!(
            h,
            "<tr><td>{step}</td><td><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&d.key),
            show(&d.before_json),
            show(&d.after_json),
            esc(&source_name(d.source)),
            esc(&d.origin)
        );
    }
    h.push_str("</table>");
}

fn rewards(h: &mut String, records: &[Record]) {
    let signals: Vec<(u32, &crate::pb::RewardSignal)> = records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::RewardSignal(s)) => Some((r.step, s)),
            _ => None,
        })
        .collect();
    let _ = write!(
        h,
        "<h2>Rewards ({} signals)</h2><table><tr><th>step</th><th>components (score × weight)</th><th>weighted sum</th><th>weight changes</th></tr>",
        signals.len()
    );
    for (step, s) in signals {
        let parts: Vec<String> =
            s.components.iter().map(|c| format!("{} {:.4} × {:.3}", esc(&c.name), c.score, c.weight)).collect();
        let deltas: Vec<String> = s
            .weight_deltas
            .iter()
            .map(|d| {
                format!(
                    "{} {} → {} at training step {}",
                    esc(&d.component),
                    d.old_weight,
                    d.new_weight,
                    d.training_step
                )
            })
            .collect();
        let _ = write!(
            h,
            "<tr><td>{step}</td><td>{}</td><td>{:.4}</td><td>{}</td></tr>",
            parts.join("<br>"),
            s.weighted_sum,
            deltas.join("<br>")
        );
    }
    h.push_str("</table>");
}

fn errors(h: &mut String, records: &[Record]) {
    let errors: Vec<(u32, &crate::pb::ErrorContext)> = records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::ErrorContext(e)) => Some((r.step, e)),
            _ => None,
        })
        .collect();
    let _ = write!(h, "<h2>Errors ({})</h2>", errors.len());
    for (step, e) in errors {
        let _ = write!(h, "<details><summary>step {step}: <b>{}</b> {}</summary>", esc(&e.error_type), esc(&e.message));
        if !e.cause_chain.is_empty() {
            let causes: Vec<String> = e.cause_chain.iter().map(|c| esc(c)).collect();
            let _ = write!(h, "<p>caused by: {}</p>", causes.join(" ← "));
        }
        if !e.stack.is_empty() {
            let _ = write!(h, "<pre>{}</pre>", esc(&e.stack));
        }
        h.push_str("<table><tr><th>memory key</th><th>value</th></tr>");
        for (k, v) in &e.memory_snapshot_json {
            let _ = write!(h, "<tr><td>{}</td><td><code>{}</code></td></tr>", esc(k), esc(v));
        }
        h.push_str("</table><table><tr><th>tool</th><th>status</th><th>arguments</th><th>response</th></tr>");
        for p in &e.last_tool_payloads {
            let status = status_name(p.status);
            let _ = write!(
                h,
                "<tr><td>{}</td><td><span class=\"badge {status}\">{status}</span></td><td><code>{}</code></td><td><code>{}</code></td></tr>",
                esc(&p.tool),
                esc(&p.arguments_json),
                esc(&p.response_json)
            );
        }
        h.push_str("</table></details>");
    }
}

fn tokens(h: &mut String, records: &[Record]) {
    let all: Vec<(u32, &crate::pb::TokenLogit)> = records
        .iter()
        .filter_map(|r| match &r.body {
            Some(Body::TokenLogit(t)) => Some((r.step, t)),
            _ => None,
        })
        .collect();
    let _ = write!(h, "<h2>Generated tokens ({}) — colour by log-probability, hover for the top-k</h2>", all.len());
    let mut current = None;
    for (step, t) in all.iter().take(MAX_TOKENS_SHOWN) {
        if current != Some(*step) {
            if current.is_some() {
                h.push_str("</div>");
            }
            let _ = write!(h, "<div><b>step {step}</b> ");
            current = Some(*step);
        }
        // exp(logprob) as the token's green: confident tokens pale, unlikely ones red.
        let p = (t.logprob as f64).exp().clamp(0.0, 1.0);
        let (r, g) = ((255.0 * (1.0 - p)) as u8, (200.0 * p + 55.0) as u8);
        let alternatives: Vec<String> = t
            .top_tokens
            .iter()
            .zip(&t.top_logprobs)
            .zip(&t.top_ids)
            .map(|((tok, lp), id)| format!("{tok:?} ({id}) {lp:.3}"))
            .collect();
        let _ = write!(
            h,
            "<span class=\"tok\" style=\"background:rgba({r},{g},80,0.25)\" title=\"#{} logprob {:.3}&#10;{}\">{}</span>",
            t.position,
            t.logprob,
            esc(&alternatives.join("\n")).replace('\n', "&#10;"),
            esc(&t.token)
        );
    }
    if current.is_some() {
        h.push_str("</div>");
    }
    if all.len() > MAX_TOKENS_SHOWN {
        let _ = write!(h, "<p>{} more tokens not shown.</p>", all.len() - MAX_TOKENS_SHOWN);
    }
}
