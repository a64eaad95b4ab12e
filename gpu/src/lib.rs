//! GPU probing and logit analytics for Basecamp.
//!
//! - [`probe`]: which CUDA devices are visible (name, compute capability,
//!   memory), with CUDA loaded at run time so nothing here needs CUDA to
//!   build; [`requirement`] turns that into the sandbox's decision (use the
//!   GPU, fall back to CPU with a warning, or refuse).
//! - [`logits`]: per-token top-k log-probabilities, log-sum-exp, entropy and
//!   KL(p || q) from full-vocabulary logits, fused into one pass per row on
//!   the CPU; [`cuda`] runs the same pass as NVRTC-compiled CUDA kernels;
//!   [`backend`] picks between them.
//! - [`mod@file`]: logits tensors in safetensors files, memory-mapped.
//! - [`testdata`]: seeded synthetic logits for tests and benchmarks.

pub mod backend;
pub mod cuda;
pub mod file;
pub mod logits;
pub mod probe;
pub mod requirement;
pub mod testdata;

pub use backend::{Analyzer, Backend, BackendError, DeviceChoice};
pub use logits::record::{ChosenToken, token_logits};
pub use logits::{
    Dtype, Input, LogitStats, LogitsError, LogitsView, MAX_TOP_K, TokenStats, analyze, analyze_pair, bf16, kl,
};
pub use probe::{GpuDevice, GpuProbe, probe_gpus};
pub use requirement::{GpuDecision, GpuRequirementError, check_gpu_requirement};
