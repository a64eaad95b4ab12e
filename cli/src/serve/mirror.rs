//! `basecamp serve s3://BUCKET/PREFIX`: the prefix's traces and summaries
//! (`*.trace`, `*.json`) mirrored into a local directory, then served from
//! there like any run directory. The mirror is refreshed in the background;
//! an object is fetched again only when its size or its `LastModified`
//! changed (a mirrored file's modification time is set to the object's
//! `LastModified`, so an object rewritten with the same size is noticed).
//! Keys are checked
//! segment by segment before they become local paths, so no key (`a/../..`)
//! can write outside the mirror.

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
    /// Keys that were not mirrored, and why.
    pub refused: Vec<String>,
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
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the mirror directory {}", dir.display()))?;
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
        for object in objects.iter().filter(|o| mirrored(&o.relative)) {
            let local = match local_path(&self.dir, &object.relative) {
                Ok(path) => path,
                Err(why) => {
                    synced.refused.push(format!("{}: {why}", object.location));
                    continue;
                }
            };
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

/// An `s3://` prefix fetched once into a new temporary directory, which is
/// removed when this is dropped: for the commands that read a prefix as a
/// directory (`trace report`, `ab compare`).
pub struct TempMirror {
    pub mirror: Mirror,
}

impl TempMirror {
    /// Fetches `url`'s traces and summaries; `what` names the directory
    /// (`basecamp-<what>-<pid>-<n>`). Keys refused are warned about; a prefix
    /// with nothing to fetch is an error.
    pub fn fetch(url: &str, what: &str) -> Result<TempMirror> {
        static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("basecamp-{what}-{}-{n}", std::process::id()));
        let fetched = TempMirror { mirror: Mirror::new(url, dir)? };
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the runtime")?;
        let synced = runtime.block_on(fetched.mirror.sync())?;
        for refused in &synced.refused {
            eprintln!("warning: not fetched: {refused}");
        }
        if synced.fetched == 0 {
            bail!("{url}: no .trace or .json objects under this prefix");
        }
        Ok(fetched)
    }
}

impl Drop for TempMirror {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.mirror.dir);
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
}
