//! `rlreplay replay` as a process: kill -9 in the middle of a run and a full disk, resume, and
//! compare with an uninterrupted run; configuration errors.

use std::io::Write;
use std::path::{Path, PathBuf};

use rlreplay_train::rundir::read_metrics;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{rlreplay, tiny_dataset, TINY_RANDOM_MODEL};

fn setup(dir: &Path, steps: usize) -> String {
    let data = tiny_dataset(&dir.join("data"), steps, 8, 4, 11);
    let cfg = dir.join("replay.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
{TINY_RANDOM_MODEL}
[data]
path = "{}"
eos_token_id = 1

[algorithm]
adv_estimator = "grpo"
loss_mode = "ppo"

[optim]
lr = 1e-3

[batch]
ppo_mini_batch_size = 4

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

#[test]
fn kill_9_then_resume_matches_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 16;
    let cfg = setup(tmp.path(), steps);
    let full = tmp.path().join("full");
    let full_s = full.to_string_lossy();
    let o = rlreplay(&["replay", "--config", &cfg, "--out", &full_s, "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained 16/16 steps"));

    let part = tmp.path().join("part");
    let part_s = part.to_string_lossy();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["replay", "--config", &cfg, "--out", &part_s, "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let latest = part.join("checkpoints/latest_checkpointed_iteration.txt");
    let t0 = Instant::now();
    while !latest.exists() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // SIGKILL: no destructor, no flush, possibly in the middle of writing a checkpoint.
    child.kill().unwrap();
    child.wait().unwrap();
    let done: u64 = std::fs::read_to_string(&latest)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(done >= 1);

    let o = rlreplay(&["replay", "--out", &part_s, "--resume", "--quiet"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        read_metrics(&full, false).unwrap(),
        read_metrics(&part, false).unwrap()
    );
    let w =
        |r: &Path| std::fs::read(r.join("checkpoints/global_step_16/model.safetensors")).unwrap();
    assert_eq!(w(&full), w(&part));
}

#[test]
fn configuration_errors_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 1);
    let out = tmp.path().join("run");
    let out_s = out.to_string_lossy();
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--set",
        "optim.lrr=1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("lrr"));
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--set",
        "algorithm.adv_estimator=nope",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("adv_estimator"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--set",
        "batch.ppo_epochs=\"two\"",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("ppo_epochs"));
    // A typed override works and lands in the saved configuration.
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--quiet",
        "--set",
        "optim.lr=2e-3",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let saved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(saved.contains("lr = 0.002"), "{saved}");
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The steps of a run's `metrics.jsonl`, in file order.
fn logged_steps(run: &Path) -> Vec<u64> {
    read_metrics(run, false)
        .unwrap()
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect()
}

/// A second process on a run directory in use is refused before it writes anything, naming the
/// holder's pid; once the holder is gone the directory is free again.
#[test]
fn a_run_directory_in_use_is_refused_naming_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 2);
    let out = tmp.path().join("run");
    let out_s = out.to_string_lossy();
    let lock = rlreplay_train::rundir::RunLock::acquire(&out).unwrap();
    let holder = format!("pid {}", std::process::id());
    for extra in [&[][..], &["--resume"][..]] {
        let mut args = vec!["replay", "--config", &cfg, "--out", &out_s, "--quiet"];
        args.extend_from_slice(extra);
        let o = rlreplay(&args);
        assert!(!o.status.success(), "{args:?}");
        assert!(
            stderr(&o).contains("in use by another rlreplay process")
                && stderr(&o).contains(&holder),
            "{}",
            stderr(&o)
        );
    }
    let written: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        written,
        [rlreplay_train::rundir::LOCK],
        "nothing else was written"
    );
    drop(lock);
    let o = rlreplay(&["replay", "--config", &cfg, "--out", &out_s, "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(logged_steps(&out), [1, 2]);
}

/// Two fresh starts at once on one `--out` (two learning rates) and a `--resume` soon after: one
/// run writes the directory, the others are refused; the metrics and the saved configuration are
/// those of that one run.
#[test]
fn concurrent_starts_on_one_run_directory_leave_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 6;
    let cfg = setup(tmp.path(), steps);
    let out = tmp.path().join("run");
    let out_s = out.to_string_lossy();
    let start = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rlreplay"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let lrs = ["1e-3", "5e-3"];
    let sets: Vec<String> = lrs.iter().map(|lr| format!("optim.lr={lr}")).collect();
    let runs: Vec<_> = sets
        .iter()
        .map(|set| {
            start(&[
                "replay", "--config", &cfg, "--out", &out_s, "--quiet", "--set", set,
            ])
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let resume = start(&["replay", "--out", &out_s, "--resume", "--quiet"]);
    let done: Vec<Output> = runs
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let resumed = resume.wait_with_output().unwrap();
    let winners: Vec<usize> = (0..2).filter(|&i| done[i].status.success()).collect();
    assert_eq!(
        winners.len(),
        1,
        "{:?}",
        done.iter().map(stderr).collect::<Vec<_>>()
    );
    let loser = &done[1 - winners[0]];
    assert!(
        stderr(loser).contains("in use by another rlreplay process (pid ")
            || stderr(loser).contains("already holds a run"),
        "{}",
        stderr(loser)
    );
    if !resumed.status.success() {
        let e = stderr(&resumed);
        assert!(
            e.contains("in use by another rlreplay process") || e.contains("config.toml"),
            "{e}"
        );
    }
    assert_eq!(logged_steps(&out), (1..=steps as u64).collect::<Vec<_>>());
    let saved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    let lr: f64 = lrs[winners[0]].parse().unwrap();
    assert!(saved.contains(&format!("lr = {lr}")), "{saved}");
}

/// `--resume` with a changed configuration names the key that changed and both values.
#[test]
fn resume_with_a_changed_config_names_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 2);
    let out = tmp.path().join("run");
    let out_s = out.to_string_lossy();
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--quiet",
        "--stop-after",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--quiet",
        "--resume",
        "--set",
        "optim.lr=5e-3",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("optim.lr = 0.001 in the run, 0.005 now"),
        "{}",
        stderr(&o)
    );
    // What may change does not count.
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--quiet",
        "--resume",
        "--set",
        "trainer.save_freq=2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(logged_steps(&out), [1, 2]);
}

/// `run.threads = 100000` used to start thousands of threads and hang: the request is capped to
/// the machine's cores, with a warning.
#[test]
fn thread_counts_are_capped_to_the_cores() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 1);
    let out = tmp.path().join("run");
    let out_s = out.to_string_lossy();
    let t0 = Instant::now();
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out_s,
        "--quiet",
        "--set",
        "run.threads=100000",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(
        stderr(&o).contains(&format!(
            "100000 worker threads requested on a machine with {cores} cores: using {cores}"
        )),
        "{}",
        stderr(&o)
    );
    assert!(t0.elapsed() < Duration::from_secs(120));
    let (threads, warning) = rlreplay_model::worker_threads(cores + 1, true);
    assert_eq!((threads, warning), (cores + 1, None), "forced");
    assert_eq!(rlreplay_model::worker_threads(0, false), (0, None));
}

/// A zero-row shard used to replay to a NaN loss with exit 0: the replay stops with an error
/// naming the shard, and no NaN loss is logged.
#[test]
fn a_zero_row_shard_is_refused_instead_of_a_nan_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 2);
    let data = tmp.path().join("data");
    // Step 2's shard replaced by one with no rows.
    let shard = data.join("data/step-0002.parquet");
    std::fs::remove_file(&shard).unwrap();
    let written =
        rlreplay_data::write_shard(&data, &rlreplay_data::RolloutBatch::empty(2)).unwrap();
    assert_eq!(written, shard);
    let out = tmp.path().join("run");
    let out_s = out.to_string_lossy();
    let o = rlreplay(&["replay", "--config", &cfg, "--out", &out_s, "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("holds no rows") && e.contains("step-0002.parquet"),
        "{e}"
    );
    for m in read_metrics(&out, false).unwrap() {
        assert!(
            m["actor/pg_loss"].as_f64().is_some_and(f64::is_finite),
            "{m}"
        );
    }
}

/// A row the trainer refuses (an empty prompt) is refused by `validate` with the same words, by
/// `replay` with its file, row and column; the failed replay leaves nothing that blocks the
/// next attempt once the data is fixed.
#[test]
fn validate_refuses_what_replay_refuses_and_a_failed_start_blocks_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 2);
    let data = tmp.path().join("data");
    let shard = data.join("data/step-0001.parquet");
    let good = std::fs::read(&shard).unwrap();
    let opts = rlreplay_data::ReadOptions::new([1]);
    let (b, _) = rlreplay_data::read_shard(&shard, 1, &opts).unwrap();
    let mut bad = rlreplay_data::RolloutBatch::empty(1);
    for i in 0..b.len() {
        let prompt: &[u32] = if i == 3 { &[] } else { b.prompt(i) };
        bad.push_row(
            &b.uids[i],
            prompt,
            b.response(i),
            b.log_probs(i),
            b.scores[i],
            None,
            None,
            None,
            None,
        );
    }
    rlreplay_data::write_shard(&data, &bad).unwrap();
    let words = "the prompt is empty, so the first response token has no context";
    let o = rlreplay(&["validate", &data.to_string_lossy(), "--eos", "1"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(words) && out.contains("step-0001.parquet") && out.contains("row 3"),
        "{out}"
    );
    let run = tmp.path().join("run");
    let run_s = run.to_string_lossy();
    let o = rlreplay(&["replay", "--config", &cfg, "--out", &run_s, "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains(words) && e.contains("step-0001.parquet") && e.contains("row 3"),
        "{e}"
    );
    std::fs::write(&shard, good).unwrap();
    // With the model the rows are for, validate also checks what the trainer checks against it:
    // token ids below its vocabulary, rows within its positions.
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../rlreplay-model/tests/fixtures/tiny_tied/config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    config["max_position_embeddings"] = 12.into();
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let o = rlreplay(&[
        "validate",
        &data.to_string_lossy(),
        "--model",
        &model.to_string_lossy(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("exceed max_position_embeddings = 12") && out.contains("too_long"),
        "{out}"
    );
    config["max_position_embeddings"] = 4096.into();
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let o = rlreplay(&[
        "validate",
        &data.to_string_lossy(),
        "--model",
        &model.to_string_lossy(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = rlreplay(&["replay", "--config", &cfg, "--out", &run_s, "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A run that has logged a step still refuses a fresh start.
    let o = rlreplay(&["replay", "--config", &cfg, "--out", &run_s, "--quiet"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("already holds a run"), "{}", stderr(&o));
}

/// A random model names no end-of-sequence id: the dataset's own ids do, and without them
/// (a dataset written by another tool) the error says to set `[data] eos_token_id`.
#[test]
fn the_datasets_stop_ids_serve_a_model_that_names_none() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 2);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("eos_token_id = 1\n", "");
    std::fs::write(&cfg, &text).unwrap();
    let out = tmp.path().join("run");
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out.to_string_lossy(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let data = tmp.path().join("data");
    for step in [1, 2] {
        let shard = data.join(format!("data/step-{step:04}.parquet"));
        let (b, _) =
            rlreplay_data::read_shard(&shard, step, &rlreplay_data::ReadOptions::new([1])).unwrap();
        rlreplay_data::write_shard(&data, &b).unwrap();
    }
    let out = tmp.path().join("run2");
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out.to_string_lossy(),
        "--quiet",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("[data] eos_token_id"), "{}", stderr(&o));
}

/// A step whose groups the schedule's filters all drop (here every rollout of step 2 failed,
/// under `drop_solve_none`) is skipped and counted; the others train as without it.
#[test]
fn a_step_the_filters_empty_is_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 3);
    let data = tmp.path().join("data");
    let shard = data.join("data/step-0002.parquet");
    let (mut b, _) =
        rlreplay_data::read_shard(&shard, 2, &rlreplay_data::ReadOptions::new([1])).unwrap();
    b.scores.iter_mut().for_each(|s| *s = 0.0);
    rlreplay_data::ShardWriter::new(&data)
        .stop_ids(rlreplay_data::StopIds::new([1], "test"))
        .write(&b)
        .unwrap();
    let out = tmp.path().join("run");
    let o = rlreplay(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &out.to_string_lossy(),
        "--quiet",
        "--set",
        "schedule.drop_solve_none=true",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m = read_metrics(&out, false).unwrap();
    assert_eq!(m.len(), 3);
    assert_eq!(m[1]["train/skipped_steps"], 1.0, "{}", m[1]);
    assert_eq!(m[1]["schedule/rows"], 0.0, "{}", m[1]);
    assert_eq!(m[1]["train/optimizer_steps"], m[0]["train/optimizer_steps"]);
    assert_eq!(m[2]["train/skipped_steps"], 0.0, "{}", m[2]);
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

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A full disk under `rlreplay replay`: the run directory lives on a small tmpfs that fills up
/// before a checkpoint is written. The error names the file, the previous complete checkpoint
/// stays the latest, nothing temporary is left, and once space is freed `--resume` finishes
/// identical to an uninterrupted run. Mounting needs root (or CAP_SYS_ADMIN); where it is not
/// permitted the test says why and skips.
#[test]
fn a_full_disk_during_a_checkpoint_keeps_the_last_one_and_resumes_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 4);
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
    let room = model_bytes / 2;
    assert!(room >= 16 << 10, "the model is too small for this test");
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

/// A build without MPI started as one of several ranks refuses to run: never independent runs
/// writing one directory.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_launched_rank_without_mpi_support_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(tmp.path(), 1);
    let out = tmp.path().join("run");
    let o = Command::new(env!("CARGO_BIN_EXE_rlreplay"))
        .args(["replay", "--config", &cfg, "--out", &out.to_string_lossy()])
        .env("OMPI_COMM_WORLD_RANK", "1")
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .env("OMPI_COMM_WORLD_LOCAL_RANK", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("rank 1 of 2, but this build has no MPI support"),
        "{err}"
    );
    assert!(!out.exists());
}
