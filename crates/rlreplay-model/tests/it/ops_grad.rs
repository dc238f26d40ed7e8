//! Op-level tests of the fused kernels: forward and gradients against the composite references
//! (f64 and f32), central finite differences in f64, packing, determinism and input errors.

use candle_core::{DType, Device, Result, Tensor, Var};
use rlreplay_model::ops::{self, composite};

/// Deterministic pseudo-random values in [-scale/2, scale/2).
fn data(n: usize, seed: f64, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let x = ((i as f64 + 1.0) * 12.9898 + seed * 78.233).sin() * 43_758.545_3;
            (x - x.floor() - 0.5) * scale
        })
        .collect()
}

/// One op input: values, shape, and whether it gets a gradient.
struct Input {
    values: Vec<f64>,
    shape: Vec<usize>,
    differentiable: bool,
}

fn input(shape: &[usize], seed: f64, scale: f64, differentiable: bool) -> Input {
    let n = shape.iter().product();
    Input {
        values: data(n, seed, scale),
        shape: shape.to_vec(),
        differentiable,
    }
}

type Op<'a> = &'a dyn Fn(&[Tensor]) -> Result<Tensor>;
/// Flattened output and the flattened gradient of every differentiable input.
type OutAndGrads = (Vec<f64>, Vec<Option<Vec<f64>>>);

/// Output and gradients of `sum(op(inputs) * weights)` w.r.t. the differentiable inputs.
fn run(op: Op, inputs: &[Input], dtype: DType) -> Result<OutAndGrads> {
    let vars = inputs
        .iter()
        .map(|i| {
            let t = Tensor::from_slice(&i.values, i.shape.as_slice(), &Device::Cpu)?;
            Var::from_tensor(&t.to_dtype(dtype)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let tensors: Vec<Tensor> = vars
        .iter()
        .zip(inputs)
        .map(|(v, i)| {
            if i.differentiable {
                v.as_tensor().clone()
            } else {
                v.as_tensor().detach()
            }
        })
        .collect();
    let out = op(&tensors)?;
    let w = Tensor::from_vec(data(out.elem_count(), 99.0, 2.0), out.shape(), &Device::Cpu)?
        .to_dtype(dtype)?;
    let loss = (out.clone() * w)?.sum_all()?;
    let grads = loss.backward()?;
    let flat =
        |t: &Tensor| -> Result<Vec<f64>> { t.to_dtype(DType::F64)?.flatten_all()?.to_vec1() };
    let gs = vars
        .iter()
        .zip(inputs)
        .map(|(v, i)| {
            if !i.differentiable {
                return Ok(None);
            }
            match grads.get(v.as_tensor()) {
                Some(g) => Ok(Some(flat(g)?)),
                None => Ok(Some(vec![0.0; i.values.len()])),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((flat(&out)?, gs))
}

/// Value of `sum(op(inputs) * weights)` in f64 without a graph.
fn loss(op: Op, inputs: &[Input]) -> Result<f64> {
    let ts = inputs
        .iter()
        .map(|i| Tensor::from_slice(&i.values, i.shape.as_slice(), &Device::Cpu))
        .collect::<Result<Vec<_>>>()?;
    let out = op(&ts)?;
    let w = Tensor::from_vec(data(out.elem_count(), 99.0, 2.0), out.shape(), &Device::Cpu)?;
    (out * w)?.sum_all()?.to_scalar::<f64>()
}

fn assert_close(what: &str, got: &[f64], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * scale,
            "{what}[{i}]: got {g}, want {w} (scale {scale}, rel tol {rel})"
        );
    }
}

/// Compares the fused op with the reference in f64 (tight) and f32, and checks f64 gradients with
/// central finite differences at a few elements of every differentiable input.
fn check(name: &str, fast: Op, reference: Op, inputs: &mut [Input]) {
    let (out, grads) = run(fast, inputs, DType::F64).unwrap();
    let (rout, rgrads) = run(reference, inputs, DType::F64).unwrap();
    assert_close(&format!("{name} f64 forward"), &out, &rout, 1e-12);
    for (k, (g, r)) in grads.iter().zip(&rgrads).enumerate() {
        if let (Some(g), Some(r)) = (g, r) {
            assert_close(&format!("{name} f64 grad of input {k}"), g, r, 1e-11);
            assert!(
                g.iter().any(|v| *v != 0.0),
                "{name}: input {k} got a zero gradient"
            );
        }
    }
    let (out32, grads32) = run(fast, inputs, DType::F32).unwrap();
    assert_close(&format!("{name} f32 forward"), &out32, &rout, 1e-5);
    for (k, (g, r)) in grads32.iter().zip(&rgrads).enumerate() {
        if let (Some(g), Some(r)) = (g, r) {
            assert_close(&format!("{name} f32 grad of input {k}"), g, r, 1e-4);
        }
    }
    let h = 1e-5;
    for k in 0..inputs.len() {
        let Some(g) = &grads[k] else { continue };
        let n = g.len();
        let argmax = (0..n)
            .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
            .unwrap();
        for idx in [argmax, 0, n / 3, n - 1, (7 * n) / 11] {
            let orig = inputs[k].values[idx];
            inputs[k].values[idx] = orig + h;
            let up = loss(fast, inputs).unwrap();
            inputs[k].values[idx] = orig - h;
            let down = loss(fast, inputs).unwrap();
            inputs[k].values[idx] = orig;
            let fd = (up - down) / (2.0 * h);
            assert!(
                (fd - g[idx]).abs() <= 1e-6 * g[idx].abs().max(1.0),
                "{name}: finite difference of input {k}[{idx}] = {fd}, gradient {}",
                g[idx]
            );
        }
    }
}

#[test]
fn rms_norm_matches_reference_and_finite_differences() {
    let mut inputs = [
        input(&[5, 3, 24], 1.0, 2.0, true),
        input(&[24], 2.0, 1.0, true),
    ];
    inputs[1].values.iter_mut().for_each(|w| *w += 1.0);
    check(
        "rms_norm",
        &|t| ops::rms_norm(&t[0], &t[1], 1e-6),
        &|t| composite::rms_norm(&t[0], &t[1], 1e-6),
        &mut inputs,
    );
}

#[test]
fn rope_matches_reference_and_finite_differences() {
    let (t, heads, d) = (9, 3, 8);
    let angles: Vec<f64> = (0..t * d / 2)
        .map(|i| (i / (d / 2)) as f64 * 10_000f64.powf(-((i % (d / 2)) as f64) / (d / 2) as f64))
        .collect();
    let mut inputs = [
        input(&[t, heads, d], 3.0, 2.0, true),
        Input {
            values: angles.iter().map(|a| a.cos()).collect(),
            shape: vec![t, d / 2],
            differentiable: false,
        },
        Input {
            values: angles.iter().map(|a| a.sin()).collect(),
            shape: vec![t, d / 2],
            differentiable: false,
        },
    ];
    check(
        "rope",
        &|x| ops::rope(&x[0], &x[1], &x[2]),
        &|x| composite::rope(&x[0], &x[1], &x[2]),
        &mut inputs,
    );
}

#[test]
fn norm_rope_matches_reference_and_finite_differences() {
    let (t, heads, d) = (5, 3, 8);
    let angles: Vec<f64> = (0..t * d / 2).map(|i| i as f64 * 0.37).collect();
    let table = |f: fn(f64) -> f64| Input {
        values: angles.iter().map(|&a| f(a)).collect(),
        shape: vec![t, d / 2],
        differentiable: false,
    };
    let mut inputs = [
        input(&[t, heads, d], 21.0, 2.0, true),
        input(&[d], 22.0, 1.0, true),
        table(f64::cos),
        table(f64::sin),
    ];
    check(
        "norm_rope",
        &|x| ops::norm_rope(&x[0], &x[1], 1e-6, &x[2], &x[3]),
        &|x| composite::rope(&composite::rms_norm(&x[0], &x[1], 1e-6)?, &x[2], &x[3]),
        &mut inputs,
    );
}

#[test]
fn swiglu_matches_reference_and_finite_differences() {
    let mut inputs = [
        input(&[7, 33], 4.0, 8.0, true),
        input(&[7, 33], 5.0, 2.0, true),
    ];
    check(
        "swiglu",
        &|t| ops::swiglu(&t[0], &t[1]),
        &|t| composite::swiglu(&t[0], &t[1]),
        &mut inputs,
    );
}

#[test]
fn attention_matches_reference_and_finite_differences() {
    // Sequences longer than one 64-row block, a single token, and an empty one; GQA 4:2.
    let offsets = [0, 70, 71, 71, 150];
    let (t, hq, hkv, d) = (150, 4, 2, 8);
    let scale = 1.0 / (d as f64).sqrt();
    let mut inputs = [
        input(&[t, hq, d], 6.0, 4.0, true),
        input(&[t, hkv, d], 7.0, 4.0, true),
        input(&[t, hkv, d], 8.0, 2.0, true),
    ];
    check(
        "attention",
        &|x| ops::packed_causal_attention(&x[0], &x[1], &x[2], &offsets, scale),
        &|x| composite::packed_causal_attention(&x[0], &x[1], &x[2], &offsets, scale),
        &mut inputs,
    );
}

#[test]
fn token_logprobs_matches_reference_and_finite_differences() {
    let (n, v, h) = (21, 40, 12);
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % v as u32).collect();
    let mut inputs = [
        input(&[n, h], 9.0, 3.0, true),
        input(&[v, h], 10.0, 3.0, true),
    ];
    let stacked = |(lp, ent): (Tensor, Option<Tensor>)| Tensor::stack(&[lp, ent.unwrap()], 1);
    check(
        "token_logprobs",
        &|x| stacked(ops::token_logprobs(&x[0], &x[1], &targets, 0.7, true)?),
        &|x| {
            stacked(composite::token_logprobs(
                &x[0], &x[1], &targets, 0.7, true, 8,
            )?)
        },
        &mut inputs,
    );
}

#[test]
fn token_logprobs_for_grad_matches_reference_and_finite_differences() {
    // `check` weights the output by `data(n, 99.0, 2.0)`: the gradient given up front, so the
    // gradients come from the forward pass; `check`'s finite differences run the forward alone.
    let (n, v, h) = (21, 40, 12);
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % v as u32).collect();
    let weights = data(n, 99.0, 2.0);
    let mut inputs = [
        input(&[n, h], 9.0, 3.0, true),
        input(&[v, h], 10.0, 3.0, true),
    ];
    check(
        "token_logprobs_for_grad",
        &|x| ops::token_logprobs_for_grad(&x[0], &x[1], &targets, 0.7, &weights),
        &|x| Ok(composite::token_logprobs(&x[0], &x[1], &targets, 0.7, false, 8)?.0),
        &mut inputs,
    );
    // Another upstream gradient than the one given: backpropagated by recomputing.
    let other = vec![0.5; n];
    check(
        "token_logprobs_for_grad, other upstream",
        &|x| ops::token_logprobs_for_grad(&x[0], &x[1], &targets, 0.7, &other),
        &|x| Ok(composite::token_logprobs(&x[0], &x[1], &targets, 0.7, false, 8)?.0),
        &mut inputs,
    );
}

#[test]
fn linear_matches_reference_and_finite_differences() {
    let mut inputs = [
        input(&[13, 9], 11.0, 2.0, true),
        input(&[6, 9], 12.0, 2.0, true),
    ];
    check(
        "linear",
        &|t| ops::linear(&t[0], &t[1]),
        &|t| t[0].matmul(&t[1].t()?),
        &mut inputs,
    );
}

#[test]
fn linear_add_and_heads_match_reference_and_finite_differences() {
    let mut inputs = [
        input(&[13, 3, 3], 16.0, 2.0, true),
        input(&[6, 9], 17.0, 2.0, true),
        input(&[13, 6], 18.0, 2.0, true),
    ];
    check(
        "linear_add",
        &|t| ops::linear_add(&t[0], &t[1], &t[2]),
        &|t| &t[2] + t[0].reshape((13, 9))?.matmul(&t[1].t()?)?,
        &mut inputs,
    );
    let mut inputs = [
        input(&[13, 9], 19.0, 2.0, true),
        input(&[6, 9], 20.0, 2.0, true),
    ];
    check(
        "linear_heads",
        &|t| ops::linear_heads(&t[0], &t[1], 2),
        &|t| t[0].matmul(&t[1].t()?)?.reshape((13, 2, 3)),
        &mut inputs,
    );
}

#[test]
fn gated_up_matches_reference_and_finite_differences() {
    let mut inputs = [
        input(&[13, 9], 13.0, 2.0, true),
        input(&[7, 9], 14.0, 2.0, true),
        input(&[7, 9], 15.0, 2.0, true),
    ];
    check(
        "gated_up",
        &|t| ops::gated_up(&t[0], &t[1], &t[2]),
        &|t| composite::swiglu(&t[0].matmul(&t[1].t()?)?, &t[0].matmul(&t[2].t()?)?),
        &mut inputs,
    );
}

#[test]
fn packed_attention_equals_each_sequence_alone() {
    let offsets = [0, 5, 75, 90];
    let (t, hq, hkv, d) = (90, 6, 2, 4);
    let q = Tensor::from_vec(data(t * hq * d, 1.0, 2.0), (t, hq, d), &Device::Cpu).unwrap();
    let k = Tensor::from_vec(data(t * hkv * d, 2.0, 2.0), (t, hkv, d), &Device::Cpu).unwrap();
    let v = Tensor::from_vec(data(t * hkv * d, 3.0, 2.0), (t, hkv, d), &Device::Cpu).unwrap();
    let packed = ops::packed_causal_attention(&q, &k, &v, &offsets, 0.5).unwrap();
    for w in offsets.windows(2) {
        let (s, l) = (w[0], w[1] - w[0]);
        let alone = ops::packed_causal_attention(
            &q.narrow(0, s, l).unwrap(),
            &k.narrow(0, s, l).unwrap(),
            &v.narrow(0, s, l).unwrap(),
            &[0, l],
            0.5,
        )
        .unwrap();
        let diff = (packed.narrow(0, s, l).unwrap() - alone)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(diff, 0.0, "sequence at {s} differs when packed");
    }
}

#[test]
fn gradients_are_deterministic() {
    let inputs = [
        input(&[300, 64], 1.0, 2.0, true),
        input(&[64], 2.0, 1.0, true),
    ];
    let op: Op = &|t| ops::rms_norm(&t[0], &t[1], 1e-6);
    let a = run(op, &inputs, DType::F32).unwrap();
    let b = run(op, &inputs, DType::F32).unwrap();
    assert_eq!(a.1, b.1);
}

#[test]
fn half_precision_runs_through_the_composite_path() {
    let x = Tensor::from_vec(data(48, 1.0, 2.0), (2, 24), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let w = Tensor::ones(24, DType::BF16, &Device::Cpu).unwrap();
    let y = ops::rms_norm(&x, &w, 1e-6).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(ops::swiglu(&x, &x).unwrap().dtype(), DType::BF16);
}

#[test]
fn empty_inputs_give_empty_outputs() {
    let q = Tensor::zeros((0, 2, 4), DType::F32, &Device::Cpu).unwrap();
    let out = ops::packed_causal_attention(&q, &q, &q, &[0], 1.0).unwrap();
    assert_eq!(out.dims(), &[0, 2, 4]);
    let h = Tensor::zeros((0, 4), DType::F32, &Device::Cpu).unwrap();
    let w = Tensor::zeros((10, 4), DType::F32, &Device::Cpu).unwrap();
    let (lp, ent) = ops::token_logprobs(&h, &w, &[], 1.0, true).unwrap();
    assert_eq!(lp.dims(), &[0]);
    assert_eq!(ent.unwrap().dims(), &[0]);
}

#[test]
fn bad_inputs_are_errors_naming_the_problem() {
    let dev = Device::Cpu;
    let q = Tensor::zeros((6, 4, 8), DType::F32, &dev).unwrap();
    let k = Tensor::zeros((6, 3, 8), DType::F32, &dev).unwrap();
    let err = ops::packed_causal_attention(&q, &k, &k, &[0, 6], 1.0).unwrap_err();
    assert!(err.to_string().contains("incompatible"), "{err}");
    let k = Tensor::zeros((6, 2, 8), DType::F32, &dev).unwrap();
    let err = ops::packed_causal_attention(&q, &k, &k, &[0, 4, 3, 6], 1.0).unwrap_err();
    assert!(err.to_string().contains("seq_offsets"), "{err}");
    let h = Tensor::zeros((2, 4), DType::F32, &dev).unwrap();
    let w = Tensor::zeros((10, 4), DType::F32, &dev).unwrap();
    let err = ops::token_logprobs(&h, &w, &[1, 10], 1.0, false).unwrap_err();
    assert!(err.to_string().contains("target 10 at row 1"), "{err}");
    let err = ops::token_logprobs(&h, &w, &[1, 2], 0.0, false).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
    let x = Tensor::zeros((2, 8), DType::F32, &dev).unwrap();
    let bad = Tensor::zeros(7, DType::F32, &dev).unwrap();
    assert!(ops::rms_norm(&x, &bad, 1e-6).is_err());
    let cs = Tensor::zeros((6, 3), DType::F32, &dev).unwrap();
    assert!(ops::rope(&q, &cs, &cs).is_err());
    assert!(ops::swiglu(&x, &h).is_err());
    let w = Tensor::zeros((6, 8), DType::F32, &dev).unwrap();
    let err = ops::linear_add(&x, &w, &x).unwrap_err();
    assert!(err.to_string().contains("residual"), "{err}");
    let err = ops::linear_heads(&x, &w, 4).unwrap_err();
    assert!(err.to_string().contains("4 heads"), "{err}");
    assert!(ops::gated_up(&x, &w, &bad).is_err());
    assert!(ops::gated_up(&h, &w, &w).is_err());
}

/// Score-block budgets that split the test sequences into several query blocks (one row, a few
/// rows, more rows than the shortest sequence) and one block per sequence.
const ATTENTION_BLOCKS: [usize; 4] = [1, 4 * 70 * 3, 4 * 70 * 16, 1 << 26];

#[test]
fn blockwise_attention_matches_reference_and_finite_differences() {
    // The CUDA code path on the CPU: ragged sequences, a single token, an empty one, GQA 4:2.
    let offsets = [0, 70, 71, 71, 150];
    let (t, hq, hkv, d) = (150, 4, 2, 8);
    let scale = 1.0 / (d as f64).sqrt();
    for elems in ATTENTION_BLOCKS {
        let mut inputs = [
            input(&[t, hq, d], 6.0, 4.0, true),
            input(&[t, hkv, d], 7.0, 4.0, true),
            input(&[t, hkv, d], 8.0, 2.0, true),
        ];
        check(
            &format!("blockwise attention ({elems} elements per block)"),
            &|x| {
                ops::blockwise_packed_causal_attention(&x[0], &x[1], &x[2], &offsets, scale, elems)
            },
            &|x| composite::packed_causal_attention(&x[0], &x[1], &x[2], &offsets, scale),
            &mut inputs,
        );
    }
}

#[test]
fn blockwise_token_logprobs_matches_reference_and_finite_differences() {
    let (n, v, h) = (21, 40, 12);
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % v as u32).collect();
    let stacked = |(lp, ent): (Tensor, Option<Tensor>)| Tensor::stack(&[lp, ent.unwrap()], 1);
    // One row per chunk, ragged chunks of 8 rows, everything in one chunk.
    for elems in [1, 8 * v, 1 << 27] {
        let mut inputs = [
            input(&[n, h], 9.0, 3.0, true),
            input(&[v, h], 10.0, 3.0, true),
        ];
        check(
            &format!("blockwise token_logprobs ({elems} logits per chunk)"),
            &|x| {
                stacked(ops::blockwise_token_logprobs(
                    &x[0], &x[1], &targets, 0.7, true, elems,
                )?)
            },
            &|x| {
                stacked(composite::token_logprobs(
                    &x[0], &x[1], &targets, 0.7, true, 8,
                )?)
            },
            &mut inputs,
        );
        // Without the entropy output, only the log-probs carry a gradient.
        let lp_only: Op =
            &|x| Ok(ops::blockwise_token_logprobs(&x[0], &x[1], &targets, 0.7, false, elems)?.0);
        let reference: Op = &|x| Ok(ops::token_logprobs(&x[0], &x[1], &targets, 0.7, false)?.0);
        let (out, grads) = run(lp_only, &inputs, DType::F64).unwrap();
        let (rout, rgrads) = run(reference, &inputs, DType::F64).unwrap();
        assert_close("blockwise log-probs", &out, &rout, 1e-12);
        for (g, r) in grads.iter().zip(&rgrads) {
            assert_close(
                "blockwise log-prob gradient",
                g.as_ref().unwrap(),
                r.as_ref().unwrap(),
                1e-11,
            );
        }
    }
}

/// Largest absolute difference between two equally long vectors.
fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn blockwise_ops_in_bf16_match_the_composite_reference_in_bf16() {
    // bf16 inputs: matrix products in bf16, softmax statistics in f32, gradients returned in
    // bf16, as the composite reference (the bf16 CUDA path before the blockwise ops) does.
    let offsets = [0, 37, 90];
    let (t, hq, hkv, d) = (90, 4, 2, 16);
    let scale = 1.0 / (d as f64).sqrt();
    let inputs = [
        input(&[t, hq, d], 11.0, 4.0, true),
        input(&[t, hkv, d], 12.0, 4.0, true),
        input(&[t, hkv, d], 13.0, 2.0, true),
    ];
    let blockwise: Op = &|x| {
        let out = ops::blockwise_packed_causal_attention(
            &x[0],
            &x[1],
            &x[2],
            &offsets,
            scale,
            4 * 37 * 5,
        )?;
        assert_eq!(out.dtype(), DType::BF16);
        Ok(out)
    };
    let reference: Op =
        &|x| composite::packed_causal_attention(&x[0], &x[1], &x[2], &offsets, scale);
    let (out, grads) = run(blockwise, &inputs, DType::BF16).unwrap();
    let (rout, rgrads) = run(reference, &inputs, DType::BF16).unwrap();
    let (exact, _) = run(reference, &inputs, DType::F64).unwrap();
    // Both are bf16 roundings of the same values: each within a few bf16 ulps of f64.
    assert!(
        max_abs_diff(&out, &exact) < 0.03,
        "{}",
        max_abs_diff(&out, &exact)
    );
    assert!(
        max_abs_diff(&out, &rout) < 0.03,
        "{}",
        max_abs_diff(&out, &rout)
    );
    for (g, r) in grads.iter().zip(&rgrads) {
        let (g, r) = (g.as_ref().unwrap(), r.as_ref().unwrap());
        let scale = r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(
            max_abs_diff(g, r) < 0.02 * scale,
            "{} vs scale {scale}",
            max_abs_diff(g, r)
        );
    }

    let (n, v, h) = (33, 50, 16);
    let targets: Vec<u32> = (0..n as u32).map(|i| (i * 13 + 1) % v as u32).collect();
    let inputs = [
        input(&[n, h], 14.0, 3.0, true),
        input(&[v, h], 15.0, 3.0, true),
    ];
    let blockwise: Op = &|x| {
        let (lp, _) = ops::blockwise_token_logprobs(&x[0], &x[1], &targets, 1.0, false, 10 * v)?;
        assert_eq!(
            lp.dtype(),
            DType::F32,
            "log-probs of bf16 hidden states are f32"
        );
        lp.to_dtype(DType::BF16)
    };
    let reference: Op = &|x| {
        composite::token_logprobs(&x[0], &x[1], &targets, 1.0, false, 128)?
            .0
            .to_dtype(DType::BF16)
    };
    let (out, grads) = run(blockwise, &inputs, DType::BF16).unwrap();
    let (rout, rgrads) = run(reference, &inputs, DType::BF16).unwrap();
    assert!(
        max_abs_diff(&out, &rout) < 0.05,
        "{}",
        max_abs_diff(&out, &rout)
    );
    for (g, r) in grads.iter().zip(&rgrads) {
        let (g, r) = (g.as_ref().unwrap(), r.as_ref().unwrap());
        let scale = r.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(
            max_abs_diff(g, r) < 0.02 * scale,
            "{} vs scale {scale}",
            max_abs_diff(g, r)
        );
    }
}

/// `sum(op(inputs) · w)` backpropagated with the inputs listed in `frozen` as plain tensors (no
/// gradient tracking, as the base weights under LoRA adapters) and the others as variables:
/// the gradient of input 0 and the shapes of the matrices the gradient store holds (read from
/// its debug output, `Tensor[dims 8, 6; f32]`): everything the backward pass computed.
fn frozen_run(
    op: Op,
    shapes: &[&[usize]],
    frozen: &[usize],
    dtype: DType,
) -> Result<(Vec<f64>, Vec<[usize; 2]>)> {
    let tensors = shapes
        .iter()
        .enumerate()
        .map(|(k, shape)| {
            let n = shape.iter().product();
            let t = Tensor::from_vec(data(n, k as f64 + 1.0, 2.0), *shape, &Device::Cpu)?
                .to_dtype(dtype)?;
            if frozen.contains(&k) {
                Ok(t)
            } else {
                Ok(Var::from_tensor(&t)?.as_tensor().clone())
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let out = op(&tensors)?;
    let w = Tensor::from_vec(data(out.elem_count(), 99.0, 2.0), out.shape(), &Device::Cpu)?
        .to_dtype(out.dtype())?;
    let store = (out * w)?.sum_all()?.backward()?;
    for &k in frozen {
        assert!(
            store.get(&tensors[k]).is_none(),
            "frozen input {k} got a gradient"
        );
    }
    let dx = store
        .get(&tensors[0])
        .ok_or_else(|| candle_core::Error::Msg("no gradient for input 0".into()))?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1()?;
    let matrices = crate::grad_store::matrix_shapes(&store);
    Ok((dx, matrices))
}

/// A frozen weight gets no gradient on any path (the CPU kernels in f64 and f32, candle's ops in
/// bf16, the blockwise log-prob head): its `dW` products are skipped, not computed and dropped,
/// so the gradient store holds no matrix of its shape or the transpose, while the input's
/// gradient is the one it gets beside a trainable weight.
#[test]
fn frozen_weights_get_no_gradient_on_any_path() {
    let (t, inp, out, v) = (5, 6, 8, 11);
    let targets: Vec<u32> = (0..t as u32).map(|i| (i * 3 + 1) % v as u32).collect();
    let g = data(t, 98.0, 2.0);
    let stacked = |(lp, ent): (Tensor, Option<Tensor>)| match ent {
        Some(ent) => Tensor::stack(&[lp, ent], 1),
        None => Ok(lp),
    };
    let proj: &[&[usize]] = &[&[t, inp], &[out, inp]];
    let proj_add: &[&[usize]] = &[&[t, inp], &[out, inp], &[t, out]];
    let mlp: &[&[usize]] = &[&[t, inp], &[out, inp], &[out, inp]];
    let head: &[&[usize]] = &[&[t, inp], &[v, inp]];
    // (name, op, input shapes, the weights among them)
    type Case<'a> = (&'a str, Op<'a>, &'a [&'a [usize]], &'a [usize]);
    let cases: [Case<'_>; 7] = [
        ("linear", &|x| ops::linear(&x[0], &x[1]), proj, &[1]),
        (
            "linear_heads",
            &|x| ops::linear_heads(&x[0], &x[1], 2),
            proj,
            &[1],
        ),
        (
            "linear_add",
            &|x| ops::linear_add(&x[0], &x[1], &x[2]),
            proj_add,
            &[1],
        ),
        (
            "gated_up",
            &|x| ops::gated_up(&x[0], &x[1], &x[2]),
            mlp,
            &[1, 2],
        ),
        (
            "token_logprobs",
            &|x| stacked(ops::token_logprobs(&x[0], &x[1], &targets, 0.7, true)?),
            head,
            &[1],
        ),
        (
            "token_logprobs_for_grad",
            &|x| ops::token_logprobs_for_grad(&x[0], &x[1], &targets, 0.7, &g),
            head,
            &[1],
        ),
        (
            "blockwise_token_logprobs",
            &|x| {
                stacked(ops::blockwise_token_logprobs(
                    &x[0],
                    &x[1],
                    &targets,
                    0.7,
                    true,
                    2 * v,
                )?)
            },
            head,
            &[1],
        ),
    ];
    for (name, op, shapes, weights) in cases {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5), (DType::BF16, 2e-2)] {
            let what = format!("{name} {dtype:?}");
            let (dx, frozen) = frozen_run(op, shapes, weights, dtype).unwrap();
            let (dx_trained, trained) = frozen_run(op, shapes, &[], dtype).unwrap();
            assert_close(&format!("{what}: input gradient"), &dx, &dx_trained, tol);
            for &k in weights {
                let (o, i) = (shapes[k][0], shapes[k][1]);
                let held = |m: &[[usize; 2]]| m.contains(&[o, i]) || m.contains(&[i, o]);
                assert!(
                    held(&trained),
                    "{what}: a trainable weight {k} gets its gradient"
                );
                assert!(
                    !held(&frozen),
                    "{what}: frozen weight {k} got a gradient: {frozen:?}"
                );
            }
        }
    }
}
