//! Where the logit analytics run: the GPU when asked for (or, with `auto`,
//! when one is usable), otherwise the CPU. The sandbox and the CLI make one
//! [`Analyzer`] and reuse it, so the kernels are compiled once.
//!
//! `auto` never fails for lack of a GPU: it records why it fell back
//! ([`Analyzer::fallback_reason`]) and runs on the CPU. `gpu` fails with the
//! reason instead.

use std::fmt;

use crate::cuda::{GpuError, GpuLogits};
use crate::logits::fused::{self, CpuKernel};
use crate::logits::{LogitStats, LogitsError, LogitsView, MAX_TOP_K};

/// What the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The GPU if one is usable, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// The GPU, or an error.
    Gpu,
}

/// What actually runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The fused CPU pass, with its instruction set.
    Cpu(&'static str),
    /// A GPU: its name and compute capability.
    Gpu {
        /// Device name.
        name: String,
        /// Compute capability.
        compute_capability: (u32, u32),
    },
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Cpu(isa) => write!(f, "cpu ({isa}, {} threads)", rayon::current_num_threads()),
            Backend::Gpu { name, compute_capability: (major, minor) } => write!(f, "gpu ({name}, sm_{major}{minor})"),
        }
    }
}

/// Errors of the backend choice and of the run.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// `--device gpu` without a usable GPU.
    #[error("--device gpu: {0} (run on a GPU node, or use --device auto or cpu)")]
    GpuUnavailable(GpuError),
    /// The GPU run failed.
    #[error(transparent)]
    Gpu(GpuError),
    /// The input is wrong.
    #[error(transparent)]
    Logits(#[from] LogitsError),
}

impl BackendError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            BackendError::GpuUnavailable(_) => "GpuUnavailable",
            BackendError::Gpu(e) => e.category(),
            BackendError::Logits(e) => e.category(),
        }
    }
}

/// Runs the analytics on the chosen backend.
pub struct Analyzer {
    gpu: Option<GpuLogits>,
    fallback_reason: Option<String>,
}

impl Analyzer {
    /// Pick the backend. With [`DeviceChoice::Gpu`] this compiles the kernels
    /// now and fails if it cannot.
    pub fn new(choice: DeviceChoice) -> Result<Self, BackendError> {
        match choice {
            DeviceChoice::Cpu => Ok(Self { gpu: None, fallback_reason: None }),
            DeviceChoice::Gpu => GpuLogits::first()
                .map(|gpu| Self { gpu: Some(gpu), fallback_reason: None })
                .map_err(BackendError::GpuUnavailable),
            DeviceChoice::Auto => Ok(match GpuLogits::first() {
                Ok(gpu) => Self { gpu: Some(gpu), fallback_reason: None },
                Err(e) => Self { gpu: None, fallback_reason: Some(e.to_string()) },
            }),
        }
    }

    /// What runs.
    pub fn backend(&self) -> Backend {
        match &self.gpu {
            Some(gpu) => {
                Backend::Gpu { name: gpu.device().name.clone(), compute_capability: gpu.device().compute_capability }
            }
            None => Backend::Cpu(CpuKernel::Auto.name()),
        }
    }

    /// Why `auto` runs on the CPU, if it does.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// Top-k, log-sum-exp, entropy of `p` and, with `q`, KL(p || q).
    pub fn analyze(&self, p: LogitsView<'_>, q: Option<LogitsView<'_>>, k: usize) -> Result<LogitStats, BackendError> {
        // Before the outputs are sized by it (rows x k): a huge k is an input error, not an abort.
        if k > MAX_TOP_K {
            return Err(LogitsError::TopKTooLarge { k }.into());
        }
        let mut out = LogitStats::poisoned(p.rows(), p.vocab(), k, q.is_some());
        match &self.gpu {
            Some(gpu) => gpu.analyze_into(p, q, k, &mut out).map_err(|e| match e {
                GpuError::Logits(e) => BackendError::Logits(e),
                other => BackendError::Gpu(other),
            })?,
            None => fused::analyze_into(p, q, k, CpuKernel::Auto, &mut out)?,
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_always_there_and_auto_explains_a_fallback() {
        let cpu = Analyzer::new(DeviceChoice::Cpu).expect("cpu");
        assert!(matches!(cpu.backend(), Backend::Cpu(_)));
        let x = [0.0f32, 1.0, 2.0, 3.0];
        let stats = cpu.analyze(LogitsView::f32(&x, 2, 2).expect("2 x 2"), None, 1).expect("valid");
        assert_eq!(stats.token(1).top_ids, vec![1]);
        // Refused before anything is sized by it (100 billion x 2 rows would abort on allocation).
        let huge = cpu.analyze(LogitsView::f32(&x, 2, 2).expect("2 x 2"), None, 100_000_000_000).err();
        assert_eq!(huge.map(|e| e.category()), Some("TopKTooLarge"));

        let auto = Analyzer::new(DeviceChoice::Auto).expect("auto never fails");
        if matches!(auto.backend(), Backend::Cpu(_)) {
            let why = auto.fallback_reason().expect("a reason");
            println!("skipping GPU backend: {why}");
            let error = Analyzer::new(DeviceChoice::Gpu).err().expect("no GPU");
            assert_eq!(error.category(), "GpuUnavailable");
            assert!(error.to_string().starts_with("--device gpu: "), "{error}");
        }
    }
}
