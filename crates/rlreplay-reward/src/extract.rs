//! Answer extraction by math-verify's priorities: final-answer phrases, `\boxed{}`, `answer:`,
//! plain LaTeX environments, plain expressions and numbers; within a priority the rightmost match
//! that converts wins.

use std::sync::{LazyLock, OnceLock};
use std::time::Instant;

use fancy_regex::{Captures, Regex};

use crate::expr::{Budget, Expr, Stop};
use crate::latex::{number_from_str, parse_latex, parse_python};
use crate::normalize::{normalize_latex, BoxedMode};

/// What an answer text is searched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// LaTeX environments and boxes (`LatexExtractionConfig()`).
    Latex,
    /// Plain expressions and numbers (`ExprExtractionConfig()`).
    Expr,
}

/// One extracted candidate.
#[derive(Debug, Clone, PartialEq)]
pub enum Extracted {
    /// A parsed expression.
    Value(Expr),
    /// The raw (normalised) text of the first match, kept as a fallback.
    Text(String),
}

const MAX_NEXT: usize = 5;

fn latex_env(prefix: &str, boxed: bool) -> String {
    let pct = format!(r"(?P<{prefix}percent>(?:\\?%|[Pp]ercent|[Pp]ercentage|[Pp]ct))");
    let dd = r"(?:[^$]|\$(?!\$))";
    let db = r"(?:[^\\]|\\(?!\]))";
    let id = r"(?:\\[$]|[^\n$])";
    let ip = r"(?:[^\\\n]|\\(?!\)))";
    let ib = r"[^\n\]\[]";
    let wrap = |c: &str| {
        if boxed {
            format!(r"{c}*?\\boxed\{{{c}+?\}}{c}*?")
        } else {
            format!("{c}+?")
        }
    };
    let mut pats = vec![
        format!(
            r"(?<!\\)\$\$(?P<{prefix}latexDisplayDollar>{})(?<!\\)\$\$",
            wrap(dd)
        ),
        format!(
            r"(?<!\\)\\\[(?P<{prefix}latexDisplayBracket>{})(?<!\\)\\\]",
            wrap(db)
        ),
        format!(
            r"(?<![\\\d])\$(?P<{prefix}latexInlineDollar>{})(?<!\\)\$",
            wrap(id)
        ),
        format!(
            r"(?<!\\)\\\((?P<{prefix}latexInlineParenthesis>{})(?<!\\)\\\)",
            wrap(ip)
        ),
        format!(r"\s\[(?P<{prefix}latexInlineBracket>{})\]\s", wrap(ib)),
    ];
    if !boxed {
        let n = r"-?\d+(?:[.,]\d+)?";
        pats.push(format!(
            r"(?P<{prefix}latexFraction>-?\\frac\{{{n}\}}\{{{n}\}})"
        ));
    }
    format!(r"(?:(?:{})\s*{pct}?)", pats.join("|"))
}

fn compile(p: &str) -> Regex {
    Regex::new(p).expect("static extraction regex")
}

/// Where a match of an extraction regex can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Starts {
    /// Anywhere: the regex scans the text itself.
    Anywhere,
    /// At a `\boxed{`.
    Box,
    /// At a LaTeX environment that holds a `\boxed{` before anything closes it: `$$`, `$`, `\[`,
    /// `\(`, or white space before `[`.
    BoxedEnv,
    /// At a LaTeX environment (as [`Starts::BoxedEnv`], without the box) or a `\frac{` (`-\frac{`).
    Env,
    /// At the start of the text, white space or `=` (the plain expression's prefix), before a
    /// digit, `.`, `-`, `(` or a currency sign (after an optional `**`).
    Expr,
}

const BOX: &str = "\\boxed{";

impl Starts {
    /// Can a match start at byte `i` (the character `c`)? `boxes` are the positions of
    /// `\boxed{` in `text`. Only necessary conditions, read off the regexes.
    fn at(self, text: &str, i: usize, c: char, boxes: &[usize]) -> bool {
        let rest = &text[i..];
        match self {
            Starts::Anywhere => true,
            Starts::Box => rest.starts_with(BOX),
            Starts::BoxedEnv => {
                // The first box after `i` must come before what closes the environment (what
                // its content cannot hold).
                let Some(&b) = boxes.iter().find(|&&b| b > i) else {
                    return false;
                };
                let span = &text[i..b];
                if let Some(inner) = span.strip_prefix("$$") {
                    !inner.contains("$$")
                } else if span.starts_with('$') {
                    // A newline or a `$` not after `\` closes inline math.
                    let bytes = span.as_bytes();
                    !(1..bytes.len())
                        .any(|k| bytes[k] == b'\n' || (bytes[k] == b'$' && bytes[k - 1] != b'\\'))
                } else if let Some(inner) = span.strip_prefix("\\[") {
                    !inner.contains("\\]")
                } else if let Some(inner) = span.strip_prefix("\\(") {
                    !inner.contains("\\)") && !inner.contains('\n')
                } else if c.is_whitespace() && rest[c.len_utf8()..].starts_with('[') {
                    !span[c.len_utf8() + 1..].contains(['\n', '[', ']'])
                } else {
                    false
                }
            }
            Starts::Env => {
                rest.starts_with('$')
                    || rest.starts_with("\\[")
                    || rest.starts_with("\\(")
                    || rest.starts_with("\\frac{")
                    || rest.starts_with("-\\frac{")
                    || (c.is_whitespace() && rest[c.len_utf8()..].starts_with('['))
            }
            // The prefix `(?:^|\s|=)`: empty at the start of the text, or one character.
            Starts::Expr => {
                (i == 0 && starts_number(rest))
                    || ((c == '=' || c.is_whitespace()) && starts_number(&rest[c.len_utf8()..]))
            }
        }
    }
}

/// Can a plain number or expression (after an optional `**`) start `s`?
fn starts_number(s: &str) -> bool {
    let s = s.strip_prefix("**").unwrap_or(s);
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '(') || CURRENCY.contains(c))
}

const CURRENCY: &str = "$€£¥₹₽₪₩₫฿₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₴₵₶₷₸₹₺₻₼₽₾₿";

/// One extraction regex with what makes its scan fast: text that every match contains (the
/// regex is not run without it) and the positions where a match can start (the regex is tried
/// there only, anchored by `\G`). Both are necessary conditions of a match, so the matches are
/// those of a plain scan. The regex is built on first use.
struct Pattern {
    source: String,
    re: OnceLock<Regex>,
    prio: i32,
    needs: Option<&'static LazyLock<regex::Regex>>,
    starts: Starts,
}

impl Pattern {
    fn new(
        p: &str,
        prio: i32,
        needs: Option<&'static LazyLock<regex::Regex>>,
        starts: Starts,
    ) -> Pattern {
        Pattern {
            source: p.to_string(),
            re: OnceLock::new(),
            prio,
            needs,
            starts,
        }
    }

    /// The regex; building it (on first use) is not charged to `budget`.
    fn regex(&self, budget: &Budget) -> &Regex {
        if let Some(re) = self.re.get() {
            return re;
        }
        let start = Instant::now();
        let re = self.re.get_or_init(|| {
            if self.starts == Starts::Anywhere {
                compile(&self.source)
            } else {
                compile(&format!(r"\G(?:{})", self.source))
            }
        });
        budget.extend(start.elapsed());
        re
    }

    /// Every match, left to right and non-overlapping, as `captures_iter` finds them.
    fn captures<'t>(&self, text: &'t str, budget: &Budget) -> Result<Vec<Captures<'t>>, Stop> {
        let mut out = Vec::new();
        if self.needs.is_some_and(|n| !n.is_match(text)) {
            return Ok(out);
        }
        let boxes: Vec<usize> = match self.starts {
            Starts::Box | Starts::BoxedEnv => text.match_indices(BOX).map(|(i, _)| i).collect(),
            _ => Vec::new(),
        };
        if matches!(self.starts, Starts::Box | Starts::BoxedEnv) && boxes.is_empty() {
            return Ok(out);
        }
        let re = self.regex(budget);
        if self.starts == Starts::Anywhere {
            for caps in re.captures_iter(text) {
                budget.check()?;
                // A regex that gives up (backtracking limit) contributes no further matches.
                let Ok(caps) = caps else { break };
                out.push(caps);
            }
            return Ok(out);
        }
        let (found, _gave_up) = anchored_matches(re, text, Some(budget), |i, c| {
            self.starts.at(text, i, c, &boxes)
        })?;
        Ok(found)
    }
}

/// The matches of `re` (a regex that starts with `\G`) tried at each position where `start`
/// holds, left to right and non-overlapping: where `start` holds wherever a match can start,
/// the matches of a plain scan (`captures_iter`) of the regex without `\G`. Also whether the
/// regex gave up (backtracking limit); the matches before that are kept. With a budget, its
/// deadline is checked at each position tried.
pub(crate) fn anchored_matches<'t>(
    re: &Regex,
    text: &'t str,
    budget: Option<&Budget>,
    mut start: impl FnMut(usize, char) -> bool,
) -> Result<(Vec<Captures<'t>>, bool), Stop> {
    let mut out = Vec::new();
    let mut next = 0;
    for (i, c) in text.char_indices() {
        if i < next || !start(i, c) {
            continue;
        }
        if let Some(b) = budget {
            b.check()?;
        }
        match re.captures_from_pos(text, i) {
            Ok(Some(caps)) => {
                let m = caps.get(0).expect("group 0");
                next = if m.end() > m.start() {
                    m.end()
                } else {
                    i + c.len_utf8()
                };
                out.push(caps);
            }
            Ok(None) => {}
            Err(_) => return Ok((out, true)),
        }
    }
    Ok((out, false))
}

/// Case-insensitive words some regexes start with (as their `(?i:…)` matches them).
static FINAL_ANSWER_RE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new("(?i)final answer").expect("static regex"));
static ANSWER_RE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new("(?i)answer").expect("static regex"));
const FINAL_ANSWER: Option<&LazyLock<regex::Regex>> = Some(&FINAL_ANSWER_RE);
const ANSWER: Option<&LazyLock<regex::Regex>> = Some(&ANSWER_RE);

/// The regexes of the LaTeX target.
static LATEX_RES: LazyLock<Vec<Pattern>> = LazyLock::new(|| {
    let next: String = (1..=MAX_NEXT)
        .map(|i| {
            format!(
                r"(?:\s*(?:,?and|,?or|,)\s*{})?",
                latex_env(&format!("next{i}_"), false)
            )
        })
        .collect();
    let envs = format!("(?:{}{next})", latex_env("first_", false));
    let any = Starts::Anywhere;
    let mut v = vec![
        (
            format!(r"(?i:final answer is)\:?\s*{envs}\.?\s?I hope"),
            0,
            FINAL_ANSWER,
            any,
        ),
        (
            format!(r"(?i:final answer.{{0,100}}?)\s+is\:?\s*{envs}"),
            50,
            FINAL_ANSWER,
            any,
        ),
        (format!(r"(?i:answer):.{{0,50}}?{envs}"), 100, ANSWER, any),
        (format!(r"(?i:answer).{{0,50}}?{envs}"), 200, ANSWER, any),
        (envs.clone(), 300, None, Starts::Env),
    ];
    let next_boxed: String = (1..=MAX_NEXT)
        .map(|i| {
            format!(
                r"\s*(?:\s*(?:,?and|,?or|,)\s*{})?",
                latex_env(&format!("next{i}_"), true)
            )
        })
        .collect();
    v.push((
        format!("{}{next_boxed}", latex_env("first_", true)),
        50,
        None,
        Starts::BoxedEnv,
    ));
    v.push((
        r"(?P<first_latexBoxed>\\boxed\{.+\})".to_string(),
        50,
        None,
        Starts::Box,
    ));
    v.into_iter()
        .map(|(p, prio, needs, starts)| Pattern::new(&format!("(?s){p}"), prio, needs, starts))
        .collect()
});

/// The regexes of the plain-expression target.
static EXPR_RES: LazyLock<Vec<Pattern>> = LazyLock::new(|| {
    let number = r"(?<!\d)(?:(?P<integer1>-?[1-9]\d{0,2}(?:[ ,]\d{3})+)(?P<decimal1>\.\d+)?|(?P<integer2>-?\d+)(?P<decimal2>[.,]\d+)|(?P<decimal3>\.\d+)|(?P<integer3>-?\d+))(?P<percent>\s*(?:%|[Pp]ercent|\s*[Pp]ercentage|\s*[Pp]ct))?";
    let ops = r"+\-*×/^()÷";
    let all = format!(r"[\d\.\s{ops}]");
    let expr = format!(r"(?P<expr>-?\(?-?\d{all}*[{ops}]{all}+\)?)");
    let currency = "$€£¥₹₽₪₩₫฿₡₢₣₤₥₦₧₨₩₪₫₭₮₯₰₱₲₳₴₵₶₷₸₹₺₻₼₽₾₿";
    let prefix = r"(?:^|\s|\=)(?:\*\*)?";
    // Python's `$` also matches before a final newline.
    let suffix = r"(?:\*\*)?(?:\.|,|:|\s|\)|\$|(?=\n?\z))";
    let expr_anch = format!("(?:{prefix}{expr}{suffix})");
    let num_anch = format!("(?:{prefix}[{currency}]?{number})");
    let either = format!("(?:{expr_anch}|{num_anch})");
    let any = Starts::Anywhere;
    [
        (
            format!(r"(?i:final answer is)\:?\s*{either}\.?\s?I hope"),
            0,
            FINAL_ANSWER,
            any,
        ),
        (
            format!(r"(?i:final answer.{{0,100}}?)\s+is\:?{either}"),
            50,
            FINAL_ANSWER,
            any,
        ),
        (
            format!(r"(?i:answer):(?:.{{0,100}}=\s*|.{{0,50}}?){either}(?!\s*=)"),
            100,
            ANSWER,
            any,
        ),
        (
            format!(r"(?i:answer)(?:.{{0,100}}=\s*|.{{0,50}}?){either}(?!\s*=)"),
            200,
            ANSWER,
            any,
        ),
        (expr_anch, 300, None, Starts::Expr),
        (num_anch, 300, None, Starts::Expr),
    ]
    .into_iter()
    .map(|(p, prio, needs, starts)| Pattern::new(&p, prio, needs, starts))
    .collect()
});

static COMPLEX: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"\\mathbb\{C\}|\\i\b|\bi\b|\\text\{i\}|\\mathrm\{i\}|\\imath\b|\\det|\\operatorname\{tr\}|\\operatorname\{rank\}|\\text\{rank\}|\\arg\{|\\Re\{|\\Im\{|\\operatorname\{Re\}|\\operatorname\{Im\}|\\text\{Re\}|\\text\{Im\}",
    )
});

/// Builds the normalisation regexes and the extraction patterns now (each extraction regex is
/// built on its first use).
pub(crate) fn compile_regexes() {
    LazyLock::force(&LATEX_RES);
    LazyLock::force(&EXPR_RES);
    LazyLock::force(&COMPLEX);
    LazyLock::force(&FINAL_ANSWER_RE);
    LazyLock::force(&ANSWER_RE);
    crate::normalize::compile_regexes();
}

fn looks_complex(s: &str) -> bool {
    COMPLEX.is_match(s).unwrap_or(false)
}

/// Splits on `=` not preceded by `\`, `<`, `!` or `>` and keeps the last part, when there are at
/// least three parts and no `,`/`;`.
fn last_equation(s: &str) -> Option<&str> {
    if s.contains(',') || s.contains(';') {
        return None;
    }
    let mut parts = 1;
    let mut last_start = 0;
    let mut prev = None;
    for (i, c) in s.char_indices() {
        if c == '=' && !matches!(prev, Some('\\') | Some('<') | Some('!') | Some('>')) {
            parts += 1;
            last_start = i + 1;
        }
        prev = Some(c);
    }
    (parts > 2).then(|| &s[last_start..])
}

fn parse_normalized(s: &str, budget: &Budget) -> Result<Expr, Stop> {
    match parse_latex(s, looks_complex(s), budget) {
        Ok(e) => Ok(e),
        Err(Stop::Timeout) => Err(Stop::Timeout),
        Err(Stop::Fail) => match last_equation(s) {
            Some(last) => parse_latex(last, looks_complex(last), budget),
            None => Err(Stop::Fail),
        },
    }
}

fn pct(e: Expr) -> Expr {
    Expr::Pct(Box::new(e))
}

fn extract_latex(
    caps: &Captures,
    re: &Regex,
    budget: &Budget,
) -> Result<(Option<Expr>, String), Stop> {
    let names: Vec<&str> = re.capture_names().flatten().collect();
    let mut exprs: Vec<Option<Expr>> = Vec::new();
    let mut strs: Vec<String> = Vec::new();
    let prefixes =
        std::iter::once("first".to_string()).chain((1..=MAX_NEXT).map(|i| format!("next{i}")));
    for prefix in prefixes {
        let latex_prefix = format!("{prefix}_latex");
        let Some((name, m)) = names
            .iter()
            .filter(|n| n.starts_with(&latex_prefix))
            .find_map(|n| {
                caps.name(n)
                    .filter(|m| !m.as_str().is_empty())
                    .map(|m| (*n, m))
            })
        else {
            continue;
        };
        let is_pct = caps.name(&format!("{prefix}_percent")).is_some();
        let mode = if name.ends_with("latexBoxed") {
            BoxedMode::Last
        } else {
            BoxedMode::All
        };
        let norm = normalize_latex(m.as_str(), mode);
        let parsed = match parse_normalized(&norm, budget) {
            Ok(e) => Some(if is_pct { pct(e) } else { e }),
            Err(Stop::Timeout) => return Err(Stop::Timeout),
            Err(Stop::Fail) => None,
        };
        strs.push(norm);
        exprs.push(parsed);
    }
    if exprs.is_empty() {
        return Ok((None, String::new()));
    }
    if exprs.len() > 1 && exprs.iter().all(Option::is_some) {
        let mut all = Vec::new();
        for e in exprs.into_iter().flatten() {
            match e {
                Expr::Set(v) => all.extend(v),
                e => all.push(e),
            }
        }
        return Ok((Some(Expr::Set(all)), strs.join(" and ")));
    }
    Ok((exprs.into_iter().next().flatten(), strs.swap_remove(0)))
}

fn extract_expr(
    caps: &Captures,
    re: &Regex,
    budget: &Budget,
) -> Result<(Option<Expr>, String), Stop> {
    let names: Vec<&str> = re.capture_names().flatten().collect();
    let first = |p: &str| {
        names
            .iter()
            .filter(|n| n.starts_with(p))
            .find_map(|n| caps.name(n).map(|m| m.as_str()).filter(|s| !s.is_empty()))
            .unwrap_or("")
    };
    let integer = first("integer");
    let decimal = first("decimal");
    if !integer.is_empty() || !decimal.is_empty() {
        let int: String = integer.chars().filter(|c| *c != ',' && *c != ' ').collect();
        let int = int.trim_start_matches('0');
        let int = if int.is_empty() { "0" } else { int };
        let number_str = format!("{int}{}", decimal.replace(',', "."));
        let Ok(mut n) = number_from_str(&number_str) else {
            return Ok((None, number_str));
        };
        if caps.name("percent").is_some() {
            n = pct(n);
        }
        return Ok((Some(n), number_str));
    }
    let expr = caps.name("expr").map(|m| m.as_str()).unwrap_or("");
    if expr.is_empty() {
        return Ok((None, String::new()));
    }
    // A Python arithmetic expression (`^` read as `**`): `×` and `÷` are not operators there,
    // and `3.` is a float.
    let py = expr.replace('\n', " ");
    if py.contains(['×', '÷']) {
        return Ok((None, expr.to_string()));
    }
    match parse_python(&py, budget) {
        Ok(e) => Ok((Some(e), expr.to_string())),
        Err(Stop::Timeout) => Err(Stop::Timeout),
        Err(Stop::Fail) => Ok((None, expr.to_string())),
    }
}

/// Extracts candidates from `text` for the targets in order (`parse` with `first_match` fallback
/// and `any_match` extraction): at most one parsed value, then the first matched text.
pub fn extract(text: &str, targets: &[Target], budget: &Budget) -> Result<Vec<Extracted>, Stop> {
    let mut patterns: Vec<(&Pattern, i32, Target)> = Vec::new();
    for t in targets {
        let set = match t {
            Target::Latex => &*LATEX_RES,
            Target::Expr => &*EXPR_RES,
        };
        patterns.extend(set.iter().map(|p| (p, p.prio, *t)));
    }
    patterns.sort_by_key(|(_, p, _)| *p);
    let mut fallbacks: Vec<String> = Vec::new();
    let mut found: Option<Expr> = None;
    let mut i = 0;
    while i < patterns.len() && found.is_none() {
        let prio = patterns[i].1;
        let group: Vec<_> = patterns[i..]
            .iter()
            .take_while(|(_, p, _)| *p == prio)
            .collect();
        i += group.len();
        let mut matches: Vec<(Captures, usize, usize, &Regex, Target)> = Vec::new();
        for (pat, _, t) in &group {
            for caps in pat.captures(text, budget)? {
                let m = caps.get(0).expect("group 0");
                let (s, e) = (m.start(), m.end());
                matches.push((caps, s, e, pat.regex(budget), *t));
            }
        }
        // Rightmost end first, then leftmost start; stable otherwise.
        matches.sort_by(|a, b| b.2.cmp(&a.2).then(a.1.cmp(&b.1)));
        for (caps, _, _, re, t) in &matches {
            budget.check()?;
            let (value, fallback) = match t {
                Target::Latex => extract_latex(caps, re, budget)?,
                Target::Expr => extract_expr(caps, re, budget)?,
            };
            if !fallback.is_empty() {
                fallbacks.push(fallback);
            }
            if let Some(v) = value {
                found = Some(v);
                break;
            }
        }
    }
    let mut out: Vec<Extracted> = found.into_iter().map(Extracted::Value).collect();
    if let Some(f) = fallbacks.into_iter().next() {
        out.push(Extracted::Text(f));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The fast scan (literal prefilters, anchored attempts at the possible starts) finds the
    /// matches of a plain scan, groups included, on the answers of the committed case files.
    #[test]
    fn fast_scan_finds_the_plain_matches() {
        let budget = Budget::new(Instant::now() + Duration::from_secs(600));
        let mut texts = Vec::new();
        for (file, n) in [
            (
                include_str!("../tests/data/math_verify_real.jsonl"),
                usize::MAX,
            ),
            (
                include_str!("../tests/data/intent_labels.jsonl"),
                usize::MAX,
            ),
            (include_str!("../tests/data/math_verify_cases.jsonl"), 400),
        ] {
            for line in file.lines().take(n) {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let gold = v["gold"].as_str().unwrap().to_string();
                texts.push(format!("\\boxed{{{gold}}}"));
                texts.push(gold);
                texts.push(v["pred"].as_str().unwrap().to_string());
            }
        }
        let spans = |c: &Captures, re: &Regex| -> Vec<Option<(usize, usize)>> {
            (0..re.captures_len())
                .map(|g| c.get(g).map(|m| (m.start(), m.end())))
                .collect()
        };
        let mut compared = 0;
        for pat in LATEX_RES.iter().chain(EXPR_RES.iter()) {
            let plain = compile(&pat.source);
            for t in &texts {
                let fast = pat.captures(t, &budget).unwrap();
                let slow: Vec<Captures> = plain.captures_iter(t).map(Result::unwrap).collect();
                let fast: Vec<_> = fast.iter().map(|c| spans(c, &plain)).collect();
                let slow: Vec<_> = slow.iter().map(|c| spans(c, &plain)).collect();
                assert_eq!(fast, slow, "{} on {t:?}", pat.source);
                compared += slow.len();
            }
        }
        assert!(compared > 1000, "{compared} matches compared");
    }
}
