//! The sandbox's Prometheus metrics, served on `/metrics` by [`crate::server`].
//!
//! One [`SandboxMetrics`] per process owns a `prometheus-client` registry.
//! Whoever runs episodes feeds it: [`SandboxMetrics::observe_call`] for every
//! executor outcome, [`SandboxMetrics::observe_rolled_back_call`] for every
//! call the plan-step deadline cut off (it has no outcome),
//! [`SandboxMetrics::observe_episode`] for every finished
//! episode, [`SandboxMetrics::observe_injection`] when an injection is
//! delivered into an episode (scheduled or live) and
//! [`SandboxMetrics::observe_policy_error`] for a failed policy turn, and
//! [`SandboxMetrics::observe_rate_limits`] with the policy's 429s so far.
//!
//! Every label is bounded. Statuses, outcomes and triggers come from fixed
//! sets; tool names come from the sandbox config, but a policy can ask for
//! any name, so calls to tools the executor does not define are labelled
//! `unknown`, and past [`MAX_TOOL_LABELS`] distinct names further tools are
//! labelled `other`. Names follow the Prometheus conventions
//! (`basecamp_sandbox_` prefix, base units, `_total` on counters) and pass
//! `promtool check metrics`.
//!
//! A sandbox pod is a short-lived scrape target: a shard may end before
//! Prometheus scraped it twice, and a counter Prometheus saw once, already
//! at its final value, gives `rate()` and `increase()` nothing. So every
//! series a run can count is there from the start at zero
//! ([`SandboxMetrics::declare_tools`]: each tool with every status, each
//! outcome, each trigger; [`SandboxMetrics::declare_policy_errors`]: each
//! category of error the policy's turns can end in), and [`Scrapes`] tells the run when Prometheus
//! has seen it: [`Scrapes::first_served`] once any `/metrics` answer was
//! served (`basecamp-sandbox run --metrics-linger` waits for it before the
//! first episode, so the zeros are scraped), and [`Scrapes::final_served`]
//! once an answer that began after the run declared its values final
//! ([`Scrapes::mark_final`]) was served (it waits for that before exiting,
//! instead of losing what changed since the last scrape).

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use basecamp_trace::pb::{InjectionTrigger, StepStatus};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::episode::EpisodeResult;
use crate::executor::{CallError, CallOutcome};
use crate::policy::throttle::RateLimits;

/// The prefix of every metric name.
pub const METRIC_PREFIX: &str = "basecamp_sandbox";

/// The most distinct `tool` label values; further tools share `other`.
pub const MAX_TOOL_LABELS: usize = 256;

/// The most distinct policy-error `category` values; further ones share `other`.
pub const MAX_POLICY_ERROR_CATEGORIES: usize = 64;

/// The label for calls to a tool the sandbox does not define.
pub const UNKNOWN_TOOL_LABEL: &str = "unknown";

/// The label shared by tools (or categories) past the cardinality cap.
pub const OVERFLOW_LABEL: &str = "other";

/// Tool-call latency buckets in seconds: 1 ms to 30 s, roughly 1-2.5-5 per decade.
pub const LATENCY_BUCKETS_SECONDS: [f64; 15] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0];

/// The statuses a tool call ends in, each a series of every declared tool.
pub const CALL_STATUSES: [StepStatus; 6] = [
    StepStatus::Ok,
    StepStatus::Error,
    StepStatus::Timeout,
    StepStatus::Fallback,
    StepStatus::RolledBack,
    StepStatus::Refused,
];

/// The episode outcomes counted, each a series from the start.
pub const EPISODE_OUTCOMES: [&str; 4] = ["completed", "max_steps", "error", "cancelled"];

/// The injection triggers counted, each a series from the start.
pub const INJECTION_TRIGGERS: [InjectionTrigger; 4] =
    [InjectionTrigger::AtStep, InjectionTrigger::AfterTool, InjectionTrigger::MemoryMatch, InjectionTrigger::Live];

/// `application/openmetrics-text`, what [`SandboxMetrics::encode`] writes.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `text/plain; version=0.0.4`, what [`SandboxMetrics::encode_prometheus_text`] writes.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ToolStatusLabels {
    tool: String,
    status: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TriggerLabels {
    trigger: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CategoryLabels {
    category: &'static str,
}

/// The sandbox's metrics and the registry they are encoded from. Share it
/// behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct SandboxMetrics {
    registry: Registry,
    tool_call_duration: Family<ToolLabels, Histogram, fn() -> Histogram>,
    tool_calls: Family<ToolStatusLabels, Counter>,
    tool_timeouts: Family<ToolLabels, Counter>,
    tool_fallbacks: Family<ToolLabels, Counter>,
    rollbacks: Counter,
    injections: Family<TriggerLabels, Counter>,
    episodes: Family<OutcomeLabels, Counter>,
    policy_errors: Family<CategoryLabels, Counter>,
    waiting_for_policy: Gauge,
    policy_rate_limited: Counter,
    policy_requests_at_once_limit: Gauge,
    tool_labels: Mutex<HashSet<String>>,
    policy_error_categories: Mutex<HashSet<&'static str>>,
    scrapes: Scrapes,
}

impl Default for SandboxMetrics {
    fn default() -> Self {
        Self::new()
    }
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_SECONDS)
}

impl SandboxMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(METRIC_PREFIX);
        let tool_call_duration = Family::<ToolLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "tool_call_duration",
            "Latency of tool calls through the executor, fallbacks included, by tool",
            Unit::Seconds,
            tool_call_duration.clone(),
        );
        let tool_calls = Family::default();
        registry.register("tool_calls", "Tool calls by tool and step status", tool_calls.clone());
        let tool_timeouts = Family::default();
        registry.register("tool_timeouts", "Tool calls that hit their tool timeout, by tool", tool_timeouts.clone());
        let tool_fallbacks = Family::default();
        registry.register(
            "tool_fallbacks",
            "Tool calls answered by the tool's fallback observation, by tool",
            tool_fallbacks.clone(),
        );
        let rollbacks = Counter::default();
        registry.register(
            "rollbacks",
            "Plan steps whose memory was rolled back to the last stable checkpoint",
            rollbacks.clone(),
        );
        let injections = Family::default();
        registry.register("injections", "Observation injections by trigger", injections.clone());
        let episodes = Family::default();
        registry.register("episodes", "Finished episodes by outcome", episodes.clone());
        let policy_errors = Family::default();
        registry.register("policy_errors", "Failed policy turns by error category", policy_errors.clone());
        let waiting_for_policy = Gauge::default();
        registry.register(
            "waiting_for_policy",
            "1 while the shard waits for its policy to answer again after episode after episode failed on it \
             (an outage), starting no episode; else 0",
            waiting_for_policy.clone(),
        );
        let policy_rate_limited = Counter::default();
        registry.register(
            "policy_rate_limited",
            "Answers 429 (too many requests) of the policy's endpoint, retried or not",
            policy_rate_limited.clone(),
        );
        let policy_requests_at_once_limit = Gauge::default();
        registry.register(
            "policy_requests_at_once_limit",
            "The most requests the shard sends its policy's endpoint at once since it answered 429 (halved at a \
             429, raised by one as it answers without; no episode starts while a request waits); 0 while it \
             never did",
            policy_requests_at_once_limit.clone(),
        );
        // Fixed label sets exist from the start at zero (see declare_tools).
        for outcome in EPISODE_OUTCOMES {
            let _ = episodes.get_or_create(&OutcomeLabels { outcome });
        }
        for trigger in INJECTION_TRIGGERS {
            let _ = injections.get_or_create(&TriggerLabels { trigger: trigger_label(trigger) });
        }
        Self {
            registry,
            tool_call_duration,
            tool_calls,
            tool_timeouts,
            tool_fallbacks,
            rollbacks,
            injections,
            episodes,
            policy_errors,
            waiting_for_policy,
            policy_rate_limited,
            policy_requests_at_once_limit,
            tool_labels: Mutex::new(HashSet::new()),
            policy_error_categories: Mutex::new(HashSet::new()),
            scrapes: Scrapes::default(),
        }
    }

    /// Which scrapes were served: the first, and one of the final values;
    /// the `/metrics` handler reports every scrape to it.
    pub fn scrapes(&self) -> &Scrapes {
        &self.scrapes
    }

    /// Creates, at zero, every series a run with these tools can count:
    /// each tool (and [`UNKNOWN_TOOL_LABEL`]) with every status a call can
    /// end in, its latency histogram, timeouts and fallbacks. A series that
    /// appears only at its first count has no zero sample before it, so
    /// `rate()` misses that count, and all of a pod scraped only once.
    pub fn declare_tools<'a>(&self, tools: impl IntoIterator<Item = &'a str>) {
        let labels = tools.into_iter().map(|name| self.tool_label(name)).chain([UNKNOWN_TOOL_LABEL.to_string()]);
        for tool in labels {
            for status in CALL_STATUSES {
                let _ = self
                    .tool_calls
                    .get_or_create(&ToolStatusLabels { tool: tool.clone(), status: status_label(status) });
            }
            let labels = ToolLabels { tool };
            let _ = self.tool_call_duration.get_or_create(&labels);
            let _ = self.tool_timeouts.get_or_create(&labels);
            let _ = self.tool_fallbacks.get_or_create(&labels);
        }
    }

    /// Creates, at zero, the `policy_errors_total` series of these
    /// categories ([`crate::policy::Policy::turn_error_categories`]), for
    /// the same reason as [`SandboxMetrics::declare_tools`].
    pub fn declare_policy_errors(&self, categories: &[&'static str]) {
        let mut seen = self.policy_error_categories.lock().unwrap_or_else(|p| p.into_inner());
        for &category in categories {
            if seen.len() < MAX_POLICY_ERROR_CATEGORIES || seen.contains(category) {
                seen.insert(category);
                let _ = self.policy_errors.get_or_create(&CategoryLabels { category });
            }
        }
    }

    /// Records one executor outcome: latency, status, timeout, fallback.
    pub fn observe_call(&self, call: &CallOutcome) {
        let tool = match &call.error {
            Some(CallError::UnknownTool { .. }) => UNKNOWN_TOOL_LABEL.to_string(),
            _ => self.tool_label(&call.plan_step.tool),
        };
        let labels = self.observe_ended(tool, call.plan_step.latency_micros as f64 / 1e6, call.status);
        if call.timed_out() {
            self.tool_timeouts.get_or_create(&labels).inc();
        }
        if call.plan_step.fallback_used {
            self.tool_fallbacks.get_or_create(&labels).inc();
        }
    }

    /// Records a call the plan-step deadline cut off (status `rolled_back`),
    /// which ends without a [`CallOutcome`]: `latency` is how long it ran.
    /// Only a tool the executor defines can be cut off (an unknown tool is
    /// refused without waiting), so `tool` is labelled by its name.
    pub fn observe_rolled_back_call(&self, tool: &str, latency: Duration) {
        self.observe_ended(self.tool_label(tool), latency.as_secs_f64(), StepStatus::RolledBack);
    }

    /// The series every call ends in, whatever ended it: its duration and
    /// its status. Returns the tool's labels for the others.
    fn observe_ended(&self, tool: String, seconds: f64, status: StepStatus) -> ToolLabels {
        let labels = ToolLabels { tool };
        self.tool_call_duration.get_or_create(&labels).observe(seconds);
        self.tool_calls
            .get_or_create(&ToolStatusLabels { tool: labels.tool.clone(), status: status_label(status) })
            .inc();
        labels
    }

    /// Records a finished episode: its outcome and its rollbacks.
    pub fn observe_episode(&self, episode: &EpisodeResult) {
        self.episodes.get_or_create(&OutcomeLabels { outcome: outcome_label(&episode.outcome) }).inc();
        self.rollbacks.inc_by(u64::from(episode.rollbacks));
    }

    /// Says whether the shard is waiting for its policy after an outage.
    pub fn set_waiting_for_policy(&self, waiting: bool) {
        self.waiting_for_policy.set(i64::from(waiting));
    }

    /// Brings the policy's 429 count and its requests-at-once limit up to
    /// what its throttle says now.
    pub fn observe_rate_limits(&self, rate_limits: &RateLimits) {
        let counted = self.policy_rate_limited.get();
        self.policy_rate_limited.inc_by(rate_limits.answers_429.saturating_sub(counted));
        let limit = i64::try_from(rate_limits.requests_at_once_at_end).unwrap_or(i64::MAX);
        self.policy_requests_at_once_limit.set(limit);
    }

    /// Records one injection delivered into an episode.
    pub fn observe_injection(&self, trigger: InjectionTrigger) {
        self.injections.get_or_create(&TriggerLabels { trigger: trigger_label(trigger) }).inc();
    }

    /// Records a failed policy turn by its bounded category
    /// (`PolicyError::category()`, e.g. `PolicyTimeout`).
    pub fn observe_policy_error(&self, category: &'static str) {
        let category = {
            let mut seen = self.policy_error_categories.lock().unwrap_or_else(|p| p.into_inner());
            if seen.contains(category) || seen.len() < MAX_POLICY_ERROR_CATEGORIES {
                seen.insert(category);
                category
            } else {
                OVERFLOW_LABEL
            }
        };
        self.policy_errors.get_or_create(&CategoryLabels { category }).inc();
    }

    /// The registry in the OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing metrics into a String cannot fail");
        out
    }

    /// The registry in the Prometheus text format 0.0.4, for scrapers (and
    /// `promtool check metrics`) that do not ask for OpenMetrics.
    pub fn encode_prometheus_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("writing metrics into a String cannot fail");
        out
    }

    /// The `tool` label for `name`: itself while fewer than
    /// [`MAX_TOOL_LABELS`] names are in use, else [`OVERFLOW_LABEL`].
    fn tool_label(&self, name: &str) -> String {
        let mut seen = self.tool_labels.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(name) {
            return name.to_string();
        }
        if seen.len() < MAX_TOOL_LABELS {
            seen.insert(name.to_string());
            return name.to_string();
        }
        OVERFLOW_LABEL.to_string()
    }
}

/// Which `/metrics` answers were served: any at all, and one that saw the
/// final values.
///
/// A scrape counts as final only when it *began* after
/// [`Scrapes::mark_final`]: one that was already encoding when the last
/// episode or upload was recorded may hold older values, however late it is
/// answered. The handler takes a [`ScrapeStart`] before it encodes and
/// hands it back with [`Scrapes::served`] once the answer is built.
#[derive(Debug)]
pub struct Scrapes {
    values_final: AtomicBool,
    /// Any answer served.
    first: tokio::sync::watch::Sender<bool>,
    /// An answer that began after the final update served.
    last: tokio::sync::watch::Sender<bool>,
}

impl Default for Scrapes {
    fn default() -> Self {
        Self {
            values_final: AtomicBool::new(false),
            first: tokio::sync::watch::channel(false).0,
            last: tokio::sync::watch::channel(false).0,
        }
    }
}

/// Taken when a scrape begins: whether the values were final by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "hand it back to Scrapes::served once the answer is built"]
pub struct ScrapeStart {
    after_final: bool,
}

impl Scrapes {
    /// Declares the values final: nothing updates them after this call.
    /// Every update made before it is visible to a scrape that begins after
    /// it (the store releases them; [`Scrapes::begin`] acquires).
    pub fn mark_final(&self) {
        self.values_final.store(true, Ordering::Release);
    }

    /// Whether [`Scrapes::mark_final`] was called.
    pub fn is_final(&self) -> bool {
        self.values_final.load(Ordering::Acquire)
    }

    /// A scrape begins; call before reading any value.
    pub fn begin(&self) -> ScrapeStart {
        ScrapeStart { after_final: self.is_final() }
    }

    /// A scrape that began at `start` has its answer.
    pub fn served(&self, start: ScrapeStart) {
        self.first.send_if_modified(|served| !std::mem::replace(served, true));
        if start.after_final {
            self.last.send_if_modified(|served| !std::mem::replace(served, true));
        }
    }

    /// Whether any scrape was served.
    pub fn was_first_served(&self) -> bool {
        *self.first.borrow()
    }

    /// Whether a scrape that began after [`Scrapes::mark_final`] was served.
    pub fn was_final_served(&self) -> bool {
        *self.last.borrow()
    }

    /// Completes once any scrape was served (at once if one already was).
    pub async fn first_served(&self) {
        Self::wait(&self.first).await
    }

    /// Completes once a scrape that began after [`Scrapes::mark_final`]
    /// was served (at once if one already was).
    pub async fn final_served(&self) {
        Self::wait(&self.last).await
    }

    async fn wait(flag: &tokio::sync::watch::Sender<bool>) {
        let mut served = flag.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = served.wait_for(|served| *served).await;
    }
}

/// The `status` label: the trace's step status in snake case.
pub fn status_label(status: StepStatus) -> &'static str {
    match status {
        StepStatus::Unspecified => "unspecified",
        StepStatus::Ok => "ok",
        StepStatus::Error => "error",
        StepStatus::Timeout => "timeout",
        StepStatus::Fallback => "fallback",
        StepStatus::RolledBack => "rolled_back",
        StepStatus::Refused => "refused",
    }
}

/// The `trigger` label: the trace's injection trigger in snake case.
pub fn trigger_label(trigger: InjectionTrigger) -> &'static str {
    match trigger {
        InjectionTrigger::Unspecified => "unspecified",
        InjectionTrigger::AtStep => "at_step",
        InjectionTrigger::AfterTool => "after_tool",
        InjectionTrigger::MemoryMatch => "memory_match",
        InjectionTrigger::Live => "live",
    }
}

/// The `outcome` label: the episode's outcome name, or `other` for a name
/// outside the fixed set.
pub fn outcome_label(outcome: &str) -> &'static str {
    match outcome {
        "completed" => "completed",
        "max_steps" => "max_steps",
        "error" => "error",
        "cancelled" => "cancelled",
        "unspecified" => "unspecified",
        _ => OVERFLOW_LABEL,
    }
}

#[cfg(test)]
mod tests {
    use basecamp_trace::pb;

    use super::*;

    fn outcome(tool: &str, status: StepStatus) -> CallOutcome {
        CallOutcome {
            observation: serde_json::Value::Null,
            status,
            error: None,
            deltas: Vec::new(),
            warnings: Vec::new(),
            plan_step: pb::PlanStep {
                tool: tool.into(),
                status: status as i32,
                latency_micros: 1500,
                ..Default::default()
            },
        }
    }

    #[test]
    fn tool_labels_are_capped_and_later_tools_share_other() {
        let metrics = SandboxMetrics::new();
        for i in 0..MAX_TOOL_LABELS + 10 {
            metrics.observe_call(&outcome(&format!("tool_{i}"), StepStatus::Ok));
        }
        // A tool seen before the cap keeps its own label after it.
        metrics.observe_call(&outcome("tool_0", StepStatus::Ok));
        let text = metrics.encode();
        let tools: HashSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("basecamp_sandbox_tool_calls_total{"))
            .filter_map(|l| l.split("tool=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(tools.len(), MAX_TOOL_LABELS + 1);
        assert!(tools.contains(OVERFLOW_LABEL));
        assert!(text.contains(r#"basecamp_sandbox_tool_calls_total{tool="other",status="ok"} 10"#), "{text}");
        assert!(text.contains(r#"basecamp_sandbox_tool_calls_total{tool="tool_0",status="ok"} 2"#));
    }

    #[test]
    fn calls_to_undefined_tools_are_labelled_unknown() {
        let metrics = SandboxMetrics::new();
        let mut call = outcome("made_up_by_the_model", StepStatus::Refused);
        call.error = Some(CallError::UnknownTool { tool: "made_up_by_the_model".into(), available: "tracking".into() });
        metrics.observe_call(&call);
        let text = metrics.encode();
        assert!(text.contains(r#"basecamp_sandbox_tool_calls_total{tool="unknown",status="refused"} 1"#), "{text}");
        assert!(!text.contains("made_up_by_the_model"));
    }

    #[test]
    fn policy_error_categories_are_capped() {
        let metrics = SandboxMetrics::new();
        let names: Vec<&'static str> =
            (0..MAX_POLICY_ERROR_CATEGORIES + 3).map(|i| &*format!("Category{i}").leak()).collect();
        for name in &names {
            metrics.observe_policy_error(name);
        }
        let text = metrics.encode();
        assert!(text.contains(r#"basecamp_sandbox_policy_errors_total{category="other"} 3"#), "{text}");
    }

    #[tokio::test]
    async fn only_a_scrape_that_began_after_the_final_update_counts_as_final() {
        let metrics = SandboxMetrics::new();
        let last_episode = metrics.scrapes();
        let first = tokio::time::timeout(std::time::Duration::from_millis(50), last_episode.first_served()).await;
        assert!(first.is_err() && !last_episode.was_first_served(), "nothing was scraped yet");
        // A scrape that begins before the final update and is answered after it.
        let early = last_episode.begin();
        metrics.rollbacks.inc();
        last_episode.mark_final();
        last_episode.served(early);
        assert!(last_episode.was_first_served());
        tokio::time::timeout(std::time::Duration::from_secs(5), last_episode.first_served())
            .await
            .expect("first_served() completes once any scrape was served");
        assert!(!last_episode.was_final_served(), "a scrape that began before the final update saw older values");
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), last_episode.final_served()).await;
        assert!(waiting.is_err(), "final_served() must not complete for the early scrape");

        let late = last_episode.begin();
        assert!(metrics.encode().contains("basecamp_sandbox_rollbacks_total 1"));
        last_episode.served(late);
        assert!(last_episode.was_final_served());
        tokio::time::timeout(std::time::Duration::from_secs(5), last_episode.final_served())
            .await
            .expect("final_served() completes once a scrape that began after the final update was served");
    }

    /// The series a short pod's one scrape must already hold at zero, so
    /// that its final scrape gives `rate()` an increase.
    #[test]
    fn every_series_a_run_can_count_is_there_at_zero_before_its_first_count() {
        let metrics = SandboxMetrics::new();
        metrics.declare_tools(["track_order", "refund"]);
        let text = metrics.encode();
        for tool in ["track_order", "refund", UNKNOWN_TOOL_LABEL] {
            for status in CALL_STATUSES {
                let status = status_label(status);
                let line = format!("basecamp_sandbox_tool_calls_total{{tool=\"{tool}\",status=\"{status}\"}} 0\n");
                assert!(text.contains(&line), "{line} missing in\n{text}");
            }
            for family in ["tool_timeouts_total", "tool_fallbacks_total", "tool_call_duration_seconds_count"] {
                let line = format!("basecamp_sandbox_{family}{{tool=\"{tool}\"}} 0\n");
                assert!(text.contains(&line), "{line} missing in\n{text}");
            }
        }
        for outcome in EPISODE_OUTCOMES {
            assert!(text.contains(&format!("basecamp_sandbox_episodes_total{{outcome=\"{outcome}\"}} 0\n")), "{text}");
        }
        for trigger in INJECTION_TRIGGERS {
            let trigger = trigger_label(trigger);
            assert!(
                text.contains(&format!("basecamp_sandbox_injections_total{{trigger=\"{trigger}\"}} 0\n")),
                "{text}"
            );
        }
        assert!(text.contains("basecamp_sandbox_rollbacks_total 0\n"), "{text}");
        metrics.declare_policy_errors(crate::policy::openai::TURN_ERROR_CATEGORIES);
        let text = metrics.encode();
        for category in crate::policy::openai::TURN_ERROR_CATEGORIES {
            let line = format!("basecamp_sandbox_policy_errors_total{{category=\"{category}\"}} 0\n");
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        // Declared tools take their labels first, so a declared tool is never `other`.
        metrics.observe_call(&outcome("refund", StepStatus::Timeout));
        assert!(metrics.encode().contains(r#"basecamp_sandbox_tool_calls_total{tool="refund",status="timeout"} 1"#));
    }

    #[test]
    fn unknown_outcomes_are_other() {
        assert_eq!(outcome_label("completed"), "completed");
        assert_eq!(outcome_label("exploded"), "other");
    }
}
