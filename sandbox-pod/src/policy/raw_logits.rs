//! Full-vocabulary logits a policy hands over with a turn (`raw_logits`).
//!
//! An OpenAI-style `logprobs` block carries only the top-k of each token. A
//! policy that has the whole distribution (a trainer in server mode, a
//! rollout engine with a logits hook, a script replaying a recorded run) can
//! send it instead, as a safetensors file; the sandbox then derives the
//! `token_logit` records itself (top-k, entropy) and, given reference logits
//! at the same context (the trainer's, say), the per-token KL that makes
//! the `logit_divergence` metric (`crate::logits`).
//!
//! # Wire shape
//!
//! The same object in a chat-completions choice (`choices[0].raw_logits`), a
//! scripted response and a gym action:
//!
//! ```text
//! {"path": "/shared/logits/turn-3.safetensors",   // or
//!  "safetensors_base64": "<the file's bytes>",
//!  "tensor": "logits",                             // optional
//!  "reference": "reference_logits",                // optional: q of KL(p || q)
//!  "token_ids": [17, 4242, 9]}                     // optional: the emitted tokens
//! ```
//!
//! - exactly one of `path` (a file the policy wrote on a volume it shares
//!   with the sandbox; in a script, relative to the script's directory) and
//!   `safetensors_base64` (standard base64, padded);
//! - `tensor`: the `[tokens, vocab]` F32 or BF16 tensor of the turn's logits
//!   (default: the file's only tensor, or the one called `logits`);
//! - `reference`: a tensor of the same shape in the same file;
//! - `token_ids`: one id per row, the token the policy emitted there; without
//!   them each record names the row's most likely token.
//!
//! Unknown fields are refused (a typo must not silently drop the reference).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

/// The logits of one turn, as the policy sent them.
#[derive(Debug, Clone, PartialEq)]
pub struct RawLogits {
    pub source: RawLogitsSource,
    /// The tensor of the policy's logits (`p`); `None` picks the default.
    pub tensor: Option<String>,
    /// The tensor of the reference logits (`q`), for KL(p || q).
    pub reference: Option<String>,
    /// The emitted token of each row.
    pub token_ids: Option<Vec<u32>>,
}

/// Where the safetensors bytes are.
#[derive(Clone, PartialEq)]
pub enum RawLogitsSource {
    /// A file on a volume the policy shares with the sandbox.
    File(PathBuf),
    /// The file's bytes, sent inline.
    Inline(Arc<[u8]>),
}

impl fmt::Debug for RawLogitsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            Self::Inline(bytes) => write!(f, "Inline({} bytes)", bytes.len()),
        }
    }
}

impl fmt::Display for RawLogitsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Inline(bytes) => write!(f, "inline raw_logits ({} bytes)", bytes.len()),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    safetensors_base64: Option<String>,
    #[serde(default)]
    tensor: Option<String>,
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
}

/// The fields a `raw_logits` object may have, for error messages.
pub const RAW_LOGITS_SHAPE: &str = r#"raw_logits is {"path": <file> or "safetensors_base64": <bytes>, "tensor"?, "reference"?, "token_ids"?: [<id>, ...]}"#;

impl RawLogits {
    /// Reads the wire shape. A relative `path` is taken relative to `base`
    /// (a script's directory); without a base it is refused, since a server's
    /// working directory is not the sandbox's. The error names the field.
    pub fn from_json(value: &Value, base: Option<&Path>) -> Result<Self, String> {
        let wire = Wire::deserialize(value).map_err(|e| format!("{e}; {RAW_LOGITS_SHAPE}"))?;
        let source = match (wire.path, wire.safetensors_base64) {
            (Some(_), Some(_)) => return Err("give `path` or `safetensors_base64`, not both".into()),
            (None, None) => return Err(format!("neither `path` nor `safetensors_base64`; {RAW_LOGITS_SHAPE}")),
            (Some(path), None) => {
                let path = PathBuf::from(path);
                match base {
                    _ if path.is_absolute() => RawLogitsSource::File(path),
                    Some(base) => RawLogitsSource::File(base.join(path)),
                    None => {
                        return Err(format!(
                            "path {:?} is relative; give an absolute path on a volume the sandbox mounts",
                            path.display()
                        ));
                    }
                }
            }
            (None, Some(text)) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text.trim())
                    .map_err(|e| format!("safetensors_base64 is not standard base64: {e}"))?;
                RawLogitsSource::Inline(bytes.into())
            }
        };
        for (field, name) in [("tensor", &wire.tensor), ("reference", &wire.reference)] {
            if name.as_deref().is_some_and(str::is_empty) {
                return Err(format!("`{field}` is empty; name a tensor of the file or leave the field out"));
            }
        }
        Ok(Self { source, tensor: wire.tensor, reference: wire.reference, token_ids: wire.token_ids })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_a_path_or_inline_bytes_and_names_what_is_wrong() {
        let raw = RawLogits::from_json(&json!({"path": "t0.safetensors", "reference": "ref"}), Some(Path::new("/s")))
            .expect("relative to the script");
        assert_eq!(raw.source, RawLogitsSource::File("/s/t0.safetensors".into()));
        assert_eq!(raw.reference.as_deref(), Some("ref"));

        let raw =
            RawLogits::from_json(&json!({"safetensors_base64": "AAEC", "token_ids": [1, 2]}), None).expect("inline");
        assert_eq!(raw.source, RawLogitsSource::Inline(vec![0u8, 1, 2].into()));
        assert_eq!(raw.token_ids, Some(vec![1, 2]));
        assert_eq!(format!("{:?}", raw.source), "Inline(3 bytes)");

        let error = |v: Value| RawLogits::from_json(&v, None).expect_err("refused");
        assert!(error(json!({"path": "x.safetensors"})).contains("is relative"));
        assert!(error(json!({"path": "/x", "safetensors_base64": ""})).contains("not both"));
        assert!(error(json!({"tensor": "logits"})).starts_with("neither `path` nor"));
        assert!(error(json!({"safetensors_base64": "!!"})).contains("not standard base64"));
        assert!(error(json!({"path": "/x", "refrence": "q"})).contains("unknown field `refrence`"));
        assert!(error(json!({"path": "/x", "token_ids": [-1]})).contains("invalid value"));
        assert!(error(json!({"path": "/x", "reference": ""})).contains("`reference` is empty"));
    }
}
