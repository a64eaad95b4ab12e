//! `basecamp-operator inject-sandbox`: copies the sandbox binary into a
//! shared volume, for the init container of pods that run a user's tools
//! image. The Basecamp image is distroless (no shell, no `cp`), so the
//! operator binary does the copy itself.

use std::path::Path;

/// Copies `from` to `to` (through a temporary file and a rename, so a
/// half-written binary is never executed) and makes it executable.
pub fn inject_sandbox(from: &Path, to: &Path) -> std::io::Result<u64> {
    let with_context = |action: &str, path: &Path, e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("cannot {action} {}: {e}", path.display()))
    };
    let tmp = to.with_extension("partial");
    let bytes = std::fs::copy(from, &tmp).map_err(|e| with_context("copy", from, e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| with_context("chmod", &tmp, e))?;
    }
    std::fs::rename(&tmp, to).map_err(|e| with_context("rename to", to, e))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_makes_executable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let from = dir.path().join("src-bin");
        std::fs::write(&from, b"\x7fELF...").expect("write");
        let to = dir.path().join("basecamp-sandbox");
        assert_eq!(inject_sandbox(&from, &to).expect("inject"), 7);
        assert_eq!(std::fs::read(&to).expect("read"), b"\x7fELF...");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&to).expect("meta").permissions().mode() & 0o777, 0o755);
        }
        let err = inject_sandbox(&dir.path().join("missing"), &to).expect_err("missing");
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
