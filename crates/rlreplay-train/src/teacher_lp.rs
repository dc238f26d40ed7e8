//! Teacher log-probs of response tokens through the incremental decoder: each teacher prompt is
//! prefilled once, then the response is fed token by token, and the full-vocabulary logits at
//! every response position are mixed (trust region) before the log-softmax.

use anyhow::{ensure, Result};
use rlreplay_algo::rlsd::trust_region_logprobs;
use rlreplay_model::generate::{Decoder, KvCache};

/// Teacher log-probs of `responses[i]` after `prompts[i]`: `log softmax(z_T / τ)[y_t]` with
/// `z_T = (1 − α)·z_teacher + α·z_current` when `current` is given (trust region; `teacher` is
/// the frozen initial model), or `z_T = z_teacher` (EMA teacher). Rows with an empty prompt or an
/// empty response get zeros (they have no teacher context or no tokens).
pub fn teacher_logprobs(
    teacher: &Decoder,
    current: Option<&Decoder>,
    alpha: f64,
    temperature: f64,
    prompts: &[&[u32]],
    responses: &[&[u32]],
) -> Result<Vec<Vec<f64>>> {
    ensure!(
        prompts.len() == responses.len(),
        "{} teacher prompts for {} responses",
        prompts.len(),
        responses.len()
    );
    let mut out: Vec<Vec<f64>> = responses.iter().map(|r| vec![0.0; r.len()]).collect();
    let rows: Vec<usize> = (0..prompts.len())
        .filter(|&i| !prompts[i].is_empty() && !responses[i].is_empty())
        .collect();
    if rows.is_empty() {
        return Ok(out);
    }
    let decoders: Vec<&Decoder> = std::iter::once(teacher).chain(current).collect();
    let mut caches: Vec<Vec<KvCache>> = decoders
        .iter()
        .map(|d| rows.iter().map(|_| d.new_cache()).collect())
        .collect();
    // `live` rows still have a token to score; `feed[k]` is what row `live[k]` feeds next.
    let mut live: Vec<usize> = (0..rows.len()).collect();
    let mut feed: Vec<&[u32]> = rows.iter().map(|&i| prompts[i]).collect();
    let mut t = 0;
    while !live.is_empty() {
        let mut logits = Vec::with_capacity(decoders.len());
        for (d, cache) in decoders.iter().zip(caches.iter_mut()) {
            let mut refs: Vec<&mut KvCache> = Vec::with_capacity(live.len());
            let mut rest: &mut [KvCache] = cache.as_mut_slice();
            let mut at = 0;
            for &k in &live {
                let (_, tail) = rest.split_at_mut(k - at);
                let (one, tail) = tail.split_at_mut(1);
                refs.push(&mut one[0]);
                rest = tail;
                at = k + 1;
            }
            let z = d.forward(&mut refs, &feed)?.to_vec2::<f32>()?;
            logits.push(z);
        }
        let mut next_live = Vec::with_capacity(live.len());
        let mut next_feed = Vec::with_capacity(live.len());
        for (j, &k) in live.iter().enumerate() {
            let i = rows[k];
            let zt: Vec<f64> = logits[0][j].iter().map(|&x| f64::from(x)).collect();
            let lp = match logits.get(1) {
                Some(cur) => {
                    let zc: Vec<f64> = cur[j].iter().map(|&x| f64::from(x)).collect();
                    trust_region_logprobs(&zt, &zc, alpha, temperature)
                }
                None => trust_region_logprobs(&zt, &zt, 0.0, temperature),
            };
            let lp = lp.ok_or_else(|| {
                anyhow::anyhow!("row {i}: non-finite teacher logits at response token {t}")
            })?;
            out[i][t] = lp[responses[i][t] as usize];
            if t + 1 < responses[i].len() {
                next_live.push(k);
                next_feed.push(&responses[i][t..t + 1]);
            }
        }
        live = next_live;
        feed = next_feed;
        t += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlreplay_model::{DType, Device, Qwen3, Qwen3Config, SeqPair};

    fn model(seed: u64) -> Qwen3 {
        let cfg = Qwen3Config {
            vocab_size: 40,
            hidden_size: 32,
            intermediate_size: 64,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            ..Qwen3Config::tiny()
        };
        Qwen3::new_random(cfg, seed, DType::F32, &Device::Cpu).unwrap()
    }

    fn close(a: &[Vec<f64>], b: &[Vec<f64>]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.len(), y.len());
            for (p, q) in x.iter().zip(y) {
                assert!((p - q).abs() < 1e-4, "{x:?} vs {y:?}");
            }
        }
    }

    #[test]
    fn matches_the_training_log_probs() {
        let (a, b) = (model(1), model(2));
        let (da, db) = (Decoder::new(&a).unwrap(), Decoder::new(&b).unwrap());
        let prompts: [&[u32]; 4] = [&[1, 2, 3], &[4], &[], &[5, 6]];
        let responses: [&[u32]; 4] = [&[7, 8, 9, 10], &[11], &[12], &[]];
        let pairs: Vec<SeqPair<'_>> = [0, 1, 3]
            .iter()
            .map(|&i| SeqPair::new(prompts[i], responses[i]))
            .collect();
        let want_a = a.logprobs(&pairs, 0.7, false).unwrap().logprobs;
        let want_b = b.logprobs(&pairs, 0.7, false).unwrap().logprobs;
        let pick = |v: Vec<Vec<f64>>| vec![v[0].clone(), v[1].clone(), v[3].clone()];
        // EMA teacher (no current model): the teacher's own log-probs.
        let ema = teacher_logprobs(&da, None, 0.1, 0.7, &prompts, &responses).unwrap();
        assert_eq!(ema[2], vec![0.0], "a row without teacher prompt gets zeros");
        close(&pick(ema), &want_a);
        // Trust region at α = 1 is the current model, at α = 0 the reference.
        close(
            &pick(teacher_logprobs(&da, Some(&db), 1.0, 0.7, &prompts, &responses).unwrap()),
            &want_b,
        );
        close(
            &pick(teacher_logprobs(&da, Some(&db), 0.0, 0.7, &prompts, &responses).unwrap()),
            &want_a,
        );
        // Mixing a model with itself changes nothing.
        close(
            &pick(teacher_logprobs(&da, Some(&da), 0.3, 0.7, &prompts, &responses).unwrap()),
            &want_a,
        );
        assert!(teacher_logprobs(&da, None, 0.1, 1.0, &prompts[..1], &responses).is_err());
    }
}
