//! Errors of reading and writing traces. Every message names the file and,
//! where it applies, the byte offset, so one line is enough to act on.

use std::io;
use std::sync::Arc;

#[derive(Debug, Clone, thiserror::Error)]
pub enum TraceError {
    #[error("{file}: cannot read: {source}")]
    Io {
        file: String,
        #[source]
        source: Arc<io::Error>,
    },
    #[error("{file}: empty file, nothing at byte 0, not a trace")]
    Empty { file: String },
    #[error("{file}: not a basecamp trace (bad magic at byte 0)")]
    NotATrace { file: String },
    #[error(
        "{file}: trace format version {version} (byte 8) is newer than this reader supports ({supported}); upgrade basecamp"
    )]
    UnsupportedFormat { file: String, version: u32, supported: u32 },
    #[error(
        "{file}: trace schema version {major}.{minor} is newer than this reader supports ({supported}.x); upgrade basecamp"
    )]
    NewerSchema { file: String, major: u32, minor: u32, supported: u32 },
    #[error("{file}: truncated at byte {offset}: records of {steps_recovered} steps recovered")]
    Truncated { file: String, offset: u64, steps_recovered: u32 },
    #[error("{file}: corrupt frame at byte {offset}: {reason}")]
    Corrupt { file: String, offset: u64, reason: String },
    #[error("{file}: the first record at byte {offset} is not a trace header")]
    MissingHeader { file: String, offset: u64 },
    #[error("{file}: step {step} is not in this trace")]
    StepNotFound { file: String, step: u32 },
    /// The file reads to its footer index and trailer, but no episode end
    /// record came before them: the episode's end was never written (the
    /// trace's own writer always writes it before the index), so its
    /// outcome is unknown. The records read are all there is.
    #[error(
        "{file}: no episode end: the file reads to its footer index (byte {offset}) but holds no episode end \
         record, so the episode's outcome is unknown (no basecamp writer leaves this: the file was written by \
         another tool or edited); `basecamp trace validate` checks the rest"
    )]
    NoEpisodeEnd { file: String, offset: u64 },
}

impl TraceError {
    pub fn io(file: impl Into<String>, source: io::Error) -> Self {
        Self::Io { file: file.into(), source: Arc::new(source) }
    }

    /// A fixed, bounded name for metrics labels and event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Io { .. } => "TraceIo",
            Self::Empty { .. } => "TraceEmpty",
            Self::NotATrace { .. } => "NotATrace",
            Self::UnsupportedFormat { .. } => "UnsupportedTraceFormat",
            Self::NewerSchema { .. } => "NewerTraceSchema",
            Self::Truncated { .. } => "TraceTruncated",
            Self::Corrupt { .. } => "TraceCorrupt",
            Self::MissingHeader { .. } => "TraceMissingHeader",
            Self::StepNotFound { .. } => "TraceStepNotFound",
            Self::NoEpisodeEnd { .. } => "TraceNoEpisodeEnd",
        }
    }

    /// True when the records before this error are trustworthy (a crashed
    /// writer, a damaged tail, an episode end never written), as opposed to
    /// a file that could not be read at all.
    pub fn keeps_prefix(&self) -> bool {
        matches!(self, Self::Truncated { .. } | Self::Corrupt { .. } | Self::NoEpisodeEnd { .. })
    }
}
