//! `exp(d)` for `d <= 88` that the compiler can vectorize: range reduction
//! by ln 2, a degree-5 polynomial for `e^r` on `|r| <= ln 2 / 2`, and 2^n
//! built from bits; branch-free so a loop over 16 lanes becomes SIMD code.
//!
//! `std`'s `f32::exp` is a call into libm and stops vectorization. The
//! polynomial is `1 + r * q(r)` in Horner form (five multiply-adds), fitted
//! for relative error (about 9e-8 before rounding). With FMA the reduction is
//! one multiply-add (see [`exp_clamped`]). Measured against float64: at most
//! 1.9e-7 relative where `exp(d) > 1e-8` (the terms that move a sum), 3.8e-7
//! down to -87. That is two multiply-adds and two other operations fewer
//! than Cephes' degree-6 `expf` (1 ulp), which this replaced: the fused pass
//! spends about half its time here, and its outputs are held to 1e-4 of
//! float64. Below -87 the result is 0 (the true value is under 1.7e-38, far
//! below anything that moves a sum whose largest term is 1). `exp(0)` is
//! exactly 1 (r = 0 and n = 0), which the fused pass relies on to count the
//! entries equal to the row maximum.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// ln 2 split in two so that `n * LN2_HI` is exact for |n| < 2^15.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this the result is flushed to 0 (exp(-87) is still a normal f32).
pub(crate) const FLUSH_BELOW: f32 = -87.0;
/// `q(r) = (e^r - 1) / r`, degree 4, highest first (fitted to minimise the
/// relative error of `1 + r q(r)` on `[-ln 2 / 2, ln 2 / 2]`).
const Q: [f32; 5] = [8.290_278e-3, 4.189_798e-2, 1.666_763_7e-1, 4.999_915e-1, 9.999_997e-1];

/// `a * b + c`, fused when the caller was compiled with FMA.
#[inline(always)]
pub(crate) fn mul_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `d` clamped to the range where [`exp_clamped`] computes (`-inf` and NaN
/// become [`FLUSH_BELOW`]). Finite, so `exp_clamped(d) * exp_arg(d)` is never
/// `0 * inf`; written as `exp_clamped` writes it, so the two share one `max`.
#[inline(always)]
pub(crate) fn exp_arg(d: f32) -> f32 {
    if d > FLUSH_BELOW { d } else { FLUSH_BELOW }
}

/// `exp(d)` for `d` in `[-inf, 88]`: 0 below [`FLUSH_BELOW`] (and for
/// `-inf`). Above 88 the result is unspecified (finite, `inf` or NaN, never
/// a panic); callers that may pass such values must not use it.
#[inline(always)]
pub(crate) fn exp_clamped<const FMA: bool>(d: f32) -> f32 {
    let x = exp_arg(d);
    let t = mul_add::<FMA>(x, LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    // n + 127, the biased exponent of 2^n, straight from the bits of t.
    let biased = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32 - 127);
    // With FMA, `x - n * ln2` is rounded once: ln 2's own rounding (1.9e-9)
    // costs n * 1.9e-9 relative, under 5e-8 wherever exp(d) > 1e-8 and 2.4e-7
    // at the flush point. Without, n * ln2 would be rounded: two steps.
    let r = if FMA {
        mul_add::<FMA>(n, -std::f32::consts::LN_2, x)
    } else {
        mul_add::<FMA>(n, -LN2_LO, mul_add::<FMA>(n, -LN2_HI, x))
    };
    let mut p = Q[0];
    p = mul_add::<FMA>(p, r, Q[1]);
    p = mul_add::<FMA>(p, r, Q[2]);
    p = mul_add::<FMA>(p, r, Q[3]);
    p = mul_add::<FMA>(p, r, Q[4]);
    let y = mul_add::<FMA>(p, r, 1.0);
    let scale = f32::from_bits((biased as u32) << 23);
    if d < FLUSH_BELOW { 0.0 } else { y * scale }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<const FMA: bool>() {
        // Where the terms that move a sum are (exp(d) > 1e-8), and beyond.
        let (mut near, mut far) = (0.0f64, 0.0f64);
        let mut d = 0.0f32;
        while d > -87.0 {
            let worst = if d > -18.5 { &mut near } else { &mut far };
            for arg in [d, -d * 0.9] {
                let (got, want) = (f64::from(exp_clamped::<FMA>(arg)), f64::from(arg).exp());
                *worst = worst.max((got - want).abs() / want);
            }
            d -= 0.001_37;
        }
        assert!(near < 2.5e-7, "worst relative error {near:e} on [-18.5, 16.6] (fma: {FMA})");
        assert!(far < 4.5e-7, "worst relative error {far:e} on [-87, 78] (fma: {FMA})");
        assert_eq!(exp_clamped::<FMA>(0.0), 1.0);
        assert_eq!(exp_clamped::<FMA>(-87.5), 0.0);
        assert_eq!(exp_clamped::<FMA>(-1000.0), 0.0);
        assert_eq!(exp_clamped::<FMA>(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn matches_f64_exp_to_two_ulp_where_terms_count() {
        check::<false>();
        check::<true>();
    }
}
