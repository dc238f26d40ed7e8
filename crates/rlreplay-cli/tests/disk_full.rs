//! A full disk under `rlreplay replay`: the run directory lives on a small tmpfs that fills up
//! before a checkpoint is written. The error names the file, the previous complete checkpoint
//! stays the latest, nothing temporary is left, and once space is freed `--resume` finishes
//! identical to an uninterrupted run.
//!
//! Mounting needs root (or CAP_SYS_ADMIN); where it is not permitted the test says why and skips.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rlreplay_data::synth::{write_dataset, SynthConfig};
use rlreplay_train::rundir::read_metrics;

fn rlreplay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(args)
        .output()
        .unwrap()
}

/// A tmpfs mounted for the life of the value.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` at `dir`, or says why it cannot.
    fn mount(dir: &Path, bytes: u64) -> Result<Self, String> {
        if !cfg!(target_os = "linux") {
            return Err("tmpfs mounts are Linux-only".into());
        }
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(Self(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Writes `path` until the file system is full; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 4096];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    f.sync_all().ok();
    written
}

fn setup(dir: &Path) -> String {
    let data = dir.join("data");
    let synth = SynthConfig {
        steps: 4,
        prompts: 8,
        group: 4,
        vocab: 64,
        mean_len: 16.0,
        max_len: 32,
        prompt_len: 6,
        eos: 1,
        pattern_len: 3,
        seed: 5,
        ..SynthConfig::default()
    };
    write_dataset(&data, &synth, |_| {}).unwrap();
    let cfg = dir.join("replay.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[model.random]
vocab_size = 64
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
head_dim = 16

[data]
path = "{}"
eos_token_id = 1

[algorithm]
adv_estimator = "grpo"
loss_mode = "ppo"

[optim]
lr = 1e-3

[batch]
ppo_mini_batch_size = 8

[checkpoint]
save_freq = 1
keep = 3
"#,
            data.display()
        ),
    )
    .unwrap();
    cfg.to_string_lossy().into_owned()
}

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_full_disk_during_a_checkpoint_keeps_the_last_one_and_resumes_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path());
    let full = tmp.path().join("full");
    let full_s = full.to_string_lossy().into_owned();
    let o = rlreplay(&["replay", "--config", &cfg, "--out", &full_s, "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ckpt = |root: &Path, s: u64| root.join(format!("checkpoints/global_step_{s}"));
    let model_bytes = std::fs::metadata(ckpt(&full, 4).join("model.safetensors"))
        .unwrap()
        .len();

    let mnt = tmp.path().join("mnt");
    let _fs = match Tmpfs::mount(&mnt, 16 << 20) {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!("skipping the disk-full test: {why}");
            return;
        }
    };
    let part = mnt.join("run");
    let part_s = part.to_string_lossy().into_owned();
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &part_s,
        "--stop-after",
        "2",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Leave less room than the next checkpoint's weights need, more than its metric lines.
    let filler = mnt.join("filler");
    let written = fill(&filler);
    let room = (model_bytes / 2).max(64 << 10);
    assert!(room < model_bytes, "the model is too small for this test");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&filler)
        .unwrap()
        .set_len(written.saturating_sub(room))
        .unwrap();

    let o = rlreplay(&["replay", "--out", &part_s, "--resume", "--quiet"]);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("the full disk's error: {err}");
    assert!(!o.status.success(), "a full disk must fail the run: {err}");
    assert!(err.contains("writing checkpoint of step 3"), "{err}");
    assert!(
        err.contains("os error 28"),
        "the error says the disk is full: {err}"
    );
    let checkpoints = part.join("checkpoints");
    assert!(
        err.contains(&*checkpoints.to_string_lossy()),
        "the error names the file: {err}"
    );
    // The previous complete checkpoint stays the latest; nothing temporary is left.
    assert_eq!(
        std::fs::read_to_string(checkpoints.join("latest_checkpointed_iteration.txt")).unwrap(),
        "2\n"
    );
    let left = names(&checkpoints);
    assert!(
        left.iter()
            .all(|n| !n.starts_with('.') && n != "global_step_3"),
        "{left:?}"
    );
    let run_left = names(&part);
    assert!(
        run_left
            .iter()
            .all(|n| !n.starts_with(".tmp") && !n.ends_with(".tmp")),
        "{run_left:?}"
    );

    // Space freed: the resumed run finishes as if nothing had happened.
    std::fs::remove_file(&filler).unwrap();
    let o = rlreplay(&["replay", "--out", &part_s, "--resume", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        read_metrics(&full, false).unwrap(),
        read_metrics(&part, false).unwrap()
    );
    let w = |r: &Path| std::fs::read(ckpt(r, 4).join("model.safetensors")).unwrap();
    assert_eq!(w(&full), w(&part));
}
