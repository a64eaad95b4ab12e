//! What an upload did, file by file.
//!
//! An upload never stops at the first failure and never deletes anything:
//! each local file ends up either uploaded or failed with its error, and the
//! report lists them all so the caller can surface failures (console, status
//! condition, Event) and try again later from the local copies.

use std::fmt;
use std::path::PathBuf;

use super::destination::Destination;
use super::error::{FailureKind, Operation, StorageError};

/// How one file's upload ended.
#[derive(Debug, Clone)]
pub enum UploadStatus {
    /// The destination holds a complete copy.
    Uploaded,
    /// It did not get there; the local file is still in place.
    Failed(StorageError),
}

/// One local file and what happened to it.
#[derive(Debug, Clone)]
pub struct FileUpload {
    /// The local file (or the directory that could not be read).
    pub local: PathBuf,
    /// Where it was to go.
    pub target: Destination,
    /// Its size in bytes (0 when it could not be read).
    pub bytes: u64,
    /// How many attempts were made.
    pub attempts: u32,
    /// The outcome.
    pub status: UploadStatus,
}

impl FileUpload {
    /// A file that was never sent, failed with `reason` (no attempt made).
    pub fn not_attempted(local: PathBuf, target: Destination, bytes: u64, reason: impl Into<String>) -> FileUpload {
        let operation = Operation::Upload { from: local.clone(), to: target.to_string() };
        let error = StorageError::Failed { operation, kind: FailureKind::Other, reason: reason.into(), attempts: 0 };
        FileUpload { local, target, bytes, attempts: 0, status: UploadStatus::Failed(error) }
    }

    /// True when the file reached its destination.
    pub fn is_uploaded(&self) -> bool {
        matches!(self.status, UploadStatus::Uploaded)
    }

    /// The error, for failed files.
    pub fn error(&self) -> Option<&StorageError> {
        match &self.status {
            UploadStatus::Failed(err) => Some(err),
            UploadStatus::Uploaded => None,
        }
    }

    /// The outcome as a result, e.g. for `?`.
    pub fn into_result(self) -> Result<FileUpload, StorageError> {
        match self.status {
            UploadStatus::Failed(err) => Err(err),
            UploadStatus::Uploaded => Ok(self),
        }
    }
}

/// The outcome of an `upload_dir`: one entry per file, in path order.
#[derive(Debug, Clone)]
pub struct UploadReport {
    /// The directory the files went to.
    pub destination: Destination,
    /// Every file found, uploaded or not.
    pub files: Vec<FileUpload>,
}

impl UploadReport {
    /// True when every file was uploaded (also when there were none).
    pub fn is_complete(&self) -> bool {
        self.files.iter().all(FileUpload::is_uploaded)
    }

    /// The files that reached the destination.
    pub fn uploaded(&self) -> impl Iterator<Item = &FileUpload> {
        self.files.iter().filter(|f| f.is_uploaded())
    }

    /// The files that did not, with their errors.
    pub fn failed(&self) -> impl Iterator<Item = (&FileUpload, &StorageError)> {
        self.files.iter().filter_map(|f| f.error().map(|e| (f, e)))
    }

    /// The report as JSON, for a shard's `summary.json`: per file its local
    /// path, target, size, attempts, and on failure the error's category
    /// and message.
    pub fn to_json(&self) -> serde_json::Value {
        let files: Vec<serde_json::Value> = self
            .files
            .iter()
            .map(|f| {
                let mut entry = serde_json::json!({
                    "local": f.local.display().to_string(),
                    "target": f.target.to_string(),
                    "bytes": f.bytes,
                    "attempts": f.attempts,
                    "status": if f.is_uploaded() { "uploaded" } else { "failed" },
                });
                if let (Some(err), Some(map)) = (f.error(), entry.as_object_mut()) {
                    map.insert("category".into(), err.category().into());
                    map.insert("error".into(), err.to_string().into());
                }
                entry
            })
            .collect();
        serde_json::json!({
            "destination": self.destination.to_string(),
            "uploaded": self.uploaded().count(),
            "failed": self.failed().count(),
            "files": files,
        })
    }
}

/// One line of totals, then one line per failed file.
impl fmt::Display for UploadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let uploaded = self.uploaded().count();
        let bytes: u64 = self.uploaded().map(|f| f.bytes).sum();
        write!(f, "uploaded {uploaded} of {} files ({bytes} bytes) to {}", self.files.len(), self.destination)?;
        let failed = self.files.len() - uploaded;
        if failed > 0 {
            write!(f, "; {failed} failed, their local copies are kept:")?;
            for (_, err) in self.failed() {
                write!(f, "\n  {err}")?;
            }
        }
        Ok(())
    }
}
