//! Raw logits into trace records: when a policy sends a turn's
//! full-vocabulary logits ([`RawLogits`]), the sandbox derives the turn's
//! `token_logit` records itself — top-k ids with log-probabilities and the
//! entropy of each token, and with reference logits the per-token
//! KL(p || q) that the episode's `logit_divergence` metric averages.
//!
//! The work is `basecamp_gpu`'s fused pass (each input read once), on the
//! GPU when one is usable and otherwise on the CPU; the [`Analyzer`] is
//! made at the first turn that needs it (compiling the kernels once) and
//! shared by every episode of the runner; a turn whose GPU run fails is
//! analysed on the CPU instead (a warning in the log). It runs on tokio's
//! blocking pool: a `[T, 129280]` turn is tens of MB of reading.

use std::sync::{Arc, OnceLock};

use basecamp_gpu::file::{FileError, LoadedLogits, LogitsFile};
use basecamp_gpu::logits::LogitsError;
use basecamp_gpu::{Analyzer, BackendError, DeviceChoice, MAX_TOP_K, token_logits};
use basecamp_trace::pb;

use crate::policy::{RawLogits, RawLogitsSource};

/// What went wrong turning raw logits into records; the turn itself still
/// counts, and its OpenAI-style logprobs (if any) are used instead.
#[derive(Debug, thiserror::Error)]
pub enum RawLogitsError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{source_name} tensor {tensor:?}: {error}")]
    Logits { source_name: String, tensor: String, error: LogitsError },
    #[error("{source_name}: reference tensor {reference:?} has shape {q:?} but the logits {tensor:?} have {p:?}")]
    ReferenceShape { source_name: String, tensor: String, reference: String, p: [usize; 2], q: [usize; 2] },
    #[error("cannot analyse raw logits: {0}")]
    Backend(String),
    #[error("the analysis task failed: {0}")]
    Join(String),
}

impl RawLogitsError {
    /// A fixed name for this kind of error, for metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            Self::File(e) => e.category(),
            Self::Logits { error, .. } => error.category(),
            Self::ReferenceShape { .. } => "LogitsShapeMismatch",
            Self::Backend(_) => "LogitsBackend",
            Self::Join(_) => "LogitsTaskFailed",
        }
    }
}

/// The records derived from one turn's raw logits.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnLogits {
    /// One per row, positions from 0, with `entropy` and (given a reference) `kl` set.
    pub records: Vec<pb::TokenLogit>,
    /// Where it ran, e.g. `cpu (avx2+fma, 2 threads)`.
    pub backend: String,
}

/// The runner's logit analytics: one [`Analyzer`], made on first use.
#[derive(Default)]
pub struct LogitAnalytics {
    choice: DeviceChoice,
    analyzer: OnceLock<Result<Analyzer, String>>,
    /// The CPU, for a turn whose GPU run failed.
    cpu: OnceLock<Analyzer>,
}

impl std::fmt::Debug for LogitAnalytics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogitAnalytics").field("choice", &self.choice).finish_non_exhaustive()
    }
}

impl LogitAnalytics {
    /// Analytics on `choice` (`Auto`: the GPU when usable, else the CPU).
    pub fn new(choice: DeviceChoice) -> Self {
        Self { choice, analyzer: OnceLock::new(), cpu: OnceLock::new() }
    }

    fn analyzer(&self) -> Result<&Analyzer, RawLogitsError> {
        self.analyzer
            .get_or_init(|| {
                let analyzer = Analyzer::new(self.choice).map_err(|e| e.to_string())?;
                match analyzer.fallback_reason() {
                    Some(why) => tracing::info!(backend = %analyzer.backend(), "raw logits analysed on the CPU: {why}"),
                    None => tracing::info!(backend = %analyzer.backend(), "raw logits analysed"),
                }
                Ok(analyzer)
            })
            .as_ref()
            .map_err(|e| RawLogitsError::Backend(e.clone()))
    }

    /// Reads the turn's logits and derives its records (blocking; see
    /// [`LogitAnalytics::analyze_blocking`]). `top_k` is clamped to
    /// [`MAX_TOP_K`].
    pub fn analyze(&self, raw: &RawLogits, top_k: usize) -> Result<TurnLogits, RawLogitsError> {
        let file = match &raw.source {
            RawLogitsSource::File(path) => LogitsFile::open(path)?,
            RawLogitsSource::Inline(bytes) => LogitsFile::from_bytes(raw.source.to_string(), Arc::clone(bytes)),
        };
        let source_name = raw.source.to_string();
        let p = file.logits(raw.tensor.as_deref())?;
        let q = raw.reference.as_deref().map(|name| file.logits(Some(name))).transpose()?;
        let tensor = p.name.clone();
        let logits_error = |error: LogitsError| RawLogitsError::Logits {
            source_name: source_name.clone(),
            tensor: tensor.clone(),
            error,
        };
        if let Some(q) = &q
            && q.shape != p.shape
        {
            return Err(RawLogitsError::ReferenceShape {
                source_name: source_name.clone(),
                tensor: p.name.clone(),
                reference: q.name.clone(),
                p: p.shape,
                q: q.shape,
            });
        }
        let p_view = p.view().map_err(logits_error)?;
        let q_view = q.as_ref().map(LoadedLogits::view).transpose().map_err(logits_error)?;
        let k = top_k.min(MAX_TOP_K);
        let mut analyzer = self.analyzer()?;
        let stats = match analyzer.analyze(p_view, q_view, k) {
            Ok(stats) => stats,
            Err(BackendError::Logits(error)) => return Err(logits_error(error)),
            // A GPU that fails mid-run costs speed, not the turn's records.
            Err(gpu_error) => {
                tracing::warn!(backend = %analyzer.backend(), "raw logits: GPU run failed, using the CPU: {gpu_error}");
                analyzer = self.cpu.get_or_init(|| Analyzer::new(DeviceChoice::Cpu).expect("the CPU is always there"));
                analyzer.analyze(p_view, q_view, k).map_err(|e| match e {
                    BackendError::Logits(error) => logits_error(error),
                    other => RawLogitsError::Backend(other.to_string()),
                })?
            }
        };
        let records =
            token_logits(&p_view, &stats.tokens(), raw.token_ids.as_deref(), 0, None).map_err(logits_error)?;
        Ok(TurnLogits { records, backend: analyzer.backend().to_string() })
    }

    /// [`LogitAnalytics::analyze`] on tokio's blocking pool.
    pub async fn analyze_blocking(
        self: &Arc<Self>,
        raw: RawLogits,
        top_k: usize,
    ) -> Result<TurnLogits, RawLogitsError> {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || this.analyze(&raw, top_k))
            .await
            .map_err(|e| RawLogitsError::Join(e.to_string()))?
    }
}

/// The per-token KL values of an episode, for its `logit_divergence`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Divergence {
    sum: f64,
    finite: u32,
    infinite: u32,
}

impl Divergence {
    /// Counts the `kl` of each record that has one.
    pub fn add(&mut self, records: &[pb::TokenLogit]) {
        for kl in records.iter().filter_map(|r| r.kl) {
            if kl.is_finite() {
                self.sum += f64::from(kl);
                self.finite += 1;
            } else {
                self.infinite += 1;
            }
        }
    }

    /// Mean KL over the tokens with a finite one; `None` without any.
    pub fn mean(&self) -> Option<f64> {
        (self.finite > 0).then(|| self.sum / f64::from(self.finite))
    }

    /// Tokens whose KL was +inf (the reference gave probability 0 to a
    /// token the policy did not); the mean leaves them out.
    pub fn infinite(&self) -> u32 {
        self.infinite
    }
}
