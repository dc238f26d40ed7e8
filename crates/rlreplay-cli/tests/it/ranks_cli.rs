//! `mpirun -np 2 rlreplay replay` against one process: the same weights and metrics bit for bit
//! (the micro-batches' gradients are summed in f64, so grouping them by rank does not change the
//! rounded sum), uneven splits, and resuming across rank counts. Needs the `mpi` feature and Open MPI's `mpirun`.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rlreplay_train::rundir::{complete_checkpoints, read_metrics};

use crate::common::{ranks, rlreplay as single, tiny_dataset, TINY_RANDOM_MODEL};

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A synthetic dataset of `steps` steps and the replay configuration over it; `extra` is
/// appended to the configuration.
fn setup(dir: &Path, steps: usize, group: usize, extra: &str) -> PathBuf {
    let data = tiny_dataset(&dir.join("data"), steps, 8, group, 5);
    let cfg = dir.join("replay.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
{TINY_RANDOM_MODEL}
[data]
path = "{}"
eos_token_id = 1

[optim]
lr = 1e-3

[trainer]
threads = 1
save_freq = 1
keep = 5
loggers = ["jsonl"]
{extra}"#,
            data.display()
        ),
    )
    .unwrap();
    cfg
}

/// Replays `cfg` into `dir/one` on one process and into `dir/two` on two ranks.
fn one_and_two(dir: &Path, cfg: &Path) -> (PathBuf, PathBuf) {
    one_and_two_for(dir, cfg, 3)
}

/// [`one_and_two`] of a run of `steps` steps.
fn one_and_two_for(dir: &Path, cfg: &Path, steps: usize) -> (PathBuf, PathBuf) {
    let cfg = cfg.to_string_lossy();
    let (one, two) = (dir.join("one"), dir.join("two"));
    for (out, n) in [(&one, 1), (&two, 2)] {
        let args = [
            "replay",
            "--config",
            &cfg,
            "--out",
            &out.to_string_lossy(),
            "--quiet",
        ];
        let o = if n == 1 {
            single(&args)
        } else {
            ranks(n, &args)
        };
        ok(&o);
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&format!("trained {steps}/{steps} steps"))
        );
    }
    let log = std::fs::read_to_string(two.join("run.log")).unwrap();
    assert!(
        log.contains(&format!("started at step 0 of {steps} on 2 ranks (mpi)")),
        "{log}"
    );
    (one, two)
}

/// The same metrics, and the same weights and optimizer state in every checkpoint of `one`.
fn same_bits(one: &Path, two: &Path) {
    assert_eq!(
        read_metrics(one, false).unwrap(),
        read_metrics(two, false).unwrap()
    );
    let steps = complete_checkpoints(&one.join("checkpoints")).unwrap();
    assert!(!steps.is_empty());
    for step in steps {
        // The full weights, or the adapters of a LoRA run.
        let f = |r: &Path| {
            let dir = r.join(format!("checkpoints/global_step_{step}"));
            let full = dir.join("model.safetensors");
            std::fs::read(if full.is_file() {
                full
            } else {
                dir.join("adapter_model.safetensors")
            })
            .unwrap()
        };
        assert_eq!(f(one), f(two), "weights after step {step}");
        let f = |r: &Path| {
            std::fs::read(r.join(format!(
                "checkpoints/global_step_{step}/optimizer.safetensors"
            )))
            .unwrap()
        };
        assert_eq!(f(one), f(two), "optimizer state after step {step}");
    }
}

/// Only rank 0 writes: the run directory holds what one process writes, no more.
fn same_files(one: &Path, two: &Path) {
    let list = |r: &Path| {
        let mut v: Vec<String> = walk(r)
            .into_iter()
            .map(|p| p.strip_prefix(r).unwrap().to_string_lossy().into_owned())
            .filter(|p| !p.starts_with("tensorboard"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(list(one), list(two));
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn maxrl_reinforce_on_two_ranks_is_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    // Mini-batches of 8 rows (two groups); a micro-batch holds at least 4 rows of at most 37
    // fed tokens, so each mini-batch has at most two and rank 1 at most one.
    let cfg = setup(
        tmp.path(),
        3,
        4,
        "[algorithm]\nadv_estimator = \"maxrl\"\nloss_mode = \"reinforce\"\n\
         [batch]\nppo_mini_batch_size = 2\nmax_tokens_per_micro_batch = 160\n",
    );
    let (one, two) = one_and_two(tmp.path(), &cfg);
    same_bits(&one, &two);
    same_files(&one, &two);
}

#[test]
fn ppo_with_token_is_on_two_ranks_is_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(
        tmp.path(),
        3,
        4,
        "[algorithm]\nadv_estimator = \"grpo\"\nloss_mode = \"ppo\"\nrollout_is = \"token\"\n\
         rollout_is_threshold = 2.0\n\
         [batch]\nppo_mini_batch_size = 2\nppo_epochs = 2\nmax_tokens_per_micro_batch = 160\n",
    );
    let (one, two) = one_and_two(tmp.path(), &cfg);
    same_bits(&one, &two);
}

#[test]
fn fewer_rows_than_ranks_is_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    // Mini-batches of one row: rank 1 never has a row and adds zeros.
    let cfg = setup(
        tmp.path(),
        3,
        1,
        "[algorithm]\nadv_estimator = \"reinforce_plus_plus\"\nloss_mode = \"ppo\"\n\
         rollout_is = \"token\"\nrollout_is_threshold = 2.0\n\
         [batch]\nppo_mini_batch_size = 1\n",
    );
    let (one, two) = one_and_two(tmp.path(), &cfg);
    same_bits(&one, &two);
}

#[test]
fn many_micro_batches_per_rank_are_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    // One row per micro-batch: each rank adds four gradients and the ranks' sums are then added,
    // where one process adds all eight; the sums are f64, rounded once.
    let cfg = setup(
        tmp.path(),
        3,
        4,
        "[algorithm]\nadv_estimator = \"maxrl\"\nloss_mode = \"reinforce\"\n\
         [batch]\nppo_mini_batch_size = 2\nmax_tokens_per_micro_batch = 40\n",
    );
    let (one, two) = one_and_two(tmp.path(), &cfg);
    same_bits(&one, &two);
}

/// PPO with token-level IS over 128 rows of about 190 response tokens in 1,024-token
/// micro-batches (about a dozen per rank) for 4 steps: two ranks give one process's weights,
/// optimizer state and metrics bit for bit. With f32 sums of the micro-batches' gradients they
/// differed by 7.5e-5 of the update.
#[test]
fn ppo_over_a_dozen_micro_batches_per_rank_is_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let synth = rlreplay_data::synth::SynthConfig {
        steps: 4,
        prompts: 8,
        group: 16,
        vocab: 64,
        mean_len: 190.0,
        max_len: 256,
        prompt_len: 6,
        eos: 1,
        seed: 7,
        ..rlreplay_data::synth::SynthConfig::default()
    };
    rlreplay_data::synth::write_dataset(&data, &synth, |_| {}).unwrap();
    let cfg = tmp.path().join("replay.toml");
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
rollout_is = "token"
rollout_is_threshold = 2.0

[batch]
max_tokens_per_micro_batch = 1024

[optim]
lr = 1e-3

[trainer]
threads = 1
save_freq = 2
keep = 5
loggers = ["jsonl"]
"#,
            data.display()
        ),
    )
    .unwrap();
    let (one, two) = one_and_two_for(tmp.path(), &cfg, 4);
    same_bits(&one, &two);
}

/// The configuration of the bit-identical MaxRL test, over `steps` logged steps.
fn exact(dir: &Path, steps: usize) -> PathBuf {
    setup(
        dir,
        steps,
        4,
        "[algorithm]\nadv_estimator = \"maxrl\"\nloss_mode = \"reinforce\"\n\
         [batch]\nppo_mini_batch_size = 2\nmax_tokens_per_micro_batch = 160\n",
    )
}

#[test]
fn a_checkpoint_resumes_on_another_number_of_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = exact(tmp.path(), 3);
    let cfg = cfg.to_string_lossy();
    let full = tmp.path().join("full");
    ok(&single(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &full.to_string_lossy(),
        "--quiet",
    ]));
    // One process, then two ranks; two ranks, then one process.
    for (first, then) in [(1, 2), (2, 1)] {
        let out = tmp.path().join(format!("from{first}"));
        let out_s = out.to_string_lossy();
        let start = [
            "replay",
            "--config",
            &cfg,
            "--out",
            &out_s,
            "--quiet",
            "--stop-after",
            "1",
        ];
        let more = ["replay", "--out", &out_s, "--resume", "--quiet"];
        for (n, args) in [(first, &start[..]), (then, &more[..])] {
            ok(&if n == 1 { single(args) } else { ranks(n, args) });
        }
        same_bits(&full, &out);
    }
}

/// The process of rank `rank` among the children of `parent` (Open MPI's `mpirun` starts the
/// ranks of a one-node job itself).
fn rank_pid(parent: u32, rank: usize) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for e in std::fs::read_dir("/proc").ok()? {
        let Ok(pid) = e.ok()?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn kill_9_of_one_rank_ends_the_job_and_resume_continues() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let cfg = exact(tmp.path(), 12);
    let cfg = cfg.to_string_lossy();
    let full = tmp.path().join("full");
    ok(&single(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &full.to_string_lossy(),
        "--quiet",
    ]));
    let part = tmp.path().join("part");
    let part_s = part.to_string_lossy();
    let bin = env!("CARGO_BIN_EXE_rlreplay");
    let job = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2", bin])
        .args(["replay", "--config", &cfg, "--out", &part_s, "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let latest = part.join("checkpoints/latest_checkpointed_iteration.txt");
    let t0 = Instant::now();
    while !latest.exists() && t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let victim = rank_pid(job.id(), 1).expect("rank 1's process");
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    let o = job.wait_with_output().unwrap();
    let took = killed.elapsed();
    eprintln!("the job ended {took:?} after the kill");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.success() {
        // The run finished before the signal arrived: nothing to resume.
        assert!(text.contains("trained 12/12 steps"), "{text}");
    } else {
        assert!(
            took < Duration::from_secs(60),
            "the job took {took:?} to end"
        );
        assert!(
            text.contains("rank 1") && text.contains("signal 9"),
            "{text}"
        );
        let o = ranks(2, &["replay", "--out", &part_s, "--resume", "--quiet"]);
        ok(&o);
    }
    same_bits(&full, &part);
}

#[test]
fn zero_1_gives_the_weights_of_one_process_and_resumes_unsharded() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = exact(tmp.path(), 3);
    let cfg = cfg.to_string_lossy();
    let full = tmp.path().join("full");
    ok(&single(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &full.to_string_lossy(),
        "--quiet",
    ]));
    let zero = tmp.path().join("zero");
    let zero_s = zero.to_string_lossy();
    let shard = "optim.shard_optimizer_state=true";
    // Two ranks with sharded moments (each checkpoint gathers the whole state), resumed on two
    // ranks with sharding, then on one process without it.
    let start = [
        "replay", "--config", &cfg, "--out", &zero_s, "--quiet", "--set", shard,
    ];
    ok(&ranks(2, &[&start[..], &["--stop-after", "1"]].concat()));
    let more = [
        "replay", "--out", &zero_s, "--resume", "--quiet", "--set", shard,
    ];
    ok(&ranks(2, &[&more[..], &["--stop-after", "2"]].concat()));
    let last = "optim.shard_optimizer_state=false";
    ok(&single(&[
        "replay", "--out", &zero_s, "--resume", "--quiet", "--set", last,
    ]));
    same_bits(&full, &zero);
}

#[test]
fn lora_with_zero_1_on_two_ranks_is_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(
        tmp.path(),
        3,
        4,
        "[model]\nlora_rank = 4\ntarget_modules = [\"q_proj\", \"up_proj\"]\n",
    );
    let cfg = cfg.to_string_lossy();
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    let args = |out: &Path| {
        [
            "replay".to_string(),
            "--config".into(),
            cfg.to_string(),
            "--out".into(),
            out.to_string_lossy().into_owned(),
            "--quiet".into(),
            "--set".into(),
            "optim.shard_optimizer_state=true".into(),
        ]
    };
    let (a1, a2) = (args(&one), args(&two));
    let v1: Vec<&str> = a1.iter().map(String::as_str).collect();
    let v2: Vec<&str> = a2.iter().map(String::as_str).collect();
    ok(&single(&v1));
    ok(&ranks(2, &v2));
    same_bits(&one, &two);
    assert!(two
        .join("checkpoints/global_step_3/adapter_config.json")
        .is_file());
}

/// The toy preset of `rlreplay train`.
fn toy_preset() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs/toy-arith.toml")
        .display()
        .to_string()
}

/// A short online run of the toy preset: `steps` steps of 3 prompt groups (2 on rank 0, 1 on
/// rank 1 of two), validation of 5 prompts (3 and 2) before training and every 2 steps, a
/// checkpoint every 2 steps.
fn toy_args(steps: u64) -> Vec<String> {
    let sets = [
        format!("trainer.total_training_steps={steps}"),
        "trainer.save_freq=2".into(),
        "trainer.keep=5".into(),
        "trainer.threads=1".into(),
        "trainer.loggers=[\"jsonl\"]".into(),
        "validation.test_freq=2".into(),
        "toy.warmup_steps=2".into(),
        "toy.val_prompts=5".into(),
        "batch.train_batch_size=3".into(),
    ];
    sets.into_iter()
        .flat_map(|s| ["--set".to_string(), s])
        .collect()
}

/// `rlreplay train` on `n` ranks (1: one process) into `out`; `more` after the toy settings.
fn train_on(n: usize, out: &Path, fresh: bool, steps: u64, more: &[&str]) -> Output {
    let config = toy_preset();
    let out = out.to_string_lossy();
    let mut args = vec!["train", "--out", &out];
    if fresh {
        args.extend(["--config", &config]);
    } else {
        args.push("--resume");
    }
    let toy = toy_args(steps);
    args.extend(toy.iter().map(String::as_str));
    args.extend(more);
    if n == 1 {
        single(&args)
    } else {
        ranks(n, &args)
    }
}

/// `steps` online steps with `more` into `dir/one` on one process and `dir/two` on two ranks,
/// checked with [`same_online_run`]; returns `dir/two`.
fn same_on_one_and_two(dir: &Path, steps: u64, more: &[&str]) -> PathBuf {
    let (one, two) = (dir.join("one"), dir.join("two"));
    ok(&train_on(1, &one, true, steps, more));
    ok(&train_on(2, &two, true, steps, more));
    same_online_run(&one, &two);
    two
}

/// `--set KEY=VALUE` for each of `sets`.
fn set_args<'a>(sets: &[&'a str]) -> Vec<&'a str> {
    sets.iter().flat_map(|s| ["--set", s]).collect()
}

/// [`same_bits`] and the same rollout shards and validation results.
fn same_online_run(one: &Path, two: &Path) {
    same_bits(one, two);
    for f in ["results/validation_mean8.csv", "best_step.txt"] {
        let read = |r: &Path| std::fs::read_to_string(r.join(f)).unwrap();
        assert_eq!(read(one), read(two), "{f}");
    }
    let shards = |r: &Path| {
        let mut v: Vec<PathBuf> = walk(&r.join("rollouts/data"));
        v.sort();
        v.iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(shards(one), shards(two), "rollout shards");
}

#[test]
fn online_toy_on_two_ranks_is_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    ok(&train_on(1, &one, true, 4, &[]));
    let o = train_on(2, &two, true, 4, &[]);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained 4 steps"));
    let log = std::fs::read_to_string(two.join("run.log")).unwrap();
    assert!(
        log.contains("started at step 0 of 4, 5 validation prompts on 2 ranks (mpi)"),
        "{log}"
    );
    same_online_run(&one, &two);
    same_files(&one, &two);
    let metrics = read_metrics(&two, false).unwrap();
    assert_eq!(metrics.len(), 4);
    assert!(metrics
        .iter()
        .all(|m| m["response_length/mean"].as_f64() > Some(0.0)));
}

#[test]
fn online_rlsd_and_more_ranks_than_groups_are_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    // Self-distillation: the teacher contexts need every row's text on every rank. One prompt
    // group per step on two ranks: rank 1 generates nothing.
    let sets = set_args(&[
        "algorithm.loss_mode=\"rlsd\"",
        "self_distillation.context=\"sibling\"",
        "batch.train_batch_size=1",
    ]);
    same_on_one_and_two(tmp.path(), 2, &sets);
}

#[test]
fn online_rlsd_teacher_passes_shared_out_are_one_process_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    // The reference answer as every row's teacher context: a teacher prompt of about 85 toy
    // tokens against the student's 24. In packs of at most 300 tokens a mini-batch (2 groups,
    // 16 rows of at most 31 fed tokens) makes 2 student packs (rank 1 runs one: the gradient
    // sums group as on one process) and about 6 of teacher contexts, several on each rank,
    // whose log-probs are gathered in row order.
    let sets = set_args(&[
        "algorithm.loss_mode=\"rlsd\"",
        "self_distillation.context=\"reference\"",
        "batch.train_batch_size=2",
        "batch.ppo_mini_batch_size=2",
        "batch.max_tokens_per_micro_batch=300",
    ]);
    let two = same_on_one_and_two(tmp.path(), 2, &sets);
    let metrics = read_metrics(&two, false).unwrap();
    assert!(metrics
        .iter()
        .all(|m| m["self_distillation/reprompt_sample_fraction"].as_f64() == Some(1.0)));
}

#[test]
fn online_run_resumes_from_one_process_on_two_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let (full, part) = (tmp.path().join("full"), tmp.path().join("part"));
    ok(&train_on(1, &full, true, 4, &[]));
    ok(&train_on(1, &part, true, 4, &["--stop-after", "2"]));
    ok(&train_on(2, &part, false, 4, &[]));
    same_online_run(&full, &part);
}

#[test]
fn online_kill_9_of_one_rank_ends_the_job_and_resume_continues() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let (full, part) = (tmp.path().join("full"), tmp.path().join("part"));
    let steps = 8;
    ok(&train_on(1, &full, true, steps, &[]));
    let config = toy_preset();
    let job = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_rlreplay"))
        .args([
            "train",
            "--config",
            &config,
            "--out",
            &part.to_string_lossy(),
        ])
        .args(toy_args(steps))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-run: after the first checkpoint, while the ranks generate the next steps.
    let latest = part.join("checkpoints/latest_checkpointed_iteration.txt");
    let t0 = Instant::now();
    while !latest.exists() && t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let victim = rank_pid(job.id(), 1).expect("rank 1's process");
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    let o = job.wait_with_output().unwrap();
    let took = killed.elapsed();
    eprintln!("the job ended {took:?} after the kill");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.success() {
        assert!(text.contains(&format!("trained {steps} steps")), "{text}");
    } else {
        assert!(
            took < Duration::from_secs(60),
            "the job took {took:?} to end"
        );
        assert!(
            text.contains("rank 1") && text.contains("signal 9"),
            "{text}"
        );
        ok(&train_on(2, &part, false, steps, &[]));
    }
    same_online_run(&full, &part);
}

#[test]
fn online_remote_on_two_ranks_is_the_local_run() {
    let tmp = tempfile::tempdir().unwrap();
    let local = tmp.path().join("local");
    ok(&train_on(1, &local, true, 4, &[]));
    // A server started from any model of the architecture: rank 0 sends it the initial weights
    // before step 1 and every update after.
    let mut cfg = rlreplay_serve::ServeConfig::new(local.join("checkpoints/global_step_4"));
    cfg.port = 0;
    let server = rlreplay_serve::BoundServer::bind(cfg)
        .unwrap()
        .spawn()
        .unwrap();
    let endpoints = format!("rollout.endpoints=[{:?}]", server.url());
    let remote = tmp.path().join("remote");
    let sets = set_args(&[
        "rollout.backend=\"remote\"",
        &endpoints,
        "rollout.request_timeout_s=60",
    ]);
    ok(&train_on(2, &remote, true, 4, &sets));
    same_online_run(&local, &remote);
    assert!(remote.join("weights/step_4/STABLE").is_file());
    server.shutdown();
}

#[test]
fn zero_1_in_bf16_shards_the_master_weights_and_gives_the_weights_of_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = setup(
        tmp.path(),
        3,
        4,
        "[algorithm]\nadv_estimator = \"maxrl\"\nloss_mode = \"reinforce\"\n\
         [batch]\nppo_mini_batch_size = 2\nmax_tokens_per_micro_batch = 160\n\
         [model]\ndtype = \"bf16\"\n",
    );
    // bf16 compute with f32 masters: two ranks without sharding are one process, bit for bit.
    let (one, two) = one_and_two(tmp.path(), &cfg);
    same_bits(&one, &two);
    let cfg = cfg.to_string_lossy();
    let shard = "optim.shard_optimizer_state=true";
    // Sharded masters and moments on two ranks, resumed on two ranks, then on one process
    // without sharding; and a one-process checkpoint resumed on two sharded ranks.
    let zero = tmp.path().join("zero");
    let zero_s = zero.to_string_lossy();
    let start = [
        "replay", "--config", &cfg, "--out", &zero_s, "--quiet", "--set", shard,
    ];
    ok(&ranks(2, &[&start[..], &["--stop-after", "1"]].concat()));
    let more = [
        "replay", "--out", &zero_s, "--resume", "--quiet", "--set", shard,
    ];
    ok(&ranks(2, &[&more[..], &["--stop-after", "2"]].concat()));
    let unsharded = "optim.shard_optimizer_state=false";
    ok(&single(&[
        "replay", "--out", &zero_s, "--resume", "--quiet", "--set", unsharded,
    ]));
    same_bits(&one, &zero);
    let from1 = tmp.path().join("from1");
    let from1_s = from1.to_string_lossy();
    ok(&single(&[
        "replay",
        "--config",
        &cfg,
        "--out",
        &from1_s,
        "--quiet",
        "--stop-after",
        "1",
    ]));
    ok(&ranks(
        2,
        &[
            "replay", "--out", &from1_s, "--resume", "--quiet", "--set", shard,
        ],
    ));
    same_bits(&one, &from1);

    // Each rank holds about half of the f32 masters (whole tensors) and bf16 replicas of the
    // rest; one process holds them all.
    let log = std::fs::read_to_string(zero.join("run.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("sharded master weights"))
        .unwrap_or_else(|| panic!("no line on the sharded masters in {log}"));
    let share = |r: usize| -> f64 {
        let key = format!("rank {r} holds ");
        let at = line.find(&key).expect(line) + key.len();
        line[at..].split(' ').next().unwrap().parse().unwrap()
    };
    let (a, b) = (share(0), share(1));
    eprintln!("{line}");
    assert!((a + b - 100.0).abs() < 0.2, "{line}");
    assert!(a.max(b) < 60.0, "{line}");
    assert!(line.contains("bf16 replicas of the rest"), "{line}");
    let log = std::fs::read_to_string(two.join("run.log")).unwrap();
    assert!(!log.contains("sharded master weights"), "{log}");
}

/// An online run on two ranks replayed with `replay --from-run` on two ranks and on one process:
/// the online run's weights and optimizer state at every checkpoint, bit for bit.
#[test]
fn replay_from_run_on_one_and_two_ranks_is_the_online_run() {
    let tmp = tempfile::tempdir().unwrap();
    let online = tmp.path().join("online");
    ok(&train_on(2, &online, true, 4, &[]));
    let from = online.to_string_lossy().into_owned();
    for n in [1, 2] {
        let out = tmp.path().join(format!("replay{n}"));
        let out_s = out.to_string_lossy().into_owned();
        let args = ["replay", "--from-run", &from, "--out", &out_s, "--quiet"];
        ok(&if n == 1 {
            single(&args)
        } else {
            ranks(n, &args)
        });
        let steps = complete_checkpoints(&online.join("checkpoints")).unwrap();
        assert_eq!(
            steps,
            complete_checkpoints(&out.join("checkpoints")).unwrap()
        );
        for step in steps {
            for file in ["model.safetensors", "optimizer.safetensors"] {
                let read = |r: &Path| {
                    std::fs::read(r.join(format!("checkpoints/global_step_{step}/{file}"))).unwrap()
                };
                assert!(
                    read(&online) == read(&out),
                    "{n} rank(s), step {step}: {file}"
                );
            }
        }
    }
}
