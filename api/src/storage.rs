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

/// Why a location is refused. It prints as `"<what the user wrote>": <reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum S3UriError {
    /// The URI does not start with `s3://`.
    NotS3 {
        /// What the user wrote.
        uri: String,
    },
    /// `gs://…`, `file://…`: a scheme that would otherwise read as a local directory name.
    Scheme {
        /// What the user wrote.
        uri: String,
        /// The part before `://`.
        scheme: String,
    },
    /// `S3://…`.
    SchemeCase {
        /// What the user wrote.
        uri: String,
    },
    /// `s3://?x` or `s3:///key`.
    NoBucket {
        /// What the user wrote.
        uri: String,
    },
    /// A bucket name S3 does not allow.
    BadBucket {
        /// What the user wrote.
        uri: String,
        /// The bucket part.
        bucket: String,
    },
    /// `s3://bucket/a//b`, `s3://bucket/../x`.
    BadKey {
        /// What the user wrote.
        uri: String,
        /// The key part.
        key: String,
    },
    /// `?versionId=...` or any other query string.
    Query {
        /// What the user wrote.
        uri: String,
        /// The part after `?`.
        query: String,
    },
    /// `#...`, spaces or control characters.
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

    /// What the user wrote.
    pub fn uri(&self) -> &str {
        match self {
            Self::NotS3 { uri }
            | Self::Scheme { uri, .. }
            | Self::SchemeCase { uri }
            | Self::NoBucket { uri }
            | Self::BadBucket { uri, .. }
            | Self::BadKey { uri, .. }
            | Self::Query { uri, .. }
            | Self::BadCharacter { uri, .. } => uri,
        }
    }

    /// What is wrong and how to write it instead, without the URI.
    pub fn reason(&self) -> String {
        match self {
            Self::NotS3 { .. } => "it is not an s3:// URI".into(),
            Self::Scheme { scheme, .. } => {
                format!("the {scheme}:// scheme is not supported; write s3://BUCKET/PREFIX or a local path")
            }
            Self::SchemeCase { uri } => {
                format!("write the scheme in lower case: s3://{}", uri.split_once("://").map_or("", |(_, rest)| rest))
            }
            Self::NoBucket { .. } => "it has no bucket name; write s3://BUCKET/PREFIX".into(),
            Self::BadBucket { bucket, .. } => format!(
                "bucket name {bucket:?} is not valid: S3 bucket names are 3-63 characters of lowercase letters, \
                 digits, '.' and '-', starting and ending with a letter or digit"
            ),
            Self::BadKey { key, .. } => {
                format!(
                    "the key {key:?} has an empty, '.' or '..' segment; write a plain prefix such as s3://BUCKET/traces"
                )
            }
            Self::Query { query, .. } => format!("it has a query string ({query:?}); S3 URIs cannot carry one"),
            Self::BadCharacter { what, .. } => format!("it contains {what}; remove it"),
        }
    }
}

impl fmt::Display for S3UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.uri(), self.reason())
    }
}

impl std::error::Error for S3UriError {}

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
        let plain = key.strip_suffix('/').unwrap_or(key);
        if !plain.is_empty() && plain.split('/').any(|segment| matches!(segment, "" | "." | "..")) {
            return Err(S3UriError::BadKey { uri: uri.to_string(), key: key.to_string() });
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
    /// `s3://...` as S3 (validated), a text without `://` as a local path;
    /// any other `scheme://` is refused, so that `gs://x` does not silently
    /// become a local directory.
    pub fn parse(text: &str) -> Result<Self, S3UriError> {
        match text.split_once("://") {
            None => Ok(Self::Local(PathBuf::from(text))),
            Some(("s3", _)) => S3Uri::parse(text).map(Self::S3),
            Some((scheme, _)) if scheme.eq_ignore_ascii_case("s3") => {
                Err(S3UriError::SchemeCase { uri: text.to_string() })
            }
            Some((scheme, _)) => Err(S3UriError::Scheme { uri: text.to_string(), scheme: scheme.to_string() }),
        }
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
        let err = StorageLocation::parse("gs://bucket/x").expect_err("other scheme");
        assert_eq!(
            err.to_string(),
            "\"gs://bucket/x\": the gs:// scheme is not supported; write s3://BUCKET/PREFIX or a local path"
        );
        let err = StorageLocation::parse("S3://bucket/x").expect_err("upper case");
        assert_eq!(err.reason(), "write the scheme in lower case: s3://bucket/x");
    }

    #[test]
    fn refuses_empty_dot_and_dot_dot_key_segments() {
        for bad in ["s3://bucket/a//b", "s3://bucket/../etc", "s3://bucket/a/./b"] {
            assert!(matches!(S3Uri::parse(bad), Err(S3UriError::BadKey { .. })), "{bad}");
        }
        for good in ["s3://bucket/a/b/", "s3://bucket/", "s3://bucket/a.b/..c"] {
            assert!(S3Uri::parse(good).is_ok(), "{good}");
        }
    }
}
