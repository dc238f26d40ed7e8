//! The `intent` grading mode: the MaxRL reward's extraction and equivalence, plus the rules a
//! careful human grader applies where math-verify's verdict is wrong.
//!
//! What counts as the response's final answer:
//! * a response whose reasoning block (`<think>`) never closes has no final answer; after a
//!   closed block only the text after `</think>` is graded;
//! * a response that stops mid-sentence (it ends with a letter, a comma or an operator, and holds
//!   no `\boxed{`, `answer` or `####`) is truncated: no final answer;
//! * a box retracted by a correction after it (`wrong`, `mistake`, `error`, `actually, the answer
//!   is`, ...) gives way to the answer stated after the correction, when one is stated;
//! * an ending that hedges between answers (`could be`, `possibly`, `not sure` after the last box;
//!   without a box also `either … or` and `the answer is 4 or 5`) has no final answer;
//! * a concluding statement after the last box (or, without a box, in the last sentence) that
//!   states a value (`the minimum is $-12$`, `he has 7 apples`) is a candidate too, unless it
//!   hedges (`or`).
//!
//! Both texts are read with common typographic forms made plain first (see [`plain_forms`]):
//! Unicode minus signs and dashes used as minus, digit groups split by thin or LaTeX spaces
//! (`12\,345`), degree marks (`30°`, `30\degree`, `30\text{ degrees}`), upright constants
//! (`\mathrm{i}`, `\mathrm{e}`) and units in upright commands (`5\operatorname{cm}`).
//!
//! Equal values in other forms are equal: number words (`\text{four}`), repeating decimals
//! (`0.\overline{3}`), cents and `70 thousand`, `\varnothing` and `\text{no solution}` for
//! `\emptyset`, `\text{all real numbers}` for `\mathbb{R}`, degrees against radians when the other
//! side is written with `\pi`, a numeral with a base subscript against a plain gold number, a
//! one-variable relation (`x \neq 2`, `1<|x|<3`, `y \ge 0`) or alternatives joined by `or`
//! (`x < -1 \text{ or } x > 2`) against the set they describe on either side, a column or row
//! vector against a tuple, renamed summation indices, the symbol `i` as the imaginary unit when
//! the other side is complex, and an option letter (`\textbf{(C)}\ 12`, `the answer is C`)
//! against a gold option letter.
//! Expanded and factored forms of a polynomial are equal (no problem text says which is asked).
//!
//! A decimal stands for an exact gold value only when it is that value exactly: `0.5` is
//! `\frac12`, but `0.333333` is not `\frac13` (see [`decimal_for_exact`]).

use std::collections::BTreeSet;
use std::sync::LazyLock;

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::ToPrimitive;
use regex::{Captures, Regex};

use crate::compare::{contains_float, expr_eq, relation_as_set};
use crate::expr::{Budget, Expr, RelOp, Stop};
use crate::extract::{extract, Extracted, Target};
use crate::sets;

fn re(p: &str) -> Regex {
    Regex::new(p).expect("static regex")
}

/// Grades `pred` against `gold`: `(correct, gold_unparsed)`.
pub(crate) fn run(gold: &str, pred: &str, b: &Budget) -> Result<(bool, bool), Stop> {
    let (gold, pred) = (&*plain_forms(gold), &*plain_forms(pred));
    let golds = extract(&format!("\\boxed{{{gold}}}"), &[Target::Latex], b)?;
    if golds.is_empty() {
        return Ok((false, true));
    }
    let Some(text) = final_part(pred) else {
        return Ok((false, false));
    };
    let text = after_retraction(text, b)?;
    let single = !matches!(golds.first(), Some(Extracted::Value(Expr::Set(_))));
    if hedged(text, single) {
        return Ok((false, false));
    }
    let preds = extract(text, &[Target::Expr, Target::Latex], b)?;
    if any_same(&golds, &preds, b)? {
        return Ok((true, false));
    }
    if option_letter(gold).is_some_and(|g| stated_option(text) == Some(g)) {
        return Ok((true, false));
    }
    // The same texts with other forms of the same values rewritten.
    let gold_pi = gold.contains("\\pi");
    let pred_pi = text.contains("\\pi");
    let gold_rw = rewrite(gold, pred_pi && !gold_pi, false);
    let pred_rw = rewrite(text, gold_pi && !pred_pi, !gold.contains('_'));
    let golds_rw = if gold_rw != gold {
        extract(&format!("\\boxed{{{gold_rw}}}"), &[Target::Latex], b)?
    } else {
        golds.clone()
    };
    let preds_rw = if pred_rw != text {
        extract(&pred_rw, &[Target::Expr, Target::Latex], b)?
    } else {
        preds
    };
    if any_same(&golds_rw, &preds_rw, b)? {
        return Ok((true, false));
    }
    for c in conclusions(&pred_rw) {
        let stated = extract(&c, &[Target::Expr, Target::Latex], b)?;
        if any_same(&golds_rw, &stated, b)? {
            return Ok((true, false));
        }
    }
    Ok((false, false))
}

fn any_same(golds: &[Extracted], preds: &[Extracted], b: &Budget) -> Result<bool, Stop> {
    for g in golds {
        for p in preds {
            let same = match (g, p) {
                (Extracted::Value(g), Extracted::Value(p)) => intent_eq(g, p, b),
                (Extracted::Text(g), Extracted::Text(p)) => {
                    let (g, p) = (g.trim(), p.trim());
                    Ok(!g.is_empty() && g == p)
                }
                _ => Ok(false),
            };
            match same {
                Ok(true) => return Ok(true),
                Ok(false) | Err(Stop::Fail) => {}
                Err(Stop::Timeout) => return Err(Stop::Timeout),
            }
        }
    }
    Ok(false)
}

/// The part of the response that holds its final answer, `None` when it has none.
fn final_part(pred: &str) -> Option<&str> {
    let text = match pred.rfind("</think>") {
        Some(i) => &pred[i + "</think>".len()..],
        None if pred.contains("<think>") => return None,
        None => pred,
    };
    let end = text.trim_end();
    let last = end.chars().last()?;
    let unfinished = last.is_alphabetic() || matches!(last, ',' | '+' | '-' | '=' | '(');
    let concluded = text.contains("\\boxed{")
        || text.contains("####")
        || text.to_lowercase().contains("answer");
    if unfinished && !concluded {
        return None;
    }
    Some(text)
}

static RETRACTION: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i)\b(?:wrong|mistake|incorrect|error|correction|oops|not right|actually,? the (?:correct )?answer is)\b",
    )
});

/// The text after a correction that follows the last box, when it states an answer; else `text`.
fn after_retraction<'t>(text: &'t str, b: &Budget) -> Result<&'t str, Stop> {
    let Some(close) = last_box_end(text) else {
        return Ok(text);
    };
    let Some(m) = RETRACTION.find(&text[close..]) else {
        return Ok(text);
    };
    let rest = &text[close + m.start()..];
    let stated = extract(rest, &[Target::Expr, Target::Latex], b)?;
    Ok(if stated.iter().any(|e| matches!(e, Extracted::Value(_))) {
        rest
    } else {
        text
    })
}

/// The byte after the closing brace of the last `\boxed{`.
fn last_box_end(text: &str) -> Option<usize> {
    last_box(text).map(|(_, close)| close + 1)
}

/// The span of the contents of the last `\boxed{`: its first byte and its closing brace.
fn last_box(text: &str) -> Option<(usize, usize)> {
    let start = text.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((start, start + i));
                }
            }
            _ => {}
        }
    }
    None
}

static HEDGED: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)\b(?:could be|might be|not sure|possibly|depending on)\b"));
static EITHER_OR: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)\beither\b.*\bor\b"));
static ANSWER_OR: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)\banswer is (?:either )?\$?-?[\d.]+\$? or \$?-?[\d.]+"));

/// The ending hedges between answers: what follows the last box says `could be`, `might be`,
/// `not sure`, `possibly` or `depending on`; without a box, the last sentence does, or says
/// `either … or`, or, for a gold answer of one value, `the answer is 4 or 5`.
fn hedged(text: &str, single: bool) -> bool {
    match last_box_end(text) {
        Some(i) => HEDGED.is_match(&text[i..]),
        None => {
            let tail = last_sentence(text);
            HEDGED.is_match(tail)
                || EITHER_OR.is_match(tail)
                || (single && ANSWER_OR.is_match(tail))
        }
    }
}

static STATEMENT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\b(?:is|are|was|were|has|have|equals)\s+(\$[^$]+\$|-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|[A-Z][a-z]+\b)",
    )
});
static HEDGE: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i)\b(?:or|either|maybe|perhaps|not sure|could be|might be)\b"));

/// The concluding statement: after the last box, or the last sentence; `None` when it hedges.
fn concluding(text: &str) -> Option<&str> {
    let tail = match last_box_end(text) {
        Some(i) => &text[i..],
        None => last_sentence(text),
    };
    (!HEDGE.is_match(tail)).then_some(tail)
}

/// Values stated by the concluding statement.
fn conclusions(text: &str) -> Vec<String> {
    let Some(tail) = concluding(text) else {
        return Vec::new();
    };
    STATEMENT
        .captures_iter(tail)
        .take(1)
        .map(|c| {
            let v = &c[1];
            if v.starts_with(|ch: char| ch.is_ascii_uppercase()) {
                format!("$\\text{{{v}}}$")
            } else if v.starts_with('$') {
                v.to_string()
            } else {
                format!(" {v} ")
            }
        })
        .collect()
}

/// The last sentence: after the last newline, or the last `. ` before a capital letter, before
/// the final character.
fn last_sentence(text: &str) -> &str {
    let body = text.trim_end().trim_end_matches('.');
    let newline = body.rfind('\n').map(|i| i + 1);
    let stop = body
        .match_indices(". ")
        .map(|(i, _)| i + 2)
        .filter(|&i| body[i..].starts_with(|c: char| c.is_uppercase()))
        .last();
    &text[newline.max(stop).unwrap_or(0)..]
}

/// The commands an option letter is written in (`\textbf{(C)}`).
const LETTER_CMD: &str = r"(?:\\(?:text|textbf|textrm|mathrm|mathbf)\s*\{\s*)?";
static GOLD_OPTION: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"^\s*{LETTER_CMD}\(?\s*([A-Z])\s*\)?\s*\}}?\s*$")));
static BOXED_OPTION: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"^\s*{LETTER_CMD}\(([A-Z])\)")));
static STATED_OPTION: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i:answer|option|choice)\b[^.\n]{0,40}?(?:\(([A-Z])\)|\b([A-Z])\$?\s*[.!]?\s*$)")
});

/// The option letter a gold answer of one letter names (`C`, `(C)`, `\text{(C)}`).
fn option_letter(gold: &str) -> Option<char> {
    GOLD_OPTION.captures(gold).and_then(|c| c[1].chars().next())
}

/// The option letter the response answers with: one in parentheses that opens the last box
/// (`\boxed{\textbf{(C)}\ 12}`), else one the concluding statement names after `answer`,
/// `option` or `choice`, in parentheses (`the correct choice is (C) 12`) or alone at its end
/// (`so the answer is D.`).
fn stated_option(text: &str) -> Option<char> {
    let letter = |c: Captures| {
        c.get(1)
            .or(c.get(2))
            .and_then(|m| m.as_str().chars().next())
    };
    if let Some((start, close)) = last_box(text) {
        if let Some(c) = BOXED_OPTION.captures(&text[start..close]) {
            return letter(c);
        }
    }
    STATED_OPTION.captures(concluding(text)?).and_then(letter)
}

/// A space between digit groups: LaTeX's thin, medium, thick and word spaces, a tie, or a
/// Unicode thin, narrow no-break, no-break, six-per-em or punctuation space.
const GROUP_SPACE: &str =
    r"(?:\\[,:; ]|\\thinspace\s*|~|[\x{2009}\x{202F}\x{00A0}\x{2006}\x{2008}])";
static INT_GROUPS: LazyLock<Regex> =
    LazyLock::new(|| re(&format!(r"([0-9]{{1,3}})((?:{GROUP_SPACE}[0-9]{{3}})+)\b")));
static FRAC_GROUPS: LazyLock<Regex> = LazyLock::new(|| {
    re(&format!(
        r"\.([0-9]{{3}})((?:{GROUP_SPACE}[0-9]{{1,3}})+)\b"
    ))
});
static DEGREE_MARK: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"([0-9])\s*(?:\\,\s*)?(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ\b|°|\\degree\b|\\deg\b|\\(?:text|mbox|mathrm)\s*\{\s*(?:°|deg|degrees?)\s*\})",
    )
});
static LOGICAL_OR: LazyLock<Regex> = LazyLock::new(|| re(r"\\(?:lor|vee)\b"));
static UPRIGHT_CONST: LazyLock<Regex> = LazyLock::new(|| {
    re(r"\\(?:mathrm|textrm|text|operatorname|mathit)\s*\{\s*([ie])\s*\}|\\mathrm\s+([ie])\b")
});
static UPRIGHT_UNIT: LazyLock<Regex> = LazyLock::new(|| {
    re(r"([0-9])(\s*(?:\\[,:; ]\s*)?)\\(?:operatorname|textup|textsf|mathsf)\s*\{")
});

/// `text` with common typographic forms made plain: minus signs ([`minus_signs`]), digit groups
/// joined (`12\,345`, `1\ 000\ 000`, `0.141\,59`), every degree mark after a number written
/// `^{\circ}` (`30°`, `30\degree`, `30\text{ degrees}`), the upright constants `\mathrm{i}` and
/// `\mathrm{e}` as `i` and `e`, a unit in an upright command after a number as `\text`, and
/// `\lor`/`\vee` as the word `or`.
fn plain_forms(text: &str) -> String {
    let mut s = minus_signs(text);
    s = LOGICAL_OR.replace_all(&s, "\\text{ or }").into_owned();
    let digits = |c: &Captures| -> String { c[2].chars().filter(char::is_ascii_digit).collect() };
    s = INT_GROUPS
        .replace_all(&s, |c: &Captures| {
            let at = c.get(0).map_or(0, |m| m.start());
            match s[..at].chars().next_back() {
                Some(p) if p.is_ascii_digit() || p == '.' => c[0].to_string(),
                _ => format!("{}{}", &c[1], digits(c)),
            }
        })
        .into_owned();
    s = FRAC_GROUPS
        .replace_all(&s, |c: &Captures| format!(".{}{}", &c[1], digits(c)))
        .into_owned();
    s = DEGREE_MARK.replace_all(&s, "${1}^{\\circ}").into_owned();
    s = UPRIGHT_CONST
        .replace_all(&s, |c: &Captures| {
            format!(" {}", c.get(1).or(c.get(2)).map_or("", |m| m.as_str()))
        })
        .into_owned();
    UPRIGHT_UNIT.replace_all(&s, "${1}${2}\\text{").into_owned()
}

/// `text` with minus signs as `-`: U+2212 always, a figure or en dash or a small or full-width
/// hyphen-minus unless it joins two letters or digits (`1–5` is a range).
fn minus_signs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut prev: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let minus = match c {
            '\u{2212}' => true,
            '\u{2012}' | '\u{2013}' | '\u{fe63}' | '\u{ff0d}' => {
                !(prev.is_some_and(char::is_alphanumeric)
                    && chars.peek().is_some_and(|n| n.is_alphanumeric()))
            }
            _ => false,
        };
        out.push(if minus { '-' } else { c });
        prev = Some(c);
    }
    out
}

static EMPTY: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\\varnothing|\\text\{\s*(?:there (?:are|is) )?(?:no (?:real )?(?:solutions?|roots?)|none)\s*\}",
    )
});
static REALS: LazyLock<Regex> = LazyLock::new(|| {
    re(r"\\text\{\s*all real (?:numbers|values)(?: of [a-z])?\s*\}|\\text\{\s*all reals\s*\}")
});
static WORD: LazyLock<Regex> =
    LazyLock::new(|| re(r"(\\text\{|\\boxed\{)\s*([A-Za-z]+(?:[- ][a-z]+)?)\s*\}"));
static REPEATING: LazyLock<Regex> = LazyLock::new(|| re(r"(-?)(\d*)\.(\d*)\\overline\{(\d+)\}"));
static CENTS: LazyLock<Regex> = LazyLock::new(|| re(r"\b(\d+)\s*cents?\b"));
static SCALE: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(\d+(?:\.\d+)?)(\}?\$?)\s*(?:\\text\{\s*(thousand|million|billion)\s*\}|(thousand|million|billion)\b)",
    )
});
/// A number of degrees, its mark as [`plain_forms`] writes it.
static DEGREES: LazyLock<Regex> = LazyLock::new(|| re(r"(\d+(?:\.\d+)?)\^\{\\circ\}"));
static BASE: LazyLock<Regex> = LazyLock::new(|| re(r"\b([0-9A-Za-z]+)_(?:\{(\d{1,2})\}|(\d))"));

/// `text` with other forms of values rewritten to the form the verifier reads: `degrees` turns
/// degrees into radians, `bases` reads numerals with a base subscript as decimal numbers.
fn rewrite(text: &str, degrees: bool, bases: bool) -> String {
    let mut s = EMPTY.replace_all(text, "\\emptyset").into_owned();
    s = REALS.replace_all(&s, "\\mathbb{R}").into_owned();
    s = WORD
        .replace_all(&s, |c: &Captures| match number_word(&c[2]) {
            Some(n) if &c[1] == "\\boxed{" => format!("\\boxed{{{n}}}"),
            Some(n) => n.to_string(),
            None => c[0].to_string(),
        })
        .into_owned();
    s = REPEATING
        .replace_all(&s, |c: &Captures| match repeating(&c[2], &c[3], &c[4]) {
            Some((n, d)) => format!("{}\\frac{{{n}}}{{{d}}}", &c[1]),
            None => c[0].to_string(),
        })
        .into_owned();
    s = CENTS
        .replace_all(&s, |c: &Captures| match c[1].parse::<u64>() {
            Ok(n) => format!("{}.{:02}", n / 100, n % 100),
            Err(_) => c[0].to_string(),
        })
        .into_owned();
    s = SCALE
        .replace_all(&s, |c: &Captures| {
            let word = c.get(3).or(c.get(4)).map_or("", |m| m.as_str());
            let zeros = match word {
                "thousand" => 3,
                "million" => 6,
                _ => 9,
            };
            format!("{}{}", shift(&c[1], zeros), &c[2])
        })
        .into_owned();
    if degrees {
        s = DEGREES
            .replace_all(&s, |c: &Captures| format!("\\frac{{{}\\pi}}{{180}}", &c[1]))
            .into_owned();
    }
    if bases {
        s = BASE
            .replace_all(&s, |c: &Captures| {
                let base = c.get(2).or(c.get(3)).map(|m| m.as_str()).unwrap_or("");
                match base
                    .parse::<u32>()
                    .ok()
                    .filter(|b| (2..=36).contains(b))
                    .and_then(|b| u64::from_str_radix(&c[1], b).ok())
                {
                    Some(v) => v.to_string(),
                    None => c[0].to_string(),
                }
            })
            .into_owned();
    }
    s
}

/// The decimal `digits` times 10^`zeros`.
fn shift(digits: &str, zeros: usize) -> String {
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let mut out = int.to_string();
    let mut frac = frac.to_string();
    while frac.len() < zeros {
        frac.push('0');
    }
    out.push_str(&frac[..zeros]);
    if frac.len() > zeros {
        out.push('.');
        out.push_str(&frac[zeros..]);
    }
    let trimmed = out.trim_start_matches('0');
    if trimmed.is_empty() || trimmed.starts_with('.') {
        format!("0{trimmed}")
    } else {
        trimmed.to_string()
    }
}

/// `int.fixed(repeat)` as a fraction (numerator, denominator).
fn repeating(int: &str, fixed: &str, rep: &str) -> Option<(u128, u128)> {
    if int.len() + fixed.len() + rep.len() > 30 {
        return None;
    }
    let pow = |n: usize| 10u128.checked_pow(n as u32);
    let num = |s: &str| {
        if s.is_empty() {
            Some(0)
        } else {
            s.parse::<u128>().ok()
        }
    };
    let r = pow(rep.len())?.checked_sub(1)?;
    let f = pow(fixed.len())?;
    let den = f.checked_mul(r)?;
    let n = num(int)?
        .checked_mul(den)?
        .checked_add(num(fixed)?.checked_mul(r)?)?
        .checked_add(num(rep)?)?;
    Some((n, den))
}

/// English number words up to ninety-nine.
fn number_word(w: &str) -> Option<u32> {
    const ONES: [&str; 20] = [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
    ];
    const TENS: [&str; 8] = [
        "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    ];
    let w = w.to_lowercase();
    let one = |s: &str| ONES.iter().position(|x| *x == s).map(|i| i as u32);
    let ten = |s: &str| {
        TENS.iter()
            .position(|x| *x == s)
            .map(|i| 20 + 10 * i as u32)
    };
    if let Some(n) = one(&w).or_else(|| ten(&w)) {
        return Some(n);
    }
    let (t, o) = w.split_once(['-', ' '])?;
    let o = one(o).filter(|o| (1..10).contains(o))?;
    Some(ten(t)? + o)
}

/// The right side of an equation, else the expression.
fn answer_value(e: &Expr) -> &Expr {
    match e {
        Expr::Rel(RelOp::Eq, _, r) => answer_value(r),
        Expr::And(v) => v.last().map(answer_value).unwrap_or(e),
        e => e,
    }
}

fn has_symbols(e: &Expr) -> bool {
    let mut s = BTreeSet::new();
    e.symbols(&mut s);
    !s.is_empty()
}

fn is_relation(e: &Expr) -> bool {
    match e {
        Expr::Rel(..) => true,
        Expr::And(v) => !v.is_empty() && v.iter().all(|x| matches!(x, Expr::Rel(..))),
        _ => false,
    }
}

fn is_set_like(e: &Expr) -> bool {
    matches!(
        e,
        Expr::Set(_) | Expr::Interval(..) | Expr::SetOp(..) | Expr::NamedSet(_)
    )
}

/// The set of reals a one-variable relation describes.
fn relation_set(e: &Expr, b: &Budget) -> Result<Option<Expr>, Stop> {
    if let Some(s) = sets::real_solution_set(e, b)? {
        return Ok(Some(s));
    }
    relation_as_set(e, b)
}

/// The set of reals that alternatives joined by `or` describe (`x < -1 \text{ or } x > 2`, which
/// reads as a list of relations): two or more relations in one and the same variable whose sets
/// are disjoint (read with `and`, they would hold nowhere).
fn alternatives(e: &Expr, b: &Budget) -> Result<Option<Expr>, Stop> {
    let (Expr::Set(v) | Expr::Tuple(v)) = e else {
        return Ok(None);
    };
    if v.len() < 2 || !v.iter().all(is_relation) {
        return Ok(None);
    }
    let mut var: Option<BTreeSet<String>> = None;
    let mut parts = Vec::with_capacity(v.len());
    for r in v {
        let mut s = BTreeSet::new();
        r.symbols(&mut s);
        if s.len() != 1 || var.as_ref().is_some_and(|x| *x != s) {
            return Ok(None);
        }
        var = Some(s);
        let Some(set) = relation_set(r, b)? else {
            return Ok(None);
        };
        parts.push(set);
    }
    sets::disjoint_union(&parts, b)
}

/// The set of reals a relation, a membership (`x \in (2, \infty)`) or alternatives describe,
/// else `e` itself; and whether it was read as a set.
fn as_real_set(e: &Expr, b: &Budget) -> Result<(Option<Expr>, bool), Stop> {
    if let Expr::Rel(RelOp::Eq, l, r) = e {
        if matches!(**l, Expr::Sym(_)) && is_set_like(r) {
            return Ok((Some((**r).clone()), true));
        }
    }
    if is_relation(e) {
        return Ok((relation_set(e, b)?, true));
    }
    Ok(match alternatives(e, b)? {
        Some(s) => (Some(s), true),
        None => (Some(e.clone()), false),
    })
}

/// A decimal given for an exact number: equal only when it is that number exactly (`0.5` is
/// `\frac12`; `0.333333` is not `\frac13`, `1.414` is not `\sqrt2`). `None` unless the
/// prediction's value is a number with a decimal literal and the gold's a number without one.
fn decimal_for_exact(gold: &Expr, pred: &Expr, b: &Budget) -> Result<Option<bool>, Stop> {
    let (g, p) = (answer_value(gold), answer_value(pred));
    let number = |e: &Expr| e.is_scalar() && !has_symbols(e) && !e.has_i();
    if !number(g) || !number(p) || !contains_float(p) || contains_float(g) {
        return Ok(None);
    }
    let Some(p) = exact_decimals(p)
        .and_then(|p| p.exact(b).transpose())
        .transpose()?
    else {
        return Ok(None);
    };
    if let Some(g) = g.exact(b)? {
        return Ok(Some(g == p));
    }
    match (g.eval(&|_| None, b), p.to_f64()) {
        (Ok(v), Some(d)) => Ok(Some((v - d).abs() <= 1e-12 * v.abs().max(1.0))),
        (Err(Stop::Timeout), _) => Err(Stop::Timeout),
        _ => Ok(None),
    }
}

/// `e` with each decimal literal as the exact number it writes; `None` for a literal of more
/// than 40 characters.
fn exact_decimals(e: &Expr) -> Option<Expr> {
    let all = |v: &[Expr]| v.iter().map(exact_decimals).collect::<Option<Vec<_>>>();
    Some(match e {
        Expr::Float(f) => Expr::Num(decimal(&f.to_string())?),
        Expr::Add(v) => Expr::Add(all(v)?),
        Expr::Mul(v) => Expr::Mul(all(v)?),
        Expr::Func(n, v) => Expr::Func(n.clone(), all(v)?),
        Expr::Pow(a, x) => Expr::Pow(Box::new(exact_decimals(a)?), Box::new(exact_decimals(x)?)),
        Expr::Pct(a) => Expr::Pct(Box::new(exact_decimals(a)?)),
        other => other.clone(),
    })
}

/// The exact value of a plain decimal numeral (`-0.125`), of at most 40 characters.
fn decimal(s: &str) -> Option<BigRational> {
    if s.len() > 40 {
        return None;
    }
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty()
        || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let n: BigInt = format!("{int}{frac}").parse().ok()?;
    let v = BigRational::new(n, BigInt::from(10u32).pow(frac.len() as u32));
    Some(if neg { -v } else { v })
}

/// Equivalence in the intent mode: math-verify's, then the other forms of the same answer.
fn intent_eq(gold: &Expr, pred: &Expr, b: &Budget) -> Result<bool, Stop> {
    if let Some(same) = decimal_for_exact(gold, pred, b)? {
        return Ok(same);
    }
    if expr_eq(gold, pred, b)? {
        return Ok(true);
    }
    // A relation or alternatives against the set they describe, on either side.
    let ((g, gr), (p, pr)) = (as_real_set(gold, b)?, as_real_set(pred, b)?);
    if gr || pr {
        if let (Some(g), Some(p)) = (g, p) {
            if (is_set_like(&g) || is_set_like(&p)) && sets_equal(&g, &p, b)? {
                return Ok(true);
            }
        }
    }
    // A vector against a tuple.
    let vector = |e: &Expr| match e {
        Expr::Matrix(rows) if rows.len() == 1 => Some(Expr::Tuple(rows[0].clone())),
        Expr::Matrix(rows) if rows.iter().all(|r| r.len() == 1) => {
            Some(Expr::Tuple(rows.iter().map(|r| r[0].clone()).collect()))
        }
        _ => None,
    };
    match (vector(gold), vector(pred)) {
        (Some(g), None) if matches!(pred, Expr::Tuple(_)) => return expr_eq(&g, pred, b),
        (None, Some(p)) if matches!(gold, Expr::Tuple(_)) => return expr_eq(gold, &p, b),
        _ => {}
    }
    // Bound summation indices renamed, `i` read as the imaginary unit.
    let (g, p) = (
        canonical(gold, gold.has_i() || pred.has_i()),
        canonical(pred, gold.has_i() || pred.has_i()),
    );
    if (g != *gold || p != *pred) && expr_eq(&g, &p, b)? {
        return Ok(true);
    }
    Ok(false)
}

fn sets_equal(g: &Expr, p: &Expr, b: &Budget) -> Result<bool, Stop> {
    if let Some(same) = sets::same_union(g, p, b, &|x, y| expr_eq(x, y, b))? {
        return Ok(same);
    }
    expr_eq(g, p, b)
}

/// `e` with the index of every `\sum`/`\prod` renamed to one name and, when `complex`, the
/// symbol `i` as the imaginary unit.
fn canonical(e: &Expr, complex: bool) -> Expr {
    let rec = |x: &Expr| canonical(x, complex);
    match e {
        Expr::Sym(s) if complex && s == "i" => Expr::I,
        Expr::Func(name, args) if (name == "sum" || name == "product") && args.len() == 4 => {
            let mut args: Vec<Expr> = args.iter().map(rec).collect();
            if let Expr::Sym(k) = &args[1] {
                let k = k.clone();
                let index = Expr::Sym("\u{1}index".into());
                args[0] = rename(&args[0], &k, &index);
                args[1] = index;
            }
            Expr::Func(name.clone(), args)
        }
        Expr::Add(v) => Expr::Add(v.iter().map(rec).collect()),
        Expr::Mul(v) => Expr::Mul(v.iter().map(rec).collect()),
        Expr::Func(n, v) => Expr::Func(n.clone(), v.iter().map(rec).collect()),
        Expr::And(v) => Expr::And(v.iter().map(rec).collect()),
        Expr::Set(v) => Expr::Set(v.iter().map(rec).collect()),
        Expr::Tuple(v) => Expr::Tuple(v.iter().map(rec).collect()),
        Expr::Pow(a, x) => Expr::Pow(Box::new(rec(a)), Box::new(rec(x))),
        Expr::Rel(op, a, x) => Expr::Rel(*op, Box::new(rec(a)), Box::new(rec(x))),
        Expr::SetOp(op, a, x) => Expr::SetOp(*op, Box::new(rec(a)), Box::new(rec(x))),
        Expr::Interval(a, x, l, r) => Expr::Interval(Box::new(rec(a)), Box::new(rec(x)), *l, *r),
        Expr::Pct(a) => Expr::Pct(Box::new(rec(a))),
        Expr::Matrix(rows) => {
            Expr::Matrix(rows.iter().map(|r| r.iter().map(rec).collect()).collect())
        }
        other => other.clone(),
    }
}

/// `e` with the symbol `from` replaced by `to`, also in subscripts (`x_{k}` is the symbol
/// `x_{k}`).
fn rename(e: &Expr, from: &str, to: &Expr) -> Expr {
    let rec = |x: &Expr| rename(x, from, to);
    match e {
        Expr::Sym(s) if s == from => to.clone(),
        Expr::Sym(s) => match s.split_once('_') {
            Some((base, sub)) => {
                let inner = sub.trim_start_matches('{').trim_end_matches('}');
                if inner == from {
                    let Expr::Sym(t) = to else { return e.clone() };
                    Expr::Sym(format!("{base}_{t}"))
                } else {
                    e.clone()
                }
            }
            None => e.clone(),
        },
        Expr::Add(v) => Expr::Add(v.iter().map(rec).collect()),
        Expr::Mul(v) => Expr::Mul(v.iter().map(rec).collect()),
        Expr::Func(n, v) => Expr::Func(n.clone(), v.iter().map(rec).collect()),
        Expr::Pow(a, x) => Expr::Pow(Box::new(rec(a)), Box::new(rec(x))),
        Expr::Pct(a) => Expr::Pct(Box::new(rec(a))),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites() {
        assert_eq!(number_word("four"), Some(4));
        assert_eq!(number_word("Twenty-one"), Some(21));
        assert_eq!(number_word("twenty-ten"), None);
        assert_eq!(repeating("0", "", "3"), Some((3, 9)));
        assert_eq!(repeating("1", "2", "34"), Some((1222, 990)));
        assert_eq!(shift("70", 3), "70000");
        assert_eq!(shift("1.5", 6), "1500000");
        assert_eq!(
            rewrite(
                "$\\boxed{2.5}$ million, $3 \\text{ thousand}$",
                false,
                false
            ),
            "$\\boxed{2500000}$, $3000$"
        );
        assert_eq!(rewrite("is 117 cents.", false, false), "is 1.17.");
        assert_eq!(
            rewrite(&plain_forms("$\\boxed{60^\\circ}$"), true, false),
            "$\\boxed{\\frac{60\\pi}{180}}$"
        );
        assert_eq!(rewrite("$\\boxed{101_{2}}$", false, true), "$\\boxed{5}$");
        assert_eq!(rewrite("\\boxed{\\text{four}}", false, false), "\\boxed{4}");
        assert_eq!(rewrite("\\boxed{four}", false, false), "\\boxed{4}");
    }

    fn intent(gold: &str, pred: &str) -> bool {
        crate::verify(gold, pred, crate::Mode::Intent, &crate::Limits::default()).correct
    }

    #[test]
    fn minus_signs_and_dashes() {
        assert_eq!(minus_signs("\u{2212}12, x \u{2212} 1"), "-12, x - 1");
        assert_eq!(
            minus_signs("x = \u{2013}2, pages 1\u{2013}5"),
            "x = -2, pages 1\u{2013}5"
        );
        assert_eq!(minus_signs("\u{ff0d}1 \u{2014} 3"), "-1 \u{2014} 3");
        assert!(intent("-12", "The minimum is $\\boxed{\u{2212}12}$."));
        assert!(intent("x-1", "$\\boxed{x \u{2212} 1}$"));
        assert!(intent("-7", "So the answer is \u{2013}7."));
        assert!(!intent("12", "$\\boxed{\u{2212}12}$"));
        assert!(!intent("2", "Pages 1\u{2013}5, so $\\boxed{\u{2013}2}$."));
    }

    #[test]
    fn digit_groups() {
        assert_eq!(
            plain_forms("12\\,345 and 1\\ 000\\ 000"),
            "12345 and 1000000"
        );
        assert_eq!(
            plain_forms("12\\;345, 12\u{2009}345, 1\u{202f}234\u{202f}567"),
            "12345, 12345, 1234567"
        );
        assert_eq!(plain_forms("3.141\\,59"), "3.14159");
        // Not digit groups: a group of other than three digits, or after more digits.
        assert_eq!(plain_forms("2\\,3 and 1234\\,567"), "2\\,3 and 1234\\,567");
        assert!(intent("12345", "$\\boxed{12\\,345}$"));
        assert!(intent("(1000,2000)", "$\\boxed{(1\\,000, 2\\,000)}$"));
        assert!(!intent("1000", "$\\boxed{1\\,000\\,000}$"));
    }

    #[test]
    fn degree_marks_and_units() {
        for mark in [
            "30°",
            "30\\degree",
            "30^\\circ",
            "30 ^{ \\circ }",
            "30\\text{ degrees}",
        ] {
            assert_eq!(plain_forms(mark), "30^{\\circ}", "{mark}");
            assert!(intent("30", &format!("$\\boxed{{{mark}}}$")), "{mark}");
            assert!(
                intent("\\frac{\\pi}{6}", &format!("$\\boxed{{{mark}}}$")),
                "{mark}"
            );
        }
        assert!(!intent("30^\\circ", "$\\boxed{60°}$"));
        assert_eq!(plain_forms("5\\,\\operatorname{cm}"), "5\\,\\text{cm}");
        assert!(intent("5", "$\\boxed{5\\textup{ cm}}$"));
        assert!(intent("5", "$\\boxed{5\\%}$"));
    }

    #[test]
    fn upright_constants() {
        assert_eq!(plain_forms("2+3\\mathrm{i}"), "2+3 i");
        assert!(intent("2+3i", "$\\boxed{2+3\\mathrm{i}}$"));
        assert!(intent("\\frac{1}{e}", "$\\boxed{\\mathrm{e}^{-1}}$"));
        assert!(intent("\\pi i", "$\\boxed{\\pi\\mathrm{i}}$"));
        assert!(intent("i", "$\\boxed{\\mathrm{i}}$"));
        assert!(!intent("e-1", "$\\boxed{\\mathrm{e}+1}$"));
    }

    #[test]
    fn option_letters() {
        assert_eq!(option_letter("\\text{(C)}"), Some('C'));
        assert_eq!(option_letter("(C)"), Some('C'));
        assert_eq!(option_letter("12"), None);
        assert_eq!(stated_option("$\\boxed{\\textbf{(C)}\\ 12}$"), Some('C'));
        assert_eq!(stated_option("The correct choice is (C) 12."), Some('C'));
        assert_eq!(
            stated_option("Only the second works. So the answer is B."),
            Some('B')
        );
        assert_eq!(stated_option("The answer is A bit more than 5."), None);
        assert_eq!(stated_option("The answer is (A) or (B)."), None);
        assert!(intent("C", "The answer is $\\boxed{\\textbf{(C)}\\ 12}$."));
        assert!(intent("D", "So the answer is D."));
        assert!(!intent(
            "C",
            "The value is 12, which is choice $\\textbf{(A)}\\ 12$."
        ));
    }

    #[test]
    fn alternatives_joined_by_or() {
        let u = "(-\\infty,-1)\\cup(2,\\infty)";
        assert!(intent(u, "$\\boxed{x < -1 \\text{ or } x > 2}$"));
        assert!(intent(u, "It holds when $x<-1$ or $x>2$."));
        assert!(intent(u, "$\\boxed{x<-1 \\lor x>2}$"));
        assert!(intent(
            "x<-1 \\text{ or } x>2",
            &format!("$\\boxed{{{u}}}$")
        ));
        assert!(intent(
            "x<-1 \\text{ or } x>2",
            &format!("$\\boxed{{x \\in {u}}}$")
        ));
        assert!(!intent(u, "$\\boxed{x \\le -1 \\text{ or } x > 2}$"));
        // Overlapping conditions are no alternatives.
        assert!(!intent(
            "\\mathbb{R}",
            "$\\boxed{x > 1 \\text{ and } x < 3}$"
        ));
    }

    #[test]
    fn decimals_for_exact_values() {
        assert_eq!(
            decimal("-0.125"),
            Some(BigRational::new((-1).into(), 8.into()))
        );
        assert_eq!(decimal("1e5"), None);
        for (gold, pred, same) in [
            ("\\frac{1}{3}", "0.333333", false),
            ("\\frac{1}{7}", "0.142857", false),
            ("e", "2.718281828", false),
            ("\\sqrt{2}", "1.414", false),
            ("\\frac{1}{2}", "0.5", true),
            ("\\frac{1}{8}", "12.5\\%", true),
            ("32000", "3.2 \\times 10^4", true),
        ] {
            assert_eq!(
                intent(gold, &format!("$\\boxed{{{pred}}}$")),
                same,
                "{gold} {pred}"
            );
        }
        assert!(!intent("x=\\frac{1}{3}", "$\\boxed{x=0.333333}$"));
    }

    #[test]
    fn expanded_and_binomial_forms() {
        assert!(intent("(x+1)^2", "$\\boxed{x^2+2x+1}$"));
        assert!(intent("(x-1)(x+2)", "Factoring, $\\boxed{x^2+x-2}$."));
        assert!(!intent("(x+2)(x-3)", "$\\boxed{x^2+x-6}$"));
        assert!(intent("\\frac{n(n-1)}{2}", "$\\boxed{\\binom{n}{2}}$"));
        assert!(intent("\\binom{n}{3}", "$\\boxed{\\frac{n^3-3n^2+2n}{6}}$"));
        assert!(!intent("\\binom{n}{2}", "$\\boxed{\\frac{n^2+n}{2}}$"));
    }
}
