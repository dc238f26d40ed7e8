//! The math verifier on arbitrary text: never panics, honours its time limit and gives the same
//! verdict twice.
//!
//! The input is read as UTF-8 (lossily) and split at its first NUL into the gold answer and the
//! prediction (without a NUL, the text is both). Both verifier modes run on the pair, and the
//! public extraction, normalisation and parsing entry points run on each side.
//!
//! A short input (at most [`MAX_PIECE`] bytes) is also repeated to about [`AMPLIFIED`] bytes and
//! verified as a boxed prediction and as a gold answer on a thread with a [`SMALL_STACK`]: long
//! postfix chains (`!!!…`, `^2^2…`), long infix chains and deep nesting (`((((…`) must stay within
//! the verifier's bounds, never overflow the stack.
//!
//! `VERIFY_FUZZ_LIMIT_MS` sets the verifier's time limit per answer (default 250 ms, so that an
//! input that reaches the limit in every call still fits libFuzzer's `-timeout=2`); a call that
//! overruns its limit by more than a second is a failure.
#![no_main]

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use rlreplay_reward::expr::Budget;
use rlreplay_reward::extract::{extract, Target};
use rlreplay_reward::latex::{number_from_str, parse_latex, parse_python};
use rlreplay_reward::normalize::{extract_boxed_content, normalize_latex, BoxedMode};
use rlreplay_reward::{mcq_reward, verify, Limits, Mode};

/// Scheduling slack allowed beyond the time limit before a call counts as overrunning it.
const SLACK: Duration = Duration::from_secs(1);
/// Longest input that is also verified repeated.
const MAX_PIECE: usize = 64;
/// Length of a repeated input, in bytes.
const AMPLIFIED: usize = 4096;
/// Stack of the thread that verifies repeated inputs, a quarter of a spawned thread's default.
const SMALL_STACK: usize = 512 * 1024;

static LIMITS: LazyLock<Limits> = LazyLock::new(|| {
    let ms = std::env::var("VERIFY_FUZZ_LIMIT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(250);
    let limits = Limits {
        time: Duration::from_millis(ms),
        ..Limits::default()
    };
    // The first calls compile the verifier's regexes (seconds in this instrumented build), which
    // no time limit covers: compile them before anything is timed.
    for mode in [Mode::Maxrl, Mode::Default] {
        verify("1", "1", mode, &limits);
    }
    limits
});

/// Runs `f` and fails when it took longer than the time limit plus [`SLACK`].
fn bounded<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let limit = LIMITS.time;
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    assert!(
        took <= limit + SLACK,
        "{what} took {took:?} with a limit of {limit:?}"
    );
    out
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (gold, pred) = text.split_once('\0').unwrap_or((&text, &text));
    for mode in [Mode::Maxrl, Mode::Default] {
        let first = bounded("verify", || verify(gold, pred, mode, &LIMITS));
        if first.timed_out {
            continue;
        }
        let second = bounded("verify", || verify(gold, pred, mode, &LIMITS));
        if !second.timed_out {
            assert_eq!(first, second, "{mode:?}: verdict changed between two runs");
        }
        if first.correct {
            assert!(
                !first.gold_unparsed,
                "{mode:?}: correct without a gold answer"
            );
        }
    }
    // One budget for all the entry points: an input takes at most five limits (1.25 s by default).
    let budget = Budget::new(Instant::now() + LIMITS.time);
    for side in [gold, pred] {
        // `verify` extracts with both targets; each one alone takes other paths.
        for target in [Target::Latex, Target::Expr] {
            let _ = bounded("extract", || extract(side, &[target], &budget));
        }
        for boxed in [BoxedMode::All, BoxedMode::Last] {
            let _ = extract_boxed_content(side, boxed);
            let normalized = normalize_latex(side, boxed);
            for complex in [false, true] {
                let _ = bounded("parse_latex", || parse_latex(&normalized, complex, &budget));
            }
        }
        let _ = bounded("parse_python", || parse_python(side, &budget));
        let _ = number_from_str(side.trim());
    }
    let score = mcq_reward(pred, gold);
    assert!(score.score == 0.0 || score.score == 1.0);

    let piece = text.replace('\0', "");
    if !piece.is_empty() && piece.len() <= MAX_PIECE {
        let long = piece.repeat(AMPLIFIED / piece.len() + 1);
        let worker = std::thread::Builder::new()
            .stack_size(SMALL_STACK)
            .spawn(move || {
                let boxed = format!("\\boxed{{{long}}}");
                bounded("verify (repeated, prediction)", || {
                    verify("1", &boxed, Mode::Maxrl, &LIMITS)
                });
                bounded("verify (repeated, gold)", || {
                    verify(&long, "\\boxed{1}", Mode::Maxrl, &LIMITS)
                });
            })
            .expect("spawn");
        if let Err(panic) = worker.join() {
            std::panic::resume_unwind(panic);
        }
    }
});
