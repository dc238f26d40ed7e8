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
//! Equal values in other forms are equal: number words (`\text{four}`), repeating decimals
//! (`0.\overline{3}`), cents and `70 thousand`, `\varnothing` and `\text{no solution}` for
//! `\emptyset`, `\text{all real numbers}` for `\mathbb{R}`, degrees against radians when the other
//! side is written with `\pi`, a numeral with a base subscript against a plain gold number, a
//! one-variable relation (`x \neq 2`, `1<|x|<3`, `y \ge 0`) against the set it describes on either
//! side, a column or row vector against a tuple, renamed summation indices, and the symbol `i`
//! as the imaginary unit when the other side is complex.
//!
//! Where the gold's form is the point, another form is wrong: a factored gold (see [`factored`])
//! is not matched by an expanded sum.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::{Captures, Regex};

use crate::compare::{expr_eq, relation_as_set};
use crate::expr::{Budget, Expr, RelOp, Stop};
use crate::extract::{extract, Extracted, Target};
use crate::sets;

fn re(p: &str) -> Regex {
    Regex::new(p).expect("static regex")
}

/// Grades `pred` against `gold`: `(correct, gold_unparsed)`.
pub(crate) fn run(gold: &str, pred: &str, b: &Budget) -> Result<(bool, bool), Stop> {
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
    if let (Some(Extracted::Value(g)), Some(Extracted::Value(p))) = (golds.first(), preds.first()) {
        if factored(g) && expanded(p) {
            return Ok((false, false));
        }
    }
    if any_same(&golds, &preds, b)? {
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
    let start = text.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(start + i + 1);
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

/// Values stated by the concluding statement: after the last box, or in the last sentence.
fn conclusions(text: &str) -> Vec<String> {
    let tail = match last_box_end(text) {
        Some(i) => &text[i..],
        None => last_sentence(text),
    };
    if HEDGE.is_match(tail) {
        return Vec::new();
    }
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
static DEGREES: LazyLock<Regex> =
    LazyLock::new(|| re(r"(\d+(?:\.\d+)?)\s*(?:\^\s*(?:\{\s*\\circ\s*\}|\\circ)|°|\\degree)"));
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

/// A factorisation: a product of a sum with symbols (or a power of one) and another factor with
/// symbols or an integer other than ±1 (`(x-1)(x+2)`, `x(x+2)`, `2(x+1)`, not `\frac{x+1}{2}`), or
/// a power of a sum with symbols (`(x+3)^2`).
fn factored(e: &Expr) -> bool {
    let sum = |f: &Expr| match f {
        Expr::Add(_) => has_symbols(f),
        Expr::Pow(base, _) => matches!(**base, Expr::Add(_)) && has_symbols(base),
        _ => false,
    };
    match answer_value(e) {
        Expr::Mul(v) => {
            let other = |f: &Expr| {
                has_symbols(f) || (f.is_integer() && *f != Expr::int(1) && *f != Expr::int(-1))
            };
            v.len() >= 2
                && v.iter()
                    .enumerate()
                    .any(|(i, f)| sum(f) && v.iter().enumerate().any(|(j, g)| j != i && other(g)))
        }
        f => sum(f) && matches!(f, Expr::Pow(..)),
    }
}

/// A sum with symbols.
fn expanded(e: &Expr) -> bool {
    let v = answer_value(e);
    matches!(v, Expr::Add(_)) && has_symbols(v)
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

/// Equivalence in the intent mode: math-verify's, then the other forms of the same answer.
fn intent_eq(gold: &Expr, pred: &Expr, b: &Budget) -> Result<bool, Stop> {
    if expr_eq(gold, pred, b)? {
        return Ok(true);
    }
    // A relation against the set it describes, on either side.
    let (gr, pr) = (is_relation(gold), is_relation(pred));
    if gr || pr {
        let g = if gr {
            relation_set(gold, b)?
        } else {
            Some(gold.clone())
        };
        let p = if pr {
            relation_set(pred, b)?
        } else {
            Some(pred.clone())
        };
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
            rewrite("$\\boxed{60^\\circ}$", true, false),
            "$\\boxed{\\frac{60\\pi}{180}}$"
        );
        assert_eq!(rewrite("$\\boxed{101_{2}}$", false, true), "$\\boxed{5}$");
        assert_eq!(rewrite("\\boxed{\\text{four}}", false, false), "\\boxed{4}");
        assert_eq!(rewrite("\\boxed{four}", false, false), "\\boxed{4}");
    }
}
