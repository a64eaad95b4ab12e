//! `basecamp serve`'s catalog, kept between requests. Each request walks
//! DIR again (names and metadata only) and reads only what is new or
//! changed since the last walk: a trace or `summary.json` whose size,
//! modification time, change time or inode differ. So a run still writing
//! shows up as it lands (a trace that grows, a summary that appears later,
//! a file deleted) while a large tree that is done is not read again. The
//! traces' digests, which the task page needs for every episode, are kept
//! the same way ([`LazyDigest`]: read on first use, dropped when the file
//! changes).
//!
//! Confinement is the full scan's: directories are walked from the real
//! root without following symlinked directories, and a symlinked trace or
//! summary counts only when its real path lies inside DIR.
//!
//! A file modified less than [`SETTLE`] before the walk that saw it is read
//! again on the next request even when its metadata look the same: the
//! kernel's timestamps have coarse ticks, so a same-size rewrite within one
//! tick would otherwise go unseen (git's "racily clean" entries).

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use basecamp_sandbox::driver::SUMMARY_FILE;
use basecamp_trace::inputs::TRACE_SUFFIX;

use super::catalog::{Catalog, LazyDigest, ShardIndex, episode_entry};

/// How long after its last change a file's metadata are trusted to reveal the next one.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The catalog of one directory, brought up to date on each [`CatalogCache::catalog`].
pub struct CatalogCache {
    /// The directory, its symlinks resolved.
    root: PathBuf,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Trace path -> its digest (read or not yet).
    traces: HashMap<PathBuf, Seen<LazyDigest>>,
    /// `summary.json` path -> what reading it gave.
    summaries: HashMap<PathBuf, Seen<SummaryRead>>,
    /// The catalog built from the above, handed out again while nothing changes.
    built: Option<Arc<Catalog>>,
}

/// What reading a `summary.json` gave ([`ShardIndex::read`]), shared by the catalogs built from it.
type SummaryRead = Arc<Result<Option<ShardIndex>, String>>;

/// What was read from a file, and the file's stamp when it was.
struct Seen<T> {
    stamp: Stamp,
    /// False while the file is too recent for its stamp to be trusted.
    settled: bool,
    value: T,
}

/// What a file's metadata say about its contents: when any of this
/// differs, the file is read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    len: u64,
    modified_nanos: i128,
    changed_nanos: i128,
    inode: u64,
    device: u64,
}

impl Stamp {
    pub fn of(meta: &Metadata) -> Stamp {
        let nanos = |secs: i64, nsec: i64| i128::from(secs) * 1_000_000_000 + i128::from(nsec);
        Stamp {
            len: meta.len(),
            modified_nanos: nanos(meta.mtime(), meta.mtime_nsec()),
            changed_nanos: nanos(meta.ctime(), meta.ctime_nsec()),
            inode: meta.ino(),
            device: meta.dev(),
        }
    }

    /// True when the file's last change lies more than [`SETTLE`] before
    /// `now` (a clock that jumped back leaves it unsettled: read again).
    pub fn settled(&self, now: SystemTime) -> bool {
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
        self.modified_nanos.max(self.changed_nanos) + SETTLE.as_nanos() as i128 <= now
    }
}

impl<T: Clone> Seen<T> {
    /// The value kept for a file now stamped `stamp`, or `None` when it must be read again.
    fn still(&self, stamp: &Stamp) -> Option<T> {
        (self.settled && self.stamp == *stamp).then(|| self.value.clone())
    }
}

/// The files a walk found: traces in the full scan's order (each
/// directory's entries sorted by name, depth first), and the summaries.
#[derive(Debug, Default)]
pub struct Listing {
    pub traces: Vec<(PathBuf, Stamp)>,
    /// Directory -> its `summary.json` and that file's stamp.
    pub summaries: HashMap<PathBuf, (PathBuf, Stamp)>,
}

/// Walks `root` (already canonical) for traces and summaries; the error
/// is the problem to show when a directory cannot be listed.
pub fn list(root: &Path) -> Result<Listing, String> {
    let mut listing = Listing::default();
    walk(root, root, &mut listing)?;
    Ok(listing)
}

fn walk(root: &Path, dir: &Path, listing: &mut Listing) -> Result<(), String> {
    let cannot = |e: std::io::Error| format!("{}: cannot list directory: {e}", dir.display());
    let mut entries: Vec<_> = std::fs::read_dir(dir).map_err(cannot)?.collect::<Result<_, _>>().map_err(cannot)?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let kind = entry.file_type().map_err(cannot)?;
        if kind.is_dir() {
            walk(root, &path, listing)?;
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let is_trace = name.ends_with(TRACE_SUFFIX);
        if !is_trace && name != SUMMARY_FILE {
            continue;
        }
        let meta = if kind.is_symlink() {
            // Counted only when it leads to a file inside the directory.
            match path.canonicalize() {
                Ok(real) if real.starts_with(root) => std::fs::metadata(&real),
                _ => continue,
            }
        } else {
            entry.metadata()
        };
        // Gone since the listing, or not a file: not there.
        let Some(meta) = meta.ok().filter(Metadata::is_file) else { continue };
        let stamp = Stamp::of(&meta);
        if is_trace {
            listing.traces.push((path, stamp));
        } else {
            listing.summaries.insert(dir.to_path_buf(), (path, stamp));
        }
    }
    Ok(())
}

impl CatalogCache {
    /// An empty cache of `root` (canonical); the first [`Self::catalog`] reads everything.
    pub fn new(root: PathBuf) -> CatalogCache {
        CatalogCache { root, state: Mutex::new(State::default()) }
    }

    /// The catalog as the directory is now, reading only files that are
    /// new or changed since the last call. Concurrent calls wait for each
    /// other; what they return is shared and read outside the lock.
    pub fn catalog(&self) -> Arc<Catalog> {
        // Taken before the walk: a change after this instant is never settled.
        self.catalog_as_of(SystemTime::now())
    }

    fn catalog_as_of(&self, now: SystemTime) -> Arc<Catalog> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let listing = match list(&self.root) {
            Ok(listing) => listing,
            Err(problem) => {
                *state = State::default();
                return Arc::new(Catalog { problems: vec![problem], ..Catalog::default() });
            }
        };
        let mut changed = false;

        let mut traces = HashMap::with_capacity(listing.traces.len());
        for (path, stamp) in &listing.traces {
            let kept = state.traces.remove(path).and_then(|seen| seen.still(stamp));
            changed |= kept.is_none();
            let value = kept.unwrap_or_default();
            traces.insert(path.clone(), Seen { stamp: *stamp, settled: stamp.settled(now), value });
        }
        changed |= !state.traces.is_empty(); // traces deleted since
        state.traces = traces;

        // Only the summaries next to traces are read, as the full scan does.
        let mut summaries = HashMap::new();
        for (path, stamp) in listing.traces.iter().filter_map(|(trace, _)| listing.summaries.get(trace.parent()?)) {
            if summaries.contains_key(path) {
                continue;
            }
            let kept = state.summaries.remove(path).and_then(|seen| seen.still(stamp));
            changed |= kept.is_none();
            let value = kept.unwrap_or_else(|| Arc::new(ShardIndex::read(path)));
            summaries.insert(path.clone(), Seen { stamp: *stamp, settled: stamp.settled(now), value });
        }
        changed |= !state.summaries.is_empty(); // summaries deleted since
        state.summaries = summaries;

        if !changed && let Some(built) = &state.built {
            return Arc::clone(built);
        }
        let built = Arc::new(self.build(&listing, &state));
        state.built = Some(Arc::clone(&built));
        built
    }

    /// The catalog of `listing` from what `state` holds (reading the
    /// digests of traces without a summary that were not read before).
    fn build(&self, listing: &Listing, state: &State) -> Catalog {
        let mut catalog = Catalog::default();
        // Directories whose summary was noted, or its problem reported, once.
        let mut reported = std::collections::HashSet::new();
        for (trace, _) in &listing.traces {
            let dir = trace.parent().unwrap_or(Path::new(""));
            let summary = listing.summaries.get(dir).and_then(|(path, _)| state.summaries.get(path));
            let summary = match summary.map(|seen| seen.value.as_ref()) {
                Some(Ok(index)) => {
                    if let Some(index) = index
                        && reported.insert(dir)
                    {
                        catalog.note_shard(index);
                    }
                    index.as_ref()
                }
                Some(Err(problem)) => {
                    if reported.insert(dir) {
                        catalog.problems.push(problem.clone());
                    }
                    None
                }
                None => None,
            };
            if let Some(index) = summary.filter(|index| index.cut_off(trace)) {
                catalog.left_out_cut_off(index);
                continue;
            }
            let digest = state.traces.get(trace).map(|seen| seen.value.clone()).unwrap_or_default();
            match episode_entry(&self.root, trace, summary, digest) {
                Ok(entry) => catalog.episodes.push(entry),
                Err(problem) => catalog.unreadable_trace(problem),
            }
        }
        catalog.finish();
        catalog
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basecamp_trace::synthetic::{EpisodeShape, generate};
    use serde_json::json;

    fn write_trace(path: &Path, seed: u64) {
        let mut episode = generate(&EpisodeShape { seed, steps: 3, tokens_per_step: 2, ..Default::default() });
        episode.header.episode_id = format!("ep-{seed}");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, episode.write_to(Vec::new(), 3).unwrap()).unwrap();
    }

    fn write_summary(dir: &Path, seeds: &[u64], accuracy: f64) {
        let episodes: Vec<_> = seeds
            .iter()
            .map(|seed| {
                json!({
                    "id": format!("ep-{seed}"), "outcome": "completed", "failure_class": "ok",
                    "trace_file": format!("ep-{seed}.trace"), "rollbacks": 0, "warnings": [],
                    "metrics": {"tool_call_accuracy": accuracy, "tool_call_accuracy_lenient": accuracy,
                                "plan_step_f1": 1.0, "memory_consistency": 1.0, "error_rate": 0.0,
                                "resolution_time_s": 1.5, "reward": 1.0, "tool_calls": 2, "steps": 3}
                })
            })
            .collect();
        let summary = json!({
            "namespace": "evals", "task": "shipping-delay", "variant": "a", "shard": 0, "shard_count": 1,
            "started_unix_nanos": 1, "wall_seconds": 1.0,
            "aggregate": {"episodes": seeds.len(), "means": {}, "resolution_time_p50_s": 1.5,
                          "resolution_time_p95_s": 1.5, "outcomes": {}},
            "episodes": episodes, "lost": []
        });
        std::fs::write(dir.join(SUMMARY_FILE), serde_json::to_vec(&summary).unwrap()).unwrap();
    }

    fn stamp(path: &Path) -> Stamp {
        Stamp::of(&std::fs::metadata(path).unwrap())
    }

    /// Later than every file the test writes: everything counts as settled.
    fn later() -> SystemTime {
        SystemTime::now() + Duration::from_secs(60)
    }

    fn accuracy_of(catalog: &Catalog, id: &str) -> Option<f64> {
        let entry = catalog.episodes.iter().find(|e| e.id == id)?;
        entry.metrics.get("tool_call_accuracy").copied()
    }

    #[test]
    fn a_stamp_changes_when_a_file_grows_or_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.trace");
        std::fs::write(&file, b"abc").unwrap();
        let before = stamp(&file);
        assert_eq!(stamp(&file), before, "nothing changed");
        std::fs::write(&file, b"abcd").unwrap();
        assert_ne!(stamp(&file), before, "grown");
        let grown = stamp(&file);
        // Same size, same modification time, another file renamed over it (how a mirror replaces one).
        let other = dir.path().join("y.tmp");
        std::fs::write(&other, b"wxyz").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&other)
            .unwrap()
            .set_modified(std::fs::metadata(&file).unwrap().modified().unwrap())
            .unwrap();
        std::fs::rename(&other, &file).unwrap();
        assert_ne!(stamp(&file), grown, "replaced: another inode");
    }

    #[test]
    fn a_file_changed_within_the_settle_time_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.trace");
        std::fs::write(&file, b"abc").unwrap();
        let now = SystemTime::now();
        assert!(!stamp(&file).settled(now), "just written");
        assert!(stamp(&file).settled(now + SETTLE + Duration::from_millis(10)));
        // An old modification time set by hand changes the change time: still recent.
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(now - Duration::from_secs(3600))
            .unwrap();
        assert!(!stamp(&file).settled(SystemTime::now()));
    }

    #[test]
    fn only_new_or_changed_files_are_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let shard = root.join("a/shard-0");
        for seed in 1..=3 {
            write_trace(&shard.join(format!("ep-{seed}.trace")), seed);
        }
        let cache = CatalogCache::new(root.clone());
        let first = cache.catalog_as_of(later());
        assert_eq!(first.episodes.len(), 3);
        assert!(first.episodes.iter().all(|e| !e.from_summary));

        // Nothing changed: the same catalog, nothing read.
        let again = cache.catalog_as_of(later());
        assert!(Arc::ptr_eq(&first, &again));

        // One trace replaced (renamed over: a new inode even within one timestamp tick): only its digest is new.
        write_trace(&shard.join("ep-2.trace.tmp"), 2);
        std::fs::rename(shard.join("ep-2.trace.tmp"), shard.join("ep-2.trace")).unwrap();
        let after = cache.catalog_as_of(later());
        assert!(!Arc::ptr_eq(&first, &after));
        let digest_of = |c: &Catalog, id: &str| {
            let e = c.episodes.iter().find(|e| e.id == id).unwrap();
            e.digest.get(&e.trace) as *const _
        };
        assert_eq!(digest_of(&first, "ep-1"), digest_of(&after, "ep-1"), "ep-1 kept its digest");
        assert_ne!(digest_of(&first, "ep-2"), digest_of(&after, "ep-2"), "ep-2 was read again");

        // A new trace, a deleted one.
        write_trace(&shard.join("ep-4.trace"), 4);
        std::fs::remove_file(shard.join("ep-1.trace")).unwrap();
        let ids: Vec<String> = cache.catalog_as_of(later()).episodes.iter().map(|e| e.id.clone()).collect();
        assert_eq!(ids, ["ep-2", "ep-3", "ep-4"]);

        // The summary lands: its metrics replace the traces' own; then it is rewritten.
        write_summary(&shard, &[2, 3, 4], 0.25);
        let scored = cache.catalog_as_of(later());
        assert!(scored.episodes.iter().all(|e| e.from_summary));
        assert_eq!(accuracy_of(&scored, "ep-3"), Some(0.25));
        // (Another size: a same-size rewrite within one timestamp tick is what SETTLE is for.)
        write_summary(&shard, &[2, 3, 4], 0.125);
        assert_eq!(accuracy_of(&cache.catalog_as_of(later()), "ep-3"), Some(0.125));
        std::fs::remove_file(shard.join(SUMMARY_FILE)).unwrap();
        assert!(cache.catalog_as_of(later()).episodes.iter().all(|e| !e.from_summary));
    }

    #[test]
    fn a_recent_file_is_read_again_even_when_its_stamp_is_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        write_trace(&root.join("ep-1.trace"), 1);
        let cache = CatalogCache::new(root);
        let first = cache.catalog_as_of(SystemTime::now());
        let second = cache.catalog_as_of(SystemTime::now());
        assert!(!Arc::ptr_eq(&first, &second), "written just now: not trusted yet");
        let settled = cache.catalog_as_of(later());
        assert!(Arc::ptr_eq(&settled, &cache.catalog_as_of(later())));
    }

    #[test]
    fn concurrent_requests_while_a_run_writes_end_where_the_full_scan_does() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let cache = Arc::new(CatalogCache::new(root.clone()));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let cache = Arc::clone(&cache);
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let catalog = cache.catalog();
                        // Every entry a request sees is whole: ids unique, digests readable.
                        let mut ids: Vec<&str> = catalog.episodes.iter().map(|e| e.id.as_str()).collect();
                        ids.dedup();
                        assert_eq!(ids.len(), catalog.episodes.len());
                    }
                })
            })
            .collect();
        for seed in 1..=12 {
            write_trace(&root.join(format!("shard-{}/ep-{seed}.trace", seed % 3)), seed);
        }
        write_summary(&root.join("shard-0"), &[3, 6, 9, 12], 0.5);
        for reader in readers {
            reader.join().expect("a reader panicked");
        }
        let shown = |c: &Catalog| -> Vec<String> {
            c.episodes.iter().map(|e| format!("{} {} {:?}", e.relative, e.from_summary, e.metrics)).collect()
        };
        assert_eq!(shown(&cache.catalog()), shown(&Catalog::scan(&root)));
        assert_eq!(cache.catalog().episodes.len(), 12);
    }

    #[test]
    fn the_cache_finds_what_the_full_scan_finds() {
        let outer = tempfile::tempdir().unwrap();
        let root = outer.path().join("served");
        let shard = root.join("a/shard-0");
        for seed in 1..=3 {
            write_trace(&shard.join(format!("ep-{seed}.trace")), seed);
        }
        write_summary(&shard, &[1, 2], 0.5);
        write_trace(&root.join("b/shard-0/ep-9.trace"), 9);
        std::fs::write(root.join("b/shard-0").join(SUMMARY_FILE), b"{not json").unwrap();
        std::fs::write(root.join("b/broken.trace"), b"not a trace").unwrap();
        // The same episode in an older copy of the run, and a link out of the directory.
        write_trace(&root.join("old/ep-1.trace"), 1);
        write_trace(&outer.path().join("secret.trace"), 7);
        std::os::unix::fs::symlink(outer.path().join("secret.trace"), root.join("a/link.trace")).unwrap();
        let summary_outside = outer.path().join("elsewhere");
        std::fs::create_dir_all(&summary_outside).unwrap();
        write_summary(&summary_outside, &[5], 0.0);
        write_trace(&root.join("c/ep-5.trace"), 5);
        std::os::unix::fs::symlink(summary_outside.join(SUMMARY_FILE), root.join("c").join(SUMMARY_FILE)).unwrap();
        let root = root.canonicalize().unwrap();

        let shown = |c: &Catalog| {
            let episodes: Vec<String> = c
                .episodes
                .iter()
                .map(|e| format!("{} {} {} {:?} {}", e.relative, e.id, e.from_summary, e.metrics, e.failure_class))
                .collect();
            (episodes, c.problems.clone())
        };
        let scanned = Catalog::scan(&root);
        let cached = CatalogCache::new(root.clone()).catalog();
        let (episodes, problems) = shown(&cached);
        assert!(!episodes.iter().any(|e| e.contains("ep-7")), "nothing outside the directory: {episodes:?}");
        assert!(episodes.iter().any(|e| e.starts_with("c/ep-5.trace ep-5 false")), "{episodes:?}");
        assert_eq!(problems.len(), 4, "{problems:?}");
        // The full scan reads a summary symlinked from outside; the walk does not. Apart from that, the same.
        let (mut scanned_episodes, mut scanned_problems) = shown(&scanned);
        for e in scanned_episodes.iter_mut().filter(|e| e.starts_with("c/")) {
            *e = episodes.iter().find(|c| c.starts_with("c/")).unwrap().clone();
        }
        assert_eq!(episodes, scanned_episodes);
        let partly_scored = |p: &String| p.starts_with("evals/shipping-delay/a: ") && p.contains("no shard summary");
        assert!(problems.iter().any(partly_scored), "{problems:?}");
        assert!(scanned_problems.iter().any(partly_scored), "{scanned_problems:?}");
        let mut problems = problems;
        problems.retain(|p| !partly_scored(p));
        scanned_problems.retain(|p| !partly_scored(p));
        assert_eq!(problems, scanned_problems);
    }

    #[test]
    fn a_variant_with_a_shard_missing_its_summary_is_noted_and_traces_alone_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        for seed in 1..=2 {
            write_trace(&root.join(format!("a/shard-0/ep-{seed}.trace")), seed);
        }
        write_summary(&root.join("a/shard-0"), &[1, 2], 0.5);
        // Shard 1 failed before writing its summary: its traces are all there is.
        for seed in 3..=5 {
            let mut episode = generate(&EpisodeShape { seed, steps: 3, tokens_per_step: 2, ..Default::default() });
            episode.header.episode_id = format!("ep-{seed}");
            episode.header.shard = 1;
            let path = root.join(format!("a/shard-1/ep-{seed}.trace"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, episode.write_to(Vec::new(), 3).unwrap()).unwrap();
        }
        let note = "evals/shipping-delay/a: 3 of 5 episodes (shard 1) have no shard summary; their metrics come from \
                    their traces, so the averages of scored metrics (tool_call_accuracy, plan_step_f1, \
                    memory_consistency) cover the other 2 only";
        // Before: the task page showed 5 episodes and shard 0's averages as if they were all five's.
        assert_eq!(Catalog::scan(&root).problems, [note]);
        assert_eq!(CatalogCache::new(root.clone()).catalog().problems, [note]);
        // Traces without any summary (not a run's output) are what they are: nothing to say.
        std::fs::remove_file(root.join("a/shard-0").join(SUMMARY_FILE)).unwrap();
        assert_eq!(Catalog::scan(&root).problems, Vec::<String>::new());
    }
}
