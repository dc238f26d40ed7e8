//! The verifier never panics and stays within its time limit on arbitrary LaTeX-like input.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use rlreplay_reward::{verify, Limits, Mode};

const PIECES: &[&str] = &[
    "\\boxed{",
    "}",
    "{",
    "$",
    "$$",
    "\\[",
    "\\]",
    "\\(",
    "\\)",
    "\\frac",
    "\\dfrac",
    "\\sqrt",
    "[",
    "]",
    "(",
    ")",
    "^",
    "_",
    "\\left(",
    "\\right)",
    "\\text{",
    "\\%",
    "%",
    ",",
    ";",
    "=",
    "<",
    "\\le",
    "\\pm",
    "\\cup",
    "\\in",
    "!",
    "\\infty",
    "\\pi",
    "e",
    "x",
    "y",
    "1",
    "2",
    "0",
    "9",
    ".",
    "-",
    "+",
    "*",
    "/",
    ":",
    "\\cdot",
    "\\times",
    " ",
    "\n",
    "answer:",
    "final answer is",
    "I hope",
    "and",
    "\\begin{pmatrix}",
    "\\end{pmatrix}",
    "&",
    "\\\\",
    "\\log_",
    "\\sin",
    "|",
    "\\{",
    "\\}",
    "10^{",
    "\\mathbf{",
    "\\approx",
    "é",
    "∞",
    "\\begin{array}{cc}",
    "\\end{array}",
    "\\binom",
    "cm",
];

fn latexish() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn never_panics(gold in latexish(), pred in latexish(), noise in "\\PC{0,30}") {
        let limits = Limits { time: Duration::from_millis(200), ..Limits::default() };
        for mode in [Mode::Maxrl, Mode::Default, Mode::Intent] {
            let start = Instant::now();
            let v = verify(&gold, &format!("{pred}{noise}"), mode, &limits);
            // The deadline is checked inside every loop: allow scheduling slack only.
            prop_assert!(start.elapsed() < Duration::from_secs(2), "{:?} took {:?}", v, start.elapsed());
        }
    }
}

#[test]
fn deep_nesting_and_huge_numbers_are_bounded() {
    let limits = Limits::default();
    let deep = format!("\\boxed{{{}1{}}}", "(".repeat(5000), ")".repeat(5000));
    assert!(!verify("1", &deep, Mode::Maxrl, &limits).correct);
    let braces = format!("{}1{}", "{".repeat(3000), "}".repeat(3000));
    assert!(!verify(&braces, "2", Mode::Default, &limits).correct);
    assert!(!verify("1", "\\boxed{10^{10^{10^{10}}}}", Mode::Maxrl, &limits).correct);
    assert!(
        verify(
            "2^{100}",
            "\\boxed{1267650600228229401496703205376}",
            Mode::Maxrl,
            &limits
        )
        .correct
    );
    assert!(!verify("1", "\\boxed{99999!}", Mode::Maxrl, &limits).correct);
    let long = "1 + ".repeat(100_000);
    let start = Instant::now();
    let _ = verify("5", &long, Mode::Maxrl, &limits);
    assert!(start.elapsed() < Duration::from_secs(3));
}

/// Inputs found by the `verify_latex` fuzz target that once ran until the time limit (the
/// committed copies are `fuzz/seeds/verify_latex/regress-*`).
#[test]
fn fuzz_findings_finish_before_the_limit() {
    let limits = Limits {
        time: Duration::from_secs(60),
        ..Limits::default()
    };
    let cases = [
        // A matrix entry `3.`: the lone `.` parsed as 0 without being consumed, forever.
        (
            r"\begin{pmatrix}1 & 2\\3. & 4\end{pmatrix}",
            r"Thus, the result is \Y\becin{pmatrix}1 & 2\\3 & 4\end{pmatrix}\]",
        ),
        (r"\begin{pmatrix}3.\end{pmatrix}", r"\boxed{x}"),
    ];
    for (gold, pred) in cases {
        for mode in [Mode::Maxrl, Mode::Default, Mode::Intent] {
            let v = verify(gold, pred, mode, &limits);
            assert!(!v.timed_out, "{mode:?} {gold:?} {pred:?}");
        }
    }
}

#[test]
fn documented_behaviours() {
    let l = Limits::default();
    let ok = |g: &str, p: &str| verify(g, p, Mode::Maxrl, &l).correct;
    assert!(ok("\\frac{1}{3}", "\\boxed{0.333333}"));
    assert!(!ok("\\frac{1}{3}", "\\boxed{0.33333}"));
    assert!(ok("\\pi", "\\boxed{3.14159265}"));
    assert!(!ok("\\pi", "\\boxed{3.14}"));
    assert!(ok("50\\%", "\\boxed{0.5}"));
    assert!(ok("15", "\\boxed{15 \\text{ cm}^2}"));
    assert!(ok("1,2", "\\boxed{\\{2,1\\}}"));
    assert!(!ok("(1,2)", "\\boxed{(2,1)}"));
    assert!(!ok("[1,3)", "\\boxed{(1,3]}"));
    assert!(ok("x=5", "\\boxed{5}"));
    assert!(ok("5", "\\boxed{x=5}"));
    assert!(ok("y=2x+1", "\\boxed{2x+1}"));
    assert!(ok("x^2+2x+1", "\\boxed{(x+1)^2}"));
    assert!(ok("90^\\circ", "\\boxed{90}"));
    assert!(ok("1000000", "\\boxed{1,000,000}"));
    assert!(ok("1000000", "\\boxed{10^6}"));
    assert!(ok("\\text{(C)}", "\\boxed{C}"));
    assert!(!ok("12", "<think> 12</think> \\boxed{13}"));
    assert!(ok("7", "3 then 7"));
    assert!(ok("5", "The final answer is 5. I hope it is correct."));
    assert!(ok("2,3", "\\boxed{2}\\boxed{3}"));
}
