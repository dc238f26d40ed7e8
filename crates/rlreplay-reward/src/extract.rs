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

const BOX: &str = "\\boxed{";

/// The regexes' `\d`: a Unicode decimal digit.
fn is_digit(c: char) -> bool {
    c.is_ascii_digit() || (!c.is_ascii() && DIGIT.is_match(c.encode_utf8(&mut [0; 4])))
}

/// How an extraction pattern finds its matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Matcher {
    /// Its regex.
    Regex,
    /// The hand-written matcher of the LaTeX environments ([`envs_at`]).
    Envs,
    /// The hand-written matcher of the boxed LaTeX environments ([`envs_at`]).
    BoxedEnvs,
    /// The hand-written matcher of `\\boxed\{.+\}` ([`boxed_at`]).
    Boxed,
    /// A regex whose lookarounds always hold where they stand: a plain scan of the regex
    /// without them ([`without_lookarounds`]).
    Plain,
    /// The hand-written matcher of a phrase before LaTeX environments ([`phrase_at`]).
    Phrase(Phrase),
}

/// The phrases of the LaTeX target's patterns before a run of environments (`envs` in
/// [`LATEX_RES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phrase {
    /// `(?i:final answer.{0,100}?)\s+is\:?\s*`
    FinalAnswerIs,
    /// `(?i:answer):.{0,50}?`
    AnswerColon,
    /// `(?i:answer).{0,50}?`
    Answer,
}

/// A regex of the plain-expression target without its lookarounds, which hold wherever they
/// stand: `(?<!\d)` follows white space, `=`, `*` or a currency sign (never a digit), and
/// `(?=\n?\z)`, the last alternative after `\s`, only matches at the end of the text. (The
/// `answer` patterns' `(?!\s*=)` is a real condition: those stay fancy.)
fn without_lookarounds(source: &str) -> regex::Regex {
    let plain = source.replace(r"(?<!\d)", "").replace(r"(?=\n?\z)", r"\z");
    assert!(!plain.contains("(?<") && !plain.contains("(?=") && !plain.contains("(?!"));
    regex::Regex::new(&plain).expect("static extraction regex")
}

/// The capture groups of a LaTeX pattern that [`extract_latex`] reads, per environment (the
/// first, then each following one): the content groups in group order (and whether each is the
/// `latexBoxed` group) and the percent group.
type LatexGroups = Vec<(Vec<(usize, bool)>, Option<usize>)>;

/// One extraction pattern with what makes its scan fast: text that every match contains (the
/// pattern is not tried without it) and how its matches are found: its regex, the same regex
/// without lookarounds that always hold, or a hand-written matcher of the regex. All find the
/// matches of a plain scan of the regex. A regex is built on first use.
struct Pattern {
    source: String,
    re: OnceLock<(Regex, LatexGroups)>,
    plain: OnceLock<regex::Regex>,
    prio: i32,
    needs: Option<&'static LazyLock<regex::Regex>>,
    /// Literal text every match also contains (case-sensitive).
    literal: Option<&'static str>,
    matcher: Matcher,
}

/// One LaTeX environment of a match: its content, whether a percent sign follows it, and
/// whether it is the whole `\boxed{…}` (whose last box is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Part<'t> {
    content: &'t str,
    pct: bool,
    boxed: bool,
}

/// One match of a pattern: its span, and its regex captures or, from a hand-written matcher,
/// its LaTeX environments.
struct Hit<'t> {
    start: usize,
    end: usize,
    found: Found<'t>,
}

enum Found<'t> {
    Caps(Captures<'t>),
    Plain(regex::Captures<'t>),
    Parts(Vec<Part<'t>>),
}

const PREFIXES: [&str; 1 + MAX_NEXT] = ["first", "next1", "next2", "next3", "next4", "next5"];

fn latex_groups(re: &Regex) -> LatexGroups {
    PREFIXES
        .iter()
        .map(|prefix| {
            let latex = format!("{prefix}_latex");
            let pct = format!("{prefix}_percent");
            let mut content = Vec::new();
            let mut percent = None;
            for (i, name) in re.capture_names().enumerate() {
                match name {
                    Some(n) if n.starts_with(&latex) => {
                        content.push((i, n.ends_with("latexBoxed")))
                    }
                    Some(n) if n == pct => percent = Some(i),
                    _ => {}
                }
            }
            (content, percent)
        })
        .collect()
}

impl Pattern {
    fn new(
        p: &str,
        prio: i32,
        needs: Option<&'static LazyLock<regex::Regex>>,
        matcher: Matcher,
    ) -> Pattern {
        Pattern {
            source: p.to_string(),
            re: OnceLock::new(),
            plain: OnceLock::new(),
            prio,
            needs,
            literal: p.contains("I hope").then_some("I hope"),
            matcher,
        }
    }

    /// The regex and its LaTeX groups; building it (on first use) is not charged to `budget`.
    fn regex(&self, budget: &Budget) -> &(Regex, LatexGroups) {
        if let Some(re) = self.re.get() {
            return re;
        }
        let start = Instant::now();
        let re = self.re.get_or_init(|| {
            let re = compile(&self.source);
            let groups = latex_groups(&re);
            (re, groups)
        });
        budget.extend(start.elapsed());
        re
    }

    /// Every match, left to right and non-overlapping, as `captures_iter` finds them.
    fn hits<'t>(&self, text: &'t str, budget: &Budget) -> Result<Vec<Hit<'t>>, Stop> {
        let mut out = Vec::new();
        if self.needs.is_some_and(|n| !n.is_match(text))
            || self.literal.is_some_and(|l| !text.contains(l))
        {
            return Ok(out);
        }
        match self.matcher {
            Matcher::Envs | Matcher::BoxedEnvs | Matcher::Boxed => {
                if self.matcher != Matcher::Envs && !text.contains(BOX) {
                    return Ok(out);
                }
                let mut next = 0;
                for (i, c) in text.char_indices() {
                    if i < next {
                        continue;
                    }
                    let hit = match self.matcher {
                        Matcher::Boxed if c == '\\' => boxed_at(text, i),
                        Matcher::BoxedEnvs if matches!(c, '$' | '\\') || c.is_whitespace() => {
                            budget.check()?;
                            envs_at(text, i, c, true)
                        }
                        Matcher::Envs if matches!(c, '$' | '\\' | '-') || c.is_whitespace() => {
                            budget.check()?;
                            envs_at(text, i, c, false)
                        }
                        _ => None,
                    };
                    if let Some(hit) = hit {
                        next = hit.end.max(i + c.len_utf8());
                        out.push(hit);
                    }
                }
                return Ok(out);
            }
            Matcher::Plain => {
                let start = Instant::now();
                let re = self.plain.get_or_init(|| without_lookarounds(&self.source));
                budget.extend(start.elapsed());
                for caps in re.captures_iter(text) {
                    budget.check()?;
                    let m = caps.get(0).expect("group 0");
                    out.push(Hit {
                        start: m.start(),
                        end: m.end(),
                        found: Found::Plain(caps),
                    });
                }
                return Ok(out);
            }
            Matcher::Phrase(phrase) => {
                let re: &regex::Regex = match phrase {
                    Phrase::FinalAnswerIs => &FINAL_ANSWER_RE,
                    Phrase::AnswerColon | Phrase::Answer => &ANSWER_RE,
                };
                let mut pos = 0;
                while let Some(m) = re.find_at(text, pos) {
                    budget.check()?;
                    match phrase_at(text, m.start(), m.end(), phrase) {
                        Some(hit) => {
                            pos = hit.end;
                            out.push(hit);
                        }
                        None => {
                            pos = m.start()
                                + text[m.start()..].chars().next().map_or(1, char::len_utf8)
                        }
                    }
                }
                return Ok(out);
            }
            Matcher::Regex => {}
        }
        let re = &self.regex(budget).0;
        for caps in re.captures_iter(text) {
            budget.check()?;
            // A regex that gives up (backtracking limit) contributes no further matches.
            let Ok(caps) = caps else { break };
            let m = caps.get(0).expect("group 0");
            out.push(Hit {
                start: m.start(),
                end: m.end(),
                found: Found::Caps(caps),
            });
        }
        Ok(out)
    }
}

/// The match of `\boxed\{.+\}` (`(?s)`) at byte `i`: to the last `}` of the text that leaves
/// the braces at least one character.
fn boxed_at(text: &str, i: usize) -> Option<Hit<'_>> {
    if !text[i..].starts_with(BOX) {
        return None;
    }
    let body = i + BOX.len();
    let close = text[body..].rfind('}').map(|r| body + r)?;
    (close > body).then(|| Hit {
        start: i,
        end: close + 1,
        found: Found::Parts(vec![Part {
            content: &text[i..close + 1],
            pct: false,
            boxed: true,
        }]),
    })
}

static DIGIT: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^\d$").expect("static regex"));

/// The character before byte `i`.
fn char_before(text: &str, i: usize) -> Option<char> {
    text[..i].chars().next_back()
}

/// One LaTeX environment of `latex_env(_, boxed)` (without its percent suffix) at byte `i`, as
/// its regex matches it there: `(content start, content end, end)`. Each alternative, in the
/// regex's order, is an opener, lazy content and the first closer; what the content cannot hold
/// before the closer (a newline in inline math, an escaped closer) leaves no match. Boxed
/// content holds a `\boxed{` with at least one character and a `}` after it; other content is
/// not empty, and a number fraction `-?\frac{n}{n}` is the last alternative.
fn env_at(text: &str, i: usize, boxed: bool) -> Option<(usize, usize, usize)> {
    let b = text.as_bytes();
    let rest = &text[i..];
    let after_backslash = char_before(text, i) == Some('\\');
    let content = |cs: usize, ce: usize, end: usize| {
        if !boxed {
            return (ce > cs).then_some((cs, ce, end));
        }
        let body = text[cs..ce].find(BOX)? + cs + BOX.len();
        let first = text[body..ce].chars().next()?;
        text[body + first.len_utf8()..ce]
            .contains('}')
            .then_some((cs, ce, end))
    };
    // `(?<!\\)\$\$` … `(?<!\\)\$\$`: the content holds no `$$`.
    if rest.starts_with("$$") && !after_backslash {
        let cs = i + 2;
        if let Some(k) = text[cs..].find("$$").map(|k| cs + k) {
            if b[k - 1] != b'\\' {
                if let Some(m) = content(cs, k, k + 2) {
                    return Some(m);
                }
            }
        }
    }
    // `(?<!\\)\\\[` … `(?<!\\)\\\]`.
    if rest.starts_with("\\[") && !after_backslash {
        let cs = i + 2;
        if let Some(k) = text[cs..].find("\\]").map(|k| cs + k) {
            if b[k - 1] != b'\\' {
                if let Some(m) = content(cs, k, k + 2) {
                    return Some(m);
                }
            }
        }
    }
    // `(?<![\\\d])\$` … `(?<!\\)\$`: the content holds no newline, and a `$` only after `\`.
    if rest.starts_with('$') && !char_before(text, i).is_some_and(|c| c == '\\' || is_digit(c)) {
        let cs = i + 1;
        let close = b[cs..]
            .iter()
            .enumerate()
            .map(|(k, &x)| (cs + k, x))
            .find(|&(k, x)| x == b'\n' || (x == b'$' && b[k - 1] != b'\\'));
        if let Some((k, b'$')) = close {
            if let Some(m) = content(cs, k, k + 1) {
                return Some(m);
            }
        }
    }
    // `(?<!\\)\\\(` … `(?<!\\)\\\)`: the content holds no newline.
    if rest.starts_with("\\(") && !after_backslash {
        let cs = i + 2;
        let close = b[cs..]
            .iter()
            .enumerate()
            .map(|(k, &x)| (cs + k, x))
            .find(|&(k, x)| x == b'\n' || (x == b'\\' && b.get(k + 1) == Some(&b')')));
        if let Some((k, b'\\')) = close {
            if b[k - 1] != b'\\' {
                if let Some(m) = content(cs, k, k + 2) {
                    return Some(m);
                }
            }
        }
    }
    // `\s\[` … `\]\s`: the content holds no newline and no bracket.
    let c = rest.chars().next()?;
    if c.is_whitespace() && rest[c.len_utf8()..].starts_with('[') {
        let cs = i + c.len_utf8() + 1;
        let close = b[cs..]
            .iter()
            .position(|&x| matches!(x, b'\n' | b'[' | b']'))
            .map(|k| cs + k);
        if let Some(k) = close.filter(|&k| b[k] == b']') {
            if let Some(w) = text[k + 1..].chars().next().filter(|w| w.is_whitespace()) {
                if let Some(m) = content(cs, k, k + 1 + w.len_utf8()) {
                    return Some(m);
                }
            }
        }
    }
    // `-?\\frac\{n\}\{n\}` with `n = -?\d+(?:[.,]\d+)?`.
    if !boxed {
        let f = rest.strip_prefix('-').unwrap_or(rest);
        let f = f.strip_prefix("\\frac{")?;
        let f = number_prefix(f)?.strip_prefix("}{")?;
        let f = number_prefix(f)?.strip_prefix('}')?;
        let end = text.len() - f.len();
        return Some((i, end, end));
    }
    None
}

/// `s` after a leading `-?\d+(?:[.,]\d+)?`.
fn number_prefix(s: &str) -> Option<&str> {
    fn digits(s: &str) -> Option<&str> {
        let n = s.find(|c: char| !is_digit(c)).unwrap_or(s.len());
        (n > 0).then(|| &s[n..])
    }
    let s = digits(s.strip_prefix('-').unwrap_or(s))?;
    match s.strip_prefix(['.', ',']).and_then(digits) {
        Some(after) => Some(after),
        None => Some(s),
    }
}

/// The match of a phrase pattern whose phrase (`final answer`, `answer`) is at `start..end`:
/// the lazy gap, then the environments, as the regex matches them.
fn phrase_at(text: &str, start: usize, end: usize, phrase: Phrase) -> Option<Hit<'_>> {
    let (from, gap) = match phrase {
        Phrase::FinalAnswerIs => (end, 100),
        Phrase::AnswerColon => (end + text[end..].starts_with(':').then_some(1)?, 50),
        Phrase::Answer => (end, 50),
    };
    let positions = text[from..]
        .char_indices()
        .map(|(k, _)| from + k)
        .chain(std::iter::once(text.len()))
        .take(gap + 1);
    for p in positions {
        let found = match phrase {
            Phrase::FinalAnswerIs => {
                // `\s+is\:?\s*`, then the environments (the bracket alternative from the last
                // white space character).
                if !text[p..].starts_with(char::is_whitespace) {
                    continue;
                }
                let q = skip_ws(text, p);
                if !text[q..].starts_with("is") {
                    continue;
                }
                let r = q + 2 + usize::from(text[q + 2..].starts_with(':'));
                let t = skip_ws(text, r);
                let at = |i: usize| {
                    let c = text[i..].chars().next()?;
                    envs_at(text, i, c, false)
                };
                at(t).or_else(|| {
                    let (w, _) = text[r..t].char_indices().next_back()?;
                    at(r + w)
                })
            }
            _ => text[p..]
                .chars()
                .next()
                .and_then(|c| envs_at(text, p, c, false)),
        };
        if let Some(hit) = found {
            return Some(Hit { start, ..hit });
        }
    }
    None
}

/// The end of the white space at byte `i`.
fn skip_ws(text: &str, i: usize) -> usize {
    text[i..]
        .char_indices()
        .find(|(_, c)| !c.is_whitespace())
        .map_or(text.len(), |(k, _)| i + k)
}

/// One environment with its `\s*` and optional percent suffix at `i`: the part and the end.
fn env_part(text: &str, i: usize, boxed: bool) -> Option<(Part<'_>, usize)> {
    let (cs, ce, end) = env_at(text, i, boxed)?;
    let k = skip_ws(text, end);
    let rest = &text[k..];
    let pct_len = if rest.starts_with("\\%") {
        2
    } else if rest.starts_with('%') {
        1
    } else if rest.starts_with("Percent") || rest.starts_with("percent") {
        7
    } else if rest.starts_with("Pct") || rest.starts_with("pct") {
        3
    } else {
        0
    };
    let part = Part {
        content: &text[cs..ce],
        pct: pct_len > 0,
        boxed: false,
    };
    Some((part, k + pct_len))
}

/// The match of an environment pattern at byte `i` (the character `c`): the first environment,
/// then up to [`MAX_NEXT`] more after `,`, `and` or `or`, as its regex (`latex_env` with `next`
/// or `next_boxed` in [`LATEX_RES`]) matches there. The boxed pattern also takes the white space
/// after its last environment.
fn envs_at(text: &str, i: usize, c: char, boxed: bool) -> Option<Hit<'_>> {
    let rest = &text[i + c.len_utf8()..];
    let opens = match c {
        '$' => true,
        '\\' => rest.starts_with(['[', '(']) || (!boxed && rest.starts_with("frac{")),
        '-' => !boxed && rest.starts_with("\\frac{"),
        c => c.is_whitespace() && rest.starts_with('['),
    };
    if !opens {
        return None;
    }
    let (first, mut end) = env_part(text, i, boxed)?;
    let mut parts = vec![first];
    for _ in 0..MAX_NEXT {
        let from = skip_ws(text, end);
        let rest = &text[from..];
        let seps = [",and", "and", ",or", "or", ","];
        let next = seps.iter().filter(|s| rest.starts_with(*s)).find_map(|s| {
            let sep_end = from + s.len();
            let k = skip_ws(text, sep_end);
            env_part(text, k, boxed).or_else(|| {
                // The bracket alternative starts at the last white space character.
                let (w, _) = text[sep_end..k].char_indices().next_back()?;
                env_part(text, sep_end + w, boxed)
            })
        });
        let Some((part, e)) = next else {
            if boxed {
                end = from;
            }
            break;
        };
        parts.push(part);
        end = e;
    }
    Some(Hit {
        start: i,
        end,
        found: Found::Parts(parts),
    })
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
    let any = Matcher::Regex;
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
            Matcher::Phrase(Phrase::FinalAnswerIs),
        ),
        (
            format!(r"(?i:answer):.{{0,50}}?{envs}"),
            100,
            ANSWER,
            Matcher::Phrase(Phrase::AnswerColon),
        ),
        (
            format!(r"(?i:answer).{{0,50}}?{envs}"),
            200,
            ANSWER,
            Matcher::Phrase(Phrase::Answer),
        ),
        (envs.clone(), 300, None, Matcher::Envs),
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
        Matcher::BoxedEnvs,
    ));
    v.push((
        r"(?P<first_latexBoxed>\\boxed\{.+\})".to_string(),
        50,
        None,
        Matcher::Boxed,
    ));
    v.into_iter()
        .map(|(p, prio, needs, matcher)| Pattern::new(&format!("(?s){p}"), prio, needs, matcher))
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
    let any = Matcher::Regex;
    [
        (
            format!(r"(?i:final answer is)\:?\s*{either}\.?\s?I hope"),
            0,
            FINAL_ANSWER,
            Matcher::Plain,
        ),
        (
            format!(r"(?i:final answer.{{0,100}}?)\s+is\:?{either}"),
            50,
            FINAL_ANSWER,
            Matcher::Plain,
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
        (expr_anch, 300, None, Matcher::Plain),
        (num_anch, 300, None, Matcher::Plain),
    ]
    .into_iter()
    .map(|(p, prio, needs, matcher)| Pattern::new(&p, prio, needs, matcher))
    .collect()
});

static COMPLEX: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(
        r"\\mathbb\{C\}|\\i\b|\bi\b|\\text\{i\}|\\mathrm\{i\}|\\imath\b|\\det|\\operatorname\{tr\}|\\operatorname\{rank\}|\\text\{rank\}|\\arg\{|\\Re\{|\\Im\{|\\operatorname\{Re\}|\\operatorname\{Im\}|\\text\{Re\}|\\text\{Im\}",
    )
    .expect("static regex")
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
    COMPLEX.is_match(s)
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

/// The LaTeX environments of a regex match, by [`LatexGroups`]: per environment, the first
/// non-empty content group.
fn caps_parts<'t>(caps: &Captures<'t>, groups: &LatexGroups) -> Vec<Part<'t>> {
    groups
        .iter()
        .filter_map(|(content, percent)| {
            let (m, boxed) = content.iter().find_map(|&(g, boxed)| {
                caps.get(g)
                    .filter(|m| !m.as_str().is_empty())
                    .map(|m| (m, boxed))
            })?;
            Some(Part {
                content: m.as_str(),
                pct: percent.is_some_and(|p| caps.get(p).is_some()),
                boxed,
            })
        })
        .collect()
}

fn extract_latex(parts: &[Part], budget: &Budget) -> Result<(Option<Expr>, String), Stop> {
    let mut exprs: Vec<Option<Expr>> = Vec::new();
    let mut strs: Vec<String> = Vec::new();
    for part in parts {
        let mode = if part.boxed {
            BoxedMode::Last
        } else {
            BoxedMode::All
        };
        let norm = normalize_latex(part.content, mode);
        let parsed = match parse_normalized(&norm, budget) {
            Ok(e) => Some(if part.pct { pct(e) } else { e }),
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

/// The value of a plain-expression match: `group(name)` gives its named groups (`names`).
fn extract_expr<'t>(
    names: &[&str],
    group: &dyn Fn(&str) -> Option<&'t str>,
    budget: &Budget,
) -> Result<(Option<Expr>, String), Stop> {
    let first = |p: &str| {
        names
            .iter()
            .filter(|n| n.starts_with(p))
            .find_map(|n| group(n).filter(|s| !s.is_empty()))
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
        if group("percent").is_some() {
            n = pct(n);
        }
        return Ok((Some(n), number_str));
    }
    let expr = group("expr").unwrap_or("");
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
        let mut matches: Vec<(Hit, &Pattern, Target)> = Vec::new();
        for (pat, _, t) in &group {
            for hit in pat.hits(text, budget)? {
                matches.push((hit, pat, *t));
            }
        }
        // Rightmost end first, then leftmost start; stable otherwise.
        matches.sort_by(|a, b| b.0.end.cmp(&a.0.end).then(a.0.start.cmp(&b.0.start)));
        for (hit, pat, t) in &matches {
            budget.check()?;
            let (value, fallback) = match (&hit.found, t) {
                (Found::Parts(parts), _) => extract_latex(parts, budget)?,
                (Found::Caps(caps), Target::Latex) => {
                    extract_latex(&caps_parts(caps, &pat.regex(budget).1), budget)?
                }
                (Found::Caps(caps), Target::Expr) => {
                    let re = &pat.regex(budget).0;
                    let names: Vec<&str> = re.capture_names().flatten().collect();
                    extract_expr(&names, &|n| caps.name(n).map(|m| m.as_str()), budget)?
                }
                (Found::Plain(caps), _) => {
                    let re = pat.plain.get().expect("built by the scan");
                    let names: Vec<&str> = re.capture_names().flatten().collect();
                    extract_expr(&names, &|n| caps.name(n).map(|m| m.as_str()), budget)?
                }
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

    /// The fast scan (literal prefilters, anchored attempts at the possible starts, the
    /// hand-written matchers) finds the matches of a plain scan of each pattern's regex, groups
    /// included, on the answers of the committed case files and on hand-made corner cases.
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
        // Hand-made texts for the boxed-environment matcher's corners: escaped closers,
        // newlines, `$$` inside `$`, brackets, separators, percent signs, digits before `$`.
        for t in [
            r"$\boxed{1}$ and $\boxed{2}$, $\boxed{3}$ or $\boxed{4}$ ,and $\boxed{5}$ % $\boxed{6}$",
            "$\\boxed{1}\n$ $$\\boxed{2}$$ $$ a \\$$ \\boxed{3} $$ 3$\\boxed{4}$ \\$\\boxed{5}$",
            r"\[ \boxed{x} \] \(\boxed{y}\) \( \boxed{z} \\) [\boxed{w}] , [\boxed{v}] x",
            "a [\\boxed{1}]\n, \t[\\boxed{2}] [\\boxed{[3]}] \\\\[\\boxed{4}\\]",
            r"$\boxed{}$ $\boxed{a}}$ $\boxed{\$}$ $\boxed{é}$ $ \boxed{1} $\% pct $\boxed{2}$Percentage",
            r"$\boxed{1}$,$\boxed{2}$,$\boxed{3}$,$\boxed{4}$,$\boxed{5}$,$\boxed{6}$,$\boxed{7}$",
            "$$\\boxed{1}$ $\\boxed{2}$$ \\($ \\boxed{3} $\\) ٣$\\boxed{4}$ \u{a0}[\\boxed{5}]\u{a0}",
            r"$1$, $2$ and $3$ or $4$,and $5$ ,or $6$ $7$ $$$$ $ $ \(\) \[\] [] [x] , [y] 2$3$",
            r"-\frac{1}{2} \frac{1.5}{2,3} \frac{-1}{2} \frac{1}{2.} \frac{٣}{4}% and \frac{1}{x}",
            "$1$\n, $2$ $$a$$ pct or $$b$$Percent, \\(c\\)\\%,\\[d\\] and -\\frac{3}{4}",
            "final answer: is $1$ Final Answer\n\nis \\[2\\] FINAL ANSWER is  [3] the final answer is:$4$",
            "answer:$3$ answer: x $4$, $5$ ANSWER \\frac{1}{2} answer is 7 anſwer $8$ answer=\\(9\\)",
            "The final answer, after a long detour of many many many many many many many many words, is $6$.",
        ] {
            texts.push(t.to_string());
        }
        let offsets = |t: &str, p: &[Part]| -> Vec<(usize, usize, bool, bool)> {
            p.iter()
                .map(|p| {
                    let at = p.content.as_ptr() as usize - t.as_ptr() as usize;
                    (at, p.content.len(), p.pct, p.boxed)
                })
                .collect()
        };
        let spans = |c: &Captures, re: &Regex| -> Vec<Option<(usize, usize)>> {
            (0..re.captures_len())
                .map(|g| c.get(g).map(|m| (m.start(), m.end())))
                .collect()
        };
        let mut compared = 0;
        for pat in LATEX_RES.iter().chain(EXPR_RES.iter()) {
            let plain = compile(&pat.source);
            let groups = latex_groups(&plain);
            for t in &texts {
                let fast = pat.hits(t, &budget).unwrap();
                let slow: Vec<Captures> = plain.captures_iter(t).map(Result::unwrap).collect();
                assert_eq!(fast.len(), slow.len(), "{} on {t:?}", pat.source);
                for (f, s) in fast.iter().zip(&slow) {
                    let m = s.get(0).unwrap();
                    assert_eq!(
                        (f.start, f.end),
                        (m.start(), m.end()),
                        "{} on {t:?}",
                        pat.source
                    );
                    match &f.found {
                        Found::Plain(c) => {
                            let fast: Vec<_> = (0..plain.captures_len())
                                .map(|g| c.get(g).map(|m| (m.start(), m.end())))
                                .collect();
                            assert_eq!(fast, spans(s, &plain), "{} on {t:?}", pat.source)
                        }
                        Found::Caps(c) => {
                            assert_eq!(
                                spans(c, &plain),
                                spans(s, &plain),
                                "{} on {t:?}",
                                pat.source
                            )
                        }
                        Found::Parts(p) => assert_eq!(
                            offsets(t, p),
                            offsets(t, &caps_parts(s, &groups)),
                            "{} on {t:?}",
                            pat.source
                        ),
                    }
                }
                compared += slow.len();
            }
        }
        assert!(compared > 1000, "{compared} matches compared");
    }
}
