//! Where traces go: `s3://bucket/prefix` or a local directory.
//!
//! A [`Destination`] is parsed once from the user's string (the task's
//! `traces.destination`, a test set location, a `basecamp trace` argument)
//! and then only extended with validated key segments ([`Destination::join`],
//! [`Destination::for_shard`]), so every object key it names is well formed.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use basecamp_api::storage::{S3UriError, StorageLocation};

use super::error::StorageError;
use super::partition::{ShardPartition, validate_segment};

/// A bucket and a key (or key prefix) in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct S3Location {
    /// The bucket name.
    pub bucket: String,
    /// The key or prefix, without leading or trailing `/` (empty for the bucket's root).
    pub key: String,
}

impl S3Location {
    /// The key as a "directory" prefix: `key/`, or empty for the bucket's root.
    pub fn dir_prefix(&self) -> String {
        if self.key.is_empty() { String::new() } else { format!("{}/", self.key) }
    }
}

impl fmt::Display for S3Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// An S3 location or a local path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    /// `s3://bucket/key`.
    S3(S3Location),
    /// A local file or directory.
    Local(PathBuf),
}

impl Destination {
    /// Parses `s3://bucket[/prefix]` or a local path with the API's one
    /// parser ([`StorageLocation::parse`]): refuses an S3 URI without a
    /// bucket, with a query string (use `dataPipeline.version`), a fragment,
    /// whitespace, or `.`/`..`/empty key segments; and any other
    /// `scheme://`, so that `gs://x` does not silently become a local directory.
    pub fn parse(input: &str) -> Result<Self, StorageError> {
        if input.is_empty() {
            return Err(StorageError::InvalidDestination {
                input: String::new(),
                reason: "it is empty; write s3://BUCKET/PREFIX or a local directory".into(),
            });
        }
        match StorageLocation::parse(input) {
            Ok(StorageLocation::Local(path)) => Ok(Self::Local(path)),
            Ok(StorageLocation::S3(uri)) => {
                let key = uri.key.strip_suffix('/').unwrap_or(&uri.key).to_string();
                Ok(Self::S3(S3Location { bucket: uri.bucket, key }))
            }
            Err(S3UriError::Query { query, .. }) => Err(StorageError::QueryString { input: input.to_string(), query }),
            Err(e) => Err(StorageError::InvalidDestination { input: input.to_string(), reason: e.reason() }),
        }
    }

    /// Parses a prefix a user typed, as [`Destination::parse`] after dropping
    /// its trailing `/`s (`s3://b/runs//`, `out/`). The scheme's own slashes
    /// stay: `s3://` is refused for want of a bucket, not read as a local
    /// directory named `s3:`.
    pub fn parse_prefix(input: &str) -> Result<Self, StorageError> {
        let trimmed = input.trim_end_matches('/');
        match input.strip_prefix("s3://") {
            Some(_) if !trimmed.starts_with("s3://") => Self::parse("s3://"),
            _ => Self::parse(trimmed),
        }
    }

    /// True for `s3://` destinations.
    pub fn is_s3(&self) -> bool {
        matches!(self, Self::S3(_))
    }

    /// This destination extended by a relative key such as `ep-1.trace` or
    /// `2026/01/05/ns/task`: each `/`-separated segment is validated (no
    /// empty, `.` or `..` segment, no control characters).
    pub fn join(&self, relative: &str) -> Result<Destination, StorageError> {
        let segments: Vec<&str> = relative.split('/').collect();
        for segment in &segments {
            validate_segment("key segment", segment)?;
        }
        Ok(self.join_validated(&segments))
    }

    /// The directory of one shard's files:
    /// `<dest>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>`.
    pub fn for_shard(&self, partition: &ShardPartition) -> Destination {
        self.join_validated(&partition.segments())
    }

    /// The place of one file of a shard: `for_shard(partition)/<file>`.
    pub fn for_shard_file(&self, partition: &ShardPartition, file: &str) -> Result<Destination, StorageError> {
        validate_segment("file", file)?;
        Ok(self.for_shard(partition).join_validated(&[file]))
    }

    /// Segments already validated (by [`validate_segment`] or [`ShardPartition`]).
    pub(crate) fn join_validated<S: AsRef<str>>(&self, segments: &[S]) -> Destination {
        match self {
            Self::S3(location) => {
                let mut key = location.key.clone();
                for segment in segments {
                    if !key.is_empty() {
                        key.push('/');
                    }
                    key.push_str(segment.as_ref());
                }
                Self::S3(S3Location { bucket: location.bucket.clone(), key })
            }
            Self::Local(path) => {
                let mut path = path.clone();
                for segment in segments {
                    path.push(segment.as_ref());
                }
                Self::Local(path)
            }
        }
    }

    /// The local path, for local destinations.
    pub fn as_local(&self) -> Option<&Path> {
        match self {
            Self::Local(path) => Some(path),
            Self::S3(_) => None,
        }
    }

    /// The bucket and key, for S3 destinations.
    pub fn as_s3(&self) -> Option<&S3Location> {
        match self {
            Self::S3(location) => Some(location),
            Self::Local(_) => None,
        }
    }
}

impl FromStr for Destination {
    type Err = StorageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::S3(location) => location.fmt(f),
            Self::Local(path) => path.display().fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(bucket: &str, key: &str) -> Destination {
        Destination::S3(S3Location { bucket: bucket.into(), key: key.into() })
    }

    #[test]
    fn parses_s3_and_local() {
        assert_eq!(Destination::parse("s3://ds-logs/ecommerce-v3/").expect("valid"), s3("ds-logs", "ecommerce-v3"));
        assert_eq!(Destination::parse("s3://ds-logs").expect("valid"), s3("ds-logs", ""));
        assert_eq!(Destination::parse("s3://ds-logs/").expect("valid"), s3("ds-logs", ""));
        assert_eq!(Destination::parse("s3://ds-logs/a/b").expect("valid"), s3("ds-logs", "a/b"));
        assert_eq!(Destination::parse("./traces").expect("local"), Destination::Local(PathBuf::from("./traces")));
        assert_eq!(Destination::parse("/var/traces").expect("local").to_string(), "/var/traces");
        assert_eq!(Destination::parse("s3://ds-logs/a").expect("valid").to_string(), "s3://ds-logs/a");
    }

    #[test]
    fn a_query_string_points_to_data_pipeline_version() {
        let err = Destination::parse("s3://bucket/logs/?versionId=abc123").expect_err("query");
        assert_eq!(err.category(), "S3UriQuery");
        let text = err.to_string();
        assert!(text.contains("versionId=abc123") && text.contains("dataPipeline.version"), "{text}");
    }

    #[test]
    fn refuses_missing_bucket_and_malformed_uris() {
        for bad in ["", "s3://", "s3:///key", "s3://Bad_Bucket/x", "s3://ab/x", "s3://b ucket/x", "s3://bucket/a#b"] {
            let err = Destination::parse(bad).expect_err(bad);
            assert_eq!(err.category(), "InvalidDestination", "{bad}");
        }
        let err = Destination::parse("s3:///key").expect_err("no bucket");
        // "location": sources (a test set, `trace parse s3://...`) are parsed here too.
        assert!(err.to_string().starts_with("invalid location \"s3:///key\": it has no bucket name"), "{err}");
        for bad in ["s3://bucket/a//b", "s3://bucket/../etc", "s3://bucket/a/./b", "gs://bucket/x", "S3://bucket/x"] {
            assert!(Destination::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_prefix_drops_trailing_slashes_but_never_the_schemes() {
        assert_eq!(Destination::parse_prefix("s3://bucket/runs//").unwrap(), s3("bucket", "runs"));
        assert_eq!(Destination::parse_prefix("s3://bucket/").unwrap(), s3("bucket", ""));
        assert_eq!(Destination::parse_prefix("out//").unwrap(), Destination::Local("out".into()));
        for bad in ["s3://", "s3:///", "s3:////"] {
            // Before: trimmed to "s3:", a local directory.
            let err = Destination::parse_prefix(bad).expect_err(bad);
            assert!(err.to_string().contains("no bucket name"), "{bad}: {err}");
        }
    }

    #[test]
    fn join_validates_each_segment() {
        let dest = s3("bucket", "p");
        assert_eq!(dest.join("a/b.trace").expect("valid"), s3("bucket", "p/a/b.trace"));
        assert_eq!(s3("bucket", "").join("a").expect("valid"), s3("bucket", "a"));
        for bad in ["", "a//b", "../x", "a/..", "/abs", "a/"] {
            assert!(dest.join(bad).is_err(), "{bad}");
        }
        let local = Destination::Local(PathBuf::from("/data"));
        assert_eq!(local.join("a/b").expect("valid"), Destination::Local(PathBuf::from("/data/a/b")));
    }
}
