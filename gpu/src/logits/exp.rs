//! `exp(d)` for `d <= 88` that the compiler can vectorize: Cephes' `expf`
//! (range reduction by ln 2, a degree-6 polynomial, 2^n built from bits),
//! branch-free so a loop over 16 lanes becomes SIMD code.
//!
//! `std`'s `f32::exp` is a call into libm and stops vectorization. Accuracy
//! here is about 1 ulp over `[-87, 0]`; below -87 the result is 0 (the true
//! value is under 1.7e-38, far below anything that moves a sum whose largest
//! term is 1). `exp(0)` is exactly 1, which the fused pass relies on to count
//! the entries equal to the row maximum.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// ln 2 split in two so that `n * LN2_HI` is exact for |n| < 2^15.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this the result is flushed to 0 (exp(-87) is still a normal f32).
const FLUSH_BELOW: f32 = -87.0;

/// `a * b + c`, fused when the caller was compiled with FMA.
#[inline(always)]
pub(crate) fn mul_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `exp(d)` for `d` in `[-inf, 88]`; callers clamp NaN and larger values
/// away before calling.
#[inline(always)]
pub(crate) fn exp_clamped<const FMA: bool>(d: f32) -> f32 {
    let x = if d > FLUSH_BELOW { d } else { FLUSH_BELOW };
    let t = mul_add::<FMA>(x, LOG2E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let n_int = (t.to_bits() as i32).wrapping_sub(ROUND_MAGIC.to_bits() as i32);
    let r = mul_add::<FMA>(n, -LN2_HI, x);
    let r = mul_add::<FMA>(n, -LN2_LO, r);
    let mut p = 1.987_569_2e-4_f32;
    p = mul_add::<FMA>(p, r, 1.398_199_9e-3);
    p = mul_add::<FMA>(p, r, 8.333_452e-3);
    p = mul_add::<FMA>(p, r, 4.166_579_6e-2);
    p = mul_add::<FMA>(p, r, 1.666_666_5e-1);
    p = mul_add::<FMA>(p, r, 0.5);
    let y = mul_add::<FMA>(p, r * r, r) + 1.0;
    let scale = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    if d < FLUSH_BELOW { 0.0 } else { y * scale }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<const FMA: bool>() {
        let mut worst = 0.0f64;
        let mut d = 0.0f32;
        while d > -87.0 {
            let got = f64::from(exp_clamped::<FMA>(-d * 0.9));
            let want = f64::from(-d * 0.9).exp();
            worst = worst.max((got - want).abs() / want);
            let got = f64::from(exp_clamped::<FMA>(d));
            let want = f64::from(d).exp();
            worst = worst.max((got - want).abs() / want);
            d -= 0.001_37;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst:e} (fma: {FMA})");
        assert_eq!(exp_clamped::<FMA>(0.0), 1.0);
        assert_eq!(exp_clamped::<FMA>(-87.5), 0.0);
        assert_eq!(exp_clamped::<FMA>(-1000.0), 0.0);
        assert_eq!(exp_clamped::<FMA>(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn matches_f64_exp_to_about_one_ulp() {
        check::<false>();
        check::<true>();
    }
}
