//! Realistic generated episodes: the shape of a shipping-support agent's
//! trace (policy turns with top-k logits, tool calls, memory deltas, rewards,
//! an occasional timeout with its error context). Used by the golden files,
//! the benchmarks and `make demo`; deterministic for a given seed.

use std::io::{self, Write};

use serde_json::{Value, json};

use crate::canonical::{canonical_json, hash_json};
use crate::memory::{Memory, MemoryPatch};
use crate::pb::{
    EpisodeEnd, ErrorContext, Header, MemorySource, Outcome, PlanStep, PolicyTurn, Record, RewardComponent,
    RewardSignal, StepKind, StepStatus, TokenLogit, ToolPayload, WeightDelta, record::Body,
};
use crate::token_logit::{TokenText, TopK};
use crate::writer::TraceWriter;

/// How memory changes are recorded: the design's deltas, or (for comparison
/// only) a full snapshot of memory after every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryMode {
    Deltas,
    Snapshots,
}

#[derive(Debug, Clone)]
pub struct EpisodeShape {
    pub seed: u64,
    pub steps: u32,
    pub memory_keys: usize,
    pub tokens_per_step: u32,
    pub top_k: usize,
    pub memory_mode: MemoryMode,
}

impl Default for EpisodeShape {
    /// The benchmark's episode: 50 steps, 20 memory keys, 200 tokens x top-5 per step.
    fn default() -> Self {
        Self { seed: 1, steps: 50, memory_keys: 20, tokens_per_step: 200, top_k: 5, memory_mode: MemoryMode::Deltas }
    }
}

/// A generated episode: the header and, per step, its records (the last
/// record of the last step is the episode end).
#[derive(Debug, Clone)]
pub struct SyntheticEpisode {
    pub header: Header,
    pub steps: Vec<Vec<Record>>,
    pub end: EpisodeEnd,
}

impl SyntheticEpisode {
    pub fn record_count(&self) -> usize {
        1 + self.steps.iter().map(Vec::len).sum::<usize>() + 1
    }

    /// Writes the episode, closing a frame after every step.
    pub fn write_to<W: Write>(&self, out: W, zstd_level: i32) -> io::Result<W> {
        let mut writer = TraceWriter::new(out, self.header.clone(), zstd_level)?;
        for step in &self.steps {
            for record in step {
                writer.write_record(record)?;
            }
            writer.end_step()?;
        }
        writer.finish(self.end.clone())
    }
}

/// splitmix64: small, fast and good enough for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const WORDS: [&str; 24] = [
    " the",
    " order",
    " shipping",
    " status",
    " is",
    " delayed",
    " tracking",
    " number",
    " I",
    " will",
    " check",
    " your",
    " package",
    " carrier",
    " update",
    " sorry",
    " for",
    " the",
    " wait",
    ".",
    ",",
    " refund",
    " today",
    " call",
];
const TOOLS: [&str; 4] = ["tracking_api", "order_lookup", "refund_policy", "send_message"];

pub fn generate(shape: &EpisodeShape) -> SyntheticEpisode {
    let mut rng = Rng(shape.seed);
    let start = 1_764_460_800_000_000_000i64 + (shape.seed as i64 % 1000) * 1_000_000_000;
    let header = Header {
        namespace: "evals".into(),
        task: "shipping-delay".into(),
        variant: "a".into(),
        shard: 0,
        shard_count: 1,
        episode_id: format!("ep-{:04}", shape.seed),
        config_hash: hash_json(&json!({"synthetic": shape.seed})).0.to_vec(),
        producer_versions: [("basecamp-trace".to_string(), env!("CARGO_PKG_VERSION").to_string())].into(),
        start_time_unix_nanos: start,
        training_step: 1200,
        top_k: shape.top_k as u32,
        ..Default::default()
    };

    let mut memory = Memory::new();
    let initial: serde_json::Map<String, Value> = (0..shape.memory_keys)
        .map(|k| (memory_key(k), json!({"value": format!("initial value of key {k}"), "updated_at": 0})))
        .collect();
    let mut steps = Vec::with_capacity(shape.steps as usize);
    let mut position = 0u32;
    let mut last_payloads: Vec<ToolPayload> = Vec::new();
    let mut first = Vec::new();
    for delta in memory.apply(&MemoryPatch::from_object(&initial), MemorySource::Initial, "test_set") {
        first.push(Record { step: 0, body: Some(Body::MemoryDelta(delta.to_record())) });
    }
    steps.push(first);

    let mut t = start;
    let mut any_timeout = false;
    for step in 1..=shape.steps {
        let mut records = Vec::new();
        let mut push = |body| records.push(Record { step, body: Some(body) });
        let tool = TOOLS[rng.below(TOOLS.len() as u64) as usize];
        let args = json!({"order_id": format!("A-{}", 1000 + rng.below(50)), "verbose": rng.below(2) == 0});
        push(Body::PolicyTurn(PolicyTurn {
            model: "policy-under-test".into(),
            content: String::new(),
            tool_calls_json: json!([{"id": format!("call_{step}"), "type": "function",
                "function": {"name": tool, "arguments": canonical_json(&args)}}])
            .to_string(),
            finish_reason: "tool_calls".into(),
            latency_micros: 20_000 + rng.below(80_000),
            prompt_tokens: 500 + step * 40,
            completion_tokens: shape.tokens_per_step,
            logprobs_missing: false,
        }));
        for _ in 0..shape.tokens_per_step {
            push(Body::TokenLogit(token_logit(&mut rng, position, shape.top_k)));
            position += 1;
        }
        let timed_out = rng.below(10) == 0;
        any_timeout |= timed_out;
        let observation = if timed_out {
            json!({"status": null, "note": "fallback after timeout"})
        } else {
            json!({"status": "in_transit", "eta_days": rng.below(7), "carrier": "ACME"})
        };
        let before = memory.hash();
        let changed = 1 + rng.below(2) as usize;
        let mut patch = MemoryPatch::default();
        for _ in 0..changed {
            let k = rng.below(shape.memory_keys as u64) as usize;
            patch = patch
                .set(memory_key(k), json!({"value": format!("{tool} result {}", rng.below(1000)), "updated_at": step}));
        }
        let source = if timed_out { MemorySource::Fallback } else { MemorySource::Tool };
        let deltas = memory.apply(&patch, source, tool);
        let latency = if timed_out { 800_000 } else { 1_000 + rng.below(300_000) };
        let status = if timed_out { StepStatus::Fallback } else { StepStatus::Ok };
        push(Body::PlanStep(Box::new(PlanStep {
            index: step,
            kind: StepKind::ToolCall as i32,
            plan_label: format!("step-{}", step.div_ceil(2)),
            tool: tool.into(),
            call_id: format!("call_{step}"),
            arguments_json: canonical_json(&args),
            input_hash: hash_json(&args).0.to_vec(),
            observation_json: canonical_json(&observation),
            result_hash: hash_json(&observation).0.to_vec(),
            response_bytes: canonical_json(&observation).len() as u64,
            status: status as i32,
            error_type: if timed_out { "timeout".into() } else { String::new() },
            error_message: if timed_out { format!("{tool} exceeded 800ms") } else { String::new() },
            fallback_used: timed_out,
            memory_hash_before: before.0.to_vec(),
            memory_hash_after: memory.hash().0.to_vec(),
            start_unix_nanos: t,
            latency_micros: latency,
            timeout_ms: 800,
            refused_memory_json: Default::default(),
            retries: 0,
        })));
        t += latency as i64 * 1000 + 50_000_000;
        match shape.memory_mode {
            MemoryMode::Deltas => {
                for d in &deltas {
                    push(Body::MemoryDelta(d.to_record()));
                }
            }
            MemoryMode::Snapshots => push(Body::MemorySnapshot(memory.to_snapshot())),
        }
        last_payloads.push(ToolPayload {
            tool: tool.into(),
            arguments_json: canonical_json(&args),
            response_json: canonical_json(&observation),
            status: status as i32,
        });
        if last_payloads.len() > 3 {
            last_payloads.remove(0);
        }
        if timed_out {
            push(Body::ErrorContext(Box::new(ErrorContext {
                error_type: "timeout".into(),
                message: format!("tool {tool} timed out after 800ms; fallback observation used"),
                cause_chain: vec![format!("tool {tool} timed out"), "deadline of 800ms exceeded".into()],
                stack: String::new(),
                memory_snapshot_json: memory.entries().take(5).map(|(k, v)| (k.clone(), canonical_json(v))).collect(),
                last_tool_payloads: last_payloads.clone(),
                omitted_memory_keys: Vec::new(),
            })));
        }
        let accuracy = if timed_out { 0.0 } else { 1.0 };
        let efficiency = -0.01 * step as f64;
        let mut reward = RewardSignal {
            components: vec![
                RewardComponent { name: "tool_call_accuracy".into(), score: accuracy, weight: 0.6 },
                RewardComponent { name: "efficiency_penalty".into(), score: efficiency, weight: 0.3 },
                RewardComponent { name: "user_satisfaction".into(), score: rng.unit(), weight: 0.1 },
            ],
            weighted_sum: 0.0,
            weight_deltas: Vec::new(),
        };
        reward.weighted_sum = reward.components.iter().map(|c| c.score * c.weight).sum();
        if step == 1 {
            reward.weight_deltas.push(WeightDelta {
                component: "efficiency_penalty".into(),
                old_weight: 0.2,
                new_weight: 0.3,
                training_step: 1200,
            });
        }
        push(Body::RewardSignal(reward));
        steps.push(records);
    }
    let end = EpisodeEnd {
        outcome: Outcome::Completed as i32,
        end_time_unix_nanos: t,
        steps: shape.steps,
        final_memory_hash: memory.hash().0.to_vec(),
        final_answer: "Your order is delayed; the carrier expects delivery within 3 days.".into(),
        failure_class: if any_timeout { "timeout" } else { crate::metrics::NO_FAILURE }.into(),
    };
    SyntheticEpisode { header, steps, end }
}

fn memory_key(k: usize) -> String {
    const NAMES: [&str; 6] = ["shipping_status", "order_id", "customer_tier", "eta", "carrier", "refund_state"];
    match NAMES.get(k) {
        Some(name) => (*name).to_string(),
        None => format!("context_{k}"),
    }
}

fn token_logit(rng: &mut Rng, position: u32, top_k: usize) -> TokenLogit {
    let mut top_ids = TopK::with_capacity(top_k);
    let mut top_tokens = TopK::with_capacity(top_k);
    let mut top_logprobs = TopK::with_capacity(top_k);
    let mut lp = -(rng.unit() as f32) * 0.5;
    for _ in 0..top_k {
        let w = rng.below(WORDS.len() as u64) as usize;
        top_ids.push(1000 + w as i32 * 37 + rng.below(3) as i32);
        top_tokens.push(TokenText::new(WORDS[w]));
        top_logprobs.push(lp);
        lp -= 0.5 + rng.unit() as f32 * 3.0;
    }
    TokenLogit {
        position,
        token_id: top_ids.first().copied().unwrap_or(-1),
        token: top_tokens.first().cloned().unwrap_or_default(),
        logprob: top_logprobs.first().copied().unwrap_or(0.0),
        top_ids,
        top_tokens,
        top_logprobs,
        entropy: None,
        kl: None,
    }
}
