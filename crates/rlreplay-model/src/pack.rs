//! Packing of (prompt, response) pairs into one token stream without padding.

use crate::{Error, Result};

/// One sequence to score: the response tokens are scored given the prompt and the response
/// tokens before them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqPair<'a> {
    /// Prompt token ids (at least one when the response is not empty).
    pub prompt: &'a [u32],
    /// Response token ids, each of which gets a log-prob.
    pub response: &'a [u32],
}

impl<'a> SeqPair<'a> {
    /// A pair from prompt and response ids.
    pub fn new(prompt: &'a [u32], response: &'a [u32]) -> Self {
        Self { prompt, response }
    }

    /// Tokens this pair feeds through the model: prompt plus response minus the last token (whose
    /// successor is never scored); 0 when the response is empty.
    pub fn fed_tokens(&self) -> usize {
        if self.response.is_empty() {
            0
        } else {
            self.prompt.len() + self.response.len() - 1
        }
    }
}

/// Splits `pairs` into consecutive ranges whose fed tokens ([`SeqPair::fed_tokens`]) sum to at
/// most `max_tokens`; a single pair longer than that gets a range of its own.
pub fn micro_batches(pairs: &[SeqPair<'_>], max_tokens: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (i, p) in pairs.iter().enumerate() {
        let n = p.fed_tokens();
        if i > start && tokens + n > max_tokens {
            out.push(start..i);
            start = i;
            tokens = 0;
        }
        tokens += n;
    }
    if start < pairs.len() {
        out.push(start..pairs.len());
    }
    out
}

/// A packed batch: the concatenated inputs of every pair with a non-empty response.
#[derive(Debug, Default)]
pub(crate) struct Packed {
    /// Input token ids, `[T]`.
    pub ids: Vec<u32>,
    /// Position of each input token within its own sequence, `[T]`.
    pub positions: Vec<u32>,
    /// Sequence boundaries in the packed stream, `[0, .., T]`.
    pub seq_offsets: Vec<usize>,
    /// For each scored token, the packed row whose hidden state predicts it, `[N]`.
    pub rows: Vec<u32>,
    /// The scored (response) tokens, `[N]`.
    pub targets: Vec<u32>,
    /// Number of response tokens of each input pair (0 for empty responses).
    pub response_lens: Vec<usize>,
}

impl Packed {
    /// Packs `pairs`, checking token ids against `vocab` and lengths against `max_positions`.
    pub fn new(pairs: &[SeqPair<'_>], vocab: usize, max_positions: usize) -> Result<Self> {
        let mut p = Packed {
            seq_offsets: vec![0],
            ..Default::default()
        };
        for (i, pair) in pairs.iter().enumerate() {
            p.response_lens.push(pair.response.len());
            if pair.response.is_empty() {
                continue;
            }
            if pair.prompt.is_empty() {
                return Err(Error::Input(format!(
                    "pair {i}: the prompt is empty, so the first response token has no context"
                )));
            }
            let total = pair.prompt.len() + pair.response.len();
            if total > max_positions {
                return Err(Error::Input(format!(
                    "pair {i}: {total} tokens exceed max_position_embeddings = {max_positions}"
                )));
            }
            for (part, ids) in [("prompt", pair.prompt), ("response", pair.response)] {
                if let Some((j, &t)) = ids.iter().enumerate().find(|(_, &t)| t as usize >= vocab) {
                    return Err(Error::Input(format!(
                        "pair {i}: {part} token {j} is {t}, outside the vocabulary of {vocab}"
                    )));
                }
            }
            let start = p.ids.len();
            let fed = pair.fed_tokens();
            p.ids.extend_from_slice(pair.prompt);
            p.ids
                .extend_from_slice(&pair.response[..pair.response.len() - 1]);
            p.positions.extend(0..fed as u32);
            let first = start + pair.prompt.len() - 1;
            p.rows
                .extend((first..first + pair.response.len()).map(|r| r as u32));
            p.targets.extend_from_slice(pair.response);
            p.seq_offsets.push(start + fed);
        }
        Ok(p)
    }

    /// Splits a flat per-scored-token vector back into one vector per input pair.
    pub fn split<T: Clone>(&self, flat: &[T]) -> Vec<Vec<T>> {
        let mut out = Vec::with_capacity(self.response_lens.len());
        let mut at = 0;
        for &n in &self.response_lens {
            out.push(flat[at..at + n].to_vec());
            at += n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_splits() {
        let pairs = [
            SeqPair::new(&[1, 2], &[3, 4, 5]),
            SeqPair::new(&[7], &[]),
            SeqPair::new(&[8], &[9]),
        ];
        let p = Packed::new(&pairs, 16, 100).unwrap();
        assert_eq!(p.ids, [1, 2, 3, 4, 8]);
        assert_eq!(p.positions, [0, 1, 2, 3, 0]);
        assert_eq!(p.seq_offsets, [0, 4, 5]);
        assert_eq!(p.rows, [1, 2, 3, 4]);
        assert_eq!(p.targets, [3, 4, 5, 9]);
        assert_eq!(
            p.split(&[0.1, 0.2, 0.3, 0.4]),
            vec![vec![0.1, 0.2, 0.3], vec![], vec![0.4]]
        );
    }

    #[test]
    fn rejects_bad_pairs() {
        let e = Packed::new(&[SeqPair::new(&[], &[1])], 16, 100).unwrap_err();
        assert!(e.to_string().contains("prompt is empty"), "{e}");
        let e = Packed::new(
            &[SeqPair::new(&[1], &[2]), SeqPair::new(&[1], &[99])],
            16,
            100,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("pair 1: response token 0 is 99"),
            "{e}"
        );
        let e = Packed::new(&[SeqPair::new(&[1; 60], &[2; 41])], 16, 100).unwrap_err();
        assert!(e.to_string().contains("101 tokens"), "{e}");
    }

    #[test]
    fn splits_into_micro_batches() {
        let a = [1u32; 10];
        let pairs = [
            SeqPair::new(&a[..3], &a[..3]), // 5 fed tokens
            SeqPair::new(&a[..3], &a[..3]), // 5
            SeqPair::new(&a[..9], &a[..3]), // 11
            SeqPair::new(&a[..1], &a[..1]), // 1
        ];
        assert_eq!(micro_batches(&pairs, 10), vec![0..2, 2..3, 3..4]);
        assert_eq!(micro_batches(&pairs, 100), vec![0..4]);
        assert!(micro_batches(&[], 10).is_empty());
    }
}
