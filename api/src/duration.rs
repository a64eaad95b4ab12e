//! Durations as users write them in manifests: `"800ms"`, `"3s"`, `"1.5s"`,
//! `"2m"`, `"1m30s"`, `"1h"`, or a plain integer meaning milliseconds.
//!
//! Tool timeouts need millisecond precision, so [`Duration`] stores whole
//! milliseconds and refuses anything finer (`"0.5ms"`). Zero and negative
//! values parse, on purpose: the validator reports them with the field path
//! ("must be greater than zero") instead of failing the whole manifest at the
//! first bad character; so do durations longer than [`MAX_SPEC_DURATION`],
//! which validation refuses the same way.
//!
//! In the CRD schema a duration is `x-kubernetes-int-or-string: true`, the
//! structural-schema form the apiserver accepts for "an integer or a string".

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const MS_PER_SECOND: i64 = 1_000;
const MS_PER_MINUTE: i64 = 60 * MS_PER_SECOND;
const MS_PER_HOUR: i64 = 60 * MS_PER_MINUTE;
const MS_PER_DAY: i64 = 24 * MS_PER_HOUR;

/// The longest duration a spec may give (a timeout, a readiness wait, a
/// backoff): 7 days, 604800000 ms. Longer is a mistake — a bare number
/// counts milliseconds — and a timer that far out never fires, so what it
/// guards hangs instead of timing out. Validation refuses more, naming the
/// field. The duration fields' doc comments, and so the CRD descriptions,
/// say so ("At most 7 days (168h)"; a test in `crd` checks each does).
pub const MAX_SPEC_DURATION: Duration = Duration::from_millis(7 * MS_PER_DAY);

/// A signed duration with millisecond precision.
///
/// Serializes to its shortest exact form (`"1500ms"`, `"3s"`, `"2m"`,
/// `"1h"`), so a value read and written again means the same thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration {
    millis: i64,
}

/// A duration string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: {reason}; write e.g. \"800ms\", \"1.5s\", \"2m\", or an integer number of milliseconds"
)]
pub struct DurationError {
    /// What the user wrote.
    pub input: String,
    /// Why it does not parse.
    pub reason: String,
}

impl DurationError {
    fn new(input: &str, reason: impl Into<String>) -> Self {
        Self { input: input.to_string(), reason: reason.into() }
    }

    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        "InvalidDuration"
    }
}

impl Duration {
    /// Zero milliseconds.
    pub const ZERO: Duration = Duration { millis: 0 };

    /// A duration of `millis` milliseconds (may be zero or negative).
    pub const fn from_millis(millis: i64) -> Self {
        Self { millis }
    }

    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: i64) -> Self {
        Self { millis: secs.saturating_mul(MS_PER_SECOND) }
    }

    /// Whole milliseconds.
    pub const fn as_millis(self) -> i64 {
        self.millis
    }

    /// Whole days (`MAX_SPEC_DURATION` is 7), for messages.
    pub const fn as_whole_days(self) -> i64 {
        self.millis / MS_PER_DAY
    }

    /// Seconds as a float (`1500ms` -> `1.5`); success criteria compare
    /// durations in seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.millis as f64 / MS_PER_SECOND as f64
    }

    /// True when strictly greater than zero: what every timeout must be.
    pub const fn is_positive(self) -> bool {
        self.millis > 0
    }

    /// The standard-library duration, or `None` when zero or negative
    /// values cannot be represented (negative).
    pub fn to_std(self) -> Option<std::time::Duration> {
        u64::try_from(self.millis).ok().map(std::time::Duration::from_millis)
    }

    /// A command-line duration of zero or more (`45s`, `1m30s`, `0s`), as
    /// manifests write them; the message names what was given.
    pub fn parse_flag(text: &str) -> Result<std::time::Duration, String> {
        let d: Duration = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
        d.to_std().ok_or_else(|| format!("{text:?}: give a duration of 0s or more, such as 45s"))
    }
}

impl From<std::time::Duration> for Duration {
    /// Truncates to whole milliseconds and saturates at `i64::MAX` ms.
    fn from(value: std::time::Duration) -> Self {
        Self { millis: i64::try_from(value.as_millis()).unwrap_or(i64::MAX) }
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.millis;
        if ms != 0 && ms % MS_PER_HOUR == 0 {
            write!(f, "{}h", ms / MS_PER_HOUR)
        } else if ms != 0 && ms % MS_PER_MINUTE == 0 {
            write!(f, "{}m", ms / MS_PER_MINUTE)
        } else if ms != 0 && ms % MS_PER_SECOND == 0 {
            write!(f, "{}s", ms / MS_PER_SECOND)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let text = input.trim();
        if text.is_empty() {
            return Err(DurationError::new(input, "it is empty"));
        }
        let (negative, body) = match text.as_bytes()[0] {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        if body.is_empty() {
            return Err(DurationError::new(input, "there is no number"));
        }
        // A bare integer (also as a string, e.g. from a JSON form) is milliseconds.
        if body.bytes().all(|b| b.is_ascii_digit()) {
            let millis: i64 = body.parse().map_err(|_| DurationError::new(input, "the number is too large"))?;
            return Ok(Self { millis: if negative { -millis } else { millis } });
        }
        let mut total: i64 = 0;
        let mut rest = body;
        while !rest.is_empty() {
            let number_len = rest.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
            if number_len == 0 {
                return Err(DurationError::new(input, format!("expected a number at {rest:?}")));
            }
            let number = &rest[..number_len];
            rest = &rest[number_len..];
            let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
            let unit = &rest[..unit_len];
            rest = &rest[unit_len..];
            let unit_ms = match unit {
                "ms" => 1,
                "s" => MS_PER_SECOND,
                "m" => MS_PER_MINUTE,
                "h" => MS_PER_HOUR,
                // `800 ms`, `7 days`: the unit is there, after a space.
                "" if rest.starts_with(char::is_whitespace) => {
                    let after = rest.trim_start();
                    let word = &after[..after.bytes().take_while(|b| b.is_ascii_alphabetic()).count()];
                    let reason = match word {
                        "" => format!("{number:?} has no unit"),
                        "ms" | "s" | "m" | "h" => format!("write {number}{word}, without the space"),
                        other => format!("unknown unit {other:?}; use ms, s, m or h"),
                    };
                    return Err(DurationError::new(input, reason));
                }
                "" => return Err(DurationError::new(input, format!("{number:?} has no unit"))),
                other => {
                    return Err(DurationError::new(input, format!("unknown unit {other:?}; use ms, s, m or h")));
                }
            };
            let part = decimal_times(number, unit_ms).map_err(|reason| DurationError::new(input, reason))?;
            total = total.checked_add(part).ok_or_else(|| DurationError::new(input, "it is too large"))?;
        }
        Ok(Self { millis: if negative { -total } else { total } })
    }
}

/// `number` (digits with at most one '.') times `unit_ms`, exactly, or an
/// error when the result is not a whole number of milliseconds.
fn decimal_times(number: &str, unit_ms: i64) -> Result<i64, String> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(format!("{number:?} is not a number"));
    }
    let too_large = || "it is too large".to_string();
    let whole_value: i64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| too_large())? };
    let mut millis = whole_value.checked_mul(unit_ms).ok_or_else(too_large)?;
    if !fraction.is_empty() {
        let digits = fraction.trim_end_matches('0');
        if digits.len() > 9 {
            return Err("durations have millisecond precision".into());
        }
        let numerator: i64 = if digits.is_empty() { 0 } else { digits.parse().map_err(|_| too_large())? };
        let denominator = 10_i64.pow(digits.len() as u32);
        let scaled = numerator.checked_mul(unit_ms).ok_or_else(too_large)?;
        if scaled % denominator != 0 {
            return Err("durations have millisecond precision".into());
        }
        millis = millis.checked_add(scaled / denominator).ok_or_else(too_large)?;
    }
    Ok(millis)
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DurationVisitor)
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as \"800ms\", \"1.5s\", \"2m\", or an integer number of milliseconds")
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Duration, E> {
        Ok(Duration::from_millis(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Duration, E> {
        i64::try_from(value).map(Duration::from_millis).map_err(|_| E::custom(too_large(&value.to_string())))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Duration, E> {
        if value.fract() == 0.0 && value.abs() < 9.0e15 {
            Ok(Duration::from_millis(value as i64))
        } else if value.fract() == 0.0 {
            Err(E::custom(too_large(&value.to_string())))
        } else {
            Err(E::custom(format!(
                "a bare number is a count of milliseconds and must be whole, got {value}; \
                 write \"{value}s\" if you meant seconds"
            )))
        }
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Duration, E> {
        value.parse().map_err(E::custom)
    }
}

/// A recorded latency as JSON gives it: a number of milliseconds, fractional
/// allowed (`1200`, `0.25`: a trace records microseconds), at least 0 and at
/// most [`MAX_SPEC_DURATION`]. For `#[serde(deserialize_with)]` on a
/// `std::time::Duration` field (recorded tools' `latencyMs`, scripted
/// policies' `delay_ms`).
pub fn fractional_millis<'de, D: Deserializer<'de>>(deserializer: D) -> Result<std::time::Duration, D::Error> {
    let millis = f64::deserialize(deserializer)?;
    let max = MAX_SPEC_DURATION.as_millis() as f64;
    if !(0.0..=max).contains(&millis) {
        return Err(de::Error::custom(format!(
            "must be a number of milliseconds from 0 to {max} ({MAX_SPEC_DURATION}), got {millis}"
        )));
    }
    Ok(std::time::Duration::from_secs_f64(millis / 1000.0))
}

/// A bare number of milliseconds beyond any duration (`1e20`, `u64::MAX`).
fn too_large(millis: &str) -> String {
    format!(
        "a duration of {millis} milliseconds is far too long; durations in a spec are at most {MAX_SPEC_DURATION} ({} days)",
        MAX_SPEC_DURATION.as_whole_days()
    )
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // No `anyOf: [{type: integer}, {type: string}]`: kube's structural
        // rewrite would hoist the types out and leave `anyOf: [{}, {}]`.
        json_schema!({ "x-kubernetes-int-or-string": true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_duration_is_zero_or_more() {
        assert_eq!(Duration::parse_flag("1m30s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(Duration::parse_flag("0s"), Ok(std::time::Duration::ZERO));
        assert_eq!(Duration::parse_flag("-5s").unwrap_err(), "\"-5s\": give a duration of 0s or more, such as 45s");
        assert!(Duration::parse_flag("soon").unwrap_err().starts_with("\"soon\": "));
    }

    fn ms(text: &str) -> i64 {
        text.parse::<Duration>().map(Duration::as_millis).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn parses_the_forms_users_write() {
        assert_eq!(ms("800ms"), 800);
        assert_eq!(ms("3s"), 3_000);
        assert_eq!(ms("1.5s"), 1_500);
        assert_eq!(ms("2m"), 120_000);
        assert_eq!(ms("1m30s"), 90_000);
        assert_eq!(ms("1h"), 3_600_000);
        assert_eq!(ms("0.25s"), 250);
        assert_eq!(ms(".5s"), 500);
        assert_eq!(ms("800"), 800);
        assert_eq!(ms(" 90s "), 90_000);
    }

    #[test]
    fn zero_and_negative_parse_so_validation_can_name_the_field() {
        assert_eq!(ms("0s"), 0);
        assert_eq!(ms("0"), 0);
        assert_eq!(ms("-5s"), -5_000);
        assert!(!Duration::from_millis(0).is_positive());
        assert!(Duration::from_millis(-1).to_std().is_none());
    }

    #[test]
    fn rejects_what_is_not_a_duration() {
        for bad in ["", "s", "3 s", "3sec", "1.2.3s", "0.5ms", "1.0005s", "abc", "-", "99999999999999999999"] {
            let err = bad.parse::<Duration>().expect_err(bad);
            assert_eq!(err.category(), "InvalidDuration");
            assert!(err.to_string().contains("e.g. \"800ms\""), "{err}");
        }
        let err = "3sec".parse::<Duration>().expect_err("unit");
        assert!(err.to_string().contains("unknown unit \"sec\""), "{err}");
        // A unit after a space is named, not called missing (before: "\"800\" has no unit").
        let err = "800 fortnights".parse::<Duration>().expect_err("unit");
        assert!(err.to_string().contains("unknown unit \"fortnights\""), "{err}");
        let err = "3 s".parse::<Duration>().expect_err("space");
        assert!(err.to_string().contains("write 3s, without the space"), "{err}");
    }

    #[test]
    fn displays_the_shortest_exact_form_and_round_trips() {
        for (millis, text) in [(0, "0ms"), (1_500, "1500ms"), (3_000, "3s"), (120_000, "2m"), (-800, "-800ms")] {
            let d = Duration::from_millis(millis);
            assert_eq!(d.to_string(), text);
            assert_eq!(text.parse::<Duration>().expect("round trip"), d);
        }
    }

    #[test]
    fn deserializes_integers_as_milliseconds_and_strings_with_units() {
        let d: Duration = serde_json::from_str("800").expect("int");
        assert_eq!(d.as_millis(), 800);
        let d: Duration = serde_json::from_str("\"1.5s\"").expect("str");
        assert_eq!(d.as_millis(), 1_500);
        let err = serde_json::from_str::<Duration>("1.5").expect_err("fractional ms");
        assert!(err.to_string().contains("\"1.5s\""), "{err}");
        // Before: "must be whole, got 100000000000000000000"; it is whole, and far too long.
        for huge in ["1e20", "18446744073709551615"] {
            let err = serde_json::from_str::<Duration>(huge).expect_err("too large");
            assert!(err.to_string().contains("far too long; durations in a spec are at most 168h (7 days)"), "{err}");
        }
        assert_eq!(serde_json::to_string(&Duration::from_millis(3_000)).expect("ser"), "\"3s\"");
    }

    #[test]
    fn schema_is_int_or_string() {
        let schema = schemars::schema_for!(Duration);
        let value = serde_json::to_value(&schema).expect("schema");
        assert_eq!(value["x-kubernetes-int-or-string"], true);
    }
}
