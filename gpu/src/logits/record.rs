//! A row's statistics as the trace's `token_logit` record
//! ([`basecamp_trace::pb::TokenLogit`]), for a sandbox whose policy hands over
//! raw logits instead of an OpenAI-style `top_logprobs` list.
//!
//! Without a tokenizer the token strings are empty (one per top-k id, so the
//! record's parallel arrays stay parallel).

use basecamp_trace::pb::TokenLogit;

use super::{LogitsError, LogitsView, TokenStats};

/// The token the policy emitted at a position, and its logit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChosenToken {
    /// Token id.
    pub id: u32,
    /// Its logit in the row the statistics came from.
    pub logit: f32,
}

/// Turns a token id into its text (a tokenizer's decode of one id).
pub type TokenText<'a> = &'a dyn Fn(u32) -> String;

fn to_sint(id: u32) -> i32 {
    // Views refuse vocabularies above i32::MAX, so every id fits.
    i32::try_from(id).unwrap_or(-1)
}

impl TokenStats {
    /// The trace record for this row at `position`.
    ///
    /// `chosen` is the emitted token; without it the record names the top-1
    /// token (what greedy decoding emits). Fails when there is neither a
    /// chosen token nor a top-k entry (k = 0), and when the chosen token's
    /// logit is -inf (a token these logits give probability 0 was not
    /// sampled from them).
    pub fn to_token_logit(
        &self,
        position: u32,
        chosen: Option<ChosenToken>,
        text: Option<TokenText<'_>>,
    ) -> Result<TokenLogit, LogitsError> {
        let (token_id, logprob) = match chosen {
            Some(c) if c.logit == f32::NEG_INFINITY => {
                return Err(LogitsError::ImpossibleToken { row: position as usize, token: c.id });
            }
            // A token in the top-k keeps the top-k's value, so the record
            // never shows one token with two log-probabilities.
            Some(c) => match self.top_ids.iter().position(|&id| id == c.id) {
                Some(i) => (c.id, self.top_logprobs[i]),
                None => (c.id, (f64::from(c.logit) - f64::from(self.logsumexp)) as f32),
            },
            None => match (self.top_ids.first(), self.top_logprobs.first()) {
                (Some(&id), Some(&logprob)) => (id, logprob),
                _ => return Err(LogitsError::NoToken { row: position as usize }),
            },
        };
        let name = |id: u32| text.map(|t| t(id)).unwrap_or_default();
        Ok(TokenLogit {
            position,
            token_id: to_sint(token_id),
            token: name(token_id).into(),
            logprob,
            top_ids: self.top_ids.iter().map(|&id| to_sint(id)).collect(),
            top_tokens: self.top_ids.iter().map(|&id| name(id).into()).collect(),
            top_logprobs: self.top_logprobs.iter().copied().collect(),
            entropy: Some(self.entropy),
            kl: self.kl,
        })
    }
}

/// Records for every row of `logits`, positions counting from `first_position`.
///
/// `emitted`, when given, holds the emitted token of each row (its logit is
/// read from `logits`); otherwise each record names the row's top-1 token.
pub fn token_logits(
    logits: &LogitsView<'_>,
    stats: &[TokenStats],
    emitted: Option<&[u32]>,
    first_position: u32,
    text: Option<TokenText<'_>>,
) -> Result<Vec<TokenLogit>, LogitsError> {
    let rows = logits.rows();
    if stats.len() != rows {
        return Err(LogitsError::RowCountMismatch { what: "the statistics", got: stats.len(), expected: rows });
    }
    if let Some(e) = emitted
        && e.len() != rows
    {
        return Err(LogitsError::TokenCountMismatch { got: e.len(), rows });
    }
    stats
        .iter()
        .enumerate()
        .map(|(row, s)| {
            let chosen = match emitted {
                Some(ids) => {
                    let id = ids[row];
                    let logit = logits.logit(row, id as usize).ok_or(LogitsError::TokenOutOfRange {
                        row,
                        token: id,
                        vocab: logits.vocab(),
                    })?;
                    if logit == f32::NEG_INFINITY {
                        return Err(LogitsError::ImpossibleToken { row, token: id });
                    }
                    Some(ChosenToken { id, logit })
                }
                None => None,
            };
            s.to_token_logit(first_position.saturating_add(row as u32), chosen, text)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logits::analyze;

    #[test]
    fn a_row_becomes_a_token_logit_record() {
        // softmax of [ln 1, ln 2, ln 1] = [1/4, 1/2, 1/4]; lse = ln 4.
        let x = [0.0f32, 2f32.ln(), 0.0];
        let view = LogitsView::f32(&x, 1, 3).expect("1 x 3");
        let stats = analyze(view, 2).expect("finite");
        let record = stats[0].to_token_logit(7, None, None).expect("top-1");
        assert_eq!(record.position, 7);
        assert_eq!(record.token_id, 1);
        assert_eq!(record.token, "");
        assert_eq!(record.top_ids[..], [1, 0]);
        assert_eq!(record.top_tokens[..], [String::new(), String::new()]);
        assert!((record.logprob - 0.5f32.ln()).abs() < 1e-6);
        assert!((record.top_logprobs[1] - 0.25f32.ln()).abs() < 1e-6);

        let words = |id: u32| ["a", "b", "c"][id as usize].to_string();
        let emitted = token_logits(&view, &stats, Some(&[2]), 3, Some(&words)).expect("in range");
        assert_eq!(emitted[0].token_id, 2);
        assert_eq!(emitted[0].token, "c");
        assert_eq!(emitted[0].top_tokens[..], ["b", "a"]);
        assert!((emitted[0].logprob - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(emitted[0].position, 3);
    }

    #[test]
    fn no_top_k_and_no_token_is_an_error_not_a_made_up_record() {
        let x = [1.0f32, 2.0];
        let stats = analyze(LogitsView::f32(&x, 1, 2).expect("1 x 2"), 0).expect("finite");
        let error = stats[0].to_token_logit(0, None, None).expect_err("nothing to name");
        assert_eq!(error.category(), "NoToken");
    }

    #[test]
    fn an_emitted_token_with_logit_minus_infinity_is_an_error_naming_row_and_token() {
        // Row 1 masks token 2; an emitted 2 there cannot come from these logits.
        let x = [0.0f32, 1.0, 2.0, 0.0, 1.0, f32::NEG_INFINITY];
        let view = LogitsView::f32(&x, 2, 3).expect("2 x 3");
        let stats = analyze(view, 1).expect("finite");
        let error = token_logits(&view, &stats, Some(&[2, 2]), 10, None).expect_err("token 2 is masked in row 1");
        assert_eq!(error.category(), "ImpossibleToken");
        assert_eq!(
            error.to_string().split(':').next(),
            Some("emitted token 2 at row 1 has logit -inf (probability 0) in these logits")
        );
        let error = stats[1]
            .to_token_logit(11, Some(ChosenToken { id: 2, logit: f32::NEG_INFINITY }), None)
            .expect_err("probability 0");
        assert_eq!(error.category(), "ImpossibleToken");
        // The same token where it is finite is a record with a finite log-probability.
        let records = token_logits(&view, &stats, Some(&[2, 1]), 10, None).expect("both finite");
        assert!(records.iter().all(|r| r.logprob.is_finite()), "{records:?}");
    }

    #[test]
    fn token_ids_of_another_length_than_the_rows_say_which_field_and_both_counts() {
        // It said "the emitted tokens has 2 rows but the logits have 3".
        let x = [0.0f32, 1.0, 2.0, 0.0, 1.0, 2.0, 0.5, 0.5, 0.5];
        let view = LogitsView::f32(&x, 3, 3).expect("3 x 3");
        let stats = analyze(view, 1).expect("finite");
        for ids in [&[0u32, 1][..], &[0, 1, 2, 0][..]] {
            let error = token_logits(&view, &stats, Some(ids), 0, None).expect_err("one id per row");
            assert_eq!(error.category(), "RowCountMismatch");
            assert_eq!(
                error.to_string(),
                format!("token_ids has {} ids but the logits have 3 rows: give one emitted token per row", ids.len())
            );
        }
    }
}
