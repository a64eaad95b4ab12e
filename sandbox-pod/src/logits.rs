//! Raw logits into trace records: when a policy sends a turn's
//! full-vocabulary logits ([`RawLogits`]), the sandbox derives the turn's
//! `token_logit` records itself — top-k ids with log-probabilities and the
//! entropy of each token, and with reference logits the per-token
//! KL(p || q) that the episode's `logit_divergence` metric averages.
//!
//! The work is `basecamp_gpu`'s fused pass (each input read once), on the
//! GPU when one is usable and otherwise on the CPU; the [`Analyzer`] is
//! made at the first turn that needs it (compiling the kernels once) and
//! shared by every episode of the runner. A turn whose GPU run fails is
//! analysed on the CPU instead (a warning in the log), so a GPU error costs
//! speed, never the turn's records; after
//! [`GPU_FAILURES_BEFORE_CPU_ONLY`] failures in a row the GPU is not tried
//! again for the rest of the run (a CUDA context that hit a sticky error
//! fails every later launch too). It runs on tokio's blocking pool: a
//! `[T, 129280]` turn is tens of MB of reading.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use basecamp_gpu::file::{FileError, LoadedLogits, LogitsFile};
use basecamp_gpu::logits::{Input, LogitStats, LogitsError, LogitsView};
use basecamp_gpu::{Analyzer, Backend, BackendError, DeviceChoice, MAX_TOP_K, token_logits};
use basecamp_trace::pb;

use crate::policy::{RawLogits, RawLogitsSource};

/// What went wrong turning raw logits into records; the turn itself still
/// counts, and its OpenAI-style logprobs (if any) are used instead.
#[derive(Debug, thiserror::Error)]
pub enum RawLogitsError {
    #[error("{error}{hint}", error = .0, hint = file_hint(.0))]
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

/// How to get past a file error from the policy's side: the file's words
/// are shared with `basecamp trace analyze`, whose way out is a flag.
fn file_hint(error: &FileError) -> &'static str {
    match error {
        FileError::AmbiguousTensor { .. } => ": name the policy's logits in raw_logits' `tensor` field",
        _ => "",
    }
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

/// GPU runs that may fail in a row before the rest of the run stays on the CPU.
pub const GPU_FAILURES_BEFORE_CPU_ONLY: u32 = 3;

/// Where the fused pass runs: `basecamp_gpu`'s [`Analyzer`] (GPU or CPU),
/// or any other implementation a caller brings (a test's failing "GPU").
pub trait LogitBackend: Send + Sync {
    /// Top-k, log-sum-exp, entropy of `p` and, with `q`, KL(p || q).
    fn analyze(&self, p: LogitsView<'_>, q: Option<LogitsView<'_>>, k: usize) -> Result<LogitStats, BackendError>;
    /// What runs, for logs and [`TurnLogits::backend`].
    fn backend(&self) -> Backend;
}

impl LogitBackend for Analyzer {
    fn analyze(&self, p: LogitsView<'_>, q: Option<LogitsView<'_>>, k: usize) -> Result<LogitStats, BackendError> {
        Analyzer::analyze(self, p, q, k)
    }

    fn backend(&self) -> Backend {
        Analyzer::backend(self)
    }
}

/// The runner's logit analytics: one backend, made on first use, and the
/// CPU for turns whose GPU run failed.
#[derive(Default)]
pub struct LogitAnalytics {
    choice: DeviceChoice,
    primary: OnceLock<Result<Box<dyn LogitBackend>, String>>,
    /// The CPU, for a turn whose GPU run failed.
    cpu: OnceLock<Analyzer>,
    /// GPU runs that failed since the last one that did not.
    gpu_failures: AtomicU32,
}

impl std::fmt::Debug for LogitAnalytics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogitAnalytics").field("choice", &self.choice).finish_non_exhaustive()
    }
}

impl LogitAnalytics {
    /// Analytics on `choice` (`Auto`: the GPU when usable, else the CPU).
    pub fn new(choice: DeviceChoice) -> Self {
        Self { choice, ..Self::default() }
    }

    /// Analytics on a backend of the caller's (failures of a GPU backend
    /// fall back to the CPU as with [`LogitAnalytics::new`]).
    pub fn with_backend(backend: Box<dyn LogitBackend>) -> Self {
        let this = Self::default();
        let _ = this.primary.set(Ok(backend));
        this
    }

    fn primary(&self) -> Result<&dyn LogitBackend, RawLogitsError> {
        self.primary
            .get_or_init(|| {
                let analyzer = Analyzer::new(self.choice).map_err(|e| e.to_string())?;
                match analyzer.fallback_reason() {
                    Some(why) => tracing::info!(backend = %analyzer.backend(), "raw logits analysed on the CPU: {why}"),
                    None => tracing::info!(backend = %analyzer.backend(), "raw logits analysed"),
                }
                Ok(Box::new(analyzer) as Box<dyn LogitBackend>)
            })
            .as_ref()
            .map(|backend| backend.as_ref())
            .map_err(|e| RawLogitsError::Backend(e.clone()))
    }

    fn cpu(&self) -> &Analyzer {
        self.cpu.get_or_init(|| Analyzer::new(DeviceChoice::Cpu).expect("the CPU is always there"))
    }

    /// Runs the pass on `primary`; a GPU failure (not an input error) runs
    /// it again on the CPU. Returns the stats and what ran.
    fn run(
        &self,
        primary: &dyn LogitBackend,
        p: LogitsView<'_>,
        q: Option<LogitsView<'_>>,
        k: usize,
    ) -> Result<(LogitStats, Backend), BackendError> {
        let backend = primary.backend();
        if !matches!(backend, Backend::Gpu { .. }) {
            return primary.analyze(p, q, k).map(|stats| (stats, backend));
        }
        if self.gpu_failures.load(Ordering::Relaxed) < GPU_FAILURES_BEFORE_CPU_ONLY {
            match primary.analyze(p, q, k) {
                Ok(stats) => {
                    self.gpu_failures.store(0, Ordering::Relaxed);
                    return Ok((stats, backend));
                }
                Err(BackendError::Logits(error)) => return Err(BackendError::Logits(error)),
                Err(gpu_error) => {
                    let failures = self.gpu_failures.fetch_add(1, Ordering::Relaxed) + 1;
                    if failures >= GPU_FAILURES_BEFORE_CPU_ONLY {
                        tracing::warn!(
                            %backend,
                            "raw logits: GPU run failed ({failures} in a row), using the CPU for the rest of this run: {gpu_error}"
                        );
                    } else {
                        tracing::warn!(%backend, "raw logits: GPU run failed, using the CPU: {gpu_error}");
                    }
                }
            }
        }
        let cpu = self.cpu();
        cpu.analyze(p, q, k).map(|stats| (stats, cpu.backend()))
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
        // A bad value in the reference is named by the reference's tensor.
        let logits_error = |error: LogitsError| RawLogitsError::Logits {
            source_name: source_name.clone(),
            tensor: match (error.input(), &q) {
                (Some(Input::Q), Some(q)) => q.name.clone(),
                _ => p.name.clone(),
            },
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
        let primary = self.primary()?;
        let (stats, backend) = self.run(primary, p_view, q_view, k).map_err(|e| match e {
            BackendError::Logits(error) => logits_error(error),
            other => RawLogitsError::Backend(other.to_string()),
        })?;
        let records =
            token_logits(&p_view, &stats.tokens(), raw.token_ids.as_deref(), 0, None).map_err(logits_error)?;
        Ok(TurnLogits { records, backend: backend.to_string() })
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use basecamp_gpu::cuda::GpuError;
    use basecamp_gpu::file::{RawTensor, write_tensors};
    use basecamp_gpu::testdata::{Rng, fresh_seed, mixed_logits, perturbed};

    use super::*;

    /// What the stand-in GPU does on each call, in order.
    enum Outcome {
        Fail,
        Succeed,
        BadInput,
    }

    /// A "GPU" that fails (or succeeds, on the CPU underneath) as scripted,
    /// counting its calls: no CUDA needed to test the fallback.
    struct ScriptedGpu {
        outcomes: Mutex<VecDeque<Outcome>>,
        calls: Arc<AtomicU32>,
        cpu: Analyzer,
    }

    impl ScriptedGpu {
        fn new(outcomes: impl IntoIterator<Item = Outcome>) -> (Self, Arc<AtomicU32>) {
            let calls = Arc::new(AtomicU32::new(0));
            let gpu = Self {
                outcomes: Mutex::new(outcomes.into_iter().collect()),
                calls: Arc::clone(&calls),
                cpu: Analyzer::new(DeviceChoice::Cpu).expect("cpu"),
            };
            (gpu, calls)
        }
    }

    impl LogitBackend for ScriptedGpu {
        fn analyze(&self, p: LogitsView<'_>, q: Option<LogitsView<'_>>, k: usize) -> Result<LogitStats, BackendError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            match self.outcomes.lock().unwrap().pop_front().unwrap_or(Outcome::Fail) {
                Outcome::Fail => Err(BackendError::Gpu(GpuError::Compile {
                    arch: "compute_90".into(),
                    log: "an injected failure".into(),
                })),
                Outcome::Succeed => self.cpu.analyze(p, q, k),
                Outcome::BadInput => Err(BackendError::Logits(LogitsError::TopKTooLarge { k: 99 })),
            }
        }

        fn backend(&self) -> Backend {
            Backend::Gpu { name: "scripted GPU".into(), compute_capability: (9, 0) }
        }
    }

    /// A turn's logits `p` and reference `q` (fresh random rows: ties,
    /// -inf, peaked and flat) in a safetensors file.
    fn turn(dir: &std::path::Path) -> RawLogits {
        let seed = fresh_seed();
        let mut rng = Rng::new(seed);
        let (rows, vocab) = (6, 1000);
        let p = mixed_logits(&mut rng, rows, vocab);
        let q = perturbed(&mut rng, &p, 0.5);
        let path = dir.join(format!("turn-{seed}.safetensors"));
        write_tensors(&path, &[RawTensor::f32("p", &[rows, vocab], &p), RawTensor::f32("q", &[rows, vocab], &q)])
            .expect("write the turn");
        RawLogits {
            source: RawLogitsSource::File(path),
            tensor: Some("p".into()),
            reference: Some("q".into()),
            token_ids: None,
        }
    }

    #[test]
    fn a_failing_gpu_costs_speed_not_records_and_is_given_up_after_three_failures_in_a_row() {
        let dir = tempfile::tempdir().unwrap();
        let raw = turn(dir.path());
        let expected = LogitAnalytics::new(DeviceChoice::Cpu).analyze(&raw, 5).expect("cpu");
        assert!(expected.backend.starts_with("cpu ("), "{}", expected.backend);
        assert!(expected.records.iter().all(|r| r.entropy.is_some() && r.kl.is_some()));

        let (gpu, calls) = ScriptedGpu::new([]);
        let analytics = LogitAnalytics::with_backend(Box::new(gpu));
        for turn in 1..=5 {
            let got = analytics.analyze(&raw, 5).unwrap_or_else(|e| panic!("turn {turn}: {e}"));
            assert_eq!(got, expected, "turn {turn}: the CPU's records, and the CPU named as what ran");
        }
        assert_eq!(
            calls.load(Ordering::Relaxed),
            GPU_FAILURES_BEFORE_CPU_ONLY,
            "the GPU is not tried again after {GPU_FAILURES_BEFORE_CPU_ONLY} failures in a row"
        );
    }

    #[test]
    fn a_gpu_run_that_works_resets_the_count_of_failures() {
        let dir = tempfile::tempdir().unwrap();
        let raw = turn(dir.path());
        let expected = LogitAnalytics::new(DeviceChoice::Cpu).analyze(&raw, 3).expect("cpu").records;
        use Outcome::{Fail, Succeed};
        let (gpu, calls) = ScriptedGpu::new([Fail, Fail, Succeed, Fail, Fail, Succeed]);
        let analytics = LogitAnalytics::with_backend(Box::new(gpu));
        let backends: Vec<String> = (0..6)
            .map(|_| {
                let got = analytics.analyze(&raw, 3).expect("every turn gets its records");
                assert_eq!(got.records, expected);
                got.backend
            })
            .collect();
        let gpu_name = "gpu (scripted GPU, sm_90)";
        assert_eq!(backends.iter().filter(|b| *b == gpu_name).count(), 2, "{backends:?}");
        assert!(backends.iter().filter(|b| *b != gpu_name).all(|b| b.starts_with("cpu (")), "{backends:?}");
        assert_eq!(calls.load(Ordering::Relaxed), 6, "two failures, then a success, never three in a row");
    }

    #[test]
    fn a_bad_value_in_the_reference_names_the_reference_tensor() {
        // It named the policy's tensor: `tensor "p": logits q row 2 column 7 is NaN`.
        let dir = tempfile::tempdir().unwrap();
        let (rows, vocab) = (3, 16);
        let p: Vec<f32> = (0..rows * vocab).map(|i| (i % 7) as f32 * 0.5).collect();
        let mut q = p.clone();
        q[2 * vocab + 7] = f32::NAN;
        let mut empty_row = p.clone();
        empty_row[vocab..2 * vocab].fill(f32::NEG_INFINITY);
        let path = dir.path().join("turn.safetensors");
        write_tensors(
            &path,
            &[
                RawTensor::f32("p", &[rows, vocab], &p),
                RawTensor::f32("q", &[rows, vocab], &q),
                RawTensor::f32("masked", &[rows, vocab], &empty_row),
            ],
        )
        .expect("write the turn");
        let analytics = LogitAnalytics::new(DeviceChoice::Cpu);
        let turn = |tensor: &str, reference: &str| RawLogits {
            source: RawLogitsSource::File(path.clone()),
            tensor: Some(tensor.into()),
            reference: Some(reference.into()),
            token_ids: None,
        };
        let error = analytics.analyze(&turn("p", "q"), 3).expect_err("NaN in the reference");
        assert_eq!(error.category(), "NonFiniteLogit");
        assert_eq!(
            error.to_string(),
            format!("{} tensor \"q\": logits q row 2 column 7 is NaN: logits must be finite or -inf", path.display())
        );
        let error = analytics.analyze(&turn("p", "masked"), 3).expect_err("a reference row without a finite logit");
        assert_eq!(error.category(), "EmptyDistribution");
        assert!(error.to_string().starts_with(&format!("{} tensor \"masked\": ", path.display())), "{error}");
        // A bad value in the policy's logits still names the policy's tensor.
        let error = analytics.analyze(&turn("masked", "p"), 3).expect_err("a policy row without a finite logit");
        assert!(
            error.to_string().starts_with(&format!("{} tensor \"masked\": logits p row 1", path.display())),
            "{error}"
        );
    }

    #[test]
    fn a_file_of_several_tensors_without_a_name_says_which_field_names_one() {
        // It said "pick one with --tensor", the CLI's flag, to a policy.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("turn.safetensors");
        write_tensors(&path, &[RawTensor::f32("p", &[1, 2], &[0.0, 1.0]), RawTensor::f32("q", &[1, 2], &[1.0, 0.0])])
            .expect("write the turn");
        let raw =
            RawLogits { source: RawLogitsSource::File(path.clone()), tensor: None, reference: None, token_ids: None };
        let error = LogitAnalytics::new(DeviceChoice::Cpu).analyze(&raw, 3).expect_err("two tensors, no name");
        assert_eq!(error.category(), "LogitsTensorAmbiguous");
        assert_eq!(
            error.to_string(),
            format!(
                "{} holds 2 tensors and none is called \"logits\" (it has: p, q): name the policy's logits in \
                 raw_logits' `tensor` field",
                path.display()
            )
        );
    }

    #[test]
    fn bad_input_on_the_gpu_is_the_turns_error_not_a_reason_to_run_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let raw = turn(dir.path());
        let (gpu, calls) = ScriptedGpu::new([Outcome::BadInput]);
        let analytics = LogitAnalytics::with_backend(Box::new(gpu));
        let error = analytics.analyze(&raw, 3).expect_err("the input error is reported");
        assert_eq!(error.category(), "TopKTooLarge", "{error}");
        assert!(error.to_string().contains("tensor \"p\""), "{error}");
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert!(analytics.cpu.get().is_none(), "the CPU was not asked to run it again");
    }
}
