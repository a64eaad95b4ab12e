//! The k largest logits of a row, kept in a small sorted array while the row
//! streams past (k <= [`MAX_TOP_K`]).
//!
//! Order: larger value first; among equal values the lower token id first.
//! Elements arrive in increasing id order, so "lower id wins a tie" follows
//! from inserting only values strictly above the current k-th and placing a
//! new value after the equal ones already held. `-inf` (probability 0) and NaN
//! never enter.

use super::MAX_TOP_K;

#[derive(Debug, Clone, Copy)]
pub(crate) struct TopK {
    k: usize,
    len: usize,
    values: [f32; MAX_TOP_K],
    ids: [u32; MAX_TOP_K],
}

impl TopK {
    /// `k` is clamped to [`MAX_TOP_K`]; callers validate it first.
    pub(crate) fn new(k: usize) -> Self {
        Self { k: k.min(MAX_TOP_K), len: 0, values: [f32::NEG_INFINITY; MAX_TOP_K], ids: [0; MAX_TOP_K] }
    }

    /// A value must be strictly greater than this to enter.
    #[inline(always)]
    pub(crate) fn threshold(&self) -> f32 {
        if self.k == 0 {
            f32::INFINITY
        } else if self.len < self.k {
            f32::NEG_INFINITY
        } else {
            self.values[self.k - 1]
        }
    }

    /// Insert `value` (which must exceed [`Self::threshold`]) for token `id`,
    /// where `id` is larger than every id offered before.
    pub(crate) fn insert(&mut self, value: f32, id: u32) {
        debug_assert!(value > self.threshold());
        let mut i = if self.len < self.k {
            self.len += 1;
            self.len - 1
        } else {
            self.k - 1
        };
        while i > 0 && self.values[i - 1] < value {
            self.values[i] = self.values[i - 1];
            self.ids[i] = self.ids[i - 1];
            i -= 1;
        }
        self.values[i] = value;
        self.ids[i] = id;
    }

    /// `(id, value)` pairs, best first.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        self.ids[..self.len].iter().copied().zip(self.values[..self.len].iter().copied())
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(k: usize, values: &[f32]) -> Vec<(u32, f32)> {
        let mut top = TopK::new(k);
        for (id, &v) in values.iter().enumerate() {
            if v > top.threshold() {
                top.insert(v, id as u32);
            }
        }
        top.entries().collect()
    }

    #[test]
    fn keeps_the_largest_in_order() {
        assert_eq!(top(3, &[1.0, 5.0, 3.0, 4.0, 2.0]), vec![(1, 5.0), (3, 4.0), (2, 3.0)]);
    }

    #[test]
    fn ties_go_to_the_lowest_id() {
        assert_eq!(top(2, &[2.0, 7.0, 7.0, 7.0]), vec![(1, 7.0), (2, 7.0)]);
        assert_eq!(top(3, &[7.0, 1.0, 7.0, 9.0, 7.0]), vec![(3, 9.0), (0, 7.0), (2, 7.0)]);
    }

    #[test]
    fn minus_infinity_and_nan_never_enter_and_k_zero_keeps_nothing() {
        let inf = f32::NEG_INFINITY;
        assert_eq!(top(4, &[inf, 1.0, f32::NAN, inf]), vec![(1, 1.0)]);
        assert!(top(0, &[1.0, 2.0]).is_empty());
    }
}
