//! The logit analytics on an NVIDIA GPU: the CUDA C kernels in `logits.cu`,
//! compiled with NVRTC for the device's compute capability when a
//! [`GpuLogits`] is made, launched through cudarc (one block per row).
//!
//! Nothing is loaded at build time: `libcuda.so` and `libnvrtc.so` are opened
//! on first use, after checking that they can be (cudarc panics otherwise).
//! Results match the CPU pass within float32 rounding; outputs are poisoned
//! before every launch and checked fully written afterwards, and a row with
//! NaN or `+inf` comes back as the same [`LogitsError`] the CPU gives.
//!
//! Two levels: [`GpuLogits::analyze_into`] takes host views (copies in and
//! out, synchronous), and [`GpuLogits::upload`] / [`GpuLogits::launch`] /
//! [`GpuLogits::download`] keep data on the device for benchmarks.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

use crate::logits::fused::{RowStatus, row_error};
use crate::logits::{Dtype, Input, LogitStats, LogitsData, LogitsError, LogitsView, validate};
use crate::probe::{self, GpuDevice, GpuProbe};

/// The kernels' source, compiled at run time.
pub const KERNEL_SOURCE: &str = include_str!("logits.cu");
/// Threads per block (one block per row); must match `BLOCK` in the source.
pub const BLOCK: u32 = 256;

/// What can go wrong on the GPU path.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// `libcuda.so` could not be loaded.
    #[error("no NVIDIA driver: libcuda.so could not be loaded")]
    NoDriver,
    /// `libnvrtc.so` could not be loaded.
    #[error(
        "NVRTC could not be loaded (libnvrtc.so): add CUDA's lib64, or the nvidia-cuda-nvrtc wheel's lib folder, \
         to LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// No device with that ordinal.
    #[error("no CUDA device {ordinal}: {probe}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// What the probe saw.
        probe: String,
    },
    /// A driver call failed.
    #[error("CUDA failed while {during}: {source}")]
    Driver {
        /// What was being done.
        during: &'static str,
        /// The driver's error.
        source: DriverError,
    },
    /// NVRTC rejected the kernel source.
    #[error("NVRTC could not compile the logit kernels for {arch}: {log}")]
    Compile {
        /// The virtual architecture asked for.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// The input or the outputs are wrong (same errors as the CPU path).
    #[error(transparent)]
    Logits(#[from] LogitsError),
}

impl GpuError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            GpuError::NoDriver => "NoNvidiaDriver",
            GpuError::NoNvrtc => "NoNvrtc",
            GpuError::NoDevice { .. } => "NoGpuDevice",
            GpuError::Driver { .. } => "CudaDriver",
            GpuError::Compile { .. } => "KernelCompile",
            GpuError::Logits(e) => e.category(),
        }
    }
}

fn driver(during: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |source| GpuError::Driver { during, source }
}

/// Logits resident on the device.
pub struct DeviceLogits {
    data: DeviceData,
    rows: usize,
    vocab: usize,
}

enum DeviceData {
    F32(CudaSlice<f32>),
    /// bf16 travels as its raw bits.
    Bf16(CudaSlice<u16>),
}

impl DeviceLogits {
    /// `[rows, vocab]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.vocab]
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        match self.data {
            DeviceData::F32(_) => Dtype::F32,
            DeviceData::Bf16(_) => Dtype::Bf16,
        }
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.rows * self.vocab * self.dtype().size()
    }
}

/// The kernels' outputs, on the device.
pub struct DeviceStats {
    rows: usize,
    vocab: usize,
    k: usize,
    has_kl: bool,
    lse: CudaSlice<f32>,
    entropy: CudaSlice<f32>,
    kl: CudaSlice<f32>,
    status: CudaSlice<i32>,
    count: CudaSlice<i32>,
    ids: CudaSlice<i32>,
    logprobs: CudaSlice<f32>,
}

struct Kernels {
    f32: CudaFunction,
    bf16: CudaFunction,
    pair_f32_f32: CudaFunction,
    pair_bf16_bf16: CudaFunction,
    pair_f32_bf16: CudaFunction,
    pair_bf16_f32: CudaFunction,
}

/// A device with the logit kernels compiled and loaded.
pub struct GpuLogits {
    device: GpuDevice,
    stream: Arc<CudaStream>,
    kernels: Kernels,
}

impl GpuLogits {
    /// Compile the kernels with NVRTC for device `ordinal` and load them.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        if !probe::driver_present() {
            return Err(GpuError::NoDriver);
        }
        if !probe::nvrtc_present() {
            return Err(GpuError::NoNvrtc);
        }
        let probe = probe::probe_gpus();
        let device = match probe.devices().iter().find(|d| d.ordinal == ordinal) {
            Some(device) => device.clone(),
            None => return Err(GpuError::NoDevice { ordinal, probe: probe.to_string() }),
        };
        let ctx = CudaContext::new(ordinal).map_err(driver("creating a context"))?;
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let ptx = compile(device.compute_capability)?;
        let module =
            ctx.load_module(ptx).map_err(driver("loading the compiled kernels (PTX newer than the driver?)"))?;
        let load = |name: &str| module.load_function(name).map_err(driver("finding a kernel in the module"));
        let kernels = Kernels {
            f32: load("logit_stats_f32")?,
            bf16: load("logit_stats_bf16")?,
            pair_f32_f32: load("logit_stats_pair_f32_f32")?,
            pair_bf16_bf16: load("logit_stats_pair_bf16_bf16")?,
            pair_f32_bf16: load("logit_stats_pair_f32_bf16")?,
            pair_bf16_f32: load("logit_stats_pair_bf16_f32")?,
        };
        Ok(Self { device, stream, kernels })
    }

    /// The first visible device, when there is one with a driver and NVRTC.
    pub fn first() -> Result<Self, GpuError> {
        match probe::probe_gpus() {
            GpuProbe::NoDriver => Err(GpuError::NoDriver),
            probe => match probe.devices().first() {
                Some(device) => Self::new(device.ordinal),
                None => Err(GpuError::NoDevice { ordinal: 0, probe: probe.to_string() }),
            },
        }
    }

    /// The device in use.
    pub fn device(&self) -> &GpuDevice {
        &self.device
    }

    /// The stream every launch and copy goes to (for timing with events).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copy logits to the device.
    pub fn upload(&self, view: LogitsView<'_>) -> Result<DeviceLogits, GpuError> {
        let data = match view.data() {
            LogitsData::F32(d) => DeviceData::F32(self.stream.clone_htod(d).map_err(driver("copying logits in"))?),
            LogitsData::Bf16(d) => {
                // SAFETY: `half::bf16` is `#[repr(transparent)]` over `u16`, so
                // the same memory read as u16 is its bit patterns.
                let bits = unsafe { std::slice::from_raw_parts(d.as_ptr().cast::<u16>(), d.len()) };
                DeviceData::Bf16(self.stream.clone_htod(bits).map_err(driver("copying logits in"))?)
            }
        };
        Ok(DeviceLogits { data, rows: view.rows(), vocab: view.vocab() })
    }

    /// Device outputs for `rows` rows.
    pub fn alloc_stats(&self, rows: usize, vocab: usize, k: usize, has_kl: bool) -> Result<DeviceStats, GpuError> {
        let f = |n: usize| self.stream.alloc_zeros::<f32>(n.max(1)).map_err(driver("allocating outputs"));
        let i = |n: usize| self.stream.alloc_zeros::<i32>(n.max(1)).map_err(driver("allocating outputs"));
        Ok(DeviceStats {
            rows,
            vocab,
            k,
            has_kl,
            lse: f(rows)?,
            entropy: f(rows)?,
            kl: f(if has_kl { rows } else { 1 })?,
            status: i(rows)?,
            count: i(rows)?,
            ids: i(rows * k)?,
            logprobs: f(rows * k)?,
        })
    }

    /// Fill every output with the poison bit patterns (before a checked run).
    pub fn poison(&self, out: &mut DeviceStats) -> Result<(), GpuError> {
        let host = LogitStats::poisoned(out.rows, out.vocab, out.k, out.has_kl);
        let copy = |src: &[f32], dst: &mut CudaSlice<f32>| {
            self.stream.memcpy_htod(src, &mut dst.slice_mut(..src.len())).map_err(driver("poisoning outputs"))
        };
        copy(&host.lse, &mut out.lse)?;
        copy(&host.entropy, &mut out.entropy)?;
        copy(&host.kl, &mut out.kl)?;
        copy(&host.top_logprobs, &mut out.logprobs)?;
        let copy_i = |src: &[i32], dst: &mut CudaSlice<i32>| {
            self.stream.memcpy_htod(src, &mut dst.slice_mut(..src.len())).map_err(driver("poisoning outputs"))
        };
        copy_i(&host.top_count, &mut out.status)?;
        copy_i(&host.top_count, &mut out.count)?;
        copy_i(&host.top_ids, &mut out.ids)
    }

    /// Queue the kernel on the stream (asynchronous; errors from the launch
    /// itself are returned, errors during the run surface at the next sync).
    pub fn launch(
        &self,
        p: &DeviceLogits,
        q: Option<&DeviceLogits>,
        k: usize,
        out: &mut DeviceStats,
    ) -> Result<(), GpuError> {
        if k > crate::logits::MAX_TOP_K {
            return Err(LogitsError::TopKTooLarge { k }.into());
        }
        if let Some(q) = q
            && q.shape() != p.shape()
        {
            return Err(LogitsError::ShapeMismatch { p: p.shape(), q: q.shape() }.into());
        }
        if out.rows != p.rows || out.vocab != p.vocab || out.k != k || out.has_kl != q.is_some() {
            return Err(
                LogitsError::RowCountMismatch { what: "the device outputs", got: out.rows, expected: p.rows }.into()
            );
        }
        if p.rows == 0 {
            return Ok(());
        }
        let grid = u32::try_from(p.rows).map_err(|_| LogitsError::Shape {
            len: p.rows * p.vocab,
            rows: p.rows,
            vocab: p.vocab,
        })?;
        let vocab = i32::try_from(p.vocab).map_err(|_| LogitsError::Shape {
            len: p.rows * p.vocab,
            rows: p.rows,
            vocab: p.vocab,
        })?;
        let k_arg = k as i32;
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        let kernels = &self.kernels;
        macro_rules! go {
            ($func:expr, $p:expr, $q:expr) => {{
                let mut b = self.stream.launch_builder($func);
                b.arg($p).arg($q).arg(&vocab).arg(&k_arg);
                b.arg(&mut out.lse).arg(&mut out.entropy).arg(&mut out.kl).arg(&mut out.status);
                b.arg(&mut out.count).arg(&mut out.ids).arg(&mut out.logprobs);
                // SAFETY: the arguments match the kernel's signature in
                // logits.cu (pointers, V, k, seven output pointers); every
                // buffer holds what the kernel indexes: inputs rows * V,
                // per-row outputs `rows`, top-k outputs rows * k, and kl
                // `rows` when a pair kernel writes it.
                unsafe { b.launch(cfg) }.map_err(driver("launching the logit kernel"))?;
            }};
        }
        match (&p.data, q.map(|q| &q.data)) {
            (DeviceData::F32(x), None) => go!(&kernels.f32, x, x),
            (DeviceData::Bf16(x), None) => go!(&kernels.bf16, x, x),
            (DeviceData::F32(x), Some(DeviceData::F32(y))) => go!(&kernels.pair_f32_f32, x, y),
            (DeviceData::Bf16(x), Some(DeviceData::Bf16(y))) => go!(&kernels.pair_bf16_bf16, x, y),
            (DeviceData::F32(x), Some(DeviceData::Bf16(y))) => go!(&kernels.pair_f32_bf16, x, y),
            (DeviceData::Bf16(x), Some(DeviceData::F32(y))) => go!(&kernels.pair_bf16_f32, x, y),
        }
        Ok(())
    }

    /// Wait for the stream and copy the outputs into `into` (which is
    /// reshaped to fit). Row statuses are returned, not interpreted.
    pub fn download(&self, out: &DeviceStats, into: &mut LogitStats) -> Result<Vec<i32>, GpuError> {
        if !into.fits(out.rows, out.vocab, out.k, out.has_kl) {
            *into = LogitStats::poisoned(out.rows, out.vocab, out.k, out.has_kl);
        }
        let n = out.rows;
        let s = &self.stream;
        let copy = |src: &CudaSlice<f32>, dst: &mut [f32]| {
            s.memcpy_dtoh(&src.slice(..dst.len()), dst).map_err(driver("copying results out"))
        };
        copy(&out.lse, &mut into.lse)?;
        copy(&out.entropy, &mut into.entropy)?;
        copy(&out.kl, &mut into.kl)?;
        copy(&out.logprobs, &mut into.top_logprobs)?;
        let copy_i = |src: &CudaSlice<i32>, dst: &mut [i32]| {
            s.memcpy_dtoh(&src.slice(..dst.len()), dst).map_err(driver("copying results out"))
        };
        copy_i(&out.count, &mut into.top_count)?;
        copy_i(&out.ids, &mut into.top_ids)?;
        let mut status = vec![0i32; n];
        copy_i(&out.status, &mut status)?;
        s.synchronize().map_err(driver("running the logit kernel"))?;
        Ok(status)
    }

    /// Analyse host logits on the GPU into `out`: copy in, poison the
    /// outputs, run, copy back, turn bad rows into errors, check that every
    /// output was written.
    pub fn analyze_into(
        &self,
        p: LogitsView<'_>,
        q: Option<LogitsView<'_>>,
        k: usize,
        out: &mut LogitStats,
    ) -> Result<(), GpuError> {
        validate(&p, q.as_ref(), k)?;
        let dp = self.upload(p)?;
        let dq = q.map(|q| self.upload(q)).transpose()?;
        let mut stats = self.alloc_stats(p.rows(), p.vocab(), k, q.is_some())?;
        self.poison(&mut stats)?;
        self.launch(&dp, dq.as_ref(), k, &mut stats)?;
        let status = self.download(&stats, out)?;
        check_status(&status, &p, q.as_ref())?;
        out.check_written()?;
        Ok(())
    }
}

/// The first bad row as the CPU path's error.
pub(crate) fn check_status(status: &[i32], p: &LogitsView<'_>, q: Option<&LogitsView<'_>>) -> Result<(), LogitsError> {
    for (row, &code) in status.iter().enumerate() {
        let status = match code {
            0 => continue,
            1 => RowStatus::NonFinite(Input::P),
            2 => RowStatus::NonFinite(Input::Q),
            3 => RowStatus::Empty(Input::P),
            4 => RowStatus::Empty(Input::Q),
            _ => return Err(LogitsError::Unwritten { row, field: "status" }),
        };
        if let Some(error) = row_error(status, row, p, q) {
            return Err(error);
        }
    }
    Ok(())
}

/// NVRTC, for the device's compute capability (PTX, compiled by the driver).
fn compile((major, minor): (u32, u32)) -> Result<cudarc::nvrtc::Ptx, GpuError> {
    let arch = format!("compute_{major}{minor}");
    let options = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()],
        ..Default::default()
    };
    compile_ptx_with_opts(KERNEL_SOURCE, options).map_err(|e| GpuError::Compile {
        arch,
        log: match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        },
    })
}

/// Compile the kernel source with NVRTC without any device (a check that the
/// source is valid CUDA; needs only libnvrtc). Returns the PTX text.
pub fn compile_check(compute_capability: (u32, u32)) -> Result<String, GpuError> {
    if !probe::nvrtc_present() {
        return Err(GpuError::NoNvrtc);
    }
    Ok(compile(compute_capability)?.to_src())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_rows_from_the_device_become_the_cpu_errors() {
        let x = [1.0f32, f32::NAN, 2.0, 3.0];
        let p = LogitsView::f32(&x, 2, 2).expect("2 x 2");
        let error = check_status(&[0, 1], &p, None).expect_err("row 1");
        assert_eq!(error.to_string(), "logits p row 1 column 0 is NaN: logits must be finite or -inf");
        assert_eq!(check_status(&[3, 0], &p, None), Err(LogitsError::NoFiniteLogit { input: Input::P, row: 0 }));
        assert_eq!(check_status(&[0, 77], &p, None), Err(LogitsError::Unwritten { row: 1, field: "status" }));
        assert!(check_status(&[0, 0], &p, None).is_ok());
    }

    #[test]
    fn without_a_driver_the_gpu_path_is_an_error_not_a_panic() {
        if probe::driver_present() {
            println!("skipping: an NVIDIA driver is present (the device tests cover it)");
            return;
        }
        let error = GpuLogits::first().err().expect("no driver, no GPU");
        assert_eq!(error.category(), "NoNvidiaDriver");
        println!("skipping GPU kernels: {error}");
    }

    #[test]
    fn the_kernel_source_compiles_with_nvrtc_when_nvrtc_is_there() {
        match compile_check((9, 0)) {
            Err(GpuError::NoNvrtc) => println!("skipping: NVRTC (libnvrtc.so) not found"),
            Err(e) => panic!("{e}"),
            Ok(ptx) => {
                for entry in
                    ["logit_stats_f32", "logit_stats_bf16", "logit_stats_pair_f32_f32", "logit_stats_pair_bf16_bf16"]
                {
                    assert!(ptx.contains(&format!(".entry {entry}")), "{entry} missing from the PTX");
                }
                assert!(ptx.contains("ex2.approx"), "exp goes through ex2.approx");
                assert!(ptx.contains("ld.global.nc.v4"), "16-byte vector loads");
            }
        }
    }
}
