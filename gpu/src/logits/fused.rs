//! The fused CPU pass: each row is read once, 16 logits at a time, by one
//! rayon task; the row's statistics come out of per-lane accumulators.
//! Where the time goes and what was tried: `bench/README.md` (logits).
//!
//! Per row it keeps one running maximum `m` of p (shared by the 16 lanes) and
//! per lane, relative to `m`:
//! - `n_max`: how many entries equal `m` (each contributes exactly 1),
//! - `s_rest`: the sum of `exp(x - m)` over the others, so that
//!   `ln S = ln_1p(s_rest)` keeps its precision on very peaked rows,
//! - `a = sum exp(x - m) * (x - m)`, giving the entropy `ln S - a / S`.
//!
//! KL(p || q) = E_p[x - y] + ln(Z_q / Z_p). Computing `lse_q - lse_p` from two
//! separately rounded sums costs ~1e-6 absolute, which is 100% of the KL of
//! two runs that agree to bf16 rounding. So q is summed on p's base:
//! `f = exp(y' - m)` with `y' = y - c0`, and per lane
//! - `b = sum e * (x - y')`, `F = sum f`, `G = sum (f - e)` (termwise, so
//!   the rounding is relative to the small differences),
//! - `KL = b / S + ln_1p(G / S)` (`ln(F / S)` when q is far from p).
//!
//! `c0` is the whole-number difference of the maxima of q and p over the
//! first `SHIFT_PROBE` entries (0 where either is all `-inf` there), so that
//! `x - y'` is small where p has its mass (q = log-softmax of p is shifted by
//! about -lse_p) and `exp(y' - m)` neither overflows nor underflows. Were q
//! left 16 below p, `b / S` and `ln(F / S)` would be about 16 and -16, and
//! their float32 rounding (~16 * 1e-7) a sizeable part of a KL of 0.005. q
//! entries seen while p is still all `-inf` wait in a small side sum.
//!
//! A row whose probe misjudged the shift (p or q masked in the probe, say)
//! shows it at the end: `|b / S|` over `REALIGN`, q's mass underflowing on
//! p's base, or some `y' - m` over 80. It is streamed again with
//! `c0 - round(b / S)` (`RowState::realigned_shift`). A row where q still
//! sits far above p then takes a float64 pass over q
//! (`KL = b/S - c0 + lse_q - lse_p`): q differs from p so much that KL is
//! large and the cancellation harmless. Real logits need neither.
//!
//! A row goes in blocks of 32 chunks (512 logits; 2 KB of f32, so the block
//! stays in L1 and memory is still read once), each in two passes:
//! 1. a scan for p's (and q's) maximum and minimum and for NaN / `+inf`;
//! 2. the exp sums against a maximum that no longer moves: no branches, no
//!    per-element flags, no bounds checks.
//!
//! Between them, when the block's maximum exceeds `m`, the row totals are
//! rescaled by `exp(m_old - m_new)` (`a` also takes `(m_old - m_new) * S`);
//! on real logits that happens a handful of times per row. Only a block whose
//! maximum beats the current k-th best is looked at for top-k, and only a
//! block that holds the row maximum splits `n_max` from `s_rest`. Each
//! block's sums are folded into the row totals, which keeps float32 rounding
//! error near `eps * (sqrt(32) + sqrt(V / 512))` instead of
//! `eps * sqrt(V / 16)`. On x86-64 with AVX2 and FMA a second copy compiled
//! for them is picked at run time.

use rayon::prelude::*;

use super::exp::{FLUSH_BELOW, exp_arg, exp_clamped as exp_f32, mul_add};
use super::topk::TopK;
use super::{BadValue, Input, LogitStats, LogitsData, LogitsError, LogitsView, bf16, validate};

const LANES: usize = 16;
const CHUNKS_PER_BLOCK: usize = 32;
const NEG_INF: f32 = f32::NEG_INFINITY;
const SIGN_BIT: u32 = 1 << 31;
/// q's `-inf` is raised to this in `x - y'`: finite, and below any real logit.
/// A finite logit of q below it is raised too, so a KL against such a q
/// (already above 1e29 nats) is understated: `KL(0,0 || 0,-2e30)` reads
/// 5e29, not 1e30. Not worth a branch in the kernel's inner loop.
const Y_FLOOR: f32 = -1e30;
/// `y' - m` above this would overflow `F`: such a row takes the float64 pass.
const OVER: f32 = 80.0;
/// q's shift `c0` is measured over this many leading entries (the GPU
/// kernel's block size, so both pick the same `c0`).
pub(crate) const SHIFT_PROBE: usize = 256;
/// `|b / S|` (`E_p[x - y']`) above this: q's shift was misjudged and the
/// row is streamed again, realigned (the GPU kernel uses the same bound).
const REALIGN: f64 = 2.0;
/// A realigned shift must stay where float32 holds whole numbers exactly.
const MAX_SHIFT: f64 = 16_777_216.0;
/// Below this `F` (in units of p's largest term) q's mass may have underflowed.
const F_UNDERFLOW: f64 = 1e-25;

/// Which compiled copy of the CPU kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuKernel {
    /// The fastest this processor supports.
    Auto,
    /// Baseline instructions only (SSE2 on x86-64).
    Portable,
    /// AVX2 with fused multiply-add (x86-64); [`CpuKernel::Portable`] where absent.
    Avx2Fma,
}

impl CpuKernel {
    /// The copy that will actually run for this request on this processor.
    pub fn resolve(self) -> CpuKernel {
        match self {
            CpuKernel::Portable => CpuKernel::Portable,
            CpuKernel::Auto | CpuKernel::Avx2Fma if avx2_fma_available() => CpuKernel::Avx2Fma,
            CpuKernel::Auto | CpuKernel::Avx2Fma => CpuKernel::Portable,
        }
    }

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self.resolve() {
            CpuKernel::Avx2Fma => "avx2+fma",
            CpuKernel::Auto | CpuKernel::Portable => "portable",
        }
    }
}

fn avx2_fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// NaN or `+inf`: what a logit must not be. `!(x < inf)` is a single
/// compare that is also true for NaN, which is the point.
#[inline(always)]
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub(crate) fn not_a_logit(x: f32) -> bool {
    !(x < f32::INFINITY)
}

/// A logit element type.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;

    /// Sixteen at once; the default is the obvious loop.
    #[inline(always)]
    fn widen16(chunk: &[Self; LANES]) -> [f32; LANES] {
        let mut out = [0.0; LANES];
        for l in 0..LANES {
            out[l] = chunk[l].to_f32();
        }
        out
    }
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn widen16(chunk: &[f32; LANES]) -> [f32; LANES] {
        *chunk
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        // Exact: bf16 is the upper half of an f32 (NaN stays NaN).
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }

    #[inline(always)]
    fn widen16(chunk: &[bf16; LANES]) -> [f32; LANES] {
        // Integer widening of the raw bits (two zero-extends and two shifts
        // in AVX2); going through `bf16::to_bits` lane by lane made LLVM
        // shuffle lanes through the stack.
        let bits: [u16; LANES] = chunk.map(bf16::to_bits);
        let mut wide = [0u32; LANES];
        for l in 0..LANES {
            wide[l] = u32::from(bits[l]) << 16;
        }
        wide.map(f32::from_bits)
    }
}

/// How a row ended, before errors get their column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowStatus {
    Ok,
    NonFinite(Input),
    Empty(Input),
}

/// One row's results.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowResult {
    pub(crate) status: RowStatus,
    pub(crate) lse: f64,
    pub(crate) entropy: f64,
    pub(crate) kl: f64,
    pub(crate) top: TopK,
}

/// Per-lane sums relative to p's running maximum.
#[derive(Clone, Copy)]
struct Sums {
    n_max: [f32; LANES],
    s_rest: [f32; LANES],
    a: [f32; LANES],
    b: [f32; LANES],
    f: [f32; LANES],
    g: [f32; LANES],
}

impl Sums {
    const ZERO: Sums = Sums {
        n_max: [0.0; LANES],
        s_rest: [0.0; LANES],
        a: [0.0; LANES],
        b: [0.0; LANES],
        f: [0.0; LANES],
        g: [0.0; LANES],
    };

    /// p's maximum moved up by `-dm` (`dm < 0`): `c = exp(dm)`.
    #[inline(always)]
    fn rescale(&mut self, dm: f32, c: f32) {
        for l in 0..LANES {
            let s = self.n_max[l] + self.s_rest[l];
            self.a[l] = c * (self.a[l] + dm * s);
            self.s_rest[l] = c * s;
            self.n_max[l] = 0.0;
            self.b[l] *= c;
            self.f[l] *= c;
            self.g[l] *= c;
        }
    }

    #[inline(always)]
    fn add(&mut self, other: &Sums) {
        for l in 0..LANES {
            self.n_max[l] += other.n_max[l];
            self.s_rest[l] += other.s_rest[l];
            self.a[l] += other.a[l];
            self.b[l] += other.b[l];
            self.f[l] += other.f[l];
            self.g[l] += other.g[l];
        }
    }
}

/// What the first pass over a block found.
struct BlockScan {
    max_p: f32,
    bad_p: bool,
    max_q: f32,
    min_q: f32,
    bad_q: bool,
}

/// First pass over a block (cache-resident, so the second pass reads it from
/// L1): the maxima that decide the rescaling and whether top-k needs to look,
/// and the validity checks, so that the exp pass carries no per-element flags.
#[inline(always)]
fn scan_block<P: Elem, Q: Elem, const PAIR: bool>(xb: &[[P; LANES]], yb: &[[Q; LANES]]) -> BlockScan {
    // NaN shows as a magnitude (bits without the sign) above +inf's, and
    // +inf as the maximum: an integer max per lane, where a per-lane flag
    // made LLVM shuffle its masks between byte and float vectors.
    let mut max_p = [NEG_INF; LANES];
    let mut mag_p = [0u32; LANES];
    let mut max_q = [NEG_INF; LANES];
    let mut min_q = [f32::INFINITY; LANES];
    let mut mag_q = [0u32; LANES];
    let yb = if PAIR { &yb[..xb.len()] } else { yb };
    for (c, xc) in xb.iter().enumerate() {
        let xs = widen(xc);
        for l in 0..LANES {
            max_p[l] = if xs[l] > max_p[l] { xs[l] } else { max_p[l] };
            mag_p[l] = mag_p[l].max(xs[l].to_bits() & !SIGN_BIT);
        }
        if PAIR {
            let ys = widen(&yb[c]);
            for l in 0..LANES {
                max_q[l] = if ys[l] > max_q[l] { ys[l] } else { max_q[l] };
                min_q[l] = if ys[l] < min_q[l] { ys[l] } else { min_q[l] };
                mag_q[l] = mag_q[l].max(ys[l].to_bits() & !SIGN_BIT);
            }
        }
    }
    let (max_p, max_q) = (max_of(&max_p), max_of(&max_q));
    let nan = |mag: &[u32; LANES]| mag.iter().fold(0, |a, &m| a.max(m)) > f32::INFINITY.to_bits();
    BlockScan {
        max_p,
        bad_p: nan(&mag_p) || max_p == f32::INFINITY,
        max_q,
        min_q: min_q.iter().fold(f32::INFINITY, |m, &y| if y < m { y } else { m }),
        bad_q: nan(&mag_q) || max_q == f32::INFINITY,
    }
}

/// Second pass over a block: the exp sums relative to a fixed row maximum `m`,
/// no branches. `AT_MAX`: the block holds entries equal to `m`, which count
/// in `n_max` rather than `s_rest` (every other block has `x - m < 0`).
#[inline(always)]
fn exp_sums<P: Elem, Q: Elem, const PAIR: bool, const FMA: bool, const AT_MAX: bool>(
    xb: &[[P; LANES]],
    yb: &[[Q; LANES]],
    m: f32,
    c0: f32,
) -> Sums {
    let mut s = Sums::ZERO;
    let x_floor = m + 2.0 * FLUSH_BELOW;
    // A closure does not inherit `target_feature`: it is fast only because
    // each copy of this function calls it from one place (PAIR is a
    // constant), so LLVM inlines it. Written out in one loop instead, the f32
    // copy measured 15% slower; see bench/README.md (logits).
    let mut step = |xs: [f32; LANES], ys: [f32; LANES]| {
        for l in 0..LANES {
            let x = xs[l];
            let d = x - m;
            let e = exp_f32::<FMA>(d);
            if AT_MAX {
                let at_max = d == 0.0;
                s.n_max[l] += if at_max { 1.0 } else { 0.0 };
                s.s_rest[l] += if at_max { 0.0 } else { e };
            } else {
                s.s_rest[l] += e;
            }
            // exp_arg: finite where d is -inf (e is 0 there).
            s.a[l] = mul_add::<FMA>(e, exp_arg(d), s.a[l]);
            if PAIR {
                // Above OVER the block set q_far and F, G go unused.
                let y = ys[l] - c0;
                let f = exp_f32::<FMA>(y - m);
                s.f[l] += f;
                s.g[l] += f - e;
                // x raised to x_floor only where e is 0 anyway, and y to
                // Y_FLOOR where it is -inf (then KL is +inf anyway; see Y_FLOOR), so
                // that x - y is finite and e * (x - y) is never 0 * inf.
                let x = if x > x_floor { x } else { x_floor };
                let y = if y > Y_FLOOR { y } else { Y_FLOOR };
                s.b[l] = mul_add::<FMA>(e, x - y, s.b[l]);
            }
        }
    };
    if PAIR {
        for (xc, yc) in xb.iter().zip(yb) {
            step(widen(xc), widen(yc));
        }
    } else {
        for xc in xb {
            step(widen(xc), [NEG_INF; LANES]);
        }
    }
    s
}

/// The state of one row being streamed.
struct RowState<const PAIR: bool, const FMA: bool> {
    m: f32,
    /// q's shift (see the module comment).
    c0: f32,
    total: Sums,
    /// q entries met while p was all `-inf`: `sum exp(y' - pending_max)`.
    pending_max: f64,
    pending_sum: f64,
    /// Some `y' - m` exceeded [`OVER`]: KL needs the float64 pass.
    q_far: bool,
    bad_p: bool,
    bad_q: bool,
    /// q is `-inf` where p is finite.
    q_zero: bool,
    q_finite: bool,
    top: TopK,
    threshold: f32,
}

#[inline(always)]
fn any_above(xs: &[f32; LANES], t: f32) -> bool {
    let mut any = 0u32;
    for &x in xs {
        any |= u32::from(x > t);
    }
    any != 0
}

#[inline(always)]
fn max_of(xs: &[f32; LANES]) -> f32 {
    xs.iter().fold(NEG_INF, |m, &x| if x > m { x } else { m })
}

#[inline(always)]
fn widen<T: Elem>(chunk: &[T; LANES]) -> [f32; LANES] {
    T::widen16(chunk)
}

/// The last `< LANES` elements, padded with `-inf` (which contributes nothing).
fn widen_tail<T: Elem>(tail: &[T]) -> [f32; LANES] {
    let mut out = [NEG_INF; LANES];
    for (o, t) in out.iter_mut().zip(tail) {
        *o = t.to_f32();
    }
    out
}

/// q's shift for a row: round(max q - max p) over the first
/// [`SHIFT_PROBE`] entries, 0 where either is all `-inf` there.
pub(crate) fn q_shift(max_p: f32, max_q: f32) -> f32 {
    let shift = max_q - max_p;
    if max_p > NEG_INF && max_q > NEG_INF && shift.is_finite() { shift.round() } else { 0.0 }
}

/// A lane array's total in float64.
fn lane_sum(v: &[f32; LANES]) -> f64 {
    v.iter().map(|&x| f64::from(x)).sum()
}

fn leading_max<T: Elem>(v: &[T]) -> f32 {
    v.iter().take(SHIFT_PROBE).fold(NEG_INF, |m, &x| {
        let x = x.to_f32();
        if x > m { x } else { m }
    })
}

impl<const PAIR: bool, const FMA: bool> RowState<PAIR, FMA> {
    fn new(k: usize, c0: f32) -> Self {
        let top = TopK::new(k);
        Self {
            m: NEG_INF,
            c0,
            total: Sums::ZERO,
            pending_max: f64::NEG_INFINITY,
            pending_sum: 0.0,
            q_far: false,
            bad_p: false,
            bad_q: false,
            q_zero: false,
            q_finite: false,
            threshold: top.threshold(),
            top,
        }
    }

    /// p's maximum grows to `new_m`: rescale the sums onto it.
    #[cold]
    fn raise_p(&mut self, new_m: f32) {
        if self.m != NEG_INF {
            let dm = self.m - new_m;
            let c = exp_f32::<FMA>(dm);
            if c == 0.0 {
                // p's sums so far are negligible next to the new maximum
                // (and dm * S could overflow). q's are not: F sits on p's
                // base with q up to OVER above it, so e^dm * F can still be
                // e^-7 of the total. q's sums (and b, which they pair with)
                // are carried over in float64, where e^dm does not vanish.
                let scale = f64::from(dm).exp();
                let carry = |v: &[f32; LANES]| (v.iter().map(|&x| f64::from(x)).sum::<f64>() * scale) as f32;
                let (b, f, g) = (carry(&self.total.b), carry(&self.total.f), carry(&self.total.g));
                self.total = Sums::ZERO;
                if PAIR {
                    (self.total.b[0], self.total.f[0], self.total.g[0]) = (b, f, g);
                }
            } else {
                self.total.rescale(dm, c);
            }
        } else if PAIR && self.pending_sum > 0.0 {
            // p's first finite logit: move the waiting q mass onto its base.
            let arg = self.pending_max - f64::from(new_m);
            if arg > f64::from(OVER) {
                self.q_far = true;
            } else {
                let f = (self.pending_sum * arg.exp()) as f32;
                self.total.f[0] += f;
                self.total.g[0] += f;
            }
            self.pending_sum = 0.0;
        }
        self.m = new_m;
    }

    /// A block in which p is still all `-inf` (or NaN): only q's mass counts.
    #[cold]
    fn before_p<Q: Elem>(&mut self, yb: &[[Q; LANES]]) {
        for y in yb.iter().flat_map(widen) {
            let y = f64::from(y - self.c0);
            if y > f64::NEG_INFINITY && y.is_finite() {
                if y > self.pending_max {
                    self.pending_sum *= (self.pending_max - y).exp();
                    self.pending_max = y;
                }
                self.pending_sum += (y - self.pending_max).exp();
            }
        }
    }

    /// The block's maximum beats the k-th best so far: look at it chunk by
    /// chunk, and lane by lane only where a chunk does.
    #[cold]
    fn offer_top<P: Elem>(&mut self, xb: &[[P; LANES]], id0: u32) {
        for (c, xc) in xb.iter().enumerate() {
            let xs = widen(xc);
            if !any_above(&xs, self.threshold) {
                continue;
            }
            let id = id0.wrapping_add((c * LANES) as u32);
            for (l, &x) in xs.iter().enumerate() {
                if x > self.threshold {
                    self.top.insert(x, id + l as u32);
                    self.threshold = self.top.threshold();
                }
            }
        }
    }

    /// Whether q is `-inf` somewhere p is finite (blocks where q has a `-inf`).
    #[cold]
    fn q_rules_out<P: Elem, Q: Elem>(xb: &[[P; LANES]], yb: &[[Q; LANES]]) -> bool {
        xb.iter().zip(yb).any(|(xc, yc)| widen(xc).iter().zip(widen(yc)).any(|(&x, y)| x > NEG_INF && y == NEG_INF))
    }

    /// Up to [`CHUNKS_PER_BLOCK`] chunks of p (and of q when `PAIR`) starting
    /// at token `id0`: one pass for the maxima, one for the sums.
    #[inline(always)]
    fn block<P: Elem, Q: Elem>(&mut self, xb: &[[P; LANES]], yb: &[[Q; LANES]], id0: u32) {
        let scan = scan_block::<P, Q, PAIR>(xb, yb);
        self.bad_p |= scan.bad_p;
        if PAIR {
            self.bad_q |= scan.bad_q;
            self.q_finite |= scan.max_q > NEG_INF;
        }
        if scan.max_p > self.m {
            self.raise_p(scan.max_p);
        }
        if self.m == NEG_INF {
            if PAIR {
                self.before_p(yb);
            }
            return;
        }
        if scan.max_p > self.threshold {
            self.offer_top(xb, id0);
        }
        if PAIR {
            self.q_far |= (scan.max_q - self.c0) - self.m > OVER;
            if scan.min_q == NEG_INF && !self.q_zero {
                self.q_zero = Self::q_rules_out(xb, yb);
            }
        }
        let (m, c0) = (self.m, self.c0);
        let sums = if scan.max_p == m {
            exp_sums::<P, Q, PAIR, FMA, true>(xb, yb, m, c0)
        } else {
            exp_sums::<P, Q, PAIR, FMA, false>(xb, yb, m, c0)
        };
        self.total.add(&sums);
    }

    /// The shift to stream the row again with, when this pass's `c0` left q
    /// misaligned with p (see the module comment): `c0 - round(b / S)`.
    fn realigned_shift(&self) -> Option<f32> {
        if !PAIR || self.bad_p || self.bad_q || self.m == NEG_INF || !self.q_finite || self.q_zero {
            return None;
        }
        let s = lane_sum(&self.total.n_max) + lane_sum(&self.total.s_rest);
        let mean = lane_sum(&self.total.b) / s;
        if !(self.q_far || lane_sum(&self.total.f) < F_UNDERFLOW || mean.abs() > REALIGN) {
            return None;
        }
        let c1 = (f64::from(self.c0) - mean).round();
        (c1.abs() < MAX_SHIFT && c1 as f32 != self.c0).then_some(c1 as f32)
    }

    /// Close the row; `lse_q` runs the float64 pass over q when KL needs it.
    fn finish(self, lse_q: impl FnOnce() -> f64) -> RowResult {
        let status = if self.bad_p {
            RowStatus::NonFinite(Input::P)
        } else if PAIR && self.bad_q {
            RowStatus::NonFinite(Input::Q)
        } else if self.m == NEG_INF {
            RowStatus::Empty(Input::P)
        } else if PAIR && !self.q_finite {
            RowStatus::Empty(Input::Q)
        } else {
            RowStatus::Ok
        };
        let n_max = lane_sum(&self.total.n_max);
        let s_rest = lane_sum(&self.total.s_rest);
        let s = n_max + s_rest;
        let ln_s = if n_max == 1.0 { s_rest.ln_1p() } else { s.ln() };
        let m = f64::from(self.m);
        let entropy = (ln_s - lane_sum(&self.total.a) / s).max(0.0);
        let kl = if !PAIR || status != RowStatus::Ok {
            0.0
        } else if self.q_zero {
            f64::INFINITY
        } else {
            let (b, f, g) = (lane_sum(&self.total.b) / s, lane_sum(&self.total.f), lane_sum(&self.total.g) / s);
            let kl = if self.q_far || f < F_UNDERFLOW {
                b - f64::from(self.c0) + lse_q() - (m + ln_s)
            } else if g.abs() < 0.5 {
                b + g.ln_1p()
            } else {
                b + (f / s).ln()
            };
            kl.max(0.0)
        };
        RowResult { status, lse: m + ln_s, entropy, kl, top: self.top }
    }
}

/// log-sum-exp of a row in float64, two passes (the rare KL fallback).
#[cold]
fn lse_f64<T: Elem>(v: &[T]) -> f64 {
    let m = v.iter().map(|x| f64::from(x.to_f32())).fold(f64::NEG_INFINITY, f64::max);
    m + v.iter().map(|x| (f64::from(x.to_f32()) - m).exp()).sum::<f64>().ln()
}

/// One row, start to end. Generic over element types so that bf16 is widened
/// in registers; `FMA` selects the fused-multiply-add flavour of the maths.
#[inline(always)]
fn row_kernel<P: Elem, Q: Elem, const PAIR: bool, const FMA: bool>(x: &[P], y: &[Q], k: usize) -> RowResult {
    let c0 = if PAIR { q_shift(leading_max(x), leading_max(y)) } else { 0.0 };
    let first = stream_row::<P, Q, PAIR, FMA>(x, y, k, c0);
    let state = match first.realigned_shift() {
        Some(c1) => stream_row::<P, Q, PAIR, FMA>(x, y, k, c1),
        None => first,
    };
    state.finish(|| lse_f64(y))
}

/// One pass over a row with q shifted by `c0`.
#[inline(always)]
fn stream_row<P: Elem, Q: Elem, const PAIR: bool, const FMA: bool>(
    x: &[P],
    y: &[Q],
    k: usize,
    c0: f32,
) -> RowState<PAIR, FMA> {
    let mut state = RowState::<PAIR, FMA>::new(k, c0);
    let (x_chunks, x_tail) = x.as_chunks::<LANES>();
    let (y_chunks, y_tail) = y.as_chunks::<LANES>();
    let mut y_blocks = y_chunks.chunks(CHUNKS_PER_BLOCK);
    let mut id0 = 0u32;
    for xb in x_chunks.chunks(CHUNKS_PER_BLOCK) {
        let yb: &[[Q; LANES]] = if PAIR { y_blocks.next().unwrap_or_default() } else { &[] };
        state.block(xb, yb, id0);
        id0 = id0.wrapping_add((xb.len() * LANES) as u32);
    }
    if !x_tail.is_empty() {
        let yb: &[[f32; LANES]] = if PAIR { &[widen_tail(y_tail)] } else { &[] };
        state.block::<f32, f32>(&[widen_tail(x_tail)], yb, id0);
    }
    state
}

fn row_portable<P: Elem, Q: Elem, const PAIR: bool>(x: &[P], y: &[Q], k: usize) -> RowResult {
    row_kernel::<P, Q, PAIR, false>(x, y, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn row_avx2_fma<P: Elem, Q: Elem, const PAIR: bool>(x: &[P], y: &[Q], k: usize) -> RowResult {
    row_kernel::<P, Q, PAIR, true>(x, y, k)
}

fn run_rows<P: Elem, Q: Elem, const PAIR: bool>(
    p: &[P],
    q: &[Q],
    vocab: usize,
    k: usize,
    kernel: CpuKernel,
) -> Vec<RowResult> {
    let kernel = kernel.resolve();
    let row = |r: usize| -> RowResult {
        let x = &p[r * vocab..(r + 1) * vocab];
        let y = if PAIR { &q[r * vocab..(r + 1) * vocab] } else { &q[..0] };
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `resolve` picks Avx2Fma only when the processor has AVX2 and FMA.
            CpuKernel::Avx2Fma => unsafe { row_avx2_fma::<P, Q, PAIR>(x, y, k) },
            _ => row_portable::<P, Q, PAIR>(x, y, k),
        }
    };
    (0..p.len() / vocab).into_par_iter().with_min_len(1).map(row).collect()
}

/// Dispatch on the element types of p and q.
pub(crate) fn rows_of(p: LogitsView<'_>, q: Option<LogitsView<'_>>, k: usize, kernel: CpuKernel) -> Vec<RowResult> {
    let v = p.vocab();
    match (p.data(), q.map(|q| q.data())) {
        (LogitsData::F32(x), None) => run_rows::<f32, f32, false>(x, &[], v, k, kernel),
        (LogitsData::Bf16(x), None) => run_rows::<bf16, bf16, false>(x, &[], v, k, kernel),
        (LogitsData::F32(x), Some(LogitsData::F32(y))) => run_rows::<f32, f32, true>(x, y, v, k, kernel),
        (LogitsData::F32(x), Some(LogitsData::Bf16(y))) => run_rows::<f32, bf16, true>(x, y, v, k, kernel),
        (LogitsData::Bf16(x), Some(LogitsData::F32(y))) => run_rows::<bf16, f32, true>(x, y, v, k, kernel),
        (LogitsData::Bf16(x), Some(LogitsData::Bf16(y))) => run_rows::<bf16, bf16, true>(x, y, v, k, kernel),
    }
}

/// The error for a row that failed, naming the offending column; `None` for a good row.
pub(crate) fn row_error(
    status: RowStatus,
    row: usize,
    p: &LogitsView<'_>,
    q: Option<&LogitsView<'_>>,
) -> Option<LogitsError> {
    match status {
        RowStatus::Ok => None,
        RowStatus::Empty(input) => Some(LogitsError::NoFiniteLogit { input, row }),
        RowStatus::NonFinite(input) => {
            let view = if input == Input::Q { q.unwrap_or(p) } else { p };
            let (column, value) = view.first_bad_value(row).unwrap_or((0, BadValue::NaN));
            Some(LogitsError::NonFinite { input, row, column, value })
        }
    }
}

/// Write finished rows into the flat outputs, or return the first row's error.
pub(crate) fn write_rows(
    results: &[RowResult],
    p: &LogitsView<'_>,
    q: Option<&LogitsView<'_>>,
    out: &mut LogitStats,
) -> Result<(), LogitsError> {
    if let Some(error) = results.iter().enumerate().find_map(|(row, r)| row_error(r.status, row, p, q)) {
        return Err(error);
    }
    let k = out.k();
    for (row, r) in results.iter().enumerate() {
        out.lse[row] = r.lse as f32;
        out.entropy[row] = r.entropy as f32;
        if q.is_some() {
            out.kl[row] = r.kl as f32;
        }
        out.top_count[row] = r.top.len() as i32;
        let ids = &mut out.top_ids[row * k..(row + 1) * k];
        let logprobs = &mut out.top_logprobs[row * k..(row + 1) * k];
        ids.fill(-1);
        logprobs.fill(f32::NEG_INFINITY);
        for (slot, (id, value)) in r.top.entries().enumerate() {
            ids[slot] = id as i32;
            logprobs[slot] = (f64::from(value) - r.lse) as f32;
        }
    }
    Ok(())
}

/// Analyse `p` (and KL against `q`) into `out`, whose shape must match
/// ([`LogitStats::poisoned`] with the same rows, vocab, k and `q.is_some()`).
pub fn analyze_into(
    p: LogitsView<'_>,
    q: Option<LogitsView<'_>>,
    k: usize,
    kernel: CpuKernel,
    out: &mut LogitStats,
) -> Result<(), LogitsError> {
    validate(&p, q.as_ref(), k)?;
    if !out.fits(p.rows(), p.vocab(), k, q.is_some()) {
        *out = LogitStats::poisoned(p.rows(), p.vocab(), k, q.is_some());
    }
    let results = rows_of(p, q, k, kernel);
    write_rows(&results, &p, q.as_ref(), out)
}
