//! Where data lives: an `s3://bucket/prefix` URI or a local path.
//!
//! Used for `dataPipeline.source`, `evaluation.testSet`, `traces.destination`
//! and `trainingConfig.resumeFrom`. S3 URIs name a bucket and a key and
//! nothing else: a query string such as `?versionId=abc` is refused with a
//! message saying where the version goes instead.

use std::fmt;
use std::path::PathBuf;

/// A parsed `s3://bucket/key` URI.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct S3Uri {
    /// The bucket name.
    pub bucket: String,
    /// The key or prefix, without the leading `/` (may be empty).
    pub key: String,
}

/// Why an `s3://` URI is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum S3UriError {
    /// The URI does not start with `s3://`.
    #[error("{uri:?} is not an s3:// URI")]
    NotS3 {
        /// What the user wrote.
        uri: String,
    },
    /// `s3://?x` or `s3:///key`.
    #[error("{uri:?} has no bucket name; write s3://BUCKET/PREFIX")]
    NoBucket {
        /// What the user wrote.
        uri: String,
    },
    /// A bucket name S3 does not allow.
    #[error(
        "{uri:?}: bucket name {bucket:?} is not valid: S3 bucket names are 3-63 characters of \
         lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"
    )]
    BadBucket {
        /// What the user wrote.
        uri: String,
        /// The bucket part.
        bucket: String,
    },
    /// `?versionId=...` or any other query string.
    #[error("{uri:?} has a query string ({query:?}); S3 URIs cannot carry one")]
    Query {
        /// What the user wrote.
        uri: String,
        /// The part after `?`.
        query: String,
    },
    /// `#...`, spaces or control characters.
    #[error("{uri:?} contains {what}; remove it")]
    BadCharacter {
        /// What the user wrote.
        uri: String,
        /// What was found.
        what: &'static str,
    },
}

impl S3UriError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            S3UriError::Query { .. } => "S3UriQuery",
            _ => "InvalidS3Uri",
        }
    }
}

impl S3Uri {
    /// Parses `s3://bucket[/key]`.
    pub fn parse(uri: &str) -> Result<Self, S3UriError> {
        let rest = uri.strip_prefix("s3://").ok_or_else(|| S3UriError::NotS3 { uri: uri.to_string() })?;
        if let Some((_, query)) = rest.split_once('?') {
            return Err(S3UriError::Query { uri: uri.to_string(), query: query.to_string() });
        }
        if rest.contains('#') {
            return Err(S3UriError::BadCharacter { uri: uri.to_string(), what: "a '#' fragment" });
        }
        if rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(S3UriError::BadCharacter { uri: uri.to_string(), what: "whitespace or control characters" });
        }
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(S3UriError::NoBucket { uri: uri.to_string() });
        }
        if !valid_bucket(bucket) {
            return Err(S3UriError::BadBucket { uri: uri.to_string(), bucket: bucket.to_string() });
        }
        Ok(Self { bucket: bucket.to_string(), key: key.to_string() })
    }

    /// The key joined with `suffix` by exactly one `/`.
    pub fn join(&self, suffix: &str) -> S3Uri {
        let suffix = suffix.trim_start_matches('/');
        let key = match (self.key.trim_end_matches('/'), suffix) {
            ("", s) => s.to_string(),
            (k, "") => k.to_string(),
            (k, s) => format!("{k}/{s}"),
        };
        S3Uri { bucket: self.bucket.clone(), key }
    }
}

fn valid_bucket(bucket: &str) -> bool {
    let bytes = bucket.as_bytes();
    (3..=63).contains(&bytes.len())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'.' || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

impl fmt::Display for S3Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// A place to read from or write to: S3 or the local file system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StorageLocation {
    /// `s3://bucket/key`.
    S3(S3Uri),
    /// A local path (relative paths are relative to the manifest's directory
    /// for the CLI, and to the working directory in a pod).
    Local(PathBuf),
}

impl StorageLocation {
    /// `s3://...` as S3 (validated), anything else as a local path.
    pub fn parse(text: &str) -> Result<Self, S3UriError> {
        if text.starts_with("s3://") { S3Uri::parse(text).map(Self::S3) } else { Ok(Self::Local(PathBuf::from(text))) }
    }

    /// True for `s3://` locations.
    pub fn is_s3(&self) -> bool {
        matches!(self, Self::S3(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bucket_and_key() {
        let uri = S3Uri::parse("s3://ds-logs/ecommerce-v3/").expect("valid");
        assert_eq!(uri.bucket, "ds-logs");
        assert_eq!(uri.key, "ecommerce-v3/");
        assert_eq!(uri.join("2026/01").to_string(), "s3://ds-logs/ecommerce-v3/2026/01");
        assert_eq!(S3Uri::parse("s3://bucket").expect("bucket only").key, "");
    }

    #[test]
    fn refuses_a_query_string_with_its_own_category() {
        let err = S3Uri::parse("s3://bucket/logs/?versionId=abc123").expect_err("query");
        assert_eq!(err.category(), "S3UriQuery");
        assert!(err.to_string().contains("versionId=abc123"), "{err}");
    }

    #[test]
    fn refuses_malformed_uris() {
        for bad in ["s3://", "s3:///key", "s3://Bad_Bucket/x", "s3://ab/x", "s3://b ucket/x", "s3://bucket/a#b"] {
            let err = S3Uri::parse(bad).expect_err(bad);
            assert_eq!(err.category(), "InvalidS3Uri", "{bad}");
        }
        assert!(matches!(S3Uri::parse("http://x"), Err(S3UriError::NotS3 { .. })));
    }

    #[test]
    fn storage_location_tells_s3_from_local() {
        assert!(StorageLocation::parse("s3://bucket/p").expect("s3").is_s3());
        assert!(!StorageLocation::parse("./traces").expect("local").is_s3());
    }
}
