//! Where the trace tools' inputs come from and how they are worked through.
//!
//! [`expand_inputs`] turns what a user typed (files, directories searched
//! recursively for `*.trace`, glob patterns with `*`, `?`, `[...]` and `**`)
//! into a sorted, de-duplicated list of files, without reading any of them.
//! [`for_each_ordered`] then works through that list on several threads, one
//! file per task, and hands each result back in input order, so output is
//! stable however the threads interleave and only a bounded window of results
//! is ever held in memory. Its `emit` may end the walk early
//! (`ControlFlow::Break`, e.g. once the output cannot be written): no new
//! item is started after that.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError, mpsc};

/// The file name suffix of traces found in directories.
pub const TRACE_SUFFIX: &str = ".trace";

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{0}: no such file or directory")]
    Missing(String),
    #[error("{0}: no files match this pattern")]
    NoMatch(String),
    #[error("{path}: cannot list directory: {cause}")]
    List { path: String, cause: io::Error },
    #[error("{0}: s3:// inputs are not supported by this command yet; download them first (aws s3 sync)")]
    S3(String),
    #[error("no input files given")]
    Nothing,
}

/// Expands files, directories and glob patterns into the files to process,
/// sorted within each argument and in argument order, each file once.
/// Directories contribute files whose names end with `suffix`; a file named
/// directly is taken whatever its name.
pub fn expand_inputs<S: AsRef<std::ffi::OsStr>>(args: &[S], suffix: &str) -> Result<Vec<PathBuf>, InputError> {
    Ok(expand_inputs_named(args, suffix)?.into_iter().map(|input| input.path).collect())
}

/// A file to process and its name relative to the argument that found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub path: PathBuf,
    /// `/`-separated: relative to the directory named, to the glob's fixed
    /// prefix, or the file name for a file named directly. Outputs that
    /// mirror their inputs (redact, archive) use it, so `a/shard-0/ep.trace`
    /// and `b/shard-0/ep.trace` stay apart.
    pub relative: String,
}

/// Like [`expand_inputs`], with each file's [`Input::relative`] name.
pub fn expand_inputs_named<S: AsRef<std::ffi::OsStr>>(args: &[S], suffix: &str) -> Result<Vec<Input>, InputError> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for arg in args {
        // A name that is not UTF-8 (a shell's expansion of a file so named)
        // is a path: only UTF-8 text can be an s3:// URL or a pattern.
        let arg_os = arg.as_ref();
        let text = arg_os.to_str();
        let shown = || arg_os.to_string_lossy().into_owned();
        let mut found = Vec::new();
        let base: PathBuf;
        if let Some(url) = text.filter(|t| t.starts_with("s3://")) {
            return Err(InputError::S3(url.to_string()));
        } else if let Some(pattern) = text.filter(|t| is_glob(t) && !Path::new(t).exists()) {
            expand_glob(pattern, suffix, &mut found)?;
            if found.is_empty() {
                return Err(InputError::NoMatch(pattern.to_string()));
            }
            base = PathBuf::from(glob_base(pattern));
        } else {
            let path = Path::new(arg_os);
            match fs::metadata(path) {
                Ok(meta) if meta.is_dir() => walk(path, suffix, &mut found)?,
                Ok(_) => found.push(path.to_path_buf()),
                // A name that is not UTF-8 is never a pattern: say so when it looks like one.
                Err(_) if text.is_none() && is_glob(&shown()) => {
                    return Err(InputError::Missing(format!(
                        "{} (not UTF-8, so taken as a path, not as a pattern)",
                        shown()
                    )));
                }
                Err(_) => return Err(InputError::Missing(shown())),
            }
            base = if path.is_dir() {
                path.to_path_buf()
            } else {
                path.parent().map(Path::to_path_buf).unwrap_or_default()
            };
        }
        for path in found {
            if seen.insert(path.clone()) {
                let relative = path.strip_prefix(&base).unwrap_or(&path);
                let relative: Vec<String> = relative
                    .components()
                    .filter(|c| matches!(c, std::path::Component::Normal(_)))
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(Input { relative: relative.join("/"), path });
            }
        }
    }
    if out.is_empty() && args.is_empty() {
        return Err(InputError::Nothing);
    }
    Ok(out)
}

/// The components of a glob pattern before the first wildcard.
fn glob_base(pattern: &str) -> String {
    let components: Vec<&str> = pattern.split('/').collect();
    let literal = components.iter().take_while(|c| !is_glob(c)).count();
    let base = components[..literal].join("/");
    if base.is_empty() && pattern.starts_with('/') { "/".to_string() } else { base }
}

fn is_glob(arg: &str) -> bool {
    arg.contains(['*', '?', '['])
}

/// Every file under `dir` whose name ends with `suffix`, sorted by path.
/// Symbolic links to directories are not followed (no cycles).
fn walk(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) -> Result<(), InputError> {
    let list = |cause| InputError::List { path: dir.display().to_string(), cause };
    let mut entries: Vec<_> = fs::read_dir(dir).map_err(list)?.collect::<Result<_, _>>().map_err(list)?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let kind = entry.file_type().map_err(list)?;
        if kind.is_dir() {
            walk(&path, suffix, out)?;
        } else if entry.file_name().to_string_lossy().ends_with(suffix)
            && fs::metadata(&path).is_ok_and(|m| m.is_file())
        {
            out.push(path);
        }
    }
    Ok(())
}

/// Files matching `pattern`: walks from the longest directory prefix without
/// wildcards and matches each path against the whole pattern. A directory
/// that matches contributes its traces.
fn expand_glob(pattern: &str, suffix: &str, out: &mut Vec<PathBuf>) -> Result<(), InputError> {
    let base = glob_base(pattern);
    let base = if base == "/" { String::new() } else { base };
    let root = if base.is_empty() {
        if pattern.starts_with('/') { "/".to_string() } else { ".".to_string() }
    } else {
        base.clone()
    };
    if !Path::new(&root).is_dir() {
        return Ok(());
    }
    let mut candidates = Vec::new();
    walk_all(Path::new(&root), &mut candidates)?;
    for path in candidates {
        let path = match path.strip_prefix(".") {
            Ok(relative) if base.is_empty() && !pattern.starts_with('/') => relative.to_path_buf(),
            _ => path,
        };
        // Matched as text; taken with its own bytes (a name that is not
        // UTF-8 would not be found again under its lossy spelling).
        if glob_match(pattern, &path.to_string_lossy()) {
            if path.is_dir() {
                walk(&path, suffix, out)?;
            } else {
                out.push(path);
            }
        }
    }
    Ok(())
}

/// Every file and directory under `dir` (not `dir` itself), sorted.
fn walk_all(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), InputError> {
    let list = |cause| InputError::List { path: dir.display().to_string(), cause };
    let mut entries: Vec<_> = fs::read_dir(dir).map_err(list)?.collect::<Result<_, _>>().map_err(list)?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        out.push(path.clone());
        if entry.file_type().map_err(list)?.is_dir() {
            walk_all(&path, out)?;
        }
    }
    Ok(())
}

/// Shell-style matching of a whole path: `*` and `?` within one component,
/// `[abc]` / `[a-z]` / `[!a]` classes, `**` as a component for any number of
/// directories.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    let path: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    match_components(&pattern, &path)
}

fn match_components(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| match_components(rest, &path[skip..])),
        Some((first, rest)) => match path.split_first() {
            Some((name, path_rest)) => {
                let p: Vec<char> = first.chars().collect();
                let n: Vec<char> = name.chars().collect();
                match_name(&p, &n) && match_components(rest, path_rest)
            }
            None => false,
        },
    }
}

fn match_name(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => (0..=n.len()).any(|skip| match_name(&p[1..], &n[skip..])),
        Some('?') => !n.is_empty() && match_name(&p[1..], &n[1..]),
        Some('[') => {
            let Some(close) = p.iter().skip(1).position(|&c| c == ']').map(|i| i + 1) else {
                return n.first() == Some(&'[') && match_name(&p[1..], &n[1..]);
            };
            let Some(&c) = n.first() else { return false };
            let class = &p[1..close];
            let (negate, class) = match class.first() {
                Some('!' | '^') => (true, &class[1..]),
                _ => (false, class),
            };
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == '-' {
                    hit |= class[i] <= c && c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == c;
                    i += 1;
                }
            }
            hit != negate && match_name(&p[close + 1..], &n[1..])
        }
        Some(&c) => n.first() == Some(&c) && match_name(&p[1..], &n[1..]),
    }
}

/// How many worker threads to use when the user did not say: one per core.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// What an `emit` of [`for_each_ordered`] returns: `ControlFlow::Break(())`
/// ends the walk, `ControlFlow::Continue(())` goes on. An `emit` that never
/// ends it may return `()`.
pub trait EmitFlow {
    fn into_control_flow(self) -> ControlFlow<()>;
}

impl EmitFlow for ControlFlow<()> {
    fn into_control_flow(self) -> ControlFlow<()> {
        self
    }
}

impl EmitFlow for () {
    fn into_control_flow(self) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

/// Runs `work` on every item on `jobs` threads and calls `emit` with each
/// result in item order, as soon as it and every earlier result are ready.
/// Workers stay at most a small window ahead of the oldest result not yet
/// emitted, so memory holds a few results, not all of them.
///
/// When `emit` breaks, no worker starts another item and `emit` is not
/// called again; the items already being worked on (at most one a worker)
/// are finished and dropped. If `emit` panics, the workers stop the same
/// way and the panic reaches the caller once they have.
pub fn for_each_ordered<T, R, W, E, F>(items: &[T], jobs: usize, work: W, mut emit: E)
where
    T: Sync,
    R: Send,
    W: Fn(&T) -> R + Sync,
    E: FnMut(usize, R) -> F,
    F: EmitFlow,
{
    let jobs = jobs.clamp(1, items.len().max(1));
    if jobs == 1 {
        for (i, item) in items.iter().enumerate() {
            if emit(i, work(item)).into_control_flow().is_break() {
                break;
            }
        }
        return;
    }
    let window = jobs * 4;
    let next = AtomicUsize::new(0);
    // Set, under `emitted`'s lock, when `emit` breaks: a worker waiting for
    // the window to move sees it on waking.
    let stopped = AtomicBool::new(false);
    let emitted = (Mutex::new(0usize), Condvar::new());
    let (tx, rx) = mpsc::channel::<(usize, R)>();
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, stopped, emitted, work) = (&next, &stopped, &emitted, &work);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= items.len() {
                        break;
                    }
                    {
                        let (lock, ready) = emitted;
                        let mut done = lock_ignoring_poison(lock);
                        while i >= *done + window && !stopped.load(Ordering::Relaxed) {
                            done = ready.wait(done).unwrap_or_else(PoisonError::into_inner);
                        }
                    }
                    if stopped.load(Ordering::Relaxed) || tx.send((i, work(&items[i]))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        // However this loop ends (a break, the last result, or `emit`
        // panicking), workers waiting for the window to move are told to
        // stop: `thread::scope` waits for them before it lets a panic reach
        // the caller, so one left waiting would hang the process instead.
        let _stop_workers = StopOnDrop { stopped: &stopped, emitted: &emitted };
        let mut pending = BTreeMap::new();
        let mut want = 0;
        for (i, result) in rx {
            pending.insert(i, result);
            while let Some(result) = pending.remove(&want) {
                let flow = emit(want, result).into_control_flow();
                want += 1;
                if flow.is_break() {
                    // Dropping `rx` fails the sends of the items in flight;
                    // `_stop_workers` wakes those waiting for the window.
                    return;
                }
                let (lock, ready) = &emitted;
                *lock_ignoring_poison(lock) = want;
                ready.notify_all();
            }
        }
    });
}

/// Tells [`for_each_ordered`]'s workers to stop when dropped: sets
/// `stopped` under the lock they wait on, so none misses the wake-up.
struct StopOnDrop<'a> {
    stopped: &'a AtomicBool,
    emitted: &'a (Mutex<usize>, Condvar),
}

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let (lock, ready) = self.emitted;
        let done = lock_ignoring_poison(lock);
        self.stopped.store(true, Ordering::Relaxed);
        drop(done);
        ready.notify_all();
    }
}

/// The lock holds a plain count that no panic can leave half-written.
fn lock_ignoring_poison<T>(lock: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matching() {
        assert!(glob_match("runs/*.trace", "runs/a.trace"));
        assert!(!glob_match("runs/*.trace", "runs/x/a.trace"));
        assert!(glob_match("runs/**/*.trace", "runs/x/y/a.trace"));
        assert!(glob_match("runs/**/*.trace", "runs/a.trace"));
        assert!(glob_match("ep-?.trace", "ep-1.trace"));
        assert!(!glob_match("ep-?.trace", "ep-10.trace"));
        assert!(glob_match("ep-[0-4].trace", "ep-3.trace"));
        assert!(!glob_match("ep-[!0-4].trace", "ep-3.trace"));
        assert!(glob_match("./a/*.trace", "a/b.trace"));
    }

    #[test]
    fn directories_globs_and_files_expand_sorted_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("b/deep")).unwrap();
        for name in ["b/deep/z.trace", "b/a.trace", "c.trace", "notes.txt", "b/summary.json"] {
            fs::write(root.join(name), b"x").unwrap();
        }
        let r = root.display().to_string();
        let got = expand_inputs(std::slice::from_ref(&r), TRACE_SUFFIX).unwrap();
        let rel: Vec<String> = got.iter().map(|p| p.strip_prefix(root).unwrap().display().to_string()).collect();
        assert_eq!(rel, ["b/a.trace", "b/deep/z.trace", "c.trace"]);

        let got =
            expand_inputs(&[format!("{r}/**/*.trace"), format!("{r}/c.trace"), format!("{r}/notes.txt")], ".trace")
                .unwrap();
        let rel: Vec<String> = got.iter().map(|p| p.strip_prefix(root).unwrap().display().to_string()).collect();
        assert_eq!(rel, ["b/a.trace", "b/deep/z.trace", "c.trace", "notes.txt"]);

        let named =
            expand_inputs_named(&[r.clone(), format!("{r}/b/*.trace"), format!("{r}/c.trace")], ".trace").unwrap();
        let rel: Vec<&str> = named.iter().map(|i| i.relative.as_str()).collect();
        assert_eq!(rel, ["b/a.trace", "b/deep/z.trace", "c.trace"], "first found, first named");
        let named = expand_inputs_named(&[format!("{r}/b/**/*.trace")], ".trace").unwrap();
        let rel: Vec<&str> = named.iter().map(|i| i.relative.as_str()).collect();
        assert_eq!(rel, ["a.trace", "deep/z.trace"]);

        assert!(matches!(expand_inputs(&[format!("{r}/nope")], ".trace"), Err(InputError::Missing(_))));
        assert!(matches!(expand_inputs(&[format!("{r}/*.nope")], ".trace"), Err(InputError::NoMatch(_))));
    }

    #[test]
    fn ordered_results_whatever_the_finishing_order() {
        let items: Vec<u64> = (0..200).collect();
        let mut got = Vec::new();
        for_each_ordered(
            &items,
            4,
            |&i| {
                std::thread::sleep(std::time::Duration::from_micros((200 - i) * 20));
                i * 2
            },
            |idx, r| got.push((idx, r)),
        );
        let want: Vec<(usize, u64)> = (0..200).map(|i| (i as usize, i * 2)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_break_starts_no_further_item_and_emits_nothing_more() {
        let items: Vec<u64> = (0..1000).collect();
        for jobs in [1, 4] {
            let worked = AtomicUsize::new(0);
            let mut emitted = Vec::new();
            for_each_ordered(
                &items,
                jobs,
                |&i| {
                    worked.fetch_add(1, Ordering::Relaxed);
                    i
                },
                |idx, _| {
                    emitted.push(idx);
                    ControlFlow::Break(())
                },
            );
            assert_eq!(emitted, [0], "{jobs} jobs");
            // One thread works on one item; several at most on the window
            // (4 items a worker) before the first result is emitted. Without
            // the break all 1000 are.
            let most = if jobs == 1 { 1 } else { jobs * 4 };
            let worked = worked.load(Ordering::Relaxed);
            assert!(worked <= most, "{jobs} jobs: {worked} items worked on");
        }
    }

    #[test]
    fn a_break_later_keeps_what_came_before_in_order() {
        let items: Vec<u64> = (0..300).collect();
        let mut got = Vec::new();
        for_each_ordered(
            &items,
            3,
            |&i| i,
            |idx, r| {
                got.push(r);
                if idx == 99 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
            },
        );
        assert_eq!(got, (0..100).collect::<Vec<u64>>());
    }

    #[test]
    fn a_panicking_emit_stops_the_workers_and_reaches_the_caller() {
        // Many more items than the window, so workers are waiting for it to
        // move when `emit` panics on the first result. Run on a thread of
        // its own: a hang fails the test instead of stalling it.
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let items: Vec<u64> = (0..1000).collect();
            let outcome = std::panic::catch_unwind(|| {
                for_each_ordered(&items, 4, |&i| i, |_, _| -> ControlFlow<()> { panic!("emit failed") });
            });
            let _ = done_tx.send(outcome.is_err());
        });
        let panicked = done_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("for_each_ordered returned within 20 s of its emit panicking");
        assert!(panicked, "the panic reaches the caller");
    }
}
