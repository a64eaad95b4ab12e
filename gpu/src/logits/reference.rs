//! Two plain implementations of the same statistics, for comparison:
//!
//! - [`scalar_into`]: the loop anyone would write first — one element at a
//!   time in float32 with `f32::exp`, one pass per row, rayon over rows. The
//!   CPU benchmark measures the fused pass against it in the same run.
//! - [`reference()`]: the test oracle — float64, two passes (max, then sums),
//!   top-k by sorting. Slow and obviously right.
//!
//! Both follow the conventions in the module above (errors, ties, -inf).

use rayon::prelude::*;

use super::fused::{Elem, RowResult, RowStatus, not_a_logit, write_rows};
use super::topk::TopK;
use super::{Input, LogitStats, LogitsData, LogitsError, LogitsView, bf16, validate};

/// One row of the float64 oracle.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceRow {
    /// log-sum-exp.
    pub lse: f64,
    /// Entropy, nats.
    pub entropy: f64,
    /// KL(p || q), nats, when q was given.
    pub kl: Option<f64>,
    /// `(id, log-probability)`, best first, ties to the lower id.
    pub top: Vec<(u32, f64)>,
}

/// The float64 oracle for every row.
pub fn reference(p: LogitsView<'_>, q: Option<LogitsView<'_>>, k: usize) -> Result<Vec<ReferenceRow>, LogitsError> {
    validate(&p, q.as_ref(), k)?;
    (0..p.rows())
        .into_par_iter()
        .map(|row| {
            let x = p.row_f64(row);
            let y = q.map(|q| q.row_f64(row));
            reference_row(&x, y.as_deref(), k).map_err(|(input, empty)| {
                let view = if input == Input::Q { q.unwrap_or(p) } else { p };
                match (empty, view.first_bad_value(row)) {
                    (false, Some((column, value))) => LogitsError::NonFinite { input, row, column, value },
                    _ => LogitsError::NoFiniteLogit { input, row },
                }
            })
        })
        .collect()
}

/// One row in float64. `Err((input, empty))`: a bad value (`empty` false) or
/// no finite logit (`empty` true) in that input.
pub fn reference_row(x: &[f64], y: Option<&[f64]>, k: usize) -> Result<ReferenceRow, (Input, bool)> {
    let bad = |v: &[f64]| v.iter().any(|&x| x.is_nan() || x == f64::INFINITY);
    if bad(x) {
        return Err((Input::P, false));
    }
    if y.is_some_and(bad) {
        return Err((Input::Q, false));
    }
    // ln S = ln(n_max + s_rest), as ln_1p(s_rest) when the maximum is unique:
    // on a very peaked row `1 + s_rest` would round s_rest away even in f64.
    let max_and_ln_s = |v: &[f64]| -> Option<(f64, f64)> {
        let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return None;
        }
        let n_max = v.iter().filter(|&&x| x == m).count() as f64;
        let s_rest: f64 = v.iter().filter(|&&x| x < m).map(|&x| (x - m).exp()).sum();
        Some((m, if n_max == 1.0 { s_rest.ln_1p() } else { (n_max + s_rest).ln() }))
    };
    let (m_p, ln_s_p) = max_and_ln_s(x).ok_or((Input::P, true))?;
    let lse_p = m_p + ln_s_p;
    let lse_q = match y {
        Some(y) => Some(max_and_ln_s(y).map(|(m, ln_s)| m + ln_s).ok_or((Input::Q, true))?),
        None => None,
    };
    // Log-probabilities as (x - m) - ln S: subtracting the large lse from x
    // directly would cost precision that the kernels keep.
    let log_p = |xi: f64| (xi - m_p) - ln_s_p;
    let mut entropy = 0.0;
    for &xi in x {
        if xi > f64::NEG_INFINITY {
            let lp = log_p(xi);
            entropy -= lp.exp() * lp;
        }
    }
    let kl = match (y, lse_q) {
        (Some(y), Some(lse_q)) => {
            let mut kl = 0.0;
            for (&xi, &yi) in x.iter().zip(y) {
                if xi == f64::NEG_INFINITY {
                    continue;
                }
                if yi == f64::NEG_INFINITY {
                    kl = f64::INFINITY;
                    break;
                }
                let lp = log_p(xi);
                kl += lp.exp() * (lp - (yi - lse_q));
            }
            Some(kl.max(0.0))
        }
        _ => None,
    };
    let mut order: Vec<u32> = (0..x.len() as u32).filter(|&i| x[i as usize] > f64::NEG_INFINITY).collect();
    // Stable sort by value, descending: equal values keep increasing id order.
    order.sort_by(|&a, &b| x[b as usize].total_cmp(&x[a as usize]));
    let top = order.into_iter().take(k).map(|i| (i, log_p(x[i as usize]))).collect();
    Ok(ReferenceRow { lse: lse_p, entropy: entropy.max(0.0), kl, top })
}

/// One row, one element at a time, float32 and `f32::exp`.
fn scalar_row<P: Elem, Q: Elem, const PAIR: bool>(x: &[P], y: &[Q], k: usize) -> RowResult {
    let inf = f32::INFINITY;
    let (mut m, mut s, mut a, mut b) = (-inf, 0.0f32, 0.0f32, 0.0f32);
    let (mut m_q, mut s_q) = (-inf, 0.0f32);
    let mut q_zero = false;
    let mut status = RowStatus::Ok;
    let mut top = TopK::new(k);
    for (i, xv) in x.iter().enumerate() {
        let xi = xv.to_f32();
        if not_a_logit(xi) {
            status = RowStatus::NonFinite(Input::P);
            break;
        }
        if xi > m {
            if m > -inf {
                let dm = m - xi;
                let c = dm.exp();
                a = if c > 0.0 { c * (a + dm * s) } else { 0.0 };
                s *= c;
                b *= c;
            }
            m = xi;
        }
        let mut e = 0.0;
        if xi > -inf {
            let d = xi - m;
            e = d.exp();
            s += e;
            a += e * d;
        }
        if PAIR {
            let yi = y[i].to_f32();
            if not_a_logit(yi) {
                status = RowStatus::NonFinite(Input::Q);
                break;
            }
            if yi > m_q {
                if m_q > -inf {
                    s_q *= (m_q - yi).exp();
                }
                m_q = yi;
            }
            if yi > -inf {
                s_q += (yi - m_q).exp();
            }
            if xi > -inf {
                if yi == -inf {
                    q_zero = true;
                } else {
                    b += e * (xi - yi);
                }
            }
        }
        if xi > top.threshold() {
            top.insert(xi, i as u32);
        }
    }
    if status == RowStatus::Ok && m == -inf {
        status = RowStatus::Empty(Input::P);
    } else if status == RowStatus::Ok && PAIR && m_q == -inf {
        status = RowStatus::Empty(Input::Q);
    }
    let ln_s = s.ln();
    let kl = if q_zero { f32::INFINITY } else { (b / s + (m_q - m) + (s_q.ln() - ln_s)).max(0.0) };
    RowResult { status, lse: f64::from(m + ln_s), entropy: f64::from((ln_s - a / s).max(0.0)), kl: f64::from(kl), top }
}

fn scalar_rows<P: Elem, Q: Elem, const PAIR: bool>(p: &[P], q: &[Q], vocab: usize, k: usize) -> Vec<RowResult> {
    (0..p.len() / vocab)
        .into_par_iter()
        .map(|r| {
            let y = if PAIR { &q[r * vocab..(r + 1) * vocab] } else { &q[..0] };
            scalar_row::<P, Q, PAIR>(&p[r * vocab..(r + 1) * vocab], y, k)
        })
        .collect()
}

/// The plain scalar loop over every row, into `out` (the benchmark's peer).
pub fn scalar_into(
    p: LogitsView<'_>,
    q: Option<LogitsView<'_>>,
    k: usize,
    out: &mut LogitStats,
) -> Result<(), LogitsError> {
    validate(&p, q.as_ref(), k)?;
    if !out.fits(p.rows(), p.vocab(), k, q.is_some()) {
        *out = LogitStats::poisoned(p.rows(), p.vocab(), k, q.is_some());
    }
    let v = p.vocab();
    let results = match (p.data(), q.map(|q| q.data())) {
        (LogitsData::F32(x), None) => scalar_rows::<f32, f32, false>(x, &[], v, k),
        (LogitsData::Bf16(x), None) => scalar_rows::<bf16, bf16, false>(x, &[], v, k),
        (LogitsData::F32(x), Some(LogitsData::F32(y))) => scalar_rows::<f32, f32, true>(x, y, v, k),
        (LogitsData::F32(x), Some(LogitsData::Bf16(y))) => scalar_rows::<f32, bf16, true>(x, y, v, k),
        (LogitsData::Bf16(x), Some(LogitsData::F32(y))) => scalar_rows::<bf16, f32, true>(x, y, v, k),
        (LogitsData::Bf16(x), Some(LogitsData::Bf16(y))) => scalar_rows::<bf16, bf16, true>(x, y, v, k),
    };
    write_rows(&results, &p, q.as_ref(), out)
}
