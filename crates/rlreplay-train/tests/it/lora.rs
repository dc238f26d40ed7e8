//! LoRA training (`[model] lora_rank`, `adapter`): only the adapters train and are checkpointed,
//! in the PEFT layout; resume is bit-identical; a run can start from an adapter; the self-
//! distillation teacher follows the adapters; export writes the adapter or merges it; bad
//! settings are refused naming the key.

use std::path::{Path, PathBuf};

use rlreplay_data::error::chain;
use rlreplay_data::synth::generate;
use rlreplay_model::lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use rlreplay_model::{DType, Device, Model, SeqPair};
use rlreplay_train::export::{export, CheckpointChoice, ExportOptions};
use rlreplay_train::rundir::{latest_checkpoint, read_metrics};
use rlreplay_train::{run, Config, RunOptions, SourceKind};

use crate::replay::{config, config_text, dataset};

const LORA: &str = "[model]\nlora_rank = 4\nlora_alpha = 8\ntarget_modules = [\"q_proj\", \"v_proj\", \"down_proj\"]\n";

/// The random base model of [`config`].
fn base(cfg: &Config) -> Model {
    let r = cfg.model.random.as_ref().unwrap();
    Model::new_random(r.to_config().unwrap(), r.seed, DType::F32, &Device::Cpu).unwrap()
}

fn last_checkpoint(run: &Path) -> PathBuf {
    latest_checkpoint(run).unwrap().unwrap().1
}

fn adapter_bytes(run: &Path) -> Vec<u8> {
    std::fs::read(last_checkpoint(run).join(ADAPTER_WEIGHTS)).unwrap()
}

/// The log-probs of step 1's logged responses under `model`.
fn logprobs(model: &Model) -> Vec<Vec<f64>> {
    let b = generate(&crate::replay::synth(1), 1).unwrap();
    let pairs: Vec<SeqPair<'_>> = (0..b.len())
        .map(|i| SeqPair::new(b.prompt(i), b.response(i)))
        .collect();
    model.logprobs(&pairs, 1.0, false).unwrap().logprobs
}

#[test]
fn lora_trains_only_the_adapters_and_checkpoints_them_in_the_peft_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 2);
    let cfg = config(&data, LORA);
    let out = tmp.path().join("run");
    let s = run(&RunOptions::new(cfg.clone(), &out)).unwrap();
    assert_eq!((s.global_step, s.skipped_updates), (2, 0));
    let m = read_metrics(&out, false).unwrap();
    assert!(m[1]["actor/grad_norm"].as_f64().unwrap() > 0.0);

    let ckpt = last_checkpoint(&out);
    for f in [ADAPTER_CONFIG, ADAPTER_WEIGHTS, "optimizer.safetensors"] {
        assert!(ckpt.join(f).is_file(), "{f}");
    }
    assert!(!ckpt.join("model.safetensors").exists());
    let peft: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join(ADAPTER_CONFIG)).unwrap()).unwrap();
    assert_eq!(peft["r"], 4);
    assert_eq!(peft["lora_alpha"], 8);
    assert_eq!(
        peft["target_modules"],
        serde_json::json!(["q_proj", "v_proj", "down_proj"])
    );
    // Only adapter state is optimised: the optimizer holds moments of lora_A / lora_B alone.
    let opt =
        candle_core::safetensors::load(ckpt.join("optimizer.safetensors"), &Device::Cpu).unwrap();
    assert!(!opt.is_empty());
    assert!(
        opt.keys()
            .all(|k| k.contains(".lora_A.") || k.contains(".lora_B.")),
        "{:?}",
        opt.keys().collect::<Vec<_>>()
    );
    // The adapters moved the policy (B starts at zero), and the base is the initial model.
    let before = base(&cfg);
    let mut after = base(&cfg);
    after.load_adapter(&ckpt).unwrap();
    let (lb, la) = (logprobs(&before), logprobs(&after));
    assert_ne!(lb, la);
    // The run root and checkpoints/last hold the adapter too.
    assert!(out.join("checkpoints/last").join(ADAPTER_CONFIG).is_file());

    // The same run again gives the same adapter, bit for bit.
    let again = tmp.path().join("again");
    run(&RunOptions::new(cfg, &again)).unwrap();
    assert_eq!(adapter_bytes(&out), adapter_bytes(&again));
    assert_eq!(m, read_metrics(&again, false).unwrap());
}

#[test]
fn lora_resume_is_bit_identical_and_a_run_can_start_from_an_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 3);
    let extra = format!("{LORA}[trainer]\nsave_freq = 1\nkeep = 3\n");
    let cfg = config(&data, &extra);
    let full = tmp.path().join("full");
    run(&RunOptions::new(cfg.clone(), &full)).unwrap();
    let part = tmp.path().join("part");
    assert_eq!(crate::replay::stop_then_resume(cfg, &part, 1), 3);
    assert_eq!(
        read_metrics(&full, false).unwrap(),
        read_metrics(&part, false).unwrap()
    );
    assert_eq!(adapter_bytes(&full), adapter_bytes(&part));
    let opt = |r: &Path| std::fs::read(last_checkpoint(r).join("optimizer.safetensors")).unwrap();
    assert_eq!(opt(&full), opt(&part));

    // `[model] adapter` starts from a saved adapter: its rank and targets are used.
    let first = full.join("checkpoints/global_step_1");
    let from = config(
        &data,
        &format!("[model]\nadapter = \"{}\"\n", first.display()),
    );
    let cont = tmp.path().join("cont");
    run(&RunOptions::new(from.clone(), &cont)).unwrap();
    let peft = std::fs::read_to_string(last_checkpoint(&cont).join(ADAPTER_CONFIG)).unwrap();
    assert!(peft.contains("\"down_proj\""), "{peft}");
    // A rank that contradicts the adapter's is refused, naming both.
    let e = run(&RunOptions::new(
        config(
            &data,
            &format!(
                "[model]\nadapter = \"{}\"\nlora_rank = 8\n",
                first.display()
            ),
        ),
        &tmp.path().join("bad-rank"),
    ))
    .unwrap_err();
    let msg = chain(&e);
    assert!(
        msg.contains("lora_rank = 8") && msg.contains("rank 4"),
        "{msg}"
    );
    // A missing adapter is named.
    let e = run(&RunOptions::new(
        config(&data, "[model]\nadapter = \"/nonexistent/adapter\"\n"),
        &tmp.path().join("missing"),
    ))
    .unwrap_err();
    let msg = chain(&e);
    assert!(
        msg.contains("/nonexistent/adapter") && msg.contains(ADAPTER_CONFIG),
        "{msg}"
    );
}

#[test]
fn bad_lora_settings_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 1);
    for (extra, key, what) in [
        (
            "[model]\nlora_rank = 4\ntarget_modules = [\"q_proj\", \"qkv\"]\n",
            "model.target_modules",
            "qkv",
        ),
        (
            "[model]\nlora_rank = 4\nlora_dropout = 0.05\n",
            "model.lora_dropout",
            "0.05",
        ),
        (
            "[model]\nlora_rank = 4\ntarget_modules = []\n",
            "model.target_modules",
            "empty",
        ),
        (
            "[model]\nlora_rank = 4\nlora_alpha = inf\n",
            "model.lora_alpha",
            "finite",
        ),
    ] {
        let e = Config::parse(&config_text(&data, extra), &[], SourceKind::Logged).unwrap_err();
        let msg = format!("{e:?}");
        assert!(msg.contains(key) && msg.contains(what), "{extra}: {msg}");
    }
    // "all-linear" (the default) and a single name parse.
    for t in ["\"all-linear\"", "\"o_proj\""] {
        let c = config(
            &data,
            &format!("[model]\nlora_rank = 2\ntarget_modules = {t}\n"),
        );
        c.validate().unwrap();
        assert!(c.model.fresh_lora().unwrap().is_some());
    }
}

#[test]
fn export_writes_the_adapter_or_merges_it_into_full_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 2);
    let cfg = config(&data, LORA);
    let out = tmp.path().join("run");
    run(&RunOptions::new(cfg.clone(), &out)).unwrap();
    let mut opts = ExportOptions {
        run_dir: out.clone(),
        card_dir: tmp.path().join("card"),
        checkpoint: CheckpointChoice::Last,
        ..Default::default()
    };
    let r = export(&opts).unwrap();
    assert!(
        r.files.contains(&ADAPTER_CONFIG.to_string()),
        "{:?}",
        r.files
    );
    assert!(!r.files.contains(&"model.safetensors".to_string()));
    let readme = std::fs::read_to_string(opts.card_dir.join("README.md")).unwrap();
    assert!(readme.contains("library_name: peft"), "{readme}");
    assert!(readme.contains("AutoPeftModelForCausalLM"), "{readme}");

    opts.card_dir = tmp.path().join("merged");
    opts.merge = true;
    let r = export(&opts).unwrap();
    assert!(
        r.files.contains(&"model.safetensors".to_string()),
        "{:?}",
        r.files
    );
    assert!(!r.files.contains(&ADAPTER_CONFIG.to_string()));
    // The merged weights compute what the base with the adapter computes.
    let merged = Model::load(&opts.card_dir, DType::F32, &Device::Cpu).unwrap();
    let mut with = base(&cfg);
    with.load_adapter(last_checkpoint(&out)).unwrap();
    let (a, b) = (logprobs(&merged), logprobs(&with));
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert!((x - y).abs() < 1e-4, "{x} {y}");
    }
    // A run without adapters has nothing to merge.
    let plain = tmp.path().join("plain");
    run(&RunOptions::new(config(&data, ""), &plain)).unwrap();
    let e = export(&ExportOptions {
        run_dir: plain,
        card_dir: tmp.path().join("plain-card"),
        merge: true,
        ..Default::default()
    })
    .unwrap_err();
    assert!(chain(&e).contains("no adapter to merge"), "{}", chain(&e));
}

#[test]
fn the_ema_teacher_follows_the_adapters_and_resumes_bit_identically() {
    use crate::replay_rlsd::{config, dataset, model_dir};
    let tmp = tempfile::tempdir().unwrap();
    let model = model_dir(tmp.path());
    let data = dataset(tmp.path(), &model, 3, true);
    let cfg = config(
        &model,
        &data,
        &[
            "self_distillation.teacher_regularization=\"ema\"",
            "self_distillation.context=\"reference\"",
            "checkpoint.save_freq=1",
            "model.lora_rank=4",
        ],
    );
    let full = tmp.path().join("full");
    run(&RunOptions::new(cfg.clone(), &full)).unwrap();
    let ema = |r: &Path| {
        std::fs::read(
            r.join("checkpoints/global_step_3/ema_teacher")
                .join(ADAPTER_WEIGHTS),
        )
        .unwrap()
    };
    let part = tmp.path().join("part");
    assert_eq!(crate::replay::stop_then_resume(cfg, &part, 1), 3);
    assert_eq!(
        read_metrics(&full, false).unwrap(),
        read_metrics(&part, false).unwrap()
    );
    assert_eq!(adapter_bytes(&full), adapter_bytes(&part));
    assert_eq!(ema(&full), ema(&part));
    // The EMA adapters moved away from the initial (zero) B towards the student's.
    assert_ne!(ema(&full), adapter_bytes(&full));
    let peft: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(last_checkpoint(&full).join(ADAPTER_CONFIG)).unwrap(),
    )
    .unwrap();
    assert_eq!(
        peft["base_model_name_or_path"],
        std::path::absolute(&model).unwrap().display().to_string()
    );
}

#[test]
fn bf16_lora_keeps_f32_adapters_and_resumes_bit_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let data = dataset(tmp.path(), 3);
    let extra = "[model]\ndtype = \"bf16\"\nlora_rank = 4\n[trainer]\nsave_freq = 1\nkeep = 3\n";
    let cfg = config(&data, extra);
    let full = tmp.path().join("full");
    run(&RunOptions::new(cfg.clone(), &full)).unwrap();
    let part = tmp.path().join("part");
    assert_eq!(crate::replay::stop_then_resume(cfg, &part, 1), 3);
    assert_eq!(adapter_bytes(&full), adapter_bytes(&part));
    let st =
        candle_core::safetensors::load(last_checkpoint(&full).join(ADAPTER_WEIGHTS), &Device::Cpu)
            .unwrap();
    assert!(st.values().all(|t| t.dtype() == DType::F32));
}
