//! Long operator chains and deep nesting never overflow the stack: every recursive walk is
//! bounded, an answer past a bound is counted (`Verdict::bounded`) and graded 0 by the reward path.
//!
//! The original reports: about 8,000 `!`, `^` or `\%` in one answer, on either side, aborted the
//! process. Each case runs on a thread with a small stack, so that a bound that is too loose
//! fails here rather than in a training run.

use std::time::Duration;

use rlreplay_reward::{verify, Limits, Mode, RewardDispatch, Verdict};

/// Far below the 2 MiB of a spawned thread (rayon's workers, test threads).
const STACK: usize = 512 * 1024;

fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

fn limits() -> Limits {
    Limits {
        time: Duration::from_secs(20),
        ..Limits::default()
    }
}

fn both_sides(chain: String) -> Vec<(Mode, Verdict, Verdict)> {
    on_small_stack(move || {
        [Mode::Maxrl, Mode::Default, Mode::Intent]
            .into_iter()
            .map(|mode| {
                let as_pred = verify("6", &format!("so \\boxed{{{chain}}}"), mode, &limits());
                let as_gold = verify(&chain, "\\boxed{6}", mode, &limits());
                (mode, as_pred, as_gold)
            })
            .collect()
    })
}

#[test]
fn long_postfix_chains_are_bounded() {
    for op in ["!", "^2", "^{2}", "\\%", "%", "'", "^\\circ"] {
        let chain = format!("3{}", op.repeat(8000));
        for (mode, as_pred, as_gold) in both_sides(chain) {
            for v in [as_pred, as_gold] {
                assert!(!v.correct && !v.timed_out, "{op} {mode:?}: {v:?}");
            }
            // `'` is no operator and `^\circ` is dropped: those chains never nest. A bare gold
            // text in the default mode is read as the plain number in front of the chain.
            if !matches!(op, "'" | "^\\circ") {
                assert!(as_pred.bounded, "{op} {mode:?}");
                assert!(as_gold.bounded || mode == Mode::Default, "{op} {mode:?}");
            }
        }
    }
}

#[test]
fn long_infix_chains_are_bounded() {
    let cases = [
        format!("x{}", "/x".repeat(8000)),
        format!("x{}", "\\div x".repeat(4000)),
        format!("A{}", " \\cup A".repeat(4000)),
        format!("x{}", " \\in x".repeat(4000)),
        format!("{}x", "-".repeat(8000)),
        format!("{}x", "\\sqrt".repeat(4000)),
        format!("{}x", "\\frac{1}".repeat(4000)),
        format!("{}1{}", "(".repeat(8000), ")".repeat(8000)),
        format!("{}1{}", "{".repeat(8000), "}".repeat(8000)),
        format!("{}1{}", "\\{".repeat(4000), "\\}".repeat(4000)),
        format!("{}1{}", "|".repeat(8000), "|".repeat(8000)),
        format!("{}2{}", "2^{".repeat(4000), "}".repeat(4000)),
    ];
    for chain in cases {
        let head: String = chain.chars().take(12).collect();
        for (mode, as_pred, as_gold) in both_sides(chain) {
            for v in [as_pred, as_gold] {
                assert!(!v.correct && !v.timed_out, "{head}… {mode:?}: {v:?}");
            }
        }
    }
}

#[test]
fn flat_chains_stay_gradable() {
    // Sums, products and lists are flat: long ones are no bound.
    let v = on_small_stack(|| {
        verify(
            "1",
            &format!("\\boxed{{{}1}}", "1\\cdot ".repeat(3000)),
            Mode::Maxrl,
            &limits(),
        )
    });
    assert!(v.correct && !v.bounded, "{v:?}");
    let v = on_small_stack(|| {
        verify(
            "3000",
            &format!("\\boxed{{{}1}}", "1+".repeat(2999)),
            Mode::Maxrl,
            &limits(),
        )
    });
    assert!(v.correct && !v.bounded, "{v:?}");
    // A few postfix operators are ordinary answers.
    let v = verify("720", "\\boxed{3!!}", Mode::Maxrl, &limits());
    assert!(v.correct && !v.bounded, "{v:?}");
}

#[test]
fn matrix_products_are_bounded() {
    let m = "\\begin{pmatrix}1 & 1\\\\1 & 0\\end{pmatrix}";
    let product = m.repeat(400);
    let v = on_small_stack(move || {
        verify(
            "\\begin{pmatrix}1 & 0\\\\0 & 1\\end{pmatrix}",
            &format!("\\boxed{{{product}}}"),
            Mode::Maxrl,
            &limits(),
        )
    });
    assert!(!v.correct && !v.timed_out && v.bounded, "{v:?}");
    // F_{k+1} F_k / F_k F_{k-1}: the 5th power of the Fibonacci matrix.
    let v = verify(
        "\\begin{pmatrix}8 & 5\\\\5 & 3\\end{pmatrix}",
        &format!("\\boxed{{{}}}", m.repeat(5)),
        Mode::Maxrl,
        &limits(),
    );
    assert!(v.correct && !v.bounded, "{v:?}");
}

#[test]
fn the_reward_path_grades_bounded_answers_zero_and_says_why() {
    let d = RewardDispatch::default();
    let chain = format!("\\boxed{{3{}}}", "!".repeat(8000));
    let out = on_small_stack(move || d.score("polaris", "6", &chain));
    assert_eq!(out.reward, 0.0);
    assert!(!out.timed_out);
    assert!(out.error.unwrap().contains("bound"));
    let d = RewardDispatch::default();
    let gold = format!("3{}", "^2".repeat(8000));
    let out = on_small_stack(move || d.score("polaris", &gold, "\\boxed{3}"));
    assert_eq!(out.reward, 0.0);
    assert!(out.error.unwrap().contains("bound"));
}
