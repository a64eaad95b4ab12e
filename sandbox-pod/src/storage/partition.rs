//! The date-partitioned layout of trace keys (DESIGN.md, "Data flow"):
//! `<prefix>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>/<file>`.
//!
//! The date is the UTC date of a moment the caller passes in (the episode's
//! or the shard's start), never "now" read here, so the same inputs always
//! give the same key. Every segment is checked to be one plain path segment.

use std::time::{SystemTime, UNIX_EPOCH};

use super::error::StorageError;

/// A calendar date in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UtcDate {
    year: u16,
    month: u8,
    day: u8,
}

impl UtcDate {
    /// A date from its parts; refuses dates that do not exist (`2026-02-30`)
    /// and years that do not fit four digits.
    pub fn new(year: u16, month: u8, day: u8) -> Result<Self, StorageError> {
        let invalid = |reason| StorageError::InvalidKeySegment {
            field: "date",
            value: format!("{year:04}-{month:02}-{day:02}"),
            reason,
        };
        if year > 9999 {
            return Err(invalid("the year must have at most four digits"));
        }
        if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
            return Err(invalid("no such calendar date"));
        }
        Ok(Self { year, month, day })
    }

    /// The UTC date of a Unix time in seconds (negative: before 1970).
    pub fn from_unix_seconds(seconds: i64) -> Result<Self, StorageError> {
        let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
        let year = u16::try_from(year).ok().filter(|y| *y <= 9999).ok_or_else(|| StorageError::InvalidKeySegment {
            field: "date",
            value: format!("unix time {seconds}"),
            reason: "the year must be between 0 and 9999",
        })?;
        Self::new(year, month, day)
    }

    /// The UTC date of a moment, e.g. an episode's start time.
    pub fn from_system_time(time: SystemTime) -> Result<Self, StorageError> {
        let seconds = match time.duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
            // Round towards the past: 0.5 s before 1970 is still 1969-12-31.
            Err(before) => {
                let d = before.duration();
                let whole = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
                -whole - i64::from(d.subsec_nanos() > 0)
            }
        };
        Self::from_unix_seconds(seconds)
    }

    /// The year.
    pub fn year(self) -> u16 {
        self.year
    }

    /// The month, 1-12.
    pub fn month(self) -> u8 {
        self.month
    }

    /// The day of the month, 1-31.
    pub fn day(self) -> u8 {
        self.day
    }
}

impl std::fmt::Display for UtcDate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

fn is_leap(year: u16) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

fn days_in_month(year: u16, month: u8) -> u8 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // day is 1..=31 and month 1..=12 by construction.
    (year, month as u8, day as u8)
}

/// Checks that `value` can be one segment of an object key and of a local
/// path: not empty, not `.` or `..`, no `/` or `\`, no control characters,
/// at most 255 bytes.
pub fn validate_segment(field: &'static str, value: &str) -> Result<(), StorageError> {
    let reason = if value.is_empty() {
        Some("it is empty")
    } else if value == "." || value == ".." {
        Some("'.' and '..' are not allowed")
    } else if value.contains('/') || value.contains('\\') {
        Some("it contains a '/' or '\\'")
    } else if value.chars().any(char::is_control) {
        Some("it contains control characters")
    } else if value.len() > 255 {
        Some("it is longer than 255 bytes")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(StorageError::InvalidKeySegment { field, value: value.to_string(), reason }),
        None => Ok(()),
    }
}

/// Where one shard's files live under a destination.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardPartition {
    date: UtcDate,
    namespace: String,
    task: String,
    variant: String,
    shard: u32,
}

impl ShardPartition {
    /// A partition; `date` is the UTC date of the episode (or shard) start.
    /// Namespace, task and variant must each be one key segment.
    pub fn new(date: UtcDate, namespace: &str, task: &str, variant: &str, shard: u32) -> Result<Self, StorageError> {
        validate_segment("namespace", namespace)?;
        validate_segment("task", task)?;
        validate_segment("variant", variant)?;
        Ok(Self { date, namespace: namespace.into(), task: task.into(), variant: variant.into(), shard })
    }

    /// The segments `yyyy, mm, dd, namespace, task, variant, shard`.
    pub fn segments(&self) -> [String; 7] {
        [
            format!("{:04}", self.date.year),
            format!("{:02}", self.date.month),
            format!("{:02}", self.date.day),
            self.namespace.clone(),
            self.task.clone(),
            self.variant.clone(),
            self.shard.to_string(),
        ]
    }

    /// `yyyy/mm/dd/namespace/task/variant/shard`.
    pub fn relative_path(&self) -> String {
        self.segments().join("/")
    }

    /// The full object key of `file` under `prefix` (which may be empty):
    /// `<prefix>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>/<file>`.
    pub fn object_key(&self, prefix: &str, file: &str) -> Result<String, StorageError> {
        validate_segment("file", file)?;
        let prefix = prefix.trim_end_matches('/');
        let rest = format!("{}/{file}", self.relative_path());
        Ok(if prefix.is_empty() { rest } else { format!("{prefix}/{rest}") })
    }

    /// The UTC date of the partition.
    pub fn date(&self) -> UtcDate {
        self.date
    }

    /// The shard index.
    pub fn shard(&self) -> u32 {
        self.shard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_from_unix_time_are_utc() {
        let date = |s| UtcDate::from_unix_seconds(s).expect("in range").to_string();
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(-1), "1969-12-31");
        assert_eq!(date(951_782_400), "2000-02-29");
        // 2026-01-05T23:59:59Z and one second later.
        assert_eq!(date(1_767_657_599), "2026-01-05");
        assert_eq!(date(1_767_657_600), "2026-01-06");
        assert_eq!(date(4_107_542_400), "2100-03-01");
        assert!(UtcDate::from_unix_seconds(i64::MAX / 2).is_err());
    }

    #[test]
    fn civil_from_days_agrees_with_counting_days() {
        // Every day from 1960 to 2110, counted one by one (bounded loop).
        let mut expected = UtcDate::new(1960, 1, 1).expect("valid");
        let start = -3653; // 1960-01-01
        for days in start..start + 55_000 {
            assert_eq!(UtcDate::from_unix_seconds(days * 86_400).expect("in range"), expected, "day {days}");
            let (y, m, d) = (expected.year, expected.month, expected.day);
            expected = if d < days_in_month(y, m) {
                UtcDate { year: y, month: m, day: d + 1 }
            } else if m < 12 {
                UtcDate { year: y, month: m + 1, day: 1 }
            } else {
                UtcDate { year: y + 1, month: 1, day: 1 }
            };
        }
    }

    #[test]
    fn system_time_before_epoch_rounds_down() {
        let t = UNIX_EPOCH - std::time::Duration::from_millis(500);
        assert_eq!(UtcDate::from_system_time(t).expect("in range").to_string(), "1969-12-31");
    }

    #[test]
    fn refuses_impossible_dates() {
        assert!(UtcDate::new(2026, 2, 29).is_err());
        assert!(UtcDate::new(2024, 2, 29).is_ok());
        assert!(UtcDate::new(2026, 13, 1).is_err());
        assert!(UtcDate::new(2026, 4, 31).is_err());
        assert!(UtcDate::new(10_000, 1, 1).is_err());
    }

    #[test]
    fn keys_follow_the_design_layout() {
        let date = UtcDate::new(2026, 1, 5).expect("valid");
        let partition = ShardPartition::new(date, "team-a", "ecommerce-eval", "baseline", 3).expect("valid");
        assert_eq!(
            partition.object_key("traces/", "ep-1.trace").expect("valid"),
            "traces/2026/01/05/team-a/ecommerce-eval/baseline/3/ep-1.trace"
        );
        assert_eq!(
            partition.object_key("", "summary.json").expect("valid"),
            "2026/01/05/team-a/ecommerce-eval/baseline/3/summary.json"
        );
    }

    #[test]
    fn a_checkpoint_run_name_is_one_segment() {
        // operator/TRAINING.md: the evaluation of step N writes under `<task>@step-N`.
        let date = UtcDate::new(2026, 1, 5).expect("valid");
        let partition = ShardPartition::new(date, "team-a", "ecommerce-eval@step-30", "baseline", 0).expect("valid");
        assert_eq!(
            partition.object_key("traces", "summary.json").expect("valid"),
            "traces/2026/01/05/team-a/ecommerce-eval@step-30/baseline/0/summary.json"
        );
    }

    #[test]
    fn refuses_bad_segments() {
        let date = UtcDate::new(2026, 1, 5).expect("valid");
        for bad in ["", "a/b", "..", ".", "a\nb", "a\\b"] {
            let err = ShardPartition::new(date, bad, "t", "v", 0).expect_err(bad);
            assert_eq!(err.category(), "InvalidObjectKey");
            assert!(err.to_string().contains("namespace"), "{err}");
            assert!(ShardPartition::new(date, "ns", bad, "v", 0).is_err());
            assert!(ShardPartition::new(date, "ns", "t", bad, 0).is_err());
        }
        let partition = ShardPartition::new(date, "ns", "t", "v", 0).expect("valid");
        for bad in ["", "../x", "a/b", ".."] {
            assert!(partition.object_key("p", bad).is_err(), "{bad}");
        }
    }
}
