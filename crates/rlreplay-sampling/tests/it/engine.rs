//! Batched sampling on a random tiny Qwen3: log-probs equal the training path's, same seed gives
//! the same outputs whatever the batch size, stop ids and length limits end sequences; groups that
//! join a running batch share its decode steps and keep their random streams; abort and cancel;
//! log-prob modes.

use rlreplay_model::generate::Decoder;
use rlreplay_model::{DType, Device, Model, ModelConfig, SeqPair};
use rlreplay_sampling::engine::{generate, generate_part, Batcher, Generation, Group};
use rlreplay_sampling::sampling::{LogprobMode, SamplingParams};

fn model() -> Model {
    Model::new_random(ModelConfig::tiny(), 7, DType::F32, &Device::Cpu).unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![1, 2, 3, 4, 5, 6, 7], vec![42], vec![9, 8, 7, 300, 500]]
}

fn params(max_new_tokens: usize, stop_ids: Vec<u32>) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        top_k: 50,
        max_new_tokens,
        stop_ids,
        seed: 123,
    }
}

fn run(dec: &Decoder, p: &SamplingParams, n: usize, batch: usize) -> Vec<Generation> {
    generate(dec, &prompts(), n, p, batch, |_| {}).unwrap()
}

#[test]
fn logprobs_match_the_training_path() {
    let m = model();
    let dec = Decoder::new(&m).unwrap();
    for temperature in [0.6f32, 1.0, 1.7] {
        let p = SamplingParams {
            temperature,
            ..params(12, vec![])
        };
        let gens = run(&dec, &p, 2, 4);
        let ps = prompts();
        let pairs: Vec<SeqPair> = gens
            .iter()
            .map(|g| SeqPair::new(&ps[g.prompt], &g.tokens))
            .collect();
        let want = m
            .logprobs(&pairs, f64::from(temperature), false)
            .unwrap()
            .logprobs;
        for (g, w) in gens.iter().zip(&want) {
            assert_eq!(g.tokens.len(), 12);
            assert!(g.truncated);
            for (a, b) in g.logprobs.iter().zip(w) {
                assert!(
                    (f64::from(*a) - b).abs() < 1e-4,
                    "τ={temperature}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn same_seed_same_outputs_whatever_the_batch() {
    let dec = Decoder::new(&model()).unwrap();
    let p = params(10, vec![3, 17, 99]);
    let a = run(&dec, &p, 4, 64);
    assert_eq!(a, run(&dec, &p, 4, 64));
    // One prompt group at a time, and continuous batching with a small batch: the same tokens;
    // log-probs agree to float rounding (matrix products of other shapes round differently).
    for batch in [1, 5] {
        let b = run(&dec, &p, 4, batch);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (x.prompt, x.sample, &x.tokens, x.truncated),
                (y.prompt, y.sample, &y.tokens, y.truncated)
            );
            for (u, v) in x.logprobs.iter().zip(&y.logprobs) {
                assert!((u - v).abs() < 1e-5, "{u} vs {v}");
            }
        }
    }
    // Prompt-major order; samples of one prompt differ.
    let order: Vec<(usize, usize)> = a.iter().map(|g| (g.prompt, g.sample)).collect();
    assert_eq!(order[..5], [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]);
    assert!(a[..4].windows(2).any(|w| w[0].tokens != w[1].tokens));
    // Another seed, other outputs.
    let b = run(&dec, &SamplingParams { seed: 124, ..p }, 4, 64);
    assert_ne!(a, b);
}

/// Prompts split into parts (as data-parallel ranks split a step's groups) and generated part by
/// part sample the same tokens and log-probs, bit for bit, as the whole list at once: a sequence's
/// logits do not depend on which others share its forward passes, one running alone included.
///
/// The model is wide enough (1024 hidden, 3000 words) that the matrix-vector path of a single row
/// would sum in another order than the batched rows (it did before the decoder ran one row as
/// two).
#[test]
fn prompts_generated_in_parts_sample_what_they_sample_whole() {
    let cfg = ModelConfig {
        hidden_size: 1024,
        intermediate_size: 2816,
        vocab_size: 3000,
        num_attention_heads: 8,
        num_key_value_heads: 4,
        head_dim: 128,
        ..ModelConfig::tiny()
    };
    let dec = Decoder::new(&Model::new_random(cfg, 3, DType::F32, &Device::Cpu).unwrap()).unwrap();
    let p = params(6, vec![3, 17, 99]);
    let ps = vec![vec![1, 2, 3], vec![42], vec![9, 8, 7, 300], vec![5]];
    let whole = generate(&dec, &ps, 2, &p, 64, |_| {}).unwrap();
    let bits = |g: &Generation| g.logprobs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for cuts in [[0, 1, 4], [0, 2, 4], [0, 3, 4]] {
        let mut parts = Vec::new();
        for w in cuts.windows(2) {
            let mut part = generate_part(&dec, &ps[w[0]..w[1]], w[0], 2, &p, 64, |_| {}).unwrap();
            for g in &mut part {
                g.prompt += w[0];
            }
            parts.extend(part);
        }
        assert_eq!(parts.len(), whole.len());
        for (x, y) in whole.iter().zip(&parts) {
            assert_eq!(
                (x.prompt, x.sample, &x.tokens, x.truncated),
                (y.prompt, y.sample, &y.tokens, y.truncated),
                "cuts {cuts:?}"
            );
            assert_eq!(bits(x), bits(y), "cuts {cuts:?}, prompt {}", x.prompt);
        }
    }
}

#[test]
fn stop_ids_and_length_limits() {
    let dec = Decoder::new(&model()).unwrap();
    let stops: Vec<u32> = (0..256).collect();
    let gens = run(&dec, &params(20, stops.clone()), 8, 16);
    let mut stopped = 0;
    for g in &gens {
        let (last, body) = g.tokens.split_last().unwrap();
        assert!(body.iter().all(|t| !stops.contains(t)), "{g:?}");
        if stops.contains(last) {
            assert!(!g.truncated);
            stopped += 1;
        } else {
            assert!(g.truncated && g.tokens.len() == 20);
        }
        assert_eq!(g.logprobs.len(), g.tokens.len());
    }
    assert!(stopped > 0);
    // Every id stops: one token each.
    let all: Vec<u32> = (0..512).collect();
    assert!(run(&dec, &params(20, all), 2, 8)
        .iter()
        .all(|g| g.tokens.len() == 1 && !g.truncated));
}

#[test]
fn greedy_is_the_argmax_path() {
    let m = model();
    let dec = Decoder::new(&m).unwrap();
    let p = SamplingParams {
        temperature: 0.0,
        ..params(6, vec![])
    };
    let gens = run(&dec, &p, 2, 8);
    // Both samples of a prompt are identical under greedy decoding.
    assert_eq!(gens[0].tokens, gens[1].tokens);
    // Each greedy token has the highest log-prob under the model.
    let ps = prompts();
    let g = &gens[0];
    for (t, &tok) in g.tokens.iter().enumerate() {
        let lp = |cand: u32| {
            let mut resp = g.tokens[..t].to_vec();
            resp.push(cand);
            m.logprobs(&[SeqPair::new(&ps[0], &resp)], 1.0, false)
                .unwrap()
                .logprobs[0][t]
        };
        let chosen = lp(tok);
        for cand in [0u32, 1, 100, 511] {
            assert!(chosen >= lp(cand) - 1e-6);
        }
    }
}

#[test]
fn bad_requests_are_errors() {
    let dec = Decoder::new(&model()).unwrap();
    let p = params(4, vec![]);
    assert!(generate(&dec, &[vec![]], 1, &p, 8, |_| {}).is_err());
    assert!(generate(&dec, &[vec![600]], 1, &p, 8, |_| {}).is_err());
    assert!(generate(&dec, &prompts(), 0, &p, 8, |_| {}).is_err());
    let bad = SamplingParams {
        top_p: 2.0,
        ..p.clone()
    };
    assert!(generate(&dec, &prompts(), 1, &bad, 8, |_| {}).is_err());
    assert!(generate(&dec, &[], 1, &p, 8, |_| {}).unwrap().is_empty());
}

fn group(prompt: Vec<u32>, n: usize, p: &SamplingParams, first_stream: u64) -> Group {
    Group {
        prompt,
        n,
        params: p.clone(),
        first_stream,
        logprobs: LogprobMode::Tempered,
        top_logprobs: 0,
    }
}

#[test]
fn groups_that_join_between_steps_share_decode_steps_and_keep_their_streams() {
    let dec = Decoder::new(&model()).unwrap();
    let p = params(12, vec![]);
    let ps = prompts();
    let mut b = Batcher::new(64);
    let first = b.push(group(ps[0].clone(), 2, &p, 0));
    let mut done = Vec::new();
    for _ in 0..4 {
        done.extend(b.step(&dec).unwrap());
    }
    // A second request arrives while the first decodes; it gets the streams of prompt 2 of a
    // three-prompt `generate` call.
    let second = b.push(group(ps[2].clone(), 2, &p, 4));
    while !b.is_idle() {
        done.extend(b.step(&dec).unwrap());
    }
    let stats = b.stats();
    assert_eq!(stats.max_running_groups, 2);
    assert_eq!(stats.max_running, 4);
    // 11 decode steps for the first group; the second joined them.
    assert_eq!(stats.decode_steps, 4 + 11);
    let alone = generate(&dec, &ps, 2, &p, 64, |_| {}).unwrap();
    for f in &done {
        let g = &f.generation;
        let want = if g.prompt == first {
            &alone[g.sample]
        } else {
            assert_eq!(g.prompt, second);
            &alone[4 + g.sample]
        };
        assert_eq!(g.tokens, want.tokens);
        for (u, v) in g.logprobs.iter().zip(&want.logprobs) {
            assert!((u - v).abs() < 1e-5, "{u} vs {v}");
        }
        assert!(!f.aborted && f.top.iter().all(Vec::is_empty));
    }
    assert_eq!(done.len(), 4);
}

#[test]
fn abort_and_cancel_end_groups() {
    let dec = Decoder::new(&model()).unwrap();
    let p = params(50, vec![]);
    let ps = prompts();
    let mut b = Batcher::new(2);
    let a = b.push(group(ps[0].clone(), 2, &p, 0));
    let c = b.push(group(ps[1].clone(), 2, &p, 2));
    let d = b.push(group(ps[2].clone(), 1, &p, 4));
    for _ in 0..3 {
        assert!(b.step(&dec).unwrap().is_empty());
    }
    assert_eq!((b.running(), b.waiting()), (2, 2));
    // Cancelling a waiting group drops it without results.
    b.retain_groups(|g| g != c);
    assert_eq!(b.waiting(), 1);
    let out = b.abort_all();
    assert!(b.is_idle());
    assert_eq!(out.len(), 3);
    for f in &out {
        assert!(f.aborted && f.generation.truncated);
        let len = f.generation.tokens.len();
        if f.generation.prompt == a {
            // The first step prefills and decodes: one token from each, then one per step.
            assert_eq!(len, 4);
            assert_eq!(f.generation.logprobs.len(), 4);
        } else {
            assert_eq!((f.generation.prompt, len), (d, 0));
        }
    }
}

#[test]
fn logprob_modes_and_top_logprobs_in_the_batcher() {
    let m = model();
    let dec = Decoder::new(&m).unwrap();
    let ps = prompts();
    let run = |p: &SamplingParams, mode: LogprobMode, top: usize| {
        let mut b = Batcher::new(8);
        b.push(Group {
            logprobs: mode,
            top_logprobs: top,
            ..group(ps[0].clone(), 1, p, 0)
        });
        let mut out = Vec::new();
        while !b.is_idle() {
            out.extend(b.step(&dec).unwrap());
        }
        out.pop().unwrap()
    };
    let p = SamplingParams {
        temperature: 0.7,
        top_p: 1.0,
        top_k: 0,
        ..params(8, vec![])
    };
    // Without top-k/top-p, processed is tempered bit for bit; raw is the τ = 1 distribution.
    let tempered = run(&p, LogprobMode::Tempered, 0);
    let processed = run(&p, LogprobMode::Processed, 3);
    let raw = run(&p, LogprobMode::Raw, 0);
    assert_eq!(tempered.generation.tokens, processed.generation.tokens);
    assert_eq!(tempered.generation.logprobs, processed.generation.logprobs);
    let want = m
        .logprobs(&[SeqPair::new(&ps[0], &raw.generation.tokens)], 1.0, false)
        .unwrap()
        .logprobs;
    for (a, b) in raw.generation.logprobs.iter().zip(&want[0]) {
        assert!((f64::from(*a) - b).abs() < 1e-4, "{a} vs {b}");
    }
    // Three alternatives per position, most likely first, the sampled one's log-prob among
    // them when it is in the top three.
    assert_eq!(processed.top.len(), 8);
    for (row, (&t, &lp)) in processed.top.iter().zip(
        processed
            .generation
            .tokens
            .iter()
            .zip(&processed.generation.logprobs),
    ) {
        assert_eq!(row.len(), 3);
        assert!(row.windows(2).all(|w| w[0].1 >= w[1].1));
        if let Some(&(_, x)) = row.iter().find(|e| e.0 == t) {
            assert_eq!(x, lp);
        } else {
            assert!(lp <= row[2].1);
        }
    }
    // With top-p the processed log-probs exceed the tempered ones by -ln(kept mass) >= 0.
    let q = SamplingParams {
        top_p: 0.5,
        ..p.clone()
    };
    let t = run(&q, LogprobMode::Tempered, 0);
    let pr = run(&q, LogprobMode::Processed, 0);
    assert_eq!(t.generation.tokens, pr.generation.tokens);
    assert!(t
        .generation
        .logprobs
        .iter()
        .zip(&pr.generation.logprobs)
        .all(|(a, b)| b >= a && *b <= 0.0));
}
