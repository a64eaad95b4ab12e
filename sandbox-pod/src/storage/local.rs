//! The local side: walking a directory of traces, atomic copies into a
//! local destination, and local reads, listings and deletions.
//!
//! Files are written under a temporary name in the target directory, synced
//! and then renamed, so a reader (or a crash) never sees half a trace.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use super::destination::Destination;
use super::error::{AttemptError, FailureKind, io_reason};
use super::s3::ObjectInfo;

/// Directories deeper than this below the walked root are reported, not entered.
const MAX_DEPTH: usize = 16;
/// A walk stops (with an error entry) after this many files.
const MAX_FILES: usize = 1_000_000;

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A file found by [`walk_files`].
#[derive(Debug, Clone)]
pub(crate) struct FoundFile {
    /// Its path.
    pub path: PathBuf,
    /// Its path relative to the walked root, `/`-separated.
    pub relative: String,
    /// Its size.
    pub size: u64,
    /// Its modification time, where the file system keeps one.
    pub modified: Option<SystemTime>,
}

/// Something in the walked tree that cannot be uploaded, and why.
#[derive(Debug, Clone)]
pub(crate) struct WalkProblem {
    pub path: PathBuf,
    pub relative: String,
    pub error: AttemptError,
}

/// Every regular file under `root` (following symbolic links to files, not
/// to directories), sorted by relative path, plus what could not be read.
pub(crate) async fn walk_files(root: &Path) -> (Vec<FoundFile>, Vec<WalkProblem>) {
    let root = root.to_path_buf();
    let joined = tokio::task::spawn_blocking(move || {
        let mut files = Vec::new();
        let mut problems = Vec::new();
        walk(&root, "", 0, &mut files, &mut problems);
        (files, problems)
    })
    .await;
    match joined {
        Ok((mut files, problems)) => {
            files.sort_by(|a: &FoundFile, b| a.relative.cmp(&b.relative));
            (files, problems)
        }
        Err(err) => (
            Vec::new(),
            vec![WalkProblem {
                path: PathBuf::new(),
                relative: String::new(),
                error: AttemptError::new(FailureKind::LocalIo, format!("the directory walk failed: {err}")),
            }],
        ),
    }
}

/// The files `relative` (`/`-separated) under `root`, in the order given,
/// plus those that cannot be read or are not regular files.
pub(crate) async fn stat_files(root: &Path, relative: &[String]) -> (Vec<FoundFile>, Vec<WalkProblem>) {
    let mut files = Vec::new();
    let mut problems = Vec::new();
    for relative in relative {
        let path = root.join(relative);
        match tokio::fs::metadata(&path).await {
            Ok(meta) if meta.is_file() => files.push(FoundFile {
                path,
                relative: relative.clone(),
                size: meta.len(),
                modified: meta.modified().ok(),
            }),
            Ok(_) => problems.push(WalkProblem {
                path,
                relative: relative.clone(),
                error: AttemptError::new(FailureKind::LocalIo, "not a regular file; not uploaded"),
            }),
            Err(err) => problems.push(WalkProblem {
                path,
                relative: relative.clone(),
                error: AttemptError::io("cannot stat", &err),
            }),
        }
    }
    (files, problems)
}

fn walk(dir: &Path, relative_dir: &str, depth: usize, files: &mut Vec<FoundFile>, problems: &mut Vec<WalkProblem>) {
    let problem = |path: &Path, relative: &str, error: AttemptError| WalkProblem {
        path: path.to_path_buf(),
        relative: relative.to_string(),
        error,
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) => {
            problems.push(problem(dir, relative_dir, AttemptError::io("cannot read the directory", &err)));
            return;
        }
    };
    let mut entries: Vec<_> = entries.collect();
    entries.sort_by_key(|e| e.as_ref().map(|e| e.file_name()).ok());
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => {
                problems.push(problem(dir, relative_dir, AttemptError::io("cannot read the directory", &err)));
                continue;
            }
        };
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            let err =
                AttemptError::new(FailureKind::LocalIo, "the file name is not UTF-8, so it cannot be an object key");
            problems.push(problem(&path, relative_dir, err));
            continue;
        };
        let relative = if relative_dir.is_empty() { name } else { format!("{relative_dir}/{name}") };
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(err) => {
                problems.push(problem(&path, &relative, AttemptError::io("cannot stat", &err)));
                continue;
            }
        };
        if meta.is_dir() {
            if depth + 1 >= MAX_DEPTH {
                let err =
                    AttemptError::new(FailureKind::LocalIo, format!("nested deeper than {MAX_DEPTH} directories"));
                problems.push(problem(&path, &relative, err));
            } else {
                walk(&path, &relative, depth + 1, files, problems);
            }
            continue;
        }
        let followed = if meta.file_type().is_symlink() { std::fs::metadata(&path) } else { Ok(meta) };
        match followed {
            Ok(meta) if meta.is_file() => {
                if files.len() >= MAX_FILES {
                    let err = AttemptError::new(FailureKind::LocalIo, format!("more than {MAX_FILES} files"));
                    problems.push(problem(&path, &relative, err));
                    return;
                }
                files.push(FoundFile { path, relative, size: meta.len(), modified: meta.modified().ok() });
            }
            Ok(_) => {
                let err = AttemptError::new(
                    FailureKind::LocalIo,
                    "not a regular file (a directory link, socket or device); not uploaded",
                );
                problems.push(problem(&path, &relative, err));
            }
            Err(err) => problems.push(problem(&path, &relative, AttemptError::io("cannot follow the link", &err))),
        }
    }
}

/// Writes `to` through `write`, which gets a fresh temporary file next to
/// `to` and returns it with the byte count; the file is synced and renamed
/// into place only when everything succeeded, and removed otherwise.
pub(crate) async fn write_atomically<F, Fut>(to: &Path, write: F) -> Result<u64, AttemptError>
where
    F: FnOnce(tokio::fs::File) -> Fut,
    Fut: Future<Output = (tokio::fs::File, std::io::Result<u64>)>,
{
    let parent = match to.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = to
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| AttemptError::new(FailureKind::LocalIo, format!("{} does not name a file", to.display())))?;
    tokio::fs::create_dir_all(&parent)
        .await
        .map_err(|err| AttemptError::io(&format!("cannot create {}", parent.display()), &err))?;
    let temp = parent.join(format!(
        ".{name}.basecamp-tmp-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let file = tokio::fs::File::create(&temp)
        .await
        .map_err(|err| AttemptError::io(&format!("cannot create {}", temp.display()), &err))?;
    let (file, written) = write(file).await;
    let result = match written {
        Ok(bytes) => match file.sync_all().await {
            Ok(()) => {
                drop(file);
                tokio::fs::rename(&temp, to)
                    .await
                    .map(|()| bytes)
                    .map_err(|err| AttemptError::io(&format!("cannot rename into {}", to.display()), &err))
            }
            Err(err) => Err(AttemptError::io("cannot sync the written file", &err)),
        },
        Err(err) => Err(write_error(&err)),
    };
    if result.is_err() {
        let _ = tokio::fs::remove_file(&temp).await;
    }
    result
}

/// A failure while copying: the network side of a download is retryable.
fn write_error(err: &std::io::Error) -> AttemptError {
    use std::io::ErrorKind as K;
    match err.kind() {
        K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof | K::TimedOut | K::BrokenPipe | K::Other => {
            AttemptError::new(FailureKind::Unreachable, format!("the transfer broke off: {}", io_reason(err)))
        }
        _ => AttemptError::io("cannot write", err),
    }
}

/// Copies a local file into place atomically; returns the bytes copied.
pub(crate) async fn copy_file(from: &Path, to: &Path) -> Result<u64, AttemptError> {
    let mut source = tokio::fs::File::open(from).await.map_err(|err| AttemptError::io("cannot read the file", &err))?;
    write_atomically(to, |file| async move {
        let mut file = file;
        let copied = tokio::io::copy(&mut source, &mut file).await;
        (file, copied)
    })
    .await
    .map_err(|mut err| {
        // Reads of the source are local, so never a network failure.
        if err.kind == FailureKind::Unreachable {
            err.kind = FailureKind::LocalIo;
        }
        err
    })
}

/// Reads a whole local file.
pub(crate) async fn read(path: &Path) -> Result<Vec<u8>, AttemptError> {
    tokio::fs::read(path).await.map_err(|err| AttemptError::io("cannot read the file", &err))
}

/// Every file under `dir`, keys relative to it; a missing directory is empty.
pub(crate) async fn list(dir: &Path) -> Result<Vec<ObjectInfo>, AttemptError> {
    match tokio::fs::metadata(dir).await {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(AttemptError::io("cannot stat the directory", &err)),
        Ok(meta) if !meta.is_dir() => {
            return Err(AttemptError::new(FailureKind::LocalIo, "it is not a directory"));
        }
        Ok(_) => {}
    }
    let (files, problems) = walk_files(dir).await;
    if let Some(first) = problems.into_iter().next() {
        return Err(AttemptError::new(first.error.kind, format!("{}: {}", first.path.display(), first.error.reason)));
    }
    Ok(files
        .into_iter()
        .map(|f| ObjectInfo {
            location: Destination::Local(f.path),
            relative: f.relative,
            size: f.size,
            last_modified: f.modified,
        })
        .collect())
}

/// The names of the directories directly in `dir`, sorted; a missing
/// directory has none. Files, links and names that are not UTF-8 (no
/// object key can name them) are left out.
pub(crate) async fn list_dirs(dir: &Path) -> Result<Vec<String>, AttemptError> {
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(AttemptError::io("cannot read the directory", &err)),
    };
    let mut names = Vec::new();
    loop {
        let entry = match entries.next_entry().await {
            Ok(Some(entry)) => entry,
            Ok(None) => break,
            Err(err) => return Err(AttemptError::io("cannot read the directory", &err)),
        };
        let is_dir = entry
            .file_type()
            .await
            .map_err(|err| AttemptError::io(&format!("cannot stat {}", entry.path().display()), &err))?
            .is_dir();
        if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// The file's size and modification time (following links); `None` when
/// there is no such file, or a directory, as for an S3 key with no object.
pub(crate) async fn head(path: &Path) -> Result<Option<ObjectInfo>, AttemptError> {
    match tokio::fs::metadata(path).await {
        Ok(meta) if meta.is_file() => Ok(Some(ObjectInfo {
            location: Destination::Local(path.to_path_buf()),
            relative: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            size: meta.len(),
            last_modified: meta.modified().ok(),
        })),
        Ok(_) => Ok(None),
        Err(err) if matches!(err.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => Ok(None),
        Err(err) => Err(AttemptError::io("cannot stat the file", &err)),
    }
}

/// Removes one file; one that is already gone counts as removed, as on S3.
pub(crate) async fn delete_file(path: &Path) -> Result<(), AttemptError> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(AttemptError::io("cannot remove the file", &err)),
    }
}

/// Removes `dir` and everything in it; returns how many files were removed.
pub(crate) async fn delete_dir(dir: &Path) -> Result<u64, AttemptError> {
    let files = list(dir).await?;
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(files.len() as u64),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(err) => Err(AttemptError::io("cannot remove the directory", &err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_write_leaves_neither_target_nor_temp() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("sub/out.trace");
        let result = write_atomically(&target, |file| async move {
            (file, Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)))
        })
        .await;
        let err = result.expect_err("the write failed");
        assert_eq!(err.kind, FailureKind::Unreachable);
        assert!(!target.exists());
        let left: Vec<_> = std::fs::read_dir(dir.path().join("sub")).expect("created").collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn walk_sorts_and_reports_unreadable_entries() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("b")).expect("mkdir");
        std::fs::write(dir.path().join("b/2.trace"), b"x").expect("write");
        std::fs::write(dir.path().join("a.trace"), b"yy").expect("write");
        std::os::unix::fs::symlink(dir.path().join("b"), dir.path().join("link-to-dir")).expect("symlink");
        let (files, problems) = walk_files(dir.path()).await;
        let names: Vec<_> = files.iter().map(|f| (f.relative.as_str(), f.size)).collect();
        assert_eq!(names, [("a.trace", 2), ("b/2.trace", 1)]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].relative, "link-to-dir");
    }
}
