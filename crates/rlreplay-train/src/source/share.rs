//! Generation on data-parallel ranks: the split of a step's prompt groups across the ranks and
//! the exchange of the scored rows, so that every rank holds the whole step.
//!
//! The groups are the unit: each rank generates and scores whole groups, contiguous and in
//! prompt order, balanced by their expected work ([`split`]). Each group draws the random
//! streams of its index in the step (see
//! [`generate_part`](rlreplay_sampling::engine::generate_part)), and a sequence's logits do not
//! depend on which others share its forward passes, so a group samples the same tokens and
//! log-probs on whichever rank generates it. The ranks then all-gather their scored rows in rank
//! order ([`share`]), which is the order one process generates them in.

use std::ops::Range;

use rlreplay_dist::wire::{Reader, Writer};
use rlreplay_dist::{partition_rows, Collective};
use rlreplay_sampling::engine::Generation;

use crate::error::Result;
use crate::prompts::RewardFailure;

/// A generated row with its reward, as the ranks exchange it.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The completion; `prompt` is its prompt's index in the step.
    pub generation: Generation,
    /// The policy version that generated it, when known.
    pub version: Option<u64>,
    /// The reward that enters training.
    pub reward: f64,
    /// Why the reward is 0, when it failed.
    pub failure: Option<RewardFailure>,
    /// The response decoded without special tokens.
    pub response: String,
}

/// The prompts of rank `rank` among `world` ranks: a contiguous range of the step's prompts,
/// whole groups, balanced by each group's expected work (its prompt, prefilled once, and `n`
/// responses of at most `max_new_tokens`). A rank may get none when there are fewer groups than
/// ranks.
pub fn split(
    prompt_lens: &[usize],
    n: usize,
    max_new_tokens: usize,
    world: usize,
    rank: usize,
) -> Range<usize> {
    if world <= 1 {
        return 0..prompt_lens.len();
    }
    let costs: Vec<u64> = prompt_lens
        .iter()
        .map(|&p| (p + n * max_new_tokens) as u64)
        .collect();
    partition_rows(&costs, world)[rank].clone()
}

/// Every rank's `mine` (and its `extra` bytes), concatenated in rank order, on every rank.
pub fn share(
    comm: &dyn Collective,
    mine: Vec<Scored>,
    extra: &[u8],
) -> Result<(Vec<Scored>, Vec<Vec<u8>>)> {
    if comm.world() == 1 {
        return Ok((mine, vec![extra.to_vec()]));
    }
    let msgs = comm.all_gather_bytes(&encode(&mine, extra))?;
    let (mut rows, mut extras) = (Vec::new(), Vec::new());
    for (rank, msg) in msgs.iter().enumerate() {
        extras.push(decode(msg, rank, &mut rows)?);
    }
    Ok((rows, extras))
}

/// Every rank's `mine`, concatenated in rank order, on every rank.
pub fn share_f64(comm: &dyn Collective, mine: Vec<f64>) -> Result<Vec<f64>> {
    if comm.world() == 1 {
        return Ok(mine);
    }
    let mut w = Writer::new();
    w.usize(mine.len());
    mine.iter().for_each(|&x| {
        w.f64(x);
    });
    let mut out = Vec::new();
    for (rank, msg) in comm.all_gather_bytes(&w.finish())?.iter().enumerate() {
        let mut r = Reader::new(msg, rank);
        for _ in 0..r.usize()? {
            out.push(r.f64()?);
        }
        r.end()?;
    }
    Ok(out)
}

fn encode(rows: &[Scored], extra: &[u8]) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(extra).usize(rows.len());
    for s in rows {
        let g = &s.generation;
        w.usize(g.prompt)
            .usize(g.sample)
            .u32s(&g.tokens)
            .f32s(&g.logprobs)
            .u32(u32::from(g.truncated))
            .u64(s.version.map_or(0, |v| v + 1))
            .f64(s.reward)
            .u32(match s.failure {
                None => 0,
                Some(RewardFailure::Error) => 1,
                Some(RewardFailure::Timeout) => 2,
            })
            .str(&s.response);
    }
    w.finish()
}

/// Appends rank `rank`'s rows to `rows`; returns its extra bytes.
fn decode(msg: &[u8], rank: usize, rows: &mut Vec<Scored>) -> Result<Vec<u8>> {
    let mut r = Reader::new(msg, rank);
    let extra = r.bytes()?.to_vec();
    for _ in 0..r.usize()? {
        let generation = Generation {
            prompt: r.usize()?,
            sample: r.usize()?,
            tokens: r.u32s()?,
            logprobs: r.f32s()?,
            truncated: r.u32()? != 0,
        };
        let version = r.u64()?.checked_sub(1);
        let reward = r.f64()?;
        let failure = match r.u32()? {
            0 => None,
            1 => Some(RewardFailure::Error),
            2 => Some(RewardFailure::Timeout),
            k => return Err(r.error(format!("unknown reward failure {k}")).into()),
        };
        let response = r.str()?.to_string();
        rows.push(Scored {
            generation,
            version,
            reward,
            failure,
            response,
        });
    }
    r.end()?;
    Ok(extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_groups_split_whole() {
        let rows = vec![
            Scored {
                generation: Generation {
                    prompt: 3,
                    sample: 1,
                    tokens: vec![5, 6],
                    logprobs: vec![-0.25, -1e-9],
                    truncated: true,
                },
                version: Some(0),
                reward: 1.0,
                failure: None,
                response: "\\boxed{4}".into(),
            },
            Scored {
                generation: Generation {
                    prompt: 4,
                    sample: 0,
                    tokens: vec![],
                    logprobs: vec![],
                    truncated: false,
                },
                version: None,
                reward: 0.0,
                failure: Some(RewardFailure::Timeout),
                response: String::new(),
            },
        ];
        let mut back = Vec::new();
        let extra = decode(&encode(&rows, b"xy"), 1, &mut back).unwrap();
        assert_eq!((back, extra), (rows.clone(), b"xy".to_vec()));
        let msg = encode(&rows, b"");
        let err = decode(&msg[..msg.len() - 2], 1, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("rank 1"), "{err}");

        // Whole groups, contiguous, balanced by expected work; idle ranks when groups run out.
        let lens = [4, 4, 4, 4, 4];
        let parts: Vec<_> = (0..2).map(|r| split(&lens, 2, 8, 2, r)).collect();
        assert_eq!(parts, [0..3, 3..5]);
        let parts: Vec<_> = (0..3).map(|r| split(&lens[..1], 2, 8, 3, r)).collect();
        assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), 1);
        assert_eq!(split(&lens, 2, 8, 1, 0), 0..5);
    }
}
