//! What every benchmark's result file (`bench/results/*.json`) records
//! about its run, so numbers from shared, noisy machines can be read in
//! context: the machine ([`machine`]: CPUs, kernel, clock source, load
//! average at the start and end), the commit ([`git_commit`]) and the time
//! ([`utc_now`]); and the small helpers every benchmark needs ([`median`],
//! [`spread`], [`env_or`], [`TempDir`]). A dev-dependency of the crates that have
//! benchmarks.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// A file's contents, trimmed; `None` where it cannot be read.
fn read_trimmed(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// `/proc/loadavg` now (take it before the run for `machine`'s `loadavg_at_start`).
pub fn loadavg() -> Option<String> {
    read_trimmed("/proc/loadavg")
}

/// The CPU's model name from `/proc/cpuinfo`.
pub fn cpu_model() -> Option<String> {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").ok()?;
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
}

/// The machine: CPUs usable and present, model, kernel, clock source, the
/// load average given from before the run and the one now, architecture.
pub fn machine(loadavg_at_start: Option<String>) -> Value {
    let processors = fs::read_to_string("/proc/cpuinfo")
        .map(|c| c.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or_default();
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "cpuinfo_processors": processors,
        "cpu_model": cpu_model(),
        "kernel": read_trimmed("/proc/sys/kernel/osrelease"),
        "clocksource": read_trimmed("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "loadavg_at_start": loadavg_at_start,
        "loadavg_at_end": loadavg(),
        "arch": std::env::consts::ARCH,
    })
}

/// The checkout's commit (short), when git can say.
pub fn git_commit() -> Option<String> {
    let out =
        Command::new("git").args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The current UTC time as RFC 3339 (seconds), without a date crate.
pub fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

fn rfc3339(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant), for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Writes a benchmark's result document to `path` (its directory created),
/// pretty-printed with a final newline; a benchmark that cannot keep its
/// numbers fails.
pub fn write_results(path: &str, doc: &Value) {
    let path = Path::new(path);
    fs::create_dir_all(path.parent().expect("the results path has a parent")).expect("create bench/results");
    let mut text = serde_json::to_string_pretty(doc).expect("a JSON value always serializes");
    text.push('\n');
    fs::write(path, text).unwrap_or_else(|e| panic!("failed to write {}: {e}", path.display()));
}

/// The median (the upper one of an even count) of `values`, which must not be empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A sampled figure as result files give it: `{"median", "min", "max"}`
/// of `values`, which must not be empty.
pub fn spread(values: &[f64]) -> Value {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    json!({"median": median(values), "min": min, "max": max})
}

/// The environment variable `name` parsed, or `default` when unset or unparsable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A directory under the system temp dir, `basecamp-<name>-bench-<pid>`, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("basecamp-{name}-bench-{}", std::process::id()));
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("failed to create {}: {e}", path.display()));
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
    }

    #[test]
    fn dates_are_civil_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z", "a leap day of a century year");
        assert_eq!(rfc3339(1_796_083_199), "2026-11-30T23:59:59Z");
    }

    #[test]
    fn the_machine_names_what_a_reader_of_the_numbers_needs() {
        let m = machine(Some("1.00 1.00 1.00 1/100 1".into()));
        for key in ["nproc", "cpu_model", "kernel", "loadavg_at_start", "loadavg_at_end", "arch"] {
            assert!(m.get(key).is_some(), "{key} in {m}");
        }
        assert_eq!(m["loadavg_at_start"], "1.00 1.00 1.00 1/100 1");
    }
}
