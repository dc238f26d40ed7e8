//! Batched sampling of `n` completions per prompt with continuous batching.
//!
//! A [`Batcher`] holds the sequences being decoded and a queue of prompt groups (all `n` samples
//! of a prompt) waiting for room. Each [`Batcher::step`] admits whole waiting groups while the
//! batch has room, prefills their prompts in one packed forward pass (each prompt once, its KV
//! cache shared by its samples), then feeds the last sampled token of every running sequence, of
//! every group, in one packed forward pass. Groups can be pushed between steps and leave as their
//! last sample finishes, so requests that arrive at different times share the decode steps.
//! [`generate`] pushes a whole prompt list and steps until it is done.
//!
//! Sample `s` of a group draws from its own random stream (`first_stream + s` of the group's
//! seed; [`generate`] gives prompt `p` the streams `p * n + s`, [`generate_part`] those of its
//! prompts' places in a longer list), and the sequences of a step are sampled in parallel, each
//! with its own stream, so the sampled tokens do not depend on the batch size or on which
//! sequences run together. On the CPU f32 decoder a row's logits are also the same bits whatever
//! the rows beside it, so a prompt list generated in parts (by data-parallel ranks) gives exactly
//! what it gives whole; on the other paths matrix products of other shapes may round differently,
//! which moves log-probs by ~1e-7 and could flip a draw that falls exactly on a boundary. The
//! same inputs and batch size give identical results.

use std::collections::VecDeque;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::sampling::{sample, top_logprobs, LogprobMode, SamplerScratch, SamplingParams};
use rlreplay_model::generate::{Decoder, KvCache};

/// One completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Index of its prompt ([`generate`]) or the id of its group ([`Batcher::push`]).
    pub prompt: usize,
    /// Index of the sample among the prompt's `n`.
    pub sample: usize,
    /// The generated token ids (a final stop id included).
    pub tokens: Vec<u32>,
    /// The log-prob of each generated token: `log softmax(z / τ)` over the full vocabulary
    /// ([`LogprobMode::Tempered`], what [`generate`] returns), or as the group's mode says.
    pub logprobs: Vec<f32>,
    /// Whether generation ended without a stop id (length or context limit, or aborted).
    pub truncated: bool,
}

/// A prompt and how to sample its `n` completions, for [`Batcher::push`].
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The prompt's token ids (not empty, shorter than the model's context).
    pub prompt: Vec<u32>,
    /// Number of samples (at least 1).
    pub n: usize,
    /// Sampling settings (validated).
    pub params: SamplingParams,
    /// Sample `s` draws from random stream `first_stream + s` of `params.seed`.
    pub first_stream: u64,
    /// Which distribution the returned log-probs are of.
    pub logprobs: LogprobMode,
    /// The number of most likely tokens (and their log-probs) to record at each position.
    pub top_logprobs: usize,
}

/// A finished sample of a [`Batcher`] group.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The sample (`prompt` is the group's id).
    pub generation: Generation,
    /// Per generated token, the group's `top_logprobs` most likely tokens and their log-probs
    /// (empty rows when none were asked for).
    pub top: Vec<Vec<(u32, f32)>>,
    /// Whether it was cut short by [`Batcher::abort_all`].
    pub aborted: bool,
}

/// Counters of a [`Batcher`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatcherStats {
    /// Forward passes run (prefills and decode steps).
    pub forward_passes: u64,
    /// Decode steps run.
    pub decode_steps: u64,
    /// Tokens sampled.
    pub sampled_tokens: u64,
    /// Most sequences one decode step served.
    pub max_running: usize,
    /// Most groups one decode step served.
    pub max_running_groups: usize,
}

/// A waiting group.
struct Waiting {
    id: usize,
    group: Group,
}

struct Running {
    /// Index into the batcher's groups.
    group: usize,
    sample: usize,
    prompt_len: usize,
    cache: KvCache,
    rng: rand_chacha::ChaCha8Rng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    top: Vec<Vec<(u32, f32)>>,
}

/// The settings of an admitted group, shared by its running samples.
struct Admitted {
    id: usize,
    params: SamplingParams,
    logprobs: LogprobMode,
    top_logprobs: usize,
    /// Samples still running.
    live: usize,
}

/// Continuous batching over a [`Decoder`]: groups join with [`Batcher::push`] and leave as they
/// finish; each [`Batcher::step`] serves every running sequence in one decode pass.
pub struct Batcher {
    max_batch: usize,
    waiting: VecDeque<Waiting>,
    groups: Vec<Option<Admitted>>,
    active: Vec<Running>,
    workers: Vec<SamplerScratch>,
    next_id: usize,
    stats: BatcherStats,
}

impl Batcher {
    /// A batcher that decodes up to `max_batch` sequences at a time (at least one group).
    pub fn new(max_batch: usize) -> Self {
        Self {
            max_batch,
            waiting: VecDeque::new(),
            groups: Vec::new(),
            active: Vec::new(),
            workers: (0..rayon::current_num_threads().max(1))
                .map(|_| SamplerScratch::default())
                .collect(),
            next_id: 0,
            stats: BatcherStats::default(),
        }
    }

    /// Queues a group; returns its id (0, 1, 2, ... in push order). The group must be valid for
    /// the decoder it will run on (see [`generate`]'s checks).
    pub fn push(&mut self, group: Group) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Waiting { id, group });
        id
    }

    /// Whether no group is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty()
    }

    /// Sequences running now.
    pub fn running(&self) -> usize {
        self.active.len()
    }

    /// Groups waiting for room.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The counters so far.
    pub fn stats(&self) -> BatcherStats {
        self.stats
    }

    /// Drops the groups for which `keep` is false, waiting or running, without results.
    pub fn retain_groups(&mut self, mut keep: impl FnMut(usize) -> bool) {
        self.waiting.retain(|w| keep(w.id));
        let groups = &mut self.groups;
        self.active.retain(|s| {
            let id = groups[s.group].as_ref().map(|g| g.id);
            id.is_some_and(&mut keep)
        });
        for g in groups.iter_mut() {
            if g.as_ref().is_some_and(|g| !keep(g.id)) {
                *g = None;
            }
        }
    }

    /// Ends every waiting and running sample now: running ones with what they generated,
    /// waiting ones empty; all marked `aborted`.
    pub fn abort_all(&mut self) -> Vec<Finished> {
        let mut out = Vec::new();
        for s in std::mem::take(&mut self.active) {
            let g = self.groups[s.group].as_ref().map_or(0, |g| g.id);
            out.push(Finished {
                generation: Generation {
                    prompt: g,
                    sample: s.sample,
                    tokens: s.tokens,
                    logprobs: s.logprobs,
                    truncated: true,
                },
                top: s.top,
                aborted: true,
            });
        }
        for w in std::mem::take(&mut self.waiting) {
            for sample in 0..w.group.n {
                out.push(Finished {
                    generation: Generation {
                        prompt: w.id,
                        sample,
                        tokens: Vec::new(),
                        logprobs: Vec::new(),
                        truncated: true,
                    },
                    top: Vec::new(),
                    aborted: true,
                });
            }
        }
        self.groups.clear();
        out
    }

    /// Admits waiting groups while they fit and prefills them, then runs one decode step over
    /// every running sequence. Returns the samples that finished, in order.
    pub fn step(&mut self, decoder: &Decoder) -> Result<Vec<Finished>> {
        rlreplay_model::on_pool(|| self.step_here(decoder))
    }

    /// [`Batcher::step`] on the calling thread.
    fn step_here(&mut self, decoder: &Decoder) -> Result<Vec<Finished>> {
        let max_pos = decoder.config().max_position_embeddings;
        let vocab = decoder.config().vocab_size;
        let mut done = Vec::new();
        // Admit whole groups while they fit (always at least one when idle).
        let mut admit: Vec<Waiting> = Vec::new();
        let mut seqs = 0;
        while let Some(w) = self.waiting.front() {
            let fits = self.active.len() + seqs + w.group.n <= self.max_batch;
            if !(fits || (self.active.is_empty() && admit.is_empty())) {
                break;
            }
            seqs += w.group.n;
            admit.extend(self.waiting.pop_front());
        }
        if !admit.is_empty() {
            let mut caches: Vec<KvCache> = admit.iter().map(|_| decoder.new_cache()).collect();
            let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
            let feed: Vec<&[u32]> = admit.iter().map(|w| w.group.prompt.as_slice()).collect();
            let logits = decoder.forward_logits(&mut refs, &feed)?;
            self.stats.forward_passes += 1;
            for (row, (w, cache)) in admit.into_iter().zip(caches).enumerate() {
                let row = &logits[row * vocab..(row + 1) * vocab];
                let g = w.group;
                let admitted = Some(Admitted {
                    id: w.id,
                    params: g.params,
                    logprobs: g.logprobs,
                    top_logprobs: g.top_logprobs,
                    live: g.n,
                });
                // Reuse a free slot: the slots stay as many as the groups running at once.
                let slot = match self.groups.iter().position(Option::is_none) {
                    Some(free) => {
                        self.groups[free] = admitted;
                        free
                    }
                    None => {
                        self.groups.push(admitted);
                        self.groups.len() - 1
                    }
                };
                let admitted = self.groups[slot].as_ref().expect("just admitted");
                for s in 0..g.n {
                    let mut seq = Running {
                        group: slot,
                        sample: s,
                        prompt_len: g.prompt.len(),
                        cache: cache.fork()?,
                        rng: admitted.params.rng_for(g.first_stream + s as u64),
                        tokens: Vec::new(),
                        logprobs: Vec::new(),
                        top: Vec::new(),
                    };
                    match advance(&mut seq, admitted, row, max_pos, &mut self.workers[0]) {
                        Some(f) => done.push((slot, f)),
                        None => self.active.push(seq),
                    }
                }
            }
            self.stats.sampled_tokens += seqs as u64;
        }
        if self.active.is_empty() {
            return Ok(self.retire(done));
        }
        let last: Vec<[u32; 1]> = self
            .active
            .iter()
            .map(|s| [*s.tokens.last().expect("a running sequence has a token")])
            .collect();
        let feed: Vec<&[u32]> = last.iter().map(|t| t.as_slice()).collect();
        let mut refs: Vec<&mut KvCache> = self.active.iter_mut().map(|s| &mut s.cache).collect();
        let logits = decoder.forward_logits(&mut refs, &feed)?;
        self.stats.forward_passes += 1;
        self.stats.decode_steps += 1;
        self.stats.sampled_tokens += self.active.len() as u64;
        self.stats.max_running = self.stats.max_running.max(self.active.len());
        let running_groups = self.groups.iter().filter(|g| g.is_some()).count();
        self.stats.max_running_groups = self.stats.max_running_groups.max(running_groups);
        // Sample every sequence in parallel (contiguous chunks, one scratch per chunk), then
        // retire the finished ones in order.
        let chunk = self.active.len().div_ceil(self.workers.len());
        let groups = &self.groups;
        let finished: Vec<Option<(usize, Finished)>> = self
            .active
            .par_chunks_mut(chunk)
            .zip(logits.par_chunks(chunk * vocab))
            .zip(self.workers.par_iter_mut())
            .flat_map_iter(|((seqs, logits), scratch)| {
                seqs.iter_mut()
                    .zip(logits.chunks_exact(vocab))
                    .map(|(seq, row)| {
                        let g = groups[seq.group].as_ref().expect("a running group");
                        advance(seq, g, row, max_pos, scratch).map(|f| (seq.group, f))
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut still = Vec::with_capacity(self.active.len());
        for (seq, f) in self.active.drain(..).zip(finished) {
            match f {
                Some(f) => done.push(f),
                None => still.push(seq),
            }
        }
        self.active = still;
        Ok(self.retire(done))
    }

    /// Counts finished samples (with their group slots) off their groups, frees the slots of
    /// groups with none left, and returns the samples.
    fn retire(&mut self, done: Vec<(usize, Finished)>) -> Vec<Finished> {
        let mut out = Vec::with_capacity(done.len());
        for (slot, f) in done {
            if let Some(g) = self.groups[slot].as_mut() {
                g.live -= 1;
                if g.live == 0 {
                    self.groups[slot] = None;
                }
            }
            out.push(f);
        }
        out
    }
}

/// Takes the token sampled from `logits` for `seq`; returns the finished sample, if any.
fn advance(
    seq: &mut Running,
    group: &Admitted,
    logits: &[f32],
    max_pos: usize,
    scratch: &mut SamplerScratch,
) -> Option<Finished> {
    let params = &group.params;
    let s = sample(logits, params, &mut seq.rng, scratch);
    seq.tokens.push(s.token);
    seq.logprobs
        .push(s.logprob_as(group.logprobs, logits, params));
    if group.top_logprobs > 0 {
        seq.top.push(top_logprobs(
            logits,
            params,
            group.logprobs,
            group.top_logprobs,
            &s,
            scratch,
        ));
    } else {
        seq.top.push(Vec::new());
    }
    let stopped = params.stop_ids.contains(&s.token);
    let full =
        seq.tokens.len() >= params.max_new_tokens || seq.prompt_len + seq.tokens.len() >= max_pos;
    (stopped || full).then(|| Finished {
        generation: Generation {
            prompt: group.id,
            sample: seq.sample,
            tokens: std::mem::take(&mut seq.tokens),
            logprobs: std::mem::take(&mut seq.logprobs),
            truncated: !stopped,
        },
        top: std::mem::take(&mut seq.top),
        aborted: false,
    })
}

/// Samples `n` completions for every prompt, running up to `max_batch` sequences at a time (at
/// least one prompt group). Returns them prompt-major (`p * n + s`) with tempered log-probs;
/// `on_done` is called as each completion finishes.
pub fn generate(
    decoder: &Decoder,
    prompts: &[Vec<u32>],
    n: usize,
    params: &SamplingParams,
    max_batch: usize,
    on_done: impl FnMut(&Generation),
) -> Result<Vec<Generation>> {
    generate_part(decoder, prompts, 0, n, params, max_batch, on_done)
}

/// [`generate`] for the prompts `first..first + prompts.len()` of a longer list: prompt `i` of
/// `prompts` draws the random streams of prompt `first + i` of the whole list, so a list
/// generated in parts (by data-parallel ranks) samples what it samples whole. A generation's
/// `prompt` is its index in `prompts`.
pub fn generate_part(
    decoder: &Decoder,
    prompts: &[Vec<u32>],
    first: usize,
    n: usize,
    params: &SamplingParams,
    max_batch: usize,
    mut on_done: impl FnMut(&Generation),
) -> Result<Vec<Generation>> {
    params.validate()?;
    if n == 0 {
        return Err(Error::NoSamples);
    }
    let max_pos = decoder.config().max_position_embeddings;
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(Error::EmptyPrompt { prompt: first + i });
        }
        if p.len() >= max_pos {
            return Err(Error::PromptTooLong {
                prompt: first + i,
                tokens: p.len(),
                context: max_pos,
            });
        }
    }
    let mut batcher = Batcher::new(max_batch);
    for (p, prompt) in prompts.iter().enumerate() {
        batcher.push(Group {
            prompt: prompt.clone(),
            n,
            params: params.clone(),
            first_stream: ((first + p) * n) as u64,
            logprobs: LogprobMode::Tempered,
            top_logprobs: 0,
        });
    }
    let mut results: Vec<Option<Generation>> = vec![None; prompts.len() * n];
    while !batcher.is_idle() {
        for f in batcher.step(decoder)? {
            let g = f.generation;
            on_done(&g);
            let id = g.prompt * n + g.sample;
            results[id] = Some(g);
        }
    }
    Ok(results
        .into_iter()
        .map(|g| g.expect("every sequence finishes"))
        .collect())
}
