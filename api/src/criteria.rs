//! Success criteria: `metric OP value[unit]`, e.g.
//! `tool_call_accuracy >= 0.9`, `user_satisfaction_score > 0.85`,
//! `avg_resolution_time < 90s`, `error_rate <= 5%`.
//!
//! OP is one of `<`, `<=`, `>`, `>=`, `==`, `!=`. A value is a number, a
//! percentage (`5%` is 0.05) or a duration (`ms`, `s`, `m`, `h`), which is
//! compared in seconds — the unit every time metric is reported in. A
//! criterion that does not parse is reported with a caret under the column
//! where parsing stopped.

use std::fmt;
use std::str::FromStr;

use crate::duration::Duration;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Comparison {
    /// `<`
    Less,
    /// `<=`
    LessOrEqual,
    /// `>`
    Greater,
    /// `>=`
    GreaterOrEqual,
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
}

impl Comparison {
    /// The operator as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Comparison::Less => "<",
            Comparison::LessOrEqual => "<=",
            Comparison::Greater => ">",
            Comparison::GreaterOrEqual => ">=",
            Comparison::Equal => "==",
            Comparison::NotEqual => "!=",
        }
    }

    /// `observed OP threshold`.
    pub fn holds(self, observed: f64, threshold: f64) -> bool {
        match self {
            Comparison::Less => observed < threshold,
            Comparison::LessOrEqual => observed <= threshold,
            Comparison::Greater => observed > threshold,
            Comparison::GreaterOrEqual => observed >= threshold,
            Comparison::Equal => observed == threshold,
            Comparison::NotEqual => observed != threshold,
        }
    }
}

/// The right-hand side of a criterion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// A plain number (a percentage is stored divided by 100).
    Number(f64),
    /// A duration, compared in seconds.
    Duration(Duration),
}

impl Threshold {
    /// The value the metric is compared with (durations in seconds).
    pub fn value(self) -> f64 {
        match self {
            Threshold::Number(n) => n,
            Threshold::Duration(d) => d.as_secs_f64(),
        }
    }
}

/// A parsed success criterion.
#[derive(Debug, Clone, PartialEq)]
pub struct Criterion {
    /// The metric name, e.g. `tool_call_accuracy`.
    pub metric: String,
    /// The comparison.
    pub op: Comparison,
    /// The threshold.
    pub threshold: Threshold,
    /// The criterion as written (trimmed).
    pub text: String,
}

impl Criterion {
    /// Whether an observed metric value meets the criterion. NaN never does.
    pub fn is_met_by(&self, observed: f64) -> bool {
        !observed.is_nan() && self.op.holds(observed, self.threshold.value())
    }
}

/// What values a metric a run reports takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A share between 0 and 1 (`tool_call_accuracy`, `error_rate`).
    Ratio,
    /// A time in seconds (`avg_resolution_time`).
    Seconds,
    /// A count (`episodes`).
    Count,
    /// Any number (`reward`).
    Number,
}

/// The metrics a criterion can name: what `basecamp run` and the operator
/// report for a variant (their means, also with an `avg_` or `mean_`
/// prefix, and the aliases either one reads). A criterion on any other name
/// is never measured, so it is never met.
pub const CRITERION_METRICS: &[(&str, MetricKind)] = &[
    ("tool_call_accuracy", MetricKind::Ratio),
    ("tool_call_accuracy_lenient", MetricKind::Ratio),
    ("plan_step_f1", MetricKind::Ratio),
    ("memory_consistency", MetricKind::Ratio),
    ("error_rate", MetricKind::Ratio),
    ("success_rate", MetricKind::Ratio),
    ("completion_rate", MetricKind::Ratio),
    ("reward", MetricKind::Number),
    ("logit_divergence", MetricKind::Number),
    ("episodes", MetricKind::Count),
    ("lost_episodes", MetricKind::Count),
    ("not_measured_episodes", MetricKind::Count),
    ("not_measured_rate", MetricKind::Ratio),
    ("resolution_time", MetricKind::Seconds),
    ("resolution_time_s", MetricKind::Seconds),
    ("resolution_time_avg", MetricKind::Seconds),
    ("resolution_time_p50", MetricKind::Seconds),
    ("resolution_time_p95", MetricKind::Seconds),
    ("resolution_time_p50_s", MetricKind::Seconds),
    ("resolution_time_p95_s", MetricKind::Seconds),
    ("p50_resolution_time", MetricKind::Seconds),
    ("p95_resolution_time", MetricKind::Seconds),
];

/// The metrics that count the episodes the policy's server or a sandbox
/// service failed (`not_measured_episodes`, and `not_measured_rate`, their
/// share of every episode run).
///
/// Such episodes fail a run however few (`basecamp run` exits 3, the task
/// is `Failed`) unless a success criterion names one of these metrics:
/// those criteria are then the tolerance, e.g. `not_measured_rate <= 1%`
/// lets a 1,000-episode run against a hosted API lose ten episodes to its
/// rate limit and still be judged on the other 990.
pub const NOT_MEASURED_METRICS: [&str; 2] = ["not_measured_episodes", "not_measured_rate"];

/// Whether a variant's episodes that measured the infrastructure, not the
/// agent, are within the tolerance its success criteria set, given each
/// criterion's metric and whether it was met: false when no criterion
/// names one of [`NOT_MEASURED_METRICS`] (no tolerance: any such episode
/// fails the run), else whether every criterion that does was met.
pub fn not_measured_tolerated<'a>(criteria: impl IntoIterator<Item = (&'a str, bool)>) -> bool {
    let mut named = false;
    for (metric, met) in criteria {
        if NOT_MEASURED_METRICS.contains(&metric) {
            if !met {
                return false;
            }
            named = true;
        }
    }
    named
}

/// The kind of a metric a run reports, `None` for a name no run reports.
pub fn metric_kind(metric: &str) -> Option<MetricKind> {
    let find = |name: &str| CRITERION_METRICS.iter().find(|(m, _)| *m == name).map(|(_, kind)| *kind);
    find(metric).or_else(|| find(metric.strip_prefix("avg_").or_else(|| metric.strip_prefix("mean_"))?))
}

impl Criterion {
    /// Why this criterion can never be met however the run goes (a metric
    /// no run reports, a share compared with a value outside 0..1, a
    /// duration for a metric that is not a time), or `None`.
    pub fn never_met_because(&self) -> Option<String> {
        let Some(kind) = metric_kind(&self.metric) else {
            return Some(format!("{:?} is not a metric any run reports, so the criterion is never met", self.metric));
        };
        if matches!(self.threshold, Threshold::Duration(_)) && kind != MetricKind::Seconds {
            return Some(format!(
                "{} is not a time but the threshold is a duration, so the criterion is never met as meant; write a plain number (e.g. 0.9) or a percentage",
                self.metric
            ));
        }
        if kind == MetricKind::Ratio {
            let t = self.threshold.value();
            let possible = match self.op {
                Comparison::Greater => t < 1.0,
                Comparison::GreaterOrEqual => t <= 1.0,
                Comparison::Less => t > 0.0,
                Comparison::LessOrEqual => t >= 0.0,
                Comparison::Equal => (0.0..=1.0).contains(&t),
                Comparison::NotEqual => true,
            };
            if !possible {
                return Some(format!(
                    "{} is a share between 0 and 1 (write 90% or 0.9), so `{} {t}` never holds",
                    self.metric,
                    self.op.as_str()
                ));
            }
        }
        None
    }
}

impl Criterion {
    /// Why a criterion on a count (`episodes`, `lost_episodes`,
    /// `not_measured_episodes`) compared with a fraction between 0 and 1
    /// (`not_measured_episodes <= 1%`) is most likely not what was meant:
    /// a count is a whole number, so it reads as a bound of 0 or 1
    /// episodes, not as a share. `None` for every other criterion.
    pub fn count_against_a_fraction(&self) -> Option<String> {
        let t = self.threshold.value();
        let fraction = matches!(self.threshold, Threshold::Number(_)) && t > 0.0 && t < 1.0;
        if !fraction || metric_kind(&self.metric) != Some(MetricKind::Count) {
            return None;
        }
        let share = if NOT_MEASURED_METRICS[0] == self.metric {
            format!("; for a share of the episodes write `{} {} {t}`", NOT_MEASURED_METRICS[1], self.op.as_str())
        } else {
            String::new()
        };
        Some(format!(
            "{} counts episodes, a whole number, but {t} is a fraction: the criterion bounds the count, not a share{share}",
            self.metric
        ))
    }
}

impl fmt::Display for Criterion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A criterion that does not parse, with the 1-based column where parsing
/// stopped. Its `Display` is two lines plus a caret line:
///
/// ```text
/// success criterion "tool_call_accuracy >= ninety" does not parse at column 23: expected a number ...
///   tool_call_accuracy >= ninety
///                         ^
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "success criterion {criterion:?} does not parse at column {column}: {expected}; \
     write `metric OP value`, e.g. `tool_call_accuracy >= 0.9` or `avg_resolution_time < 90s`\n  {criterion}\n  {caret}^",
    caret = " ".repeat(column.saturating_sub(1))
)]
pub struct CriterionError {
    /// The criterion as written.
    pub criterion: String,
    /// 1-based column (in characters) where parsing stopped.
    pub column: usize,
    /// What was expected there.
    pub expected: String,
}

impl CriterionError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        "InvalidCriterion"
    }
}

impl FromStr for Criterion {
    type Err = CriterionError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        Parser { chars: input.chars().collect(), pos: 0, input }.criterion()
    }
}

/// Parses a criterion; the same as `text.parse::<Criterion>()`.
pub fn parse_criterion(text: &str) -> Result<Criterion, CriterionError> {
    text.parse()
}

struct Parser<'a> {
    chars: Vec<char>,
    pos: usize,
    input: &'a str,
}

impl Parser<'_> {
    fn error(&self, expected: impl Into<String>) -> CriterionError {
        CriterionError { criterion: self.input.to_string(), column: self.pos + 1, expected: expected.into() }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let start = self.pos;
        while self.peek().is_some_and(&f) {
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }

    fn criterion(mut self) -> Result<Criterion, CriterionError> {
        self.skip_spaces();
        if !self.peek().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') {
            return Err(self.error("expected a metric name (letters, digits, '_' and '.')"));
        }
        let metric = self.take_while(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        self.skip_spaces();
        let op = self.comparison()?;
        self.skip_spaces();
        let threshold = self.threshold()?;
        self.skip_spaces();
        if self.peek().is_some_and(|c| c.is_ascii_alphabetic()) && matches!(threshold, Threshold::Number(_)) {
            return Err(self.error(
                "a unit must follow the number without a space (90s, 800ms, 2m, 5%); units are ms, s, m, h and %",
            ));
        }
        if self.peek().is_some() {
            return Err(self.error("expected the end of the criterion (one comparison per criterion)"));
        }
        Ok(Criterion { metric, op, threshold, text: self.input.trim().to_string() })
    }

    fn comparison(&mut self) -> Result<Comparison, CriterionError> {
        let first = self.peek();
        let second = self.chars.get(self.pos + 1).copied();
        let (op, len) = match (first, second) {
            (Some('<'), Some('=')) => (Comparison::LessOrEqual, 2),
            (Some('>'), Some('=')) => (Comparison::GreaterOrEqual, 2),
            (Some('='), Some('=')) => (Comparison::Equal, 2),
            (Some('!'), Some('=')) => (Comparison::NotEqual, 2),
            (Some('<'), _) => (Comparison::Less, 1),
            (Some('>'), _) => (Comparison::Greater, 1),
            (Some('='), _) => return Err(self.error("expected a comparison; use == for equality")),
            _ => return Err(self.error("expected a comparison: <, <=, >, >=, == or !=")),
        };
        self.pos += len;
        if matches!(self.peek(), Some('<' | '>' | '=' | '!')) {
            return Err(self.error("expected a value after the comparison (`=>` and `=<` are not operators)"));
        }
        Ok(op)
    }

    fn threshold(&mut self) -> Result<Threshold, CriterionError> {
        let start = self.pos;
        if matches!(self.peek(), Some('-' | '+')) {
            self.pos += 1;
        }
        let digits = self.take_while(|c| c.is_ascii_digit() || c == '.');
        if digits.is_empty() || digits == "." || digits.matches('.').count() > 1 {
            self.pos = start;
            return Err(self.error("expected a number, a percentage (5%) or a duration (90s, 800ms, 2m)"));
        }
        let number_text: String = self.chars[start..self.pos].iter().collect();
        let unit_start = self.pos;
        let unit = self.take_while(|c| c.is_ascii_alphabetic() || c == '%');
        match unit.as_str() {
            "" => number_text.parse::<f64>().map(Threshold::Number).map_err(|_| {
                self.pos = start;
                self.error("expected a number")
            }),
            "%" => number_text.parse::<f64>().map(|n| Threshold::Number(n / 100.0)).map_err(|_| {
                self.pos = start;
                self.error("expected a number before '%'")
            }),
            "ms" | "s" | "m" | "h" => {
                format!("{number_text}{unit}").parse::<Duration>().map(Threshold::Duration).map_err(|e| {
                    self.pos = start;
                    self.error(e.reason)
                })
            }
            _ => {
                self.pos = unit_start;
                Err(self.error(format!("unknown unit {unit:?}; use ms, s, m, h or %")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Criterion {
        text.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_the_criteria_users_write() {
        let c = parse("user_satisfaction_score > 0.85");
        assert_eq!(c.metric, "user_satisfaction_score");
        assert_eq!(c.op, Comparison::Greater);
        assert_eq!(c.threshold, Threshold::Number(0.85));
        assert!(c.is_met_by(0.9) && !c.is_met_by(0.85) && !c.is_met_by(f64::NAN));

        let c = parse("avg_resolution_time < 90s");
        assert_eq!(c.threshold, Threshold::Duration(Duration::from_secs(90)));
        assert!(c.is_met_by(89.5) && !c.is_met_by(90.0));

        assert_eq!(parse("tool_call_accuracy >= 0.9").op, Comparison::GreaterOrEqual);
        assert_eq!(parse("latency_p99<=800ms").threshold.value(), 0.8);
        assert_eq!(parse("error_rate <= 5%").threshold.value(), 0.05);
        assert_eq!(parse("episodes == 50").op, Comparison::Equal);
        assert_eq!(parse("timeouts != 0").op, Comparison::NotEqual);
        assert_eq!(parse("  reward.total > -1.5 ").threshold.value(), -1.5);
        assert_eq!(parse("resolution_time < 2m").threshold.value(), 120.0);
    }

    #[test]
    fn errors_point_at_the_column_with_a_caret() {
        let err = "tool_call_accuracy >= ninety".parse::<Criterion>().expect_err("word");
        assert_eq!(err.column, 23);
        assert_eq!(err.category(), "InvalidCriterion");
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[1], "  tool_call_accuracy >= ninety");
        assert_eq!(lines[2].find('^'), Some(2 + 22), "{text}");
    }

    #[test]
    fn refuses_what_is_not_a_criterion() {
        let cases = [
            ("", 1),
            ("0.9 <= accuracy", 1),
            ("accuracy 0.9", 10),
            ("accuracy = 0.9", 10),
            ("accuracy => 0.9", 10),
            ("accuracy >= ", 13),
            ("accuracy >= 0.9 and x < 1", 17),
            ("avg_resolution_time < 90sec", 25),
            ("accuracy >= 1.2.3", 13),
            ("avg_resolution_time < 90 seconds", 26),
            ("latency < 0.5ms", 11),
        ];
        for (text, column) in cases {
            let err = text.parse::<Criterion>().expect_err(text);
            assert_eq!(err.column, column, "{text}: {err}");
        }
    }

    #[test]
    fn only_criteria_on_the_not_measured_metrics_set_a_tolerance_and_all_of_them_must_hold() {
        assert!(!not_measured_tolerated([]), "no criterion: no tolerance");
        assert!(!not_measured_tolerated([("tool_call_accuracy", true)]), "other metrics set none");
        assert!(not_measured_tolerated([("tool_call_accuracy", false), ("not_measured_rate", true)]));
        assert!(not_measured_tolerated([("not_measured_episodes", true), ("not_measured_rate", true)]));
        assert!(!not_measured_tolerated([("not_measured_episodes", true), ("not_measured_rate", false)]));
        assert!(!not_measured_tolerated([("not_measured_rate", false), ("not_measured_episodes", true)]));
        let rate: Criterion = "not_measured_rate <= 1%".parse().unwrap();
        assert_eq!(rate.never_met_because(), None);
        let beyond_a_share: Criterion = "not_measured_rate <= 5".parse().unwrap();
        assert!(beyond_a_share.never_met_because().is_none(), "<= 5 holds for any share: odd, but met");
        assert!("not_measured_rate > 1".parse::<Criterion>().unwrap().never_met_because().is_some());
    }

    #[test]
    fn a_count_against_a_fraction_is_flagged_with_the_share_metric_to_use() {
        let doubt = |text: &str| text.parse::<Criterion>().unwrap().count_against_a_fraction();
        let said = doubt("not_measured_episodes <= 1%").expect("1% of what?");
        assert_eq!(
            said,
            "not_measured_episodes counts episodes, a whole number, but 0.01 is a fraction: the criterion bounds the \
             count, not a share; for a share of the episodes write `not_measured_rate <= 0.01`"
        );
        assert!(doubt("lost_episodes < 0.5").is_some_and(|s| !s.contains("not_measured_rate")));
        for fine in
            ["not_measured_episodes <= 5", "not_measured_episodes == 0", "not_measured_rate <= 1%", "episodes >= 60"]
        {
            assert_eq!(doubt(fine), None, "{fine}");
        }
    }
}
