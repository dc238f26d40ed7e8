//! Devices from the command line: a binary built without CUDA refuses a CUDA device with an error
//! that says how to build one; the GPU check's measurements (`rlreplay device-check`) and
//! `scripts/gpu-check.sh` itself run on the CPU.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn rlreplay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> String {
    root()
        .join("crates/rlreplay-model/tests/fixtures")
        .to_string_lossy()
        .into_owned()
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_devices_need_a_cuda_build() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let synth = rlreplay(&[
        "synth",
        "--out",
        data.to_str().unwrap(),
        "--steps",
        "1",
        "--prompts",
        "2",
        "--group",
        "2",
        "--vocab",
        "512",
        "--mean-len",
        "8",
        "--max-len",
        "16",
        "--prompt-len",
        "4",
    ]);
    assert!(synth.status.success());
    let demo = root().join("configs/demo.toml");
    let data_path = format!("data.path={:?}", data.to_string_lossy());
    let run_dir = tmp.path().join("run");
    let commands: Vec<Vec<String>> = vec![
        [
            "logprobs", "--model", "m", "--input", "i", "--device", "cuda",
        ]
        .map(String::from)
        .to_vec(),
        [
            "replay",
            "--config",
            demo.to_str().unwrap(),
            "--set",
            &data_path,
            "--set",
            "model.device=\"cuda:1\"",
            "--out",
            run_dir.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec(),
        [
            "device-check",
            "golden",
            "--fixtures",
            &fixtures(),
            "--device",
            "cuda",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for args in commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = rlreplay(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("built without CUDA"), "{args:?}: {stderr}");
        assert!(stderr.contains("--features cuda"), "{args:?}: {stderr}");
    }
    let out = rlreplay(&[
        "logprobs", "--model", "m", "--input", "i", "--device", "gpu",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("expected cpu, cuda or cuda:N"), "{stderr}");
}

#[test]
fn device_check_measures_on_the_cpu() {
    let golden = json_of(&rlreplay(&[
        "device-check",
        "golden",
        "--fixtures",
        &fixtures(),
        "--device",
        "cpu",
    ]));
    assert_eq!(golden["meets_goal"], true, "{golden}");
    assert_eq!(golden["fixtures"].as_object().unwrap().len(), 6);
    let f32_err = golden["logprob_max_abs_err"]["f32"].as_f64().unwrap();
    assert!(f32_err < 1e-4, "{golden}");

    let step = json_of(&rlreplay(&[
        "device-check",
        "step",
        "--fixtures",
        &fixtures(),
        "--device",
        "cpu",
    ]));
    let worst = &step["worst_rel_err_vs_cpu_f32"];
    // The CPU in f32 against itself is exact; bf16 within its precision.
    assert_eq!(worst["f32_grad"].as_f64().unwrap(), 0.0, "{step}");
    assert_eq!(worst["f32_update"].as_f64().unwrap(), 0.0, "{step}");
    assert!(worst["bf16_grad"].as_f64().unwrap() < 0.1, "{step}");
    let f64_err = step["fixtures"]["tiny_tied"]["cpu_f32"]["grad_rel_err_vs_f64"]
        .as_f64()
        .unwrap();
    assert!(f64_err < 1e-4, "{step}");

    let tp = json_of(&rlreplay(&[
        "device-check",
        "throughput",
        "--shape",
        "tiny",
        "--device",
        "cpu",
        "--seqs",
        "2",
        "--seq-len",
        "48",
        "--prompt-len",
        "8",
        "--warmup",
        "0",
        "--steps",
        "1",
        "--optimizer",
        "--dtype",
        "f32",
    ]));
    assert_eq!(tp["tokens_per_step"], 96, "{tp}");
    for mode in ["full_graph", "gradient_checkpointing"] {
        let m = &tp["modes"][mode];
        assert_eq!(m["ok"], true, "{tp}");
        assert!(m["tokens_per_s"].as_f64().unwrap() > 0.0, "{tp}");
        assert!(
            m["peak_memory_gib"].is_null(),
            "no device memory on the CPU: {tp}"
        );
    }
    let bad = rlreplay(&[
        "device-check",
        "throughput",
        "--shape",
        "tiny",
        "--device",
        "cpu",
        "--seq-len",
        "8",
        "--prompt-len",
        "8",
    ]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn gpu_check_script_runs_every_item_on_the_cpu() {
    let out = Command::new("bash")
        .arg(root().join("scripts/gpu-check.sh"))
        .env("RLREPLAY", env!("CARGO_BIN_EXE_rlreplay"))
        .env("DEVICE", "cpu")
        .output()
        .unwrap();
    let report = json_of(&out);
    for item in [
        "golden_logprobs",
        "replay_step",
        "throughput_qwen3_0_6b",
        "replay_step_qwen3_4b",
        "replay_cli",
    ] {
        let v = &report[item];
        assert!(v.get("error").is_none(), "{item}: {v}");
        assert!(v["wall_s"].is_number(), "{item}: {v}");
    }
    assert_eq!(report["golden_logprobs"]["meets_goal"], true);
    assert_eq!(report["replay_cli"]["ok"], true);
    assert_eq!(
        report["replay_step_qwen3_4b"]["modes"]["gradient_checkpointing"]["ok"],
        true
    );
}
