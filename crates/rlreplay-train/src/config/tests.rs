use super::*;
use rlreplay_data::error::chain;
use serde_json::json;

const BASE: &str = r#"
[model]
path = "m"
[data]
path = "d"
"#;

fn replay(text: &str, sets: &[&str]) -> Result<Config> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Config::parse(text, &sets, SourceKind::Logged)
}

fn online(text: &str, sets: &[&str]) -> Result<Config> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Config::parse(text, &sets, SourceKind::Online)
}

#[test]
fn defaults_fill_in() {
    let c = replay(BASE, &[]).unwrap();
    assert_eq!(c.optim.lr, 1e-6);
    assert_eq!(c.schedule.mode, ScheduleMode::Exact);
    assert_eq!(c.rollout.temperature, 1.0);
    assert_eq!(
        c.data.eos_token_id, None,
        "the model's own end-of-response ids"
    );
    assert_eq!(c.trainer.total_training_steps, None, "the whole schedule");
    let o = online("", &[]).unwrap();
    assert_eq!(o.data.task, Some(Task::Toy));
    assert_eq!(o.trainer.total_training_steps, Some(DEFAULT_ONLINE_STEPS));
}

#[test]
fn loggers_are_named_and_may_change_on_resume() {
    let c = replay(BASE, &[]).unwrap();
    assert_eq!(c.trainer.loggers, [Logger::Console, Logger::Jsonl]);
    let o = online(
        "",
        &["trainer.loggers=[\"console\", \"jsonl\", \"tensorboard\"]"],
    )
    .unwrap();
    assert_eq!(
        o.trainer.loggers,
        [Logger::Console, Logger::Jsonl, Logger::Tensorboard]
    );
    let e = replay(BASE, &["trainer.loggers=[\"wandb\"]"]).unwrap_err();
    assert!(chain(&e).contains("wandb"), "{e:?}");
    let mut t = c.clone();
    t.trainer.loggers = vec![Logger::Tensorboard];
    assert_eq!(t.comparable(), c.comparable());
    // Servers restarted on other ports may be named on resume; the protocol may not change.
    let o = online("", &["rollout.endpoints=[\"http://127.0.0.1:1\"]"]).unwrap();
    let mut t = o.clone();
    t.rollout.endpoints = vec!["http://10.0.0.2:8000".into()];
    t.rollout.retries = 7;
    assert_eq!(t.comparable(), o.comparable());
    t.rollout.protocol = RolloutProtocol::Sglang;
    assert_ne!(t.comparable(), o.comparable());
}

#[test]
fn unknown_key_is_an_error_naming_it() {
    let e = replay(&format!("{BASE}\n[optim]\nlrr = 1.0\n"), &[]).unwrap_err();
    assert!(chain(&e).contains("lrr"), "{e:?}");
    let e = replay(&format!("{BASE}\n[nosuch]\nx = 1\n"), &[]).unwrap_err();
    assert!(chain(&e).contains("nosuch"), "{e:?}");
    let e = online("[rollout]\nbogus = 1\n", &[]).unwrap_err();
    assert!(chain(&e).contains("bogus"), "{e:?}");
}

#[test]
fn overrides_are_typed() {
    let c = replay(
        BASE,
        &[
            "optim.lr=3e-4",
            "schedule.mode=shuffle",
            "optim.betas=[0.9, 0.95]",
            "algorithm.adv_estimator=maxrl",
            "batch.ppo_mini_batch_size=8",
            "data.eos_token_id=[1, 2]",
        ],
    )
    .unwrap();
    assert_eq!(c.optim.lr, 3e-4);
    assert_eq!(c.optim.betas, [0.9, 0.95]);
    assert_eq!(c.schedule.mode, ScheduleMode::Shuffle);
    assert_eq!(c.batch.ppo_mini_batch_size, Some(8));
    assert_eq!(c.algorithm.adv_estimator.name(), "maxrl");
    assert_eq!(c.data.eos_token_id, Some(TokenIds::Many(vec![1, 2])));
    let e = replay(BASE, &["optim.lr=fast"]).unwrap_err();
    assert!(chain(&e).contains("lr"), "{e:?}");
    let e = replay(BASE, &["lr=1"]).unwrap_err();
    assert!(chain(&e).contains("section.key"), "{e:?}");
    let e = replay(BASE, &["algorithm.adv_estimator=nope"]).unwrap_err();
    assert!(chain(&e).contains("adv_estimator"), "{e:?}");
}

/// A type error is reported where the value came from: an override names itself, not a
/// line of the edited document; an error in the file quotes the user's own line.
#[test]
fn type_errors_name_their_origin() {
    let e = chain(&replay(BASE, &["optim.lr=1e-5", "batch.ppo_epochs=\"two\""]).unwrap_err());
    assert!(
        e.contains("--set \"batch.ppo_epochs=\\\"two\\\"\"") && e.contains("ppo_epochs"),
        "{e}"
    );
    assert!(!e.contains("line"), "{e}");
    // Line 7 of the user's file, whatever the overrides add to the document.
    let text = format!("{BASE}[optim]\nlr = \"fast\"\n");
    let e = chain(&replay(&text, &["trainer.seed=3"]).unwrap_err());
    assert!(e.contains("line 7") && e.contains("lr = \"fast\""), "{e}");
    // With a moved key the file's lines shift: the error names the key instead.
    let text = format!("{BASE}[run]\nseed = 1\n[optim]\nlr = \"fast\"\n");
    let e = chain(&replay(&text, &[]).unwrap_err());
    assert!(e.contains("optim.lr") && e.contains("string"), "{e}");
}

#[test]
fn resolved_config_round_trips() {
    let c = replay(
        BASE,
        &[
            "schedule.mode=mix",
            "schedule.mix=[{steps=\"1..2\", weight=1.0}]",
        ],
    )
    .unwrap();
    let text = c.to_toml().unwrap();
    assert_eq!(replay(&text, &[]).unwrap(), c);
    assert!(!text.contains("train_batch_size"), "{text}");
    let o = online("", &["rollout.n=4", "trainer.dir=/tmp/x"]).unwrap();
    let text = o.to_toml().unwrap();
    assert_eq!(online(&text, &[]).unwrap(), o);
    assert!(!text.contains("[schedule]"), "{text}");
}

/// Guards the one schema: a key of one kind of source is refused by the other front, naming
/// the front that reads it.
#[test]
fn keys_of_the_other_source_are_refused() {
    let e = replay(BASE, &["rollout.n=4"]).unwrap_err();
    assert!(
        chain(&e).contains("`rollout.n` belongs to `rlreplay train`"),
        "{e:?}"
    );
    let e = online("[schedule]\nmode = \"lag\"\n", &[]).unwrap_err();
    assert!(
        chain(&e).contains("`schedule` belongs to `rlreplay replay`"),
        "{e:?}"
    );
    let e = online("", &["data.path=/d"]).unwrap_err();
    assert!(chain(&e).contains("data.path"), "{e:?}");
}

/// Guards the one schema: keys that moved (`temperature` to `[rollout]`, the one success
/// threshold to `[algorithm]`, replay's `[checkpoint]` and `[run]` and online's toy-model
/// keys) keep working with a warning naming the new key.
#[test]
fn moved_keys_warn_and_keep_working() {
    let text = format!(
        "{BASE}\n[algorithm]\ntemperature = 0.7\n\
         [self_distillation]\nsuccess_reward_threshold = 0.8\n\
         [checkpoint]\nsave_freq = 3\nkeep = 4\n[run]\nseed = 5\nthreads = 1\n"
    );
    let (c, warnings) = Config::parse_reporting(&text, &[], SourceKind::Logged).unwrap();
    assert_eq!(c.rollout.temperature, 0.7);
    assert_eq!(c.algorithm.success_reward_threshold, 0.8);
    assert_eq!(c.self_distillation.context.success_reward_threshold, 0.8);
    assert_eq!(
        (c.trainer.save_freq, c.trainer.keep, c.trainer.seed),
        (3, 4, 5)
    );
    assert_eq!(c.trainer.threads, 1);
    assert_eq!(warnings.len(), 6, "{warnings:?}");
    assert!(
        warnings[0].contains("algorithm.temperature")
            && warnings[0].contains("use rollout.temperature"),
        "{warnings:?}"
    );
    assert!(warnings[1].contains("use algorithm.success_reward_threshold"));
    assert!(warnings[2].contains("use trainer.save_freq"));
    // The resolved form names only the new keys and reads back without warnings.
    let (back, w) =
        Config::parse_reporting(&c.to_toml().unwrap(), &[], SourceKind::Logged).unwrap();
    assert_eq!(back, c);
    assert!(w.is_empty(), "{w:?}");
    let e = replay(
        &format!("{BASE}\n[algorithm]\ntemperature = 0.7\n[rollout]\ntemperature = 0.9\n"),
        &[],
    )
    .unwrap_err();
    assert!(chain(&e).contains("keep only rollout.temperature"), "{e:?}");
    // An override of a moved key sets the new key over the file's value.
    let (c, w) = Config::parse_reporting(
        &format!("{BASE}\n[trainer]\nsave_freq = 3\n"),
        &["checkpoint.save_freq=5".into(), "run.seed=2".into()],
        SourceKind::Logged,
    )
    .unwrap();
    assert_eq!((c.trainer.save_freq, c.trainer.seed), (5, 2));
    assert!(w[0].contains("use trainer.save_freq"), "{w:?}");
    let (o, w) = Config::parse_reporting(
        "[model]\ninit_seed = 7\nwarmup_steps = 3\n[model.toy]\nhidden_size = 16\n",
        &[],
        SourceKind::Online,
    )
    .unwrap();
    let random = o.model.random.unwrap();
    assert_eq!(
        (&random.config["hidden_size"], random.seed),
        (&json!(16), 7)
    );
    assert_eq!(o.toy.warmup_steps, 3);
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(w[0].contains("use model.random"), "{w:?}");
}

/// Guards that a template typo is refused at load, not found later as self-distillation
/// silently off for every row.
#[test]
fn template_typos_are_refused_at_load() {
    type Parse = fn(&str, &[&str]) -> Result<Config>;
    let fronts: [(Parse, &str); 2] = [(replay, BASE), (online, "")];
    for (parse, base) in fronts {
        let e = parse(
            &format!(
                "{base}\n[self_distillation]\nreprompt_template = \"{{promt}}{{solution}}\"\n"
            ),
            &[],
        )
        .unwrap_err();
        let e = chain(&e);
        assert!(
            e.contains("reprompt_template") && e.contains("{promt}"),
            "{e}"
        );
    }
}

#[test]
fn bad_values_are_refused() {
    let e = replay(BASE, &["data.steps=\"5..4\""]).unwrap_err();
    assert!(chain(&e).contains("[data] steps"), "{e:?}");
    let e = online("", &["rollout.n=0"]).unwrap_err();
    assert!(e.to_string().contains("[rollout]"), "{e}");
    for f in ["0", "1.5", "nan"] {
        let e = replay(BASE, &[&format!("schedule.group_fraction={f}")]).unwrap_err();
        assert!(e.to_string().contains("group_fraction"), "{e}");
    }
    let e = replay(BASE, &["algorithm.use_kl_loss=true"]).unwrap_err();
    assert!(e.to_string().contains("no reference policy"), "{e}");
    let e = online("", &["algorithm.use_kl_loss=true"]).unwrap_err();
    assert!(e.to_string().contains("no reference policy"), "{e}");
    let e = online("", &["data.task=\"files\""]).unwrap_err();
    assert!(e.to_string().contains("train_files"), "{e}");
    let e = online("", &["model.random.vocab_size=7"]).unwrap_err();
    assert!(e.to_string().contains("toy tokenizer"), "{e}");
    for (set, want) in [
        ("model.random.hiden_size=8", "unknown key `hiden_size`"),
        (
            "model.random.num_key_value_heads=3",
            "not a multiple of num_key_value_heads",
        ),
        ("model.random.hidden_size=\"wide\"", "hidden_size"),
    ] {
        let e = online("", &[set]).unwrap_err();
        assert!(e.to_string().contains("[model.random]"), "{set}: {e}");
        assert!(chain(&e).contains(want), "{set}: {e}");
    }
    let gpu = online("", &["model.device=\"gpu\""]).unwrap();
    assert!(gpu
        .model
        .device()
        .unwrap_err()
        .to_string()
        .contains("cuda:N"));
}

#[test]
fn presets_parse() {
    let bio = online(
        include_str!("../../../../configs/rlsd-tr-biology.toml"),
        &[],
    )
    .unwrap();
    assert!(bio.uses_teacher());
    assert_eq!(bio.batch.train_batch_size, 32);
    assert_eq!(bio.batch.ppo_mini_batch_size, Some(8));
    assert_eq!(bio.rollout.n, 8);
    assert_eq!(bio.validation.val_n, 16);
    assert!(!bio.algorithm.norm_adv_by_std_in_grpo);
    assert_eq!(bio.self_distillation.teacher_update_rate, 0.1);
    assert_eq!(bio.algorithm.clip_high(), 0.28);
    let (toy, w) = Config::parse_reporting(
        include_str!("../../../../configs/toy-arith.toml"),
        &[],
        SourceKind::Online,
    )
    .unwrap();
    assert_eq!(toy.data.task(), Task::Toy);
    assert!(w.is_empty(), "{w:?}");
    for preset in [
        include_str!("../../../../configs/maxrl-polaris.toml"),
        include_str!("../../../../configs/demo.toml"),
    ] {
        let (_, w) = Config::parse_reporting(preset, &[], SourceKind::Logged).unwrap();
        assert!(w.is_empty(), "{w:?}");
    }
}
