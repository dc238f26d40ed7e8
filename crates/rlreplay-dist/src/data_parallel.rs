//! Data-parallel passes of a model: the passes of an update split across the ranks of a
//! [`Collective`], everything else computed identically on every rank.
//!
//! Every rank holds the whole batch (the same rows in the same order) and a full replica of the
//! model. The passes through the model are what costs, so only they are split:
//!
//! - The micro-batches (packs of at most a budget of tokens) are formed over the whole batch
//!   exactly as one process forms them, whatever the number of ranks, and the packs — never a
//!   row of one — are shared out by [`partition`] (contiguous, balanced by the passes'
//!   multiply-adds, the attention's quadratic term included). A pack's log-probs and gradient
//!   are therefore the same bits on any number of ranks.
//! - Per-token outputs are gathered in rank order, which is row order, so every rank then holds
//!   the whole batch's outputs; what the caller computes from them is the same on every rank.
//! - Before clipping and AdamW, the gradients each rank accumulated over its packs are summed
//!   over the ranks in rank order, the same bits on every rank, so every rank applies the same
//!   update. With ZeRO-1 ([`DataParallel::sharded`]) the optimizer state, and optionally the
//!   master weights, are sharded over the ranks.
//!
//! The one sum that is grouped differently from one process: one process adds the packs'
//! gradients left to right, `((g₁ + g₂) + g₃) + g₄`; two ranks holding `g₁, g₂` and `g₃, g₄` add
//! `(g₁ + g₂) + (g₃ + g₄)`. Both add in f64 ([`Model::grad_sums`]: the packs' f32 gradients,
//! the ranks' partial sums) and round to f32 once, at the end; a sum of f32 values in f64 is exact
//! unless one parameter's terms lie more than about 2^29 apart in magnitude, so the groupings
//! give the same bits (and where an f64 sum does round, the f32 result changes about once in
//! 2^29).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Instant;

use candle_core::{DType, Tensor};
use rlreplay_model::{micro_batches, AdamW, Model, ModelConfig, SeqPair, StepReport};

use crate::collective::{Collective, Shards, SingleProcess};
use crate::error::{DistError, Result};
use crate::partition::{partition, partition_rows};
use crate::wire::{Reader, Writer};

/// Where an update's model passes run: this process alone, or shared by data-parallel ranks.
pub struct DataParallel<'a> {
    comm: &'a dyn Collective,
    /// ZeRO-1: the optimizer state sharded over the ranks.
    shard: bool,
    /// With `shard`, the master weights too (where they are not the compute weights).
    shard_masters: bool,
    /// Seconds spent in collectives since the last [`DataParallel::take_metrics`].
    gather_s: Cell<f64>,
    all_reduce_s: Cell<f64>,
}

impl<'a> DataParallel<'a> {
    /// The passes of `comm`'s ranks.
    pub fn new(comm: &'a dyn Collective) -> Self {
        Self {
            comm,
            shard: false,
            shard_masters: false,
            gather_s: Cell::new(0.0),
            all_reduce_s: Cell::new(0.0),
        }
    }

    /// With [`DataParallel::sharded`], shard the master weights too (where they are not the
    /// compute weights); not when something reads them whole after every update.
    pub fn with_sharded_masters(mut self, shard_masters: bool) -> Self {
        self.shard_masters = shard_masters;
        self
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.comm.world()
    }

    /// The pack indices of this rank among `packs` (contiguous row ranges over `pairs`):
    /// [`partition`] with the packs as units, weighted by each pair's [`pass_cost`] under
    /// `cfg`.
    fn my_packs(
        &self,
        cfg: &ModelConfig,
        pairs: &[SeqPair<'_>],
        packs: &[Range<usize>],
    ) -> Result<Range<usize>> {
        if self.world() == 1 {
            return Ok(0..packs.len());
        }
        let costs: Vec<u64> = pairs.iter().map(|p| pass_cost(cfg, p)).collect();
        let parts = partition(&costs, packs, self.world())?;
        let rows = parts[self.comm.rank()].clone();
        let first = packs.partition_point(|p| p.start < rows.start);
        let last = packs.partition_point(|p| p.end <= rows.end);
        Ok(first..last.max(first))
    }

    /// Runs `pass` on this rank's share of the packs of `pairs` (micro-batches of `budget`
    /// tokens, formed as one process forms them; shared out by their cost under a model of
    /// shape `cfg`) and returns the per-token outputs of every pack, flat in pair order, on
    /// every rank. `pass` gets a pack's row range and returns one output per response token of
    /// each of its pairs.
    pub fn packed<E: From<DistError>>(
        &self,
        cfg: &ModelConfig,
        pairs: &[SeqPair<'_>],
        budget: usize,
        mut pass: impl FnMut(Range<usize>) -> std::result::Result<Vec<Vec<f64>>, E>,
    ) -> std::result::Result<Vec<f64>, E> {
        let packs = micro_batches(pairs, budget);
        let mut out = Vec::new();
        for c in &packs[self.my_packs(cfg, pairs, &packs)?] {
            out.extend(pass(c.clone())?.into_iter().flatten());
        }
        Ok(self.gather(out)?)
    }

    /// Per-token log-probs of `pairs` (no graph), packed into micro-batches of `budget` tokens;
    /// flat, in pair order, on every rank. Each rank runs its share of the packs.
    pub fn logprobs(
        &self,
        model: &Model,
        pairs: &[SeqPair<'_>],
        budget: usize,
        temperature: f64,
    ) -> Result<Vec<f64>> {
        self.packed(model.config(), pairs, budget, |c| {
            Ok(model.logprobs(&pairs[c], temperature, false)?.logprobs)
        })
    }

    /// Accumulates into `model`'s gradient buffers the gradient of `Σ g_t · ℓ_t` over this
    /// rank's packs of `pairs` (`grad_logprobs`: every response token of every pair); returns
    /// the log-probs of all the pairs, on every rank.
    pub fn forward_backward(
        &self,
        model: &mut Model,
        pairs: &[SeqPair<'_>],
        grad_logprobs: &[f64],
        budget: usize,
        temperature: f64,
    ) -> Result<Vec<f64>> {
        let mut at = vec![0usize];
        for p in pairs {
            at.push(at[at.len() - 1] + p.response.len());
        }
        if grad_logprobs.len() != at[pairs.len()] {
            return Err(DistError::Shape(format!(
                "{} log-prob gradients for {} response tokens",
                grad_logprobs.len(),
                at[pairs.len()]
            )));
        }
        let cfg = model.config().clone();
        self.packed(&cfg, pairs, budget, |c| {
            let g = &grad_logprobs[at[c.start]..at[c.end]];
            Ok(model.forward_backward(&pairs[c], g, temperature)?)
        })
    }

    /// Sums the gradients accumulated on every rank over the ranks, in rank order, so every
    /// rank holds the mini-batch's gradient before clipping and AdamW. A rank that ran no pack
    /// adds zeros; a parameter keeps no gradient only when no rank ran a pack.
    pub fn sum_gradients(&self, model: &mut Model) -> Result<()> {
        if self.world() == 1 {
            return Ok(());
        }
        let started = Instant::now();
        let present = model.grads().iter().any(Option::is_some);
        let sums = model.grad_sums()?;
        let mut flat = Vec::with_capacity(model.params().len() + 1);
        for (p, g) in model.params().iter().zip(sums) {
            let g = match g {
                Some(g) => g,
                None => p.var.as_detached_tensor().zeros_like()?,
            };
            flat.push(g.flatten_all()?.to_dtype(DType::F64)?);
        }
        flat.push(Tensor::new(
            &[f64::from(u8::from(present))],
            model.device(),
        )?);
        let sum = self
            .comm
            .all_reduce_sum_tensor(&Tensor::cat(&flat, 0)?)
            .map_err(|e| e.during("summing the gradients over the ranks"))?;
        let n = sum.dim(0)?;
        let any = sum
            .narrow(0, n - 1, 1)?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?[0]
            > 0.0;
        if !any {
            model.zero_grad();
        } else {
            let mut at = 0;
            let mut totals = Vec::with_capacity(model.params().len());
            for p in model.params() {
                let shape = p.var.shape().clone();
                let len = shape.elem_count();
                totals.push(Some(sum.narrow(0, at, len)?.reshape(shape)?));
                at += len;
            }
            model.set_grad_sums(totals)?;
        }
        self.all_reduce_s
            .set(self.all_reduce_s.get() + started.elapsed().as_secs_f64());
        Ok(())
    }

    /// ZeRO-1: the optimizer state of whole parameter tensors is kept by one rank each,
    /// contiguous in parameter order and balanced by elements.
    pub fn sharded(mut self, shard: bool) -> Self {
        self.shard = shard;
        self
    }

    /// Whether the master weights of `model` are sharded: ZeRO-1 on several ranks with a
    /// compute dtype other than the master dtype (bf16: in f32 the masters are the compute
    /// weights, which every rank needs whole).
    fn masters_sharded(&self, model: &Model) -> bool {
        self.shard
            && self.shard_masters
            && self.world() > 1
            && model.compute_dtype() != model.master_dtype()
    }

    /// With sharded master weights, drops the masters of the parameters this rank does not own
    /// and keeps their compute-dtype casts instead: each rank then holds the f32 masters of its
    /// share and a compute-dtype replica of the rest. Every rank calls it (after loading the
    /// policy, after a checkpoint); it does nothing otherwise, or a second time.
    pub fn shard_masters(&self, model: &mut Model) -> Result<()> {
        if !self.masters_sharded(model) {
            return Ok(());
        }
        let (owner, _) = self.zero_layout(model)?;
        let me = self.comm.rank();
        for (i, &o) in owner.iter().enumerate() {
            if o != me && model.holds_master(i) {
                model.drop_master(i)?;
            }
        }
        Ok(())
    }

    /// With sharded master weights, hands rank 0 the master weights of every parameter (before
    /// it saves the policy: a checkpoint holds the f32 masters whatever the number of ranks);
    /// [`DataParallel::shard_masters`] drops them again. Every rank calls it.
    pub fn gather_masters(&self, model: &mut Model) -> Result<()> {
        if !self.masters_sharded(model) {
            return Ok(());
        }
        let (owner, _) = self.zero_layout(model)?;
        let dtype = model.master_dtype();
        self.send_weights(
            model,
            &owner,
            dtype,
            Some(0),
            "gathering the master weights on rank 0",
        )
    }

    /// Sends every parameter's weights in `dtype` from its owner (`owner[i]`), one broadcast
    /// per tensor, to every other rank (`to = None`) or to rank `to` alone (the others drop
    /// what they receive; the tensors `to` owns are not sent). Every rank calls it.
    fn send_weights(
        &self,
        model: &mut Model,
        owner: &[usize],
        dtype: DType,
        to: Option<usize>,
        what: &'static str,
    ) -> Result<()> {
        let me = self.comm.rank();
        for (i, &o) in owner.iter().enumerate() {
            if to == Some(o) {
                continue;
            }
            let mut bytes = if o == me {
                model.weight_bytes(i, dtype)?
            } else {
                Vec::new()
            };
            self.comm
                .broadcast_bytes(o, &mut bytes)
                .map_err(|e| e.during(what))?;
            if o != me && to.is_none_or(|t| t == me) {
                model.set_weight_bytes(i, dtype, &bytes)?;
            }
        }
        Ok(())
    }

    /// With sharded master weights, the run log's line on the weights every rank holds (`None`
    /// otherwise). Every rank calls it.
    pub fn describe_held_weights(&self, model: &Model) -> Result<Option<String>> {
        if !self.masters_sharded(model) {
            return Ok(None);
        }
        let held = self.held_weights(model)?;
        let total = held[0][0] + 2 * held[0][1];
        let compute = format!("{:?}", model.compute_dtype()).to_lowercase();
        let ranks: Vec<String> = held
            .iter()
            .enumerate()
            .map(|(r, [m, rep])| {
                format!(
                    "rank {r} holds {:.1} % of the f32 master weights ({m} of {total} bytes) and \
                     {compute} replicas of the rest ({rep} bytes)",
                    100.0 * *m as f64 / total.max(1) as f64
                )
            })
            .collect();
        Ok(Some(format!(
            "sharded master weights: {}",
            ranks.join("; ")
        )))
    }

    /// The weights each rank holds (`[masters, replicas]` bytes, in rank order): every rank
    /// calls it.
    pub fn held_weights(&self, model: &Model) -> Result<Vec<[u64; 2]>> {
        let held = model.held_weights();
        let mut mine = Writer::new();
        mine.u64(held.masters).u64(held.replicas);
        let mine = mine.finish();
        let all = if self.world() == 1 {
            vec![mine]
        } else {
            self.comm.all_gather_bytes(&mine)?
        };
        all.iter()
            .enumerate()
            .map(|(rank, b)| {
                let mut r = Reader::new(b, rank);
                let held = [r.u64()?, r.u64()?];
                r.end()?;
                Ok(held)
            })
            .collect()
    }

    /// The ZeRO-1 layout: the owner of each parameter and the element ranges of the ranks in
    /// the flat buffer of every parameter.
    fn zero_layout(&self, model: &Model) -> Result<(Vec<usize>, Shards)> {
        let sizes: Vec<u64> = model
            .params()
            .iter()
            .map(|p| p.var.elem_count() as u64)
            .collect();
        let parts = partition_rows(&sizes, self.world());
        let mut owner = vec![0; sizes.len()];
        let mut at = vec![0usize];
        for &s in &sizes {
            at.push(at[at.len() - 1] + s as usize);
        }
        for (r, part) in parts.iter().enumerate() {
            owner[part.clone()].iter_mut().for_each(|o| *o = r);
        }
        let ranges = parts.iter().map(|p| at[p.start]..at[p.end]).collect();
        Ok((owner, Shards::from_ranges(ranges)?))
    }

    /// The optimizer step of a mini-batch: the gradients summed over the ranks, clipped to the
    /// global norm and applied by AdamW, the same update on every rank. With ZeRO-1 the sum is a
    /// reduce-scatter (each rank gets the summed gradients of its own parameters), each rank
    /// updates its own parameters with its share of the moments, and an all-gather hands every
    /// rank the new weights: the same bits as without it.
    pub fn optimizer_step(
        &self,
        model: &mut Model,
        opt: &mut AdamW,
        lr: f64,
    ) -> Result<StepReport> {
        if !self.shard || self.world() == 1 {
            self.sum_gradients(model)?;
            return Ok(opt.step(model, lr)?);
        }
        let started = Instant::now();
        if model.master_dtype() != DType::F32 {
            return Err(DistError::Unsupported(
                "[optim] shard_optimizer_state shards f32 master weights; this model's are f64"
                    .into(),
            ));
        }
        self.shard_masters(model)?;
        let (owner, shards) = self.zero_layout(model)?;
        let me = self.comm.rank();
        for (i, &o) in owner.iter().enumerate() {
            if o != me {
                opt.set_moments(i, None);
            }
        }
        let mut present = [f64::from(u8::from(
            model.grads().iter().any(Option::is_some),
        ))];
        self.comm.all_reduce_sum_f64(&mut present)?;
        if present[0] == 0.0 {
            model.zero_grad();
            return Ok(opt.step(model, lr)?);
        }
        // The ranks' f64 sums are summed, then rounded once, as one process rounds its sum.
        let mut flat = Vec::with_capacity(shards.len());
        for (p, g) in model.params().iter().zip(model.grad_sums()?) {
            match g {
                Some(g) => flat.extend(g.flatten_all()?.to_vec1::<f64>()?),
                None => flat.resize(flat.len() + p.var.elem_count(), 0.0),
            }
        }
        let mut mine64 = vec![0f64; shards.range(me).len()];
        self.comm
            .reduce_scatter_sum_f64(&flat, &shards, &mut mine64)
            .map_err(|e| e.during("reduce-scatter of the gradients"))?;
        drop(flat);
        // `as` rounds to nearest, as the tensors' f64 -> f32 cast does.
        let mine: Vec<f32> = mine64.iter().map(|&x| x as f32).collect();
        drop(mine64);
        let shapes: Vec<candle_core::Shape> = model
            .params()
            .iter()
            .map(|p| p.var.shape().clone())
            .collect();
        let device = model.device().clone();
        let mut at = 0;
        let mut squares = Vec::new();
        for (i, g) in model.grads_mut().iter_mut().enumerate() {
            *g = None;
            if owner[i] == me {
                let len = shapes[i].elem_count();
                let t = Tensor::from_slice(&mine[at..at + len], shapes[i].clone(), &device)?;
                // Model::grad_norm's terms, the same bits.
                squares.push(
                    t.sqr()?
                        .sum_all()?
                        .to_dtype(DType::F64)?
                        .to_scalar::<f64>()?,
                );
                *g = Some(t);
                at += len;
            }
        }
        // The ranks own consecutive parameters: rank order is parameter order, as in
        // Model::grad_norm's sum.
        let sq: f64 = self.all_gather_f64s(&squares)?.into_iter().sum();
        let report = opt.step_with_norm(model, lr, sq.sqrt())?;
        if !report.skipped && self.masters_sharded(model) {
            // Each owner casts its updated masters to the compute dtype and sends them to the
            // others' replicas.
            let dtype = model.compute_dtype();
            self.send_weights(
                model,
                &owner,
                dtype,
                None,
                "all-gather of the updated weights",
            )?;
        } else if !report.skipped {
            let mut mine = Vec::with_capacity(shards.range(me).len());
            for (p, &o) in model.params().iter().zip(&owner) {
                if o == me {
                    mine.extend(p.var.as_detached_tensor().flatten_all()?.to_vec1::<f32>()?);
                }
            }
            let mut all = vec![0f32; shards.len()];
            self.comm
                .all_gather_f32(&mine, &shards, &mut all)
                .map_err(|e| e.during("all-gather of the updated parameters"))?;
            let mut at = 0;
            for (i, p) in model.params().iter().enumerate() {
                let len = shapes[i].elem_count();
                if owner[i] != me {
                    p.var.set(&Tensor::from_slice(
                        &all[at..at + len],
                        shapes[i].clone(),
                        &device,
                    )?)?;
                }
                at += len;
            }
        }
        self.all_reduce_s
            .set(self.all_reduce_s.get() + started.elapsed().as_secs_f64());
        Ok(report)
    }

    /// With ZeRO-1, hands every rank the moments of every parameter (before rank 0 writes a
    /// checkpoint, which holds the whole optimizer state whatever the number of ranks); the next
    /// optimizer step drops the other ranks' shares again. Every rank calls it.
    pub fn gather_optimizer_state(&self, model: &Model, opt: &mut AdamW) -> Result<()> {
        if !self.shard || self.world() == 1 {
            return Ok(());
        }
        let (owner, shards) = self.zero_layout(model)?;
        let me = self.comm.rank();
        let (mut avg, mut sq, mut steps) = (Vec::new(), Vec::new(), Vec::new());
        for (i, p) in model.params().iter().enumerate() {
            if owner[i] != me {
                continue;
            }
            match opt.moments(i) {
                Some((step, m, v)) => {
                    avg.extend(m.flatten_all()?.to_vec1::<f32>()?);
                    sq.extend(v.flatten_all()?.to_vec1::<f32>()?);
                    steps.push(step);
                }
                None => {
                    avg.resize(avg.len() + p.var.elem_count(), 0.0);
                    sq.resize(sq.len() + p.var.elem_count(), 0.0);
                    steps.push(0);
                }
            }
        }
        let mut all_avg = vec![0f32; shards.len()];
        let mut all_sq = vec![0f32; shards.len()];
        self.comm.all_gather_f32(&avg, &shards, &mut all_avg)?;
        self.comm.all_gather_f32(&sq, &shards, &mut all_sq)?;
        let mut all_steps = Vec::with_capacity(owner.len());
        let mut mine = Writer::new();
        mine.u64s(&steps);
        for (rank, b) in self
            .comm
            .all_gather_bytes(&mine.finish())?
            .iter()
            .enumerate()
        {
            let mut r = Reader::new(b, rank);
            all_steps.extend(r.u64s()?);
            r.end()?;
        }
        if all_steps.len() != owner.len() {
            return Err(DistError::Shape(format!(
                "optimizer state of {} parameters gathered, the model has {}",
                all_steps.len(),
                owner.len()
            )));
        }
        let mut at = 0;
        for (i, p) in model.params().iter().enumerate() {
            let len = p.var.elem_count();
            let shape = p.var.shape().clone();
            let moments = if all_steps[i] == 0 {
                None
            } else {
                let t = |x: &[f32]| Tensor::from_slice(x, shape.clone(), model.device());
                Some((
                    all_steps[i],
                    t(&all_avg[at..at + len])?,
                    t(&all_sq[at..at + len])?,
                ))
            };
            opt.set_moments(i, moments);
            at += len;
        }
        Ok(())
    }

    /// Every rank's `mine`, concatenated in rank order, on every rank (the time it takes is
    /// `timing_s/logprob_gather`).
    fn gather(&self, mine: Vec<f64>) -> Result<Vec<f64>> {
        if self.world() == 1 {
            return Ok(mine);
        }
        let started = Instant::now();
        let out = self.all_gather_f64s(&mine)?;
        self.gather_s
            .set(self.gather_s.get() + started.elapsed().as_secs_f64());
        Ok(out)
    }

    /// Every rank's `mine`, concatenated in rank order, on every rank.
    fn all_gather_f64s(&self, mine: &[f64]) -> Result<Vec<f64>> {
        let mut out = Vec::new();
        let mut w = Writer::new();
        w.f64s(mine);
        for (rank, b) in self.comm.all_gather_bytes(&w.finish())?.iter().enumerate() {
            let mut r = Reader::new(b, rank);
            out.extend(r.f64s()?);
            r.end()?;
        }
        Ok(out)
    }

    /// The time spent in collectives since the last call (`timing_s/grad_all_reduce`,
    /// `timing_s/logprob_gather`); empty on one process.
    pub fn take_metrics(&self) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        if self.world() > 1 {
            m.insert("timing_s/grad_all_reduce".into(), self.all_reduce_s.take());
            m.insert("timing_s/logprob_gather".into(), self.gather_s.take());
        }
        m
    }
}

/// What one pass over `pair` costs a model of shape `cfg`, in multiply-adds of the forward pass
/// (the backward pass is about twice as many of the same kinds): per fed token and layer the
/// projections and the MLP, the causal attention over the sequence so far (the quadratic term:
/// position `t` attends to `t` keys), and the lm_head of every scored (response) token.
fn pass_cost(cfg: &ModelConfig, pair: &SeqPair<'_>) -> u64 {
    let fed = pair.fed_tokens() as u64;
    if fed == 0 {
        return 0;
    }
    let [h, i, v] = [cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size].map(|x| x as u64);
    let q = (cfg.num_attention_heads * cfg.head_dim) as u64;
    let kv = (cfg.num_key_value_heads * cfg.head_dim) as u64;
    let per_token = h * (2 * q + 2 * kv) + 3 * h * i;
    // Σ over positions t = 1..fed of t keys, for QKᵀ and for PV.
    let attention = q * fed * (fed + 1);
    let layer = fed.saturating_mul(per_token).saturating_add(attention);
    layer
        .saturating_mul(cfg.num_hidden_layers as u64)
        .saturating_add((pair.response.len() as u64).saturating_mul(h * v))
}

impl Default for DataParallel<'static> {
    /// One process.
    fn default() -> Self {
        static SINGLE: std::sync::OnceLock<SingleProcess> = std::sync::OnceLock::new();
        Self::new(SINGLE.get_or_init(SingleProcess::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny shape's terms by hand; the attention's quadratic term makes one long row cost
    /// more than two rows of half its length, and prompt tokens skip the lm_head.
    #[test]
    fn pass_cost_counts_projections_attention_and_lm_head() {
        let cfg = ModelConfig::tiny();
        let (prompt, response) = ([2u32; 3], [3u32; 5]);
        // 7 fed tokens; per token and layer 128·(2·128 + 2·64) + 3·128·384, attention
        // 128·7·8, lm_head 5·128·512, two layers.
        let want = 2 * (7 * (128 * 384 + 3 * 128 * 384) + 128 * 7 * 8) + 5 * 128 * 512;
        assert_eq!(pass_cost(&cfg, &SeqPair::new(&prompt, &response)), want);
        assert_eq!(pass_cost(&cfg, &SeqPair::new(&prompt, &[])), 0);
        let long = vec![3u32; 400];
        let half = vec![3u32; 200];
        let (one, two) = (
            pass_cost(&cfg, &SeqPair::new(&[1], &long)),
            pass_cost(&cfg, &SeqPair::new(&[1], &half)),
        );
        assert!(one > 2 * two);
        let moved = vec![3u32; 201];
        assert!(
            pass_cost(&cfg, &SeqPair::new(&moved, &half))
                < pass_cost(&cfg, &SeqPair::new(&[1], &long))
        );
    }
}
