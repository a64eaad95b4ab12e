//! Logit analytics: from full-vocabulary logits `[T, V]` (f32 or bf16), per
//! token the top-k ids with log-probabilities, the log-sum-exp, the entropy,
//! and KL(p || q) against a second logit set of the same shape.
//!
//! Everything comes out of one pass over each row ([`fused`]): an online
//! softmax (running max, sums rescaled when it grows), the entropy from
//! `sum p * (x - max)` under the same rescaling, KL from both rows in the same
//! loop, and the top-k in a small sorted array. [`mod@reference`] holds the plain
//! scalar loop (the benchmark's peer) and the float64 oracle of the tests;
//! [`record`] turns a row into the trace's `TokenLogit`; `crate::cuda` runs the
//! same computation on a GPU.
//!
//! Conventions, shared by every implementation:
//! - logits are finite or `-inf` (probability 0). NaN or `+inf` is an error
//!   naming the input, row and column; a row that is `-inf` everywhere is an
//!   error too (it is no distribution).
//! - top-k holds entries of nonzero probability only, best first; ties go to
//!   the lower token id. A row with fewer than k finite logits gives fewer.
//! - entropy is in nats. KL(p || q) is in nats, `+inf` when q gives
//!   probability 0 (logit `-inf`) to a token p does not, and rounding below 0
//!   is reported as 0.

pub mod fused;
pub mod record;
pub mod reference;

mod exp;
mod topk;

use std::fmt;

pub use half::bf16;

pub use fused::CpuKernel;

/// The largest top-k supported (the trace keeps 5 by default).
pub const MAX_TOP_K: usize = 20;

/// Element type of a logits tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// IEEE float32.
    F32,
    /// bfloat16 (the upper half of a float32).
    Bf16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        })
    }
}

/// The elements of a logits tensor, borrowed.
#[derive(Debug, Clone, Copy)]
pub enum LogitsData<'a> {
    /// float32 values.
    F32(&'a [f32]),
    /// bfloat16 values.
    Bf16(&'a [bf16]),
}

/// A borrowed, row-major `[rows, vocab]` logits tensor.
#[derive(Debug, Clone, Copy)]
pub struct LogitsView<'a> {
    data: LogitsData<'a>,
    rows: usize,
    vocab: usize,
}

impl<'a> LogitsView<'a> {
    /// A float32 `[rows, vocab]` view; `data.len()` must be `rows * vocab`.
    pub fn f32(data: &'a [f32], rows: usize, vocab: usize) -> Result<Self, LogitsError> {
        Self::new(LogitsData::F32(data), data.len(), rows, vocab)
    }

    /// A bfloat16 `[rows, vocab]` view; `data.len()` must be `rows * vocab`.
    pub fn bf16(data: &'a [bf16], rows: usize, vocab: usize) -> Result<Self, LogitsError> {
        Self::new(LogitsData::Bf16(data), data.len(), rows, vocab)
    }

    fn new(data: LogitsData<'a>, len: usize, rows: usize, vocab: usize) -> Result<Self, LogitsError> {
        if vocab == 0 || rows.checked_mul(vocab) != Some(len) || i32::try_from(vocab).is_err() {
            return Err(LogitsError::Shape { len, rows, vocab });
        }
        Ok(Self { data, rows, vocab })
    }

    /// Number of rows (tokens), `T`.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row length (vocabulary size), `V`.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// `[rows, vocab]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.vocab]
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        match self.data {
            LogitsData::F32(_) => Dtype::F32,
            LogitsData::Bf16(_) => Dtype::Bf16,
        }
    }

    /// The borrowed elements.
    pub fn data(&self) -> LogitsData<'a> {
        self.data
    }

    /// Size of the elements in bytes.
    pub fn bytes(&self) -> usize {
        self.rows * self.vocab * self.dtype().size()
    }

    /// Rows `range` as a view of their own (`None` when out of bounds).
    pub fn slice_rows(&self, range: std::ops::Range<usize>) -> Option<LogitsView<'a>> {
        if range.start > range.end || range.end > self.rows {
            return None;
        }
        let elems = range.start * self.vocab..range.end * self.vocab;
        let data = match self.data {
            LogitsData::F32(d) => LogitsData::F32(d.get(elems)?),
            LogitsData::Bf16(d) => LogitsData::Bf16(d.get(elems)?),
        };
        Some(LogitsView { data, rows: range.end - range.start, vocab: self.vocab })
    }

    /// The logit of `token` in `row`, as f32.
    pub fn logit(&self, row: usize, token: usize) -> Option<f32> {
        if row >= self.rows || token >= self.vocab {
            return None;
        }
        let i = row * self.vocab + token;
        match self.data {
            LogitsData::F32(d) => d.get(i).copied(),
            LogitsData::Bf16(d) => d.get(i).map(|v| v.to_f32()),
        }
    }

    /// Row `row` as f64 (for references and error reports).
    pub fn row_f64(&self, row: usize) -> Vec<f64> {
        let range = row * self.vocab..(row + 1) * self.vocab;
        match self.data {
            LogitsData::F32(d) => d[range].iter().map(|&v| f64::from(v)).collect(),
            LogitsData::Bf16(d) => d[range].iter().map(|v| v.to_f64()).collect(),
        }
    }

    /// The first NaN or +inf in `row`: `(column, value)`.
    pub(crate) fn first_bad_value(&self, row: usize) -> Option<(usize, BadValue)> {
        self.row_f64(row).iter().enumerate().find_map(|(column, &v)| {
            if v.is_nan() {
                Some((column, BadValue::NaN))
            } else if v == f64::INFINITY {
                Some((column, BadValue::PosInf))
            } else {
                None
            }
        })
    }
}

/// Which of the two inputs an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The distribution analysed (`p` in KL(p || q)).
    P,
    /// The distribution compared against (`q`).
    Q,
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Input::P => "p",
            Input::Q => "q",
        })
    }
}

/// A logit that is not a logit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadValue {
    /// Not a number.
    NaN,
    /// Positive infinity.
    PosInf,
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadValue::NaN => "NaN",
            BadValue::PosInf => "+inf",
        })
    }
}

/// What can go wrong analysing logits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogitsError {
    /// The buffer does not hold `rows * vocab` values.
    #[error("logits buffer of {len} values is not [rows, vocab] = [{rows}, {vocab}] (vocab must be 1..=2^31-1)")]
    Shape {
        /// Values in the buffer.
        len: usize,
        /// Rows claimed.
        rows: usize,
        /// Row length claimed.
        vocab: usize,
    },
    /// `k` above [`MAX_TOP_K`].
    #[error("top-k of {k} is more than the {MAX_TOP_K} supported: ask for at most {MAX_TOP_K}")]
    TopKTooLarge {
        /// What was asked for.
        k: usize,
    },
    /// p and q differ in shape.
    #[error("p has shape {p:?} but q has shape {q:?}: KL needs two logit sets of the same shape")]
    ShapeMismatch {
        /// Shape of p.
        p: [usize; 2],
        /// Shape of q.
        q: [usize; 2],
    },
    /// NaN or +inf in the input.
    #[error("logits {input} row {row} column {column} is {value}: logits must be finite or -inf")]
    NonFinite {
        /// Which input.
        input: Input,
        /// Row (token position).
        row: usize,
        /// Column (token id).
        column: usize,
        /// What was found.
        value: BadValue,
    },
    /// A row with no finite logit.
    #[error("logits {input} row {row} is -inf everywhere: it is not a probability distribution")]
    NoFiniteLogit {
        /// Which input.
        input: Input,
        /// Row (token position).
        row: usize,
    },
    /// An output the kernel should have written still holds the poison value.
    #[error("internal error: the {field} output of row {row} was not written by the kernel")]
    Unwritten {
        /// Row.
        row: usize,
        /// Which output.
        field: &'static str,
    },
    /// An emitted token id outside the vocabulary.
    #[error("emitted token {token} at row {row} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange {
        /// Row.
        row: usize,
        /// The id given.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A per-row input whose length is not the number of rows.
    #[error("{what} has {got} rows but the logits have {expected}")]
    RowCountMismatch {
        /// Which input.
        what: &'static str,
        /// Its length.
        got: usize,
        /// Rows of the logits.
        expected: usize,
    },
    /// An emitted token whose logit is -inf: probability zero, so no
    /// sampler over these logits could have emitted it (the logits and the
    /// tokens are most likely from different positions or models).
    #[error(
        "emitted token {token} at row {row} has logit -inf (probability 0) in these logits: the tokens and the logits do not belong together (shifted by a position, or another model's logits?)"
    )]
    ImpossibleToken {
        /// Row.
        row: usize,
        /// The id given.
        token: u32,
    },
    /// `token_ids` (the emitted token of each row) of another length than
    /// the logits have rows.
    #[error("token_ids has {got} ids but the logits have {rows} rows: give one emitted token per row")]
    TokenCountMismatch {
        /// Ids given.
        got: usize,
        /// Rows of the logits.
        rows: usize,
    },
    /// A trace record needs a token and none was given nor found.
    #[error("row {row} has no top-k entries and no chosen token: pass the emitted token or ask for k >= 1")]
    NoToken {
        /// Row.
        row: usize,
    },
}

impl LogitsError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            LogitsError::Shape { .. } => "LogitsShape",
            LogitsError::TopKTooLarge { .. } => "TopKTooLarge",
            LogitsError::ShapeMismatch { .. } => "LogitsShapeMismatch",
            LogitsError::NonFinite { .. } => "NonFiniteLogit",
            LogitsError::NoFiniteLogit { .. } => "EmptyDistribution",
            LogitsError::Unwritten { .. } => "UnwrittenOutput",
            LogitsError::NoToken { .. } => "NoToken",
            LogitsError::TokenOutOfRange { .. } => "TokenOutOfRange",
            LogitsError::ImpossibleToken { .. } => "ImpossibleToken",
            // The same label as before it had a variant of its own.
            LogitsError::RowCountMismatch { .. } | LogitsError::TokenCountMismatch { .. } => "RowCountMismatch",
        }
    }

    /// The input a bad value is in (`NonFinite`, `NoFiniteLogit`), so a
    /// caller can name that input's file and tensor rather than the first's.
    pub fn input(&self) -> Option<Input> {
        match self {
            LogitsError::NonFinite { input, .. } | LogitsError::NoFiniteLogit { input, .. } => Some(*input),
            _ => None,
        }
    }
}

/// One token's statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenStats {
    /// log(sum(exp(logits))).
    pub logsumexp: f32,
    /// Entropy of softmax(logits), in nats.
    pub entropy: f32,
    /// KL(p || q) in nats, when a second logit set was given.
    pub kl: Option<f32>,
    /// Token ids of the top-k, best first (ties: lower id first).
    pub top_ids: Vec<u32>,
    /// Their log-probabilities.
    pub top_logprobs: Vec<f32>,
}

/// Bit patterns that no kernel writes: outputs start as these, and
/// [`LogitStats::check_written`] fails if any is left.
pub(crate) const POISON_F32: u32 = 0x7fc0_bad0;
pub(crate) const POISON_I32: i32 = i32::MIN + 0xbad;

/// The statistics of every row, flat (what the kernels write): row-major,
/// `k` top-k slots per row; unused slots hold id -1 and log-probability -inf.
#[derive(Debug, Clone)]
pub struct LogitStats {
    rows: usize,
    vocab: usize,
    k: usize,
    has_kl: bool,
    pub(crate) lse: Vec<f32>,
    pub(crate) entropy: Vec<f32>,
    pub(crate) kl: Vec<f32>,
    pub(crate) top_count: Vec<i32>,
    pub(crate) top_ids: Vec<i32>,
    pub(crate) top_logprobs: Vec<f32>,
}

impl LogitStats {
    /// Outputs for `rows` rows of `vocab` logits, every value poisoned.
    pub fn poisoned(rows: usize, vocab: usize, k: usize, has_kl: bool) -> Self {
        let f = f32::from_bits(POISON_F32);
        Self {
            rows,
            vocab,
            k,
            has_kl,
            lse: vec![f; rows],
            entropy: vec![f; rows],
            kl: vec![f; if has_kl { rows } else { 0 }],
            top_count: vec![POISON_I32; rows],
            top_ids: vec![POISON_I32; rows * k],
            top_logprobs: vec![f; rows * k],
        }
    }

    /// Outputs produced elsewhere (another implementation of the kernels),
    /// in this layout; `kl` is `Some` when KL was computed. Lengths must fit.
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        rows: usize,
        vocab: usize,
        k: usize,
        lse: Vec<f32>,
        entropy: Vec<f32>,
        kl: Option<Vec<f32>>,
        top_count: Vec<i32>,
        top_ids: Vec<i32>,
        top_logprobs: Vec<f32>,
    ) -> Result<Self, LogitsError> {
        let per_row = [lse.len(), entropy.len(), top_count.len(), kl.as_ref().map_or(rows, Vec::len)];
        let per_slot = [top_ids.len(), top_logprobs.len()];
        if let Some(&got) = per_row.iter().find(|&&n| n != rows) {
            return Err(LogitsError::RowCountMismatch { what: "a per-row output", got, expected: rows });
        }
        if let Some(&got) = per_slot.iter().find(|&&n| n != rows * k) {
            return Err(LogitsError::RowCountMismatch { what: "a top-k output", got, expected: rows * k });
        }
        let has_kl = kl.is_some();
        Ok(Self { rows, vocab, k, has_kl, lse, entropy, kl: kl.unwrap_or_default(), top_count, top_ids, top_logprobs })
    }

    /// Poison every value again (before reusing the buffers).
    pub fn poison(&mut self) {
        let f = f32::from_bits(POISON_F32);
        for v in [&mut self.lse, &mut self.entropy, &mut self.kl, &mut self.top_logprobs] {
            v.fill(f);
        }
        self.top_count.fill(POISON_I32);
        self.top_ids.fill(POISON_I32);
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Top-k slots per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Log-sum-exp per row.
    pub fn logsumexp(&self) -> &[f32] {
        &self.lse
    }

    /// Entropy per row, nats.
    pub fn entropy(&self) -> &[f32] {
        &self.entropy
    }

    /// KL(p || q) per row, when q was given.
    pub fn kl(&self) -> Option<&[f32]> {
        self.has_kl.then_some(&self.kl[..])
    }

    /// Whether KL was computed.
    pub fn has_kl(&self) -> bool {
        self.has_kl
    }

    /// Row length the outputs were made for.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Whether the outputs match this problem's shape.
    pub(crate) fn fits(&self, rows: usize, vocab: usize, k: usize, has_kl: bool) -> bool {
        self.rows == rows && self.vocab == vocab && self.k == k && self.has_kl == has_kl
    }

    /// Fail if any output still holds the poison or breaks the layout's rules
    /// (count <= k, ids in range for used slots, -1/-inf in unused ones).
    pub fn check_written(&self) -> Result<(), LogitsError> {
        let poisoned = |v: f32| v.to_bits() == POISON_F32 || v.is_nan();
        for row in 0..self.rows {
            let unwritten = |field| Err(LogitsError::Unwritten { row, field });
            if poisoned(self.lse[row]) || !self.lse[row].is_finite() {
                return unwritten("logsumexp");
            }
            if poisoned(self.entropy[row]) || self.entropy[row] < 0.0 {
                return unwritten("entropy");
            }
            if self.has_kl && (poisoned(self.kl[row]) || self.kl[row] < 0.0) {
                return unwritten("kl");
            }
            let count = self.top_count[row];
            if count < 0 || count as usize > self.k {
                return unwritten("top_count");
            }
            for slot in 0..self.k {
                let id = self.top_ids[row * self.k + slot];
                let logprob = self.top_logprobs[row * self.k + slot];
                if slot < count as usize {
                    if id < 0 || id as usize >= self.vocab {
                        return unwritten("top_ids");
                    }
                    if poisoned(logprob) || logprob > 1e-3 {
                        return unwritten("top_logprobs");
                    }
                } else if id != -1 {
                    return unwritten("top_ids");
                } else if logprob != f32::NEG_INFINITY {
                    return unwritten("top_logprobs");
                }
            }
        }
        Ok(())
    }

    /// Row `row` as a [`TokenStats`].
    pub fn token(&self, row: usize) -> TokenStats {
        let count = usize::try_from(self.top_count[row]).unwrap_or(0).min(self.k);
        let slots = row * self.k..row * self.k + count;
        TokenStats {
            logsumexp: self.lse[row],
            entropy: self.entropy[row],
            kl: self.has_kl.then(|| self.kl[row]),
            top_ids: self.top_ids[slots.clone()].iter().map(|&id| u32::try_from(id).unwrap_or(u32::MAX)).collect(),
            top_logprobs: self.top_logprobs[slots].to_vec(),
        }
    }

    /// Every row as a [`TokenStats`].
    pub fn tokens(&self) -> Vec<TokenStats> {
        (0..self.rows).map(|row| self.token(row)).collect()
    }
}

/// Check the problem before any kernel runs.
pub(crate) fn validate(p: &LogitsView<'_>, q: Option<&LogitsView<'_>>, k: usize) -> Result<(), LogitsError> {
    if k > MAX_TOP_K {
        return Err(LogitsError::TopKTooLarge { k });
    }
    if let Some(q) = q
        && q.shape() != p.shape()
    {
        return Err(LogitsError::ShapeMismatch { p: p.shape(), q: q.shape() });
    }
    Ok(())
}

/// Top-k, log-sum-exp and entropy of every row, on the CPU.
pub fn analyze(logits: LogitsView<'_>, k: usize) -> Result<Vec<TokenStats>, LogitsError> {
    let mut out = LogitStats::poisoned(logits.rows(), logits.vocab(), k, false);
    fused::analyze_into(logits, None, k, CpuKernel::Auto, &mut out)?;
    Ok(out.tokens())
}

/// [`analyze`] of `p`, with KL(p || q) per row, on the CPU.
pub fn analyze_pair(p: LogitsView<'_>, q: LogitsView<'_>, k: usize) -> Result<Vec<TokenStats>, LogitsError> {
    let mut out = LogitStats::poisoned(p.rows(), p.vocab(), k, true);
    fused::analyze_into(p, Some(q), k, CpuKernel::Auto, &mut out)?;
    Ok(out.tokens())
}

/// KL(p || q) per row, in nats, on the CPU.
pub fn kl(p: LogitsView<'_>, q: LogitsView<'_>) -> Result<Vec<f32>, LogitsError> {
    let mut out = LogitStats::poisoned(p.rows(), p.vocab(), 0, true);
    fused::analyze_into(p, Some(q), 0, CpuKernel::Auto, &mut out)?;
    Ok(out.kl)
}

#[cfg(test)]
mod tests;
