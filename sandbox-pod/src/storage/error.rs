//! The storage module's one error type.
//!
//! Messages read "failed to upload /tmp/x/ep-1.trace to s3://bucket/key:
//! connection refused (after 4 attempts)". [`StorageError::category`] is a
//! fixed PascalCase name for Event reasons and metric labels; it names the
//! cause (`S3Unreachable`, `S3AccessDenied`, ...) because that is what a user
//! acts on, while the operation and the paths stay in the message.

use std::fmt;
use std::path::PathBuf;

/// What went wrong, as a bounded set (one [`StorageError::category`] each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// No connection to the endpoint (refused, reset, DNS, TLS).
    Unreachable,
    /// A connect, read or attempt timeout.
    Timeout,
    /// Wrong or missing credentials, a bad signature, or a denying policy.
    AccessDenied,
    /// The bucket does not exist.
    NoSuchBucket,
    /// The object (or local file) does not exist.
    NotFound,
    /// The server asked us to slow down (HTTP 429, `SlowDown`).
    Throttled,
    /// An HTTP 5xx answer.
    ServerError,
    /// Reading or writing a local file failed.
    LocalIo,
    /// Anything else the server refused (a 4xx we do not know) or a malformed answer.
    Other,
}

impl FailureKind {
    /// Whether trying again later can succeed. Credentials, missing buckets
    /// and missing objects do not fix themselves, so they fail at once.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Unreachable | Self::Timeout | Self::Throttled | Self::ServerError)
    }

    fn category(self) -> &'static str {
        match self {
            Self::Unreachable => "S3Unreachable",
            Self::Timeout => "S3Timeout",
            Self::AccessDenied => "S3AccessDenied",
            Self::NoSuchBucket => "S3NoSuchBucket",
            Self::NotFound => "ObjectNotFound",
            Self::Throttled => "S3Throttled",
            Self::ServerError => "S3ServerError",
            Self::LocalIo => "LocalIo",
            Self::Other => "StorageRequestFailed",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Self::AccessDenied => {
                "; check the S3 credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, the AWS profile, \
                 or the pod's web identity) and the bucket policy"
            }
            Self::NoSuchBucket => "; create the bucket or fix the bucket name in the destination",
            _ => "",
        }
    }
}

/// The operation that failed, with the places it involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// Copying a local file to a destination (S3 object or local file).
    Upload {
        /// The local file.
        from: PathBuf,
        /// `s3://bucket/key` or a local path.
        to: String,
    },
    /// Reading an object (or local file) into memory or into a local file.
    Fetch {
        /// `s3://bucket/key` or a local path.
        from: String,
        /// The local file written, when fetching to a file.
        to: Option<PathBuf>,
    },
    /// Listing a prefix.
    List {
        /// `s3://bucket/prefix` or a local directory.
        of: String,
    },
    /// Deleting one object (or local file).
    Delete {
        /// `s3://bucket/key` or a local path.
        object: String,
    },
    /// Deleting everything under a prefix.
    DeletePrefix {
        /// `s3://bucket/prefix` or a local directory.
        of: String,
    },
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Upload { from, to } => write!(f, "upload {} to {to}", from.display()),
            Self::Fetch { from, to: None } => write!(f, "fetch {from}"),
            Self::Fetch { from, to: Some(to) } => write!(f, "fetch {from} to {}", to.display()),
            Self::List { of } => write!(f, "list {of}"),
            Self::Delete { object } => write!(f, "delete {object}"),
            Self::DeletePrefix { of } => write!(f, "delete everything under {of}"),
        }
    }
}

/// Every way the storage module fails.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    /// A location (a destination, or a source to read) that is neither `s3://bucket[/prefix]` nor a usable path.
    #[error("invalid location {input:?}: {reason}")]
    InvalidDestination {
        /// What the user wrote.
        input: String,
        /// What is wrong and how to write it instead.
        reason: String,
    },
    /// An `s3://` URI with `?...`: S3 URIs name a bucket and a key only.
    #[error(
        "invalid location {input:?}: S3 URIs cannot carry a query string ({query:?}); \
         write s3://BUCKET/PREFIX and pin the data version with dataPipeline.version instead"
    )]
    QueryString {
        /// What the user wrote.
        input: String,
        /// The part after `?`.
        query: String,
    },
    /// A namespace, task, variant, shard or file name that cannot be one key segment.
    #[error("invalid {field} {value:?} for an object key: {reason}")]
    InvalidKeySegment {
        /// Which segment (`namespace`, `task`, `variant`, `file`, ...).
        field: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A request that would be unsafe to run, such as deleting a whole bucket.
    #[error("refusing to {operation}: {reason}")]
    Refused {
        /// What was asked.
        operation: Operation,
        /// Why it was refused and what to do instead.
        reason: String,
    },
    /// An operation that was tried and failed.
    #[error("failed to {operation}: {reason} (after {attempts} attempt{plural}){hint}",
        plural = if *attempts == 1 { "" } else { "s" }, hint = kind.hint())]
    Failed {
        /// What was being done, and where.
        operation: Operation,
        /// The cause, as a bounded kind.
        kind: FailureKind,
        /// The cause in words (`connection refused`, `InvalidAccessKeyId: ... (HTTP 403)`).
        reason: String,
        /// How many times it was tried.
        attempts: u32,
    },
}

impl StorageError {
    /// A fixed PascalCase name for this error, for Event reasons and metric
    /// labels (never the formatted message, whose cardinality is unbounded).
    pub fn category(&self) -> &'static str {
        match self {
            Self::InvalidDestination { .. } => "InvalidDestination",
            Self::QueryString { .. } => "S3UriQuery",
            Self::InvalidKeySegment { .. } => "InvalidObjectKey",
            Self::Refused { .. } => "StorageRequestRefused",
            Self::Failed { kind, .. } => kind.category(),
        }
    }

    /// The failure kind, for errors that come from trying an operation.
    pub fn kind(&self) -> Option<FailureKind> {
        match self {
            Self::Failed { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// How many attempts were made (0 when nothing was tried).
    pub fn attempts(&self) -> u32 {
        match self {
            Self::Failed { attempts, .. } => *attempts,
            _ => 0,
        }
    }

    /// Whether trying again later can succeed.
    pub fn is_retryable(&self) -> bool {
        self.kind().is_some_and(FailureKind::is_retryable)
    }
}

/// One failed attempt, before the retry loop turns it into a [`StorageError`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptError {
    pub kind: FailureKind,
    pub reason: String,
}

impl AttemptError {
    pub fn new(kind: FailureKind, reason: impl Into<String>) -> Self {
        Self { kind, reason: reason.into() }
    }

    /// A local I/O error, worded without the OS's "(os error N)" suffix.
    pub fn io(context: &str, err: &std::io::Error) -> Self {
        let kind =
            if err.kind() == std::io::ErrorKind::NotFound { FailureKind::NotFound } else { FailureKind::LocalIo };
        Self::new(kind, format!("{context}: {}", io_reason(err)))
    }

    pub fn into_error(self, operation: Operation, attempts: u32) -> StorageError {
        StorageError::Failed { operation, kind: self.kind, reason: self.reason, attempts }
    }
}

/// An I/O error in lower-case words, e.g. `connection refused`.
pub(crate) fn io_reason(err: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    let words = match err.kind() {
        K::NotFound => "no such file or directory",
        K::PermissionDenied => "permission denied",
        K::ConnectionRefused => "connection refused",
        K::ConnectionReset => "connection reset",
        K::ConnectionAborted => "connection aborted",
        K::NotConnected => "not connected",
        K::AddrNotAvailable => "address not available",
        K::BrokenPipe => "broken pipe",
        K::TimedOut => "timed out",
        K::UnexpectedEof => "unexpected end of stream",
        K::StorageFull => "no space left on device",
        K::IsADirectory => "is a directory",
        K::NotADirectory => "not a directory",
        K::ReadOnlyFilesystem => "read-only file system",
        _ => return err.to_string(),
    };
    words.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_operation_places_cause_and_attempts() {
        let err = AttemptError::new(FailureKind::Unreachable, "connection refused").into_error(
            Operation::Upload { from: PathBuf::from("/tmp/x/ep-1.trace"), to: "s3://bucket/key".into() },
            4,
        );
        assert_eq!(
            err.to_string(),
            "failed to upload /tmp/x/ep-1.trace to s3://bucket/key: connection refused (after 4 attempts)"
        );
        assert_eq!(err.category(), "S3Unreachable");
        assert!(err.is_retryable());
    }

    #[test]
    fn one_attempt_is_singular_and_access_denied_says_what_to_check() {
        let err = AttemptError::new(FailureKind::AccessDenied, "InvalidAccessKeyId (HTTP 403)")
            .into_error(Operation::List { of: "s3://b/p".into() }, 1);
        let text = err.to_string();
        assert!(
            text.starts_with("failed to list s3://b/p: InvalidAccessKeyId (HTTP 403) (after 1 attempt); check"),
            "{text}"
        );
        assert_eq!(err.category(), "S3AccessDenied");
        assert!(!err.is_retryable());
    }

    #[test]
    fn categories_are_pascal_case() {
        let kinds = [
            FailureKind::Unreachable,
            FailureKind::Timeout,
            FailureKind::AccessDenied,
            FailureKind::NoSuchBucket,
            FailureKind::NotFound,
            FailureKind::Throttled,
            FailureKind::ServerError,
            FailureKind::LocalIo,
            FailureKind::Other,
        ];
        for kind in kinds {
            let category = kind.category();
            assert!(category.chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{category}");
            assert!(category.chars().all(|c| c.is_ascii_alphanumeric()), "{category}");
        }
    }
}
