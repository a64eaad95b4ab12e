//! `basecamp serve s3://BUCKET/PREFIX`: the prefix's traces and summaries
//! (`*.trace`, `*.json`) mirrored into a local directory, then served from
//! there like any run directory. The mirror is refreshed in the background;
//! an object is fetched again only when its size or its `LastModified`
//! changed (a mirrored file's modification time is set to the object's
//! `LastModified`, so an object rewritten with the same size is noticed).
//! A mirrored file whose object is gone from a listing is removed, so a
//! deleted object stops being served; a listing that fails removes nothing
//! (S3 being down must not empty the view). Only files of the kinds mirrored
//! are ever removed. Keys are checked segment by segment before they become
//! local paths, so no key (`a/../..`) can write outside the mirror. The
//! mirror directory is marked (`.basecamp-mirror`); a directory that holds
//! files and no mark is refused, since a refresh would delete its traces.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use basecamp_sandbox::storage::{Destination, Storage, StorageConfig, validate_segment};

pub struct Mirror {
    storage: Storage,
    prefix: Destination,
    pub dir: PathBuf,
}

/// What one refresh did.
#[derive(Debug, Default)]
pub struct Synced {
    pub fetched: usize,
    pub unchanged: usize,
    /// Mirrored files removed because their objects are gone.
    pub removed: usize,
    /// Keys that were not mirrored, and why.
    pub refused: Vec<String>,
    /// Mirrored files whose objects are gone but that could not be removed, and why.
    pub not_removed: Vec<String>,
}

/// The local path of a key relative to the prefix, or why it has none.
pub fn local_path(dir: &Path, relative: &str) -> Result<PathBuf, String> {
    let mut path = dir.to_path_buf();
    for segment in relative.split('/') {
        validate_segment("key", segment).map_err(|e| e.to_string())?;
        path.push(segment);
    }
    Ok(path)
}

fn mirrored(relative: &str) -> bool {
    relative.ends_with(".trace") || relative.ends_with(".json")
}

impl Mirror {
    /// A mirror of `url` (an `s3://` prefix) in `dir`, created when missing.
    pub fn new(url: &str, dir: PathBuf) -> Result<Mirror> {
        let prefix = Destination::parse(url)?;
        if !prefix.is_s3() {
            bail!("{url}: not an s3:// prefix");
        }
        crate::create_out_dir(&dir).context("the mirror directory (--cache)")?;
        claim(&dir, url)?;
        Ok(Mirror { storage: Storage::new(StorageConfig::from_env()), prefix, dir })
    }

    /// The prefix mirrored, as its `s3://` URL.
    pub fn url(&self) -> String {
        self.prefix.to_string()
    }

    /// The `s3://` URL of the object mirrored at `relative` (`/`-separated, under [`Self::dir`]).
    pub fn url_of(&self, relative: &str) -> String {
        match self.prefix.join(relative) {
            Ok(object) => object.to_string(),
            // Not a key this mirror would have written; named as it is.
            Err(_) => format!("{}/{relative}", self.url().trim_end_matches('/')),
        }
    }

    pub async fn sync(&self) -> Result<Synced> {
        let objects = self.storage.list(&self.prefix).await.with_context(|| format!("cannot list {}", self.prefix))?;
        let mut synced = Synced::default();
        let mut wanted = Vec::new();
        for object in objects.iter().filter(|o| mirrored(&o.relative)) {
            match local_path(&self.dir, &object.relative) {
                Ok(path) => wanted.push((object, path)),
                Err(why) => synced.refused.push(format!("{}: {why}", object.location)),
            }
        }
        // Before fetching, so that an object that cannot be fetched does not
        // keep the deleted ones in the view.
        let listed: HashSet<&Path> = wanted.iter().map(|(_, path)| path.as_path()).collect();
        remove_unlisted(&self.dir, &listed, &mut synced);
        for (object, local) in wanted {
            let same = |m: std::fs::Metadata| {
                m.len() == object.size
                    && object.last_modified.is_none_or(|t| m.modified().is_ok_and(|local| local == t))
            };
            if std::fs::metadata(&local).is_ok_and(same) {
                synced.unchanged += 1;
                continue;
            }
            if let Some(parent) = local.parent() {
                std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
            }
            self.storage
                .fetch_to_file(&object.location, &local)
                .await
                .with_context(|| format!("cannot fetch {}", object.location))?;
            if let Some(modified) = object.last_modified {
                std::fs::File::options()
                    .write(true)
                    .open(&local)
                    .and_then(|f| f.set_modified(modified))
                    .with_context(|| format!("cannot set the modification time of {}", local.display()))?;
            }
            synced.fetched += 1;
        }
        Ok(synced)
    }
}

/// The file that marks a directory as a mirror this command made (it holds
/// the prefix's URL, for people).
pub const MARKER: &str = ".basecamp-mirror";

/// Makes `dir` a mirror, or refuses it: a refresh removes every `.trace` and
/// `.json` file whose object is gone, so a directory that holds files and no
/// [`MARKER`] (a run directory given as `--cache` by mistake) would lose
/// them. An empty directory, or one an earlier mirror marked, is taken.
fn claim(dir: &Path, url: &str) -> Result<()> {
    let marker = dir.join(MARKER);
    if marker.exists() {
        return Ok(());
    }
    let mut entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read the mirror directory {}", dir.display()))?;
    if let Some(entry) = entries.next() {
        let first = entry.map(|e| e.file_name().to_string_lossy().into_owned()).unwrap_or_default();
        bail!(
            "{} is not empty (it holds {first:?}, ...) and is not a mirror basecamp made (no {MARKER} file): a \
             mirror's refresh removes the .trace and .json files whose objects are gone, so it would delete this \
             directory's own; give a new or empty directory",
            dir.display()
        );
    }
    std::fs::write(&marker, format!("{url}\n"))
        .with_context(|| format!("cannot write {} (the mirror's marker)", marker.display()))
}

/// Removes every file under `dir` of a kind mirrored that is not in
/// `listed`: the copies of objects deleted since they were fetched. Only
/// regular files are removed and symlinks are not followed (the mirror
/// writes neither symlinks nor anything but `.trace` and `.json` files), so
/// nothing else in the directory, and nothing outside it, is touched.
fn remove_unlisted(dir: &Path, listed: &HashSet<&Path>, synced: &mut Synced) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) => {
            synced.not_removed.push(format!("{}: cannot read the directory: {err}", dir.display()));
            return;
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => {
                synced.not_removed.push(format!("{}: cannot read the directory: {err}", dir.display()));
                continue;
            }
        };
        let path = entry.path();
        // The type of the entry itself: a symlink is neither a file nor a directory here.
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            remove_unlisted(&path, listed, synced);
        } else if kind.is_file() && entry.file_name().to_str().is_some_and(mirrored) && !listed.contains(path.as_path())
        {
            match std::fs::remove_file(&path) {
                Ok(()) => synced.removed += 1,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => synced.not_removed.push(format!("{}: cannot remove it: {err}", path.display())),
            }
        }
    }
}

/// An `s3://` prefix fetched once into a new temporary directory, which is
/// removed when this is dropped: for the commands that read a prefix as a
/// directory (`trace report`, `ab compare`).
pub struct TempMirror {
    pub mirror: Mirror,
    _removed: RemovedWhenDropped,
}

/// A directory removed, with what it holds, when this is dropped.
pub struct RemovedWhenDropped(pub Option<std::path::PathBuf>);

impl Drop for RemovedWhenDropped {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl TempMirror {
    /// Fetches `url`'s traces and summaries; `what` names the directory
    /// (`basecamp-<what>-<pid>-<n>`). Keys refused are warned about; a prefix
    /// with nothing to fetch is an error.
    pub fn fetch(url: &str, what: &str) -> Result<TempMirror> {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("basecamp-{what}-{}-{n}", std::process::id()));
        let fetched = TempMirror { mirror: Mirror::new(url, dir.clone())?, _removed: RemovedWhenDropped(Some(dir)) };
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the runtime")?;
        let synced = runtime.block_on(fetched.mirror.sync())?;
        for refused in &synced.refused {
            basecamp_sandbox::stderr_line!("warning: not fetched: {refused}");
        }
        if synced.fetched == 0 {
            bail!("{url}: no .trace or .json objects under this prefix");
        }
        Ok(fetched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cannot_leave_the_mirror() {
        let dir = Path::new("/mirror");
        assert_eq!(local_path(dir, "2026/a/shard-0/ep.trace").unwrap(), Path::new("/mirror/2026/a/shard-0/ep.trace"));
        for key in ["../x.trace", "a/../../x.trace", "a//x.trace", "./x.trace", "a\\..\\x.trace", ""] {
            assert!(local_path(dir, key).is_err(), "{key:?} must be refused");
        }
    }

    #[test]
    fn a_directory_holding_files_is_not_taken_as_a_mirror_but_an_empty_or_marked_one_is() {
        let outer = tempfile::tempdir().unwrap();
        let runs = outer.path().join("runs");
        std::fs::create_dir_all(runs.join("shard-0")).unwrap();
        std::fs::write(runs.join("shard-0/ep.trace"), b"x").unwrap();
        // Before: taken, and its first refresh removed ep.trace (no object lists it).
        let refused = claim(&runs, "s3://b/p").unwrap_err().to_string();
        assert!(
            refused.contains("runs is not empty") && refused.contains("give a new or empty directory"),
            "{refused}"
        );
        assert!(!runs.join(MARKER).exists());

        let fresh = outer.path().join("fresh");
        std::fs::create_dir_all(&fresh).unwrap();
        claim(&fresh, "s3://b/p").unwrap();
        assert_eq!(std::fs::read_to_string(fresh.join(MARKER)).unwrap(), "s3://b/p\n");
        std::fs::write(fresh.join("ep.trace"), b"x").unwrap();
        claim(&fresh, "s3://b/p").expect("a mirror made earlier is taken again");
    }

    #[test]
    fn only_mirrored_kinds_whose_objects_are_gone_are_removed() {
        let outer = tempfile::tempdir().unwrap();
        let outside = outer.path().join("outside");
        let dir = outer.path().join("mirror");
        std::fs::create_dir_all(dir.join("a/shard-0")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        for file in ["a/shard-0/kept.trace", "a/shard-0/gone.trace", "a/shard-0/summary.json", "notes.txt"] {
            std::fs::write(dir.join(file), b"x").unwrap();
        }
        std::fs::write(dir.join("a/shard-0/.gone.trace.basecamp-tmp-1-2"), b"x").unwrap();
        std::fs::write(outside.join("secret.trace"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.join("secret.trace"), dir.join("link.trace")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("linked-dir")).unwrap();

        let kept = dir.join("a/shard-0/kept.trace");
        let listed = HashSet::from([kept.as_path()]);
        let mut synced = Synced::default();
        remove_unlisted(&dir, &listed, &mut synced);

        assert_eq!(synced.removed, 2, "{synced:?}");
        assert!(synced.not_removed.is_empty(), "{synced:?}");
        assert!(kept.exists());
        assert!(!dir.join("a/shard-0/gone.trace").exists() && !dir.join("a/shard-0/summary.json").exists());
        for untouched in ["notes.txt", "a/shard-0/.gone.trace.basecamp-tmp-1-2", "link.trace"] {
            assert!(dir.join(untouched).symlink_metadata().is_ok(), "{untouched} must stay");
        }
        assert!(outside.join("secret.trace").exists(), "nothing outside the mirror is removed");
    }
}
