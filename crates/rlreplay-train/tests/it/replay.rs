//! End-to-end replays on small synthetic datasets with a tiny random Qwen3: determinism, resume,
//! learning signal, skipped non-finite updates, schedules.

use std::path::{Path, PathBuf};

use rlreplay_data::synth::{generate, write_dataset, SynthConfig};
use rlreplay_model::{DType, Device, Model, SeqPair};
use rlreplay_train::rundir::{latest_checkpoint, read_metrics};
use rlreplay_train::{run, Config, RunOptions, SourceKind};

const EOS: u32 = 1;

pub(crate) fn synth(steps: usize) -> SynthConfig {
    SynthConfig {
        steps,
        first_step: 1,
        prompts: 8,
        group: 4,
        vocab: 64,
        mean_len: 12.0,
        max_len: 24,
        prompt_len: 6,
        eos: EOS,
        pattern_len: 3,
        seed: 7,
    }
}

pub(crate) fn dataset(dir: &Path, steps: usize) -> PathBuf {
    let out = dir.join("data");
    write_dataset(&out, &synth(steps), |_| {}).unwrap();
    out
}

pub(crate) fn config(data: &Path, extra: &str) -> Config {
    Config::parse(&config_text(data, extra), &[], SourceKind::Logged).unwrap()
}

/// The TOML text of [`config`].
pub(crate) fn config_text(data: &Path, extra: &str) -> String {
    format!(
        r#"
[model.random]
vocab_size = 64
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 8
seed = 3

[data]
path = "{}"
eos_token_id = {EOS}

[algorithm]
adv_estimator = "maxrl"
loss_mode = "reinforce"

[optim]
lr = 1e-2
grad_clip = 1.0

[batch]
ppo_mini_batch_size = 4
max_tokens_per_micro_batch = 200
{extra}
"#,
        data.display()
    )
}

/// Runs `cfg` into `out` for `stop` steps, then resumes it to its end: the last step trained.
pub(crate) fn stop_then_resume(cfg: Config, out: &Path, stop: u64) -> u64 {
    let mut o = RunOptions::new(cfg, out);
    o.stop_after = Some(stop);
    assert_eq!(run(&o).unwrap().global_step, stop);
    o.stop_after = None;
    o.resume = true;
    run(&o).unwrap().global_step
}

fn final_weights(run: &Path) -> Vec<u8> {
    let (_, dir) = latest_checkpoint(run).unwrap().unwrap();
    std::fs::read(dir.join("model.safetensors")).unwrap()
}

#[test]
fn same_inputs_give_identical_metrics_and_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 2);
    let cfg = config(&data, "[schedule]\nmode = \"shuffle\"\nsubsample = 3\n");
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    run(&RunOptions::new(cfg.clone(), &a)).unwrap();
    run(&RunOptions::new(cfg, &b)).unwrap();
    let ma = read_metrics(&a, false).unwrap();
    assert_eq!(ma.len(), 2);
    assert_eq!(ma, read_metrics(&b, false).unwrap());
    assert_eq!(final_weights(&a), final_weights(&b));
    for key in [
        "actor/pg_loss",
        "actor/grad_norm",
        "actor/lr",
        "critic/score/mean",
        "critic/advantages/mean",
        "response_length/clip_ratio",
        "rollout_corr/kl",
        "rollout_corr/chi2_token",
        "actor/ppo_kl",
    ] {
        assert!(
            ma[0].get(key).is_some_and(|v| v.is_number()),
            "missing {key}: {}",
            ma[0]
        );
    }
    assert_eq!(ma[0]["schedule/rows"], 24.0);
    for f in [
        "config.toml",
        "training_scores.csv",
        "plots/training_score.png",
        "plots/training_score.svg",
        "checkpoints/latest_checkpointed_iteration.txt",
        "checkpoints/global_step_2/config.json",
        "checkpoints/global_step_2/optimizer.safetensors",
        "checkpoints/global_step_2/trainer_state.json",
    ] {
        assert!(a.join(f).is_file(), "{f}");
    }
    // The saved configuration reproduces the run's.
    let saved = Config::load(&a.join("config.toml"), &[], SourceKind::Logged)
        .unwrap()
        .0;
    assert_eq!(
        saved,
        config(&data, "[schedule]\nmode = \"shuffle\"\nsubsample = 3\n")
    );
}

#[test]
fn resume_is_bit_identical_to_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 4);
    let cfg = config(
        &data,
        "[trainer]\nsave_freq = 1\nkeep = 2\n[schedule]\nmode = \"shuffle\"\nepochs = 2\n",
    );
    let full = tmp.path().join("full");
    run(&RunOptions::new(cfg.clone(), &full)).unwrap();

    let part = tmp.path().join("part");
    assert_eq!(stop_then_resume(cfg, &part, 3), 8);
    assert_eq!(
        read_metrics(&full, false).unwrap(),
        read_metrics(&part, false).unwrap()
    );
    assert_eq!(final_weights(&full), final_weights(&part));
    // The optimizer moments and step counts are identical too.
    let opt = |r: &Path| {
        let t = candle_core::safetensors::load(
            r.join("checkpoints/global_step_8/optimizer.safetensors"),
            &Device::Cpu,
        )
        .unwrap();
        let mut v: Vec<(String, Vec<f32>)> = t
            .into_iter()
            .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(opt(&full), opt(&part));
    // keep = 2 bounds the checkpoints.
    let n = std::fs::read_dir(full.join("checkpoints"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("global_step_")
        })
        .count();
    assert_eq!(n, 2);
    // A fresh start into a directory holding a run is refused.
    assert!(run(&RunOptions::new(config(&data, ""), &full)).is_err());
}

/// Mean per-token log-prob of the successful minus the failed responses of one step.
fn success_gap(model: &Model, step: i64) -> f64 {
    let b = generate(&synth(6), step).unwrap();
    let pairs: Vec<SeqPair<'_>> = (0..b.len())
        .map(|i| SeqPair::new(b.prompt(i), b.response(i)))
        .collect();
    let lp = model.logprobs(&pairs, 1.0, false).unwrap().logprobs;
    let mean = |win: bool| {
        let rows: Vec<&Vec<f64>> = (0..b.len())
            .filter(|&i| (b.scores[i] >= 0.5) == win)
            .map(|i| &lp[i])
            .collect();
        let n: usize = rows.iter().map(|r| r.len()).sum();
        rows.iter().flat_map(|r| r.iter()).sum::<f64>() / n as f64
    };
    mean(true) - mean(false)
}

#[test]
fn replay_raises_held_out_successes_over_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 5);
    let cfg = config(&data, "");
    let out = tmp.path().join("run");
    run(&RunOptions::new(cfg, &out)).unwrap();
    let before = Model::new_random(
        config(&data, "").model.random.unwrap().to_config().unwrap(),
        3,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let (_, dir) = latest_checkpoint(&out).unwrap().unwrap();
    let after = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
    // Step 6 was never trained on: held-out prompts and responses.
    let (g0, g1) = (success_gap(&before, 6), success_gap(&after, 6));
    assert!(g1 > g0 + 0.25, "gap before {g0}, after {g1}");
}

#[test]
fn non_finite_updates_are_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 3);
    let mut cfg = config(&data, "");
    // A learning rate this large overflows the weights after the first update: every later
    // forward pass is non-finite, so those updates are skipped and never reach the weights.
    cfg.optim.lr = 1e38;
    cfg.optim.weight_decay = 0.0;
    cfg.trainer.save_freq = 1;
    cfg.trainer.keep = 0;
    let out = tmp.path().join("run");
    let s = run(&RunOptions::new(cfg, &out)).unwrap();
    assert_eq!(s.global_step, 3);
    assert!(s.skipped_updates >= 2, "{}", s.skipped_updates);
    let w = |step: u64| {
        std::fs::read(out.join(format!("checkpoints/global_step_{step}/model.safetensors")))
            .unwrap()
    };
    assert_eq!(w(2), w(3));
    let m = read_metrics(&out, false).unwrap();
    assert_eq!(m[2]["train/skipped_updates"], 2.0);
}

#[test]
fn schedules_pick_the_planned_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 4);
    let source = |extra: &str, name: &str| -> Vec<serde_json::Value> {
        let out = tmp.path().join(name);
        let mut cfg = config(&data, extra);
        cfg.optim.lr = 1e-4;
        run(&RunOptions::new(cfg, &out)).unwrap();
        read_metrics(&out, false).unwrap()
    };
    let m = source(
        "[schedule]\nmode = \"lag\"\nlag = 2\ndrop_solve_none = true\ndrop_solve_all = true\ndrop_truncated = true\n",
        "lag",
    );
    let src: Vec<f64> = m
        .iter()
        .map(|x| x["train/source_step"].as_f64().unwrap())
        .collect();
    // Two steps on their own rows, then the rows of two steps before.
    assert_eq!(src, [1.0, 2.0, 1.0, 2.0]);
    for x in &m {
        let kept = x["schedule/groups"].as_f64().unwrap();
        let dropped = x["schedule/dropped_solve_none"].as_f64().unwrap()
            + x["schedule/dropped_solve_all"].as_f64().unwrap();
        assert_eq!(kept + dropped, 8.0);
        assert_eq!(x["response_length/clip_ratio"], 0.0);
    }
    let m = source(
        "[schedule]\nmode = \"mix\"\nmix = [{steps = \"1..2\", weight = 1.0}, {steps = \"4..4\", weight = 3.0}]\nsubsample = 2\n",
        "mix",
    );
    assert_eq!(m.len(), 3);
    for x in &m {
        assert!([1.0, 2.0, 4.0].contains(&x["train/source_step"].as_f64().unwrap()));
        assert_eq!(x["schedule/rows"], 16.0);
    }
    let m = source("[schedule]\ngroup_fraction = 0.25\n", "groups");
    assert_eq!(m.len(), 4);
    for x in &m {
        assert_eq!(x["schedule/groups"], 2.0);
        assert_eq!(x["schedule/dropped_group_fraction"], 6.0);
    }
}

#[test]
fn off_policy_corrections_run_and_are_logged() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 1);
    for (name, algo) in [
        (
            "is",
            "loss_mode = \"ppo\"\nrollout_is = \"token\"\nrollout_is_threshold = 2.0\n",
        ),
        ("bypass", "loss_mode = \"reinforce\"\nbypass_mode = true\n"),
    ] {
        let text = format!("[algorithm]\n{algo}\n");
        let extra: toml::Table = toml::from_str(&text).unwrap();
        let sets: Vec<String> = extra["algorithm"]
            .as_table()
            .unwrap()
            .iter()
            .map(|(k, v)| format!("algorithm.{k}={v}"))
            .collect();
        let base = config(&data, "").to_toml().unwrap();
        let mut cfg = Config::parse(&base, &sets, SourceKind::Logged).unwrap();
        cfg.batch.ppo_epochs = 2;
        let out = tmp.path().join(name);
        let s = run(&RunOptions::new(cfg, &out)).unwrap();
        assert_eq!(s.skipped_updates, 0);
        let m = &read_metrics(&out, false).unwrap()[0];
        assert_eq!(m["train/optimizer_steps"], 4.0, "{name}");
        for key in [
            "rollout_corr/kl",
            "rollout_corr/k3_kl",
            "rollout_corr/chi2_seq",
        ] {
            assert!(m[key].is_number(), "{name}: {key} missing in {m}");
        }
        if name == "is" {
            assert!(m["rollout_corr/rollout_is_mean"].is_number(), "{m}");
            assert!(m["actor/pg_clipfrac"].is_number(), "{m}");
        }
    }
}

#[test]
fn gradient_checkpointing_gives_the_same_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 2);
    let mut cfg = config(&data, "");
    cfg.model.dtype = rlreplay_train::config::Dtype::F64;
    let off = tmp.path().join("off");
    run(&RunOptions::new(cfg.clone(), &off)).unwrap();
    cfg.model.enable_gradient_checkpointing = true;
    let on = tmp.path().join("on");
    run(&RunOptions::new(cfg, &on)).unwrap();
    let (a, b) = (
        read_metrics(&off, false).unwrap(),
        read_metrics(&on, false).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for (k, v) in x.as_object().unwrap() {
            let (p, q) = (v.as_f64().unwrap(), y[k].as_f64().unwrap());
            assert!((p - q).abs() <= 1e-9 * p.abs().max(1.0), "{k}: {p} vs {q}");
        }
    }
}

/// Guards against checkpoints without tokenizer files after `--resume`: the resumed model's own
/// source directory is a checkpoint that rotation (`keep = 1`) deletes, so the tokenizer files
/// must come from `[model] path`.
#[test]
fn resumed_checkpoints_keep_the_tokenizer_files_through_rotation() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 3);
    let model_dir = tmp.path().join("model");
    let random = config(&data, "").model.random.unwrap();
    Model::new_random(random.to_config().unwrap(), 3, DType::F32, &Device::Cpu)
        .unwrap()
        .save_hf(&model_dir)
        .unwrap();
    std::fs::write(model_dir.join("tokenizer.json"), "{}").unwrap();
    std::fs::write(model_dir.join("tokenizer_config.json"), "{}").unwrap();
    let mut cfg = config(&data, "[trainer]\nsave_freq = 1\nkeep = 1\n");
    cfg.model.random = None;
    cfg.model.path = Some(model_dir);
    let out = tmp.path().join("run");
    stop_then_resume(cfg, &out, 1);
    let (step, last) = latest_checkpoint(&out).unwrap().unwrap();
    assert_eq!(step, 3);
    assert!(
        !out.join("checkpoints/global_step_1").exists(),
        "rotated away"
    );
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        assert!(
            last.join(f).is_file(),
            "{f} missing from {}",
            last.display()
        );
    }
}

/// Guards that `[trainer] threads` is a pool of that size, not a change of the whole process's
/// environment (a library must not set `RAYON_NUM_THREADS` for its caller).
#[test]
fn threads_do_not_touch_the_process_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 1);
    let before = std::env::var_os("RAYON_NUM_THREADS");
    let cfg = config(&data, "[trainer]\nthreads = 1\n");
    run(&RunOptions::new(cfg, &tmp.path().join("run"))).unwrap();
    assert_eq!(std::env::var_os("RAYON_NUM_THREADS"), before);
}

/// The scalars TensorBoard shows for a run directory: the event files in name order, a
/// `SessionLog` `START` at step N dropping what earlier files hold at N and later (as
/// TensorBoard's `EventAccumulator` purges a restarted run). `(step, tag) -> value`.
fn tensorboard_view(run: &Path) -> std::collections::BTreeMap<(i64, String), f32> {
    use rlreplay_tensorboard::proto::{What, SESSION_START};
    let mut view = std::collections::BTreeMap::new();
    for file in rlreplay_tensorboard::event_files(&run.join("tensorboard")).unwrap() {
        for e in rlreplay_tensorboard::read_events(&file).unwrap() {
            match e.what {
                Some(What::SessionLog(s)) if s.status == SESSION_START => {
                    view.retain(|(step, _): &(i64, String), _| *step < e.step);
                }
                Some(What::Summary(s)) => {
                    for v in s.value {
                        view.insert((e.step, v.tag), v.simple_value.unwrap());
                    }
                }
                _ => {}
            }
        }
    }
    view
}

#[test]
fn tensorboard_logger_holds_every_metric_at_its_step_across_a_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 4);
    let base = config(
        &data,
        "[trainer]\nsave_freq = 1\nkeep = 0\nloggers = [\"jsonl\", \"tensorboard\"]\n",
    )
    .to_toml()
    .unwrap();
    let sets = [
        "algorithm.loss_mode=\"ppo\"".to_string(),
        "algorithm.rollout_is=\"token\"".into(),
        "algorithm.rollout_is_threshold=2.0".into(),
    ];
    let cfg = Config::parse(&base, &sets, SourceKind::Logged).unwrap();
    let out = tmp.path().join("run");
    let mut o = RunOptions::new(cfg, &out);
    o.stop_after = Some(3);
    run(&o).unwrap();
    // Killed after step 3 was logged but before its checkpoint was complete.
    std::fs::remove_dir_all(out.join("checkpoints/global_step_3")).unwrap();
    o.stop_after = None;
    o.resume = true;
    assert_eq!(run(&o).unwrap().global_step, 4);

    let files = rlreplay_tensorboard::event_files(&out.join("tensorboard")).unwrap();
    assert_eq!(files.len(), 2, "{files:?}");
    let view = tensorboard_view(&out);
    let lines = read_metrics(&out, true).unwrap();
    assert_eq!(lines.len(), 4);
    let mut expected = std::collections::BTreeMap::new();
    for line in &lines {
        let step = line["step"].as_i64().unwrap();
        for (k, v) in line.as_object().unwrap() {
            if k != "step" {
                let v = v.as_f64().map_or(f32::NAN, |v| v as f32);
                expected.insert((step, k.clone()), v);
            }
        }
    }
    assert_eq!(
        view.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (key, v) in &expected {
        let got = view[key];
        assert!(
            got == *v || (got.is_nan() && v.is_nan()),
            "{key:?}: {got} != {v}"
        );
    }
    // The learning signal and the IS diagnostics are logged per step and plotted.
    for key in [
        "replay/logprob_success",
        "replay/logprob_failure",
        "rollout_corr/rollout_is_mean",
        "rollout_corr/k3_kl",
    ] {
        assert!(expected.contains_key(&(4, key.to_string())), "{key}");
    }
    let csv = std::fs::read_to_string(out.join("training_scores.csv")).unwrap();
    assert!(csv.lines().next().unwrap().contains("logprob_success"));
    assert_eq!(csv.lines().count(), 5);
    assert!(out.join("results/training_score.svg").is_file());
}

#[test]
fn without_the_jsonl_logger_no_metrics_file_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 1);
    let cfg = config(&data, "[trainer]\nloggers = [\"tensorboard\"]\n");
    let out = tmp.path().join("run");
    run(&RunOptions::new(cfg, &out)).unwrap();
    assert!(!out.join("metrics.jsonl").exists());
    assert!(out.join("training_scores.csv").is_file());
    let view = tensorboard_view(&out);
    assert!(view.contains_key(&(1, "critic/score/mean".to_string())));
}
