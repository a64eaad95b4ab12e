//! The directories a run creates for its output, so that a run refused
//! after it made them (a tool that cannot start, found once the services
//! it names are up) can take them away again: a refused run leaves no
//! directory behind holding only its services' logs. Only what did not
//! exist before the run is noted, so a directory the user made, or one
//! holding an earlier run, is never removed.

use std::path::{Path, PathBuf};

/// Directories this run created, outermost first.
#[derive(Debug, Default)]
pub(super) struct CreatedDirs(Vec<PathBuf>);

impl CreatedDirs {
    /// Creates `out_root` (and its missing parents), noting what it created.
    pub(super) fn create(out_root: &Path) -> anyhow::Result<Self> {
        let mut created = Self::default();
        created.note(out_root);
        crate::create_out_dir(out_root)?;
        Ok(created)
    }

    /// Notes `dir`, or the outermost of its parents that does not exist,
    /// before something creates it; nothing when it exists.
    pub(super) fn note(&mut self, dir: &Path) {
        let outermost_missing = dir
            .ancestors()
            .take_while(|ancestor| !ancestor.as_os_str().is_empty() && ancestor.symlink_metadata().is_err())
            .last();
        if let Some(missing) = outermost_missing
            && !self.0.iter().any(|noted| missing.starts_with(noted))
        {
            self.0.push(missing.to_path_buf());
        }
    }

    /// Removes everything noted, with what is in it: all of it this run's.
    pub(super) fn remove(self) {
        for dir in self.0.iter().rev() {
            // Best effort: the run's own error is what the user needs to see.
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_did_not_exist_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let existing = tmp.path().join("existing");
        std::fs::create_dir_all(existing.join("a/services")).unwrap();
        std::fs::write(existing.join("a/services/tracking.log"), "an earlier run's").unwrap();
        let mut created = CreatedDirs::create(&existing).unwrap();
        created.note(&existing.join("a/services"));
        created.note(&existing.join("b/services"));
        std::fs::create_dir_all(existing.join("b/services")).unwrap();
        created.remove();
        assert!(existing.join("a/services/tracking.log").is_file());
        assert!(!existing.join("b").exists());

        let fresh = tmp.path().join("x/y/z");
        let created = CreatedDirs::create(&fresh).unwrap();
        std::fs::write(fresh.join("f"), "").unwrap();
        created.remove();
        assert!(!tmp.path().join("x").exists());
        assert!(tmp.path().is_dir());
    }
}
