//! Batched sampling of `n` completions per prompt with continuous batching.
//!
//! Prompts are admitted group by group (all `n` samples of a prompt at once) while the batch has
//! room; each prompt is prefilled once and its KV cache shared by its samples. Every step feeds the
//! last sampled token of every running sequence in one packed forward pass. Sequence `p * n + s`
//! (prompt `p`, sample `s`) draws from its own random stream (the sequences of a step are sampled
//! in parallel, each with its own stream), so the sampled tokens do not depend
//! on the batch size or on which sequences run together (up to float rounding of the logits: matrix
//! products of other shapes may round differently, which moves log-probs by ~1e-7 and could flip a
//! draw that falls exactly on a boundary). The same inputs and batch size give identical results.

use anyhow::{bail, Result};
use rayon::prelude::*;

use crate::sampling::{sample, SamplerScratch, SamplingParams};
use rlreplay_model::generate::{Decoder, KvCache};

/// One completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Index of its prompt.
    pub prompt: usize,
    /// Index of the sample among the prompt's `n`.
    pub sample: usize,
    /// The generated token ids (a final stop id included).
    pub tokens: Vec<u32>,
    /// `log softmax(z / τ)` of each generated token over the full vocabulary.
    pub logprobs: Vec<f32>,
    /// Whether generation ended without a stop id (length or context limit).
    pub truncated: bool,
}

struct Running {
    id: usize,
    prompt_len: usize,
    cache: KvCache,
    rng: rand_chacha::ChaCha8Rng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
}

/// Samples `n` completions for every prompt, running up to `max_batch` sequences at a time (at
/// least one prompt group). Returns them prompt-major (`p * n + s`); `on_done` is called as each
/// completion finishes.
pub fn generate(
    decoder: &Decoder,
    prompts: &[Vec<u32>],
    n: usize,
    params: &SamplingParams,
    max_batch: usize,
    mut on_done: impl FnMut(&Generation),
) -> Result<Vec<Generation>> {
    params.validate()?;
    if n == 0 {
        bail!("the number of samples per prompt must be >= 1");
    }
    let max_pos = decoder.config().max_position_embeddings;
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            bail!("prompt {i} is empty");
        }
        if p.len() >= max_pos {
            bail!(
                "prompt {i} has {} tokens; the model's context is {max_pos}",
                p.len()
            );
        }
    }
    let vocab = decoder.config().vocab_size;
    let mut results: Vec<Option<Generation>> = vec![None; prompts.len() * n];
    let mut workers: Vec<SamplerScratch> = (0..rayon::current_num_threads().max(1))
        .map(|_| SamplerScratch::default())
        .collect();
    let mut active: Vec<Running> = Vec::new();
    let mut next_prompt = 0;
    // Takes the token sampled from `logits` for `seq`; returns the finished generation, if any.
    let advance = |seq: &mut Running, logits: &[f32], scratch: &mut SamplerScratch| {
        let s = sample(logits, params, &mut seq.rng, scratch);
        seq.tokens.push(s.token);
        seq.logprobs.push(s.logprob);
        let stopped = params.stop_ids.contains(&s.token);
        let full = seq.tokens.len() >= params.max_new_tokens
            || seq.prompt_len + seq.tokens.len() >= max_pos;
        (stopped || full).then(|| Generation {
            prompt: seq.id / n,
            sample: seq.id % n,
            tokens: std::mem::take(&mut seq.tokens),
            logprobs: std::mem::take(&mut seq.logprobs),
            truncated: !stopped,
        })
    };
    let mut finish = |g: Generation, results: &mut Vec<Option<Generation>>| {
        on_done(&g);
        let id = g.prompt * n + g.sample;
        results[id] = Some(g);
    };
    loop {
        // Admit whole prompt groups while they fit (always at least one when idle).
        let mut admit = Vec::new();
        while next_prompt < prompts.len()
            && (active.len() + (admit.len() + 1) * n <= max_batch
                || (active.is_empty() && admit.is_empty()))
        {
            admit.push(next_prompt);
            next_prompt += 1;
        }
        if !admit.is_empty() {
            let mut caches: Vec<KvCache> = admit.iter().map(|_| decoder.new_cache()).collect();
            let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
            let feed: Vec<&[u32]> = admit.iter().map(|&p| prompts[p].as_slice()).collect();
            let logits = decoder.forward_logits(&mut refs, &feed)?;
            for (row, (&p, cache)) in admit.iter().zip(caches).enumerate() {
                let row = &logits[row * vocab..(row + 1) * vocab];
                for s in 0..n {
                    let id = p * n + s;
                    let mut seq = Running {
                        id,
                        prompt_len: prompts[p].len(),
                        cache: cache.fork()?,
                        rng: params.rng_for(id as u64),
                        tokens: Vec::new(),
                        logprobs: Vec::new(),
                    };
                    match advance(&mut seq, row, &mut workers[0]) {
                        Some(g) => finish(g, &mut results),
                        None => active.push(seq),
                    }
                }
            }
        }
        if active.is_empty() {
            if next_prompt >= prompts.len() {
                break;
            }
            continue;
        }
        let last: Vec<[u32; 1]> = active
            .iter()
            .map(|s| [*s.tokens.last().expect("a running sequence has a token")])
            .collect();
        let feed: Vec<&[u32]> = last.iter().map(|t| t.as_slice()).collect();
        let mut refs: Vec<&mut KvCache> = active.iter_mut().map(|s| &mut s.cache).collect();
        let logits = decoder.forward_logits(&mut refs, &feed)?;
        // Sample every sequence in parallel (contiguous chunks, one scratch per chunk), then
        // retire the finished ones in order.
        let chunk = active.len().div_ceil(workers.len());
        let done: Vec<Option<Generation>> = active
            .par_chunks_mut(chunk)
            .zip(logits.par_chunks(chunk * vocab))
            .zip(workers.par_iter_mut())
            .flat_map_iter(|((seqs, logits), scratch)| {
                seqs.iter_mut()
                    .zip(logits.chunks_exact(vocab))
                    .map(|(seq, row)| advance(seq, row, scratch))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut still = Vec::with_capacity(active.len());
        for (seq, g) in active.drain(..).zip(done) {
            match g {
                Some(g) => finish(g, &mut results),
                None => still.push(seq),
            }
        }
        active = still;
    }
    Ok(results
        .into_iter()
        .map(|g| g.expect("every sequence finishes"))
        .collect())
}
