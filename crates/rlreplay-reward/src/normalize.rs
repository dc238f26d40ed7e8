//! LaTeX normalisation before parsing: boxed extraction, basic command clean-up, units, small nits
//! and malformed operators, in the order and with the rules of latex2sympy2_extended 1.11.

use std::sync::LazyLock;

use fancy_regex::Regex as FRegex;
use regex::Regex;

use crate::expr::{Budget, Stop};

/// How `\boxed{}` contents are extracted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoxedMode {
    /// Every box, joined by commas.
    All,
    /// The last box, plus boxes just before it that are separated by a short separator.
    Last,
}

fn re(p: &str) -> Regex {
    Regex::new(p).expect("static regex")
}

fn fre(p: &str) -> FRegex {
    FRegex::new(p).expect("static regex")
}

static R_LEFT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\\m?left(\\\{|\{|\\\||\||\[|\(|\\rbracl|\\lgroup|\\lbrace|\\lbrack|\\vert|\\lvert|\\lceil|\\lfloor|\\vert|\\lvert|\\langle|\\llcorner|\\ulcorner)",
    )
});
static R_RIGHT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\\m?right(\\\}|\}|\\\||\||\]|\)|\\rbrack|\\rgroup|\\rbrace|\\rbrack|\\vert|\\rvert|\\rceil|\\rfloor|\\vert|\\rvert|\\rangle|\\lrcorner|\\urcorner)",
    )
});

const UNITS: &[&str] = &[
    "integerpoint",
    "feet",
    "sue",
    "digit",
    "pound",
    "meal",
    "edge",
    "student",
    "children ticket",
    "multiple",
    "east",
    "degree",
    "mph",
    "kmph",
    "ft",
    "m square",
    " m east",
    "sq m",
    "deg",
    "mile",
    "q .",
    "monkey",
    "prime",
    "ratio",
    "profit of rs",
    "rd",
    "o",
    "gm",
    "p . m",
    "lb",
    "tile",
    "per",
    "dm",
    "lt",
    "gain",
    "ab",
    "way",
    "west",
    "a .",
    "b .",
    "c .",
    "d .",
    "e .",
    "f .",
    "g .",
    "h .",
    "t",
    "h",
    "no change",
    "men",
    "soldier",
    "pie",
    "bc",
    "excess",
    "st",
    "inches",
    "noon",
    "cent",
    "by",
    "gal",
    "kmh",
    "c",
    "acre",
    "rise",
    "a . m",
    "th",
    "π r 2",
    "sq",
    "mark",
    "l",
    "toy",
    "coin",
    "sq . m",
    "gallon",
    "° f",
    "profit",
    "minw",
    "yr",
    "women",
    "am",
    "pm",
    "hr",
    "cu cm",
    "square",
    "v â € ™",
    "are",
    "rupee",
    "rounds",
    "cubic",
    "cc",
    "mtr",
    "s",
    "ohm",
    "number",
    "kmph",
    "day",
    "hour",
    "minute",
    "min",
    "second",
    "man",
    "woman",
    "sec",
    "cube",
    "mt",
    "sq inch",
    "mp",
    "∏ cm ³",
    "hectare",
    "more",
    "sec",
    "unit",
    "cu . m",
    "cm 2",
    "rs .",
    "rs",
    "kg",
    "g",
    "month",
    "km",
    "m",
    "cm",
    "mm",
    "apple",
    "liter",
    "loss",
    "yard",
    "pure",
    "year",
    "increase",
    "decrease",
    "d",
    "less",
    "Surface",
    "litre",
    "pi sq m",
    "s .",
    "metre",
    "meter",
    "inch",
];

static UNITS_RE: LazyLock<Regex> = LazyLock::new(|| {
    // The unit words are regular expressions (`q .` matches `q` and any character).
    re(&format!(
        r"(\d|\}}|\s)\s*(?:(?:{})(?:s|es)?)\s*$",
        UNITS.join("|")
    ))
});

static TO_REMOVE: LazyLock<FRegex> = LazyLock::new(|| {
    fre(r#"\G(?:\\mathrm\{th\}|\\!\s*|\\text\s*\{\s*\}|\\\$|\$|(?<!\\)["']|\\displaystyle)"#)
});

/// Where a match of [`TO_REMOVE`] can start.
fn to_remove_starts(c: char) -> bool {
    matches!(c, '\\' | '$' | '"' | '\'')
}

/// Where a match of [`TO_REPLACE_RE`] can start at byte `i` (the character `c`): what each of
/// its alternatives needs at its first characters (white space, an optional comma and more
/// white space before a word, `{`, a command).
fn to_replace_starts(text: &str, i: usize, c: char) -> bool {
    let rest = &text[i + c.len_utf8()..];
    let word = |s: &str| {
        let s = s.trim_start();
        s.starts_with("and")
            || s.starts_with("or")
            || s.starts_with('\\')
            || s.starts_with('{')
            || s.starts_with('p')
    };
    match c {
        '\\' => {
            rest.starts_with(['m', 't', 'd', 'c', 'l']) || rest.starts_with(char::is_whitespace)
        }
        '{' => rest.trim_start().starts_with(',') || rest.starts_with('.'),
        '~' => rest.starts_with('='),
        ',' => word(rest) || rest.trim_start().starts_with("\\text"),
        'a' => rest.starts_with("nd"),
        'o' => rest.starts_with('r'),
        'i' => rest.starts_with("nf"),
        'p' => rest.starts_with("ercent") || rest.starts_with("ct"),
        ' ' if rest.starts_with("sqrt") => true,
        c if c.is_whitespace() => rest.starts_with('.') || word(rest),
        _ => false,
    }
}

const TO_REPLACE: &[(&str, &str, &str)] = &[
    ("math", r"\\math(?:rm|it|bf)", r"\text"),
    ("text", r"\\text(?:normal|bf|it|rm)", r"\text"),
    ("frac", r"\\(?:d|t|c)frac", r"\frac"),
    ("decimal_space", r"\s\.", r" 0."),
    ("decimal_brace", r"\{\.", r"{0."),
    ("approx", r"\~\=", r"\approx"),
    ("comma", r"\s*\{\s*,\s*\}", r","),
    (
        "and_or",
        r"(?<![a-zA-Z])(,?\s*(?:and|or))(?![a-zA-Z])",
        r",",
    ),
    ("and_or_text", r"(,?\s*\\text\{\s*(?:and|or)\s*\})", r","),
    ("backslash_space", r"(?<!\\)\\\s", r" "),
    ("infinity", r"infinity", r"\infty"),
    ("dot", r",?(\\ldots)", r" "),
    ("percentage", r"\s*\bpercentage\b", r"\%"),
    ("percentage_in_text", r"\\text\{percentage\}", r"%"),
    ("percent", r"\s*\bpercent\b", r"\%"),
    ("percent_in_text", r"\\text\{percent\}", r"%"),
    ("pct", r"\s*\bpct\b", r"\%"),
    ("pct_in_text", r"\\text\{pct\}", r"%"),
    ("inf", r"((?<!\\)inf(?!inity))", r"\infty"),
    ("sqrt", r" sqrt", r"\sqrt"),
];

static TO_REPLACE_RE: LazyLock<FRegex> = LazyLock::new(|| {
    let alts: Vec<String> = TO_REPLACE
        .iter()
        .map(|(n, p, _)| format!("(?P<{n}>{p})"))
        .collect();
    fre(&format!(r"\G(?:{})", alts.join("|")))
});

static COMMAND_SLASH_FIX: LazyLock<FRegex> = LazyLock::new(|| fre(r"\G(?:\\\\(?=[a-zA-Z]))"));
static PERMUTATION: LazyLock<Regex> =
    LazyLock::new(|| re(r"\(([a-zA-Z0-9+\-*/\\ ]+?)\)_\{([a-zA-Z0-9+\-*/\\ ]+?)\}"));
static UNIT_SUPERSCRIPT: LazyLock<Regex> =
    LazyLock::new(|| re(r"(\\(?:text|mbox)\{.*?\})(\^\d|\{\^\d\})?$"));
static VALID_SEPARATOR: LazyLock<Regex> = LazyLock::new(|| re(r"\b(and|or)\b|,|;"));

/// The malformed-operator rewrites, each with text its matches contain.
static MALFORMED: LazyLock<Vec<(Regex, &'static str, &'static str)>> = LazyLock::new(|| {
    vec![
        (re(r"\^\s?\((.*?)\)"), "^", r"^{${1}}"),
        (re(r"sqrt\s?\((.*?)\)"), "sqrt", r"\sqrt{${1}}"),
        (re(r"\\frac\s?(\d)\s?(\d+)"), "\\frac", r"\frac{${1}}{${2}}"),
        (re(r"\\log_\s?(\d)\s?(\d+)"), "\\log_", r"\log_{${1}}{${2}}"),
        (
            re(r"\\frac\s?\{(.*?)\}\s?(\d)"),
            "\\frac",
            r"\frac{${1}}{${2}}",
        ),
        (
            re(r"\\frac\s?(\d)\s?\{(.*?)\}"),
            "\\frac",
            r"\frac{${1}}{${2}}",
        ),
        (re(r"\\sqrt\s?(\d)"), "\\sqrt", r"\sqrt{${1}}"),
    ]
});

/// Compiles the normalisation regexes now (they are built on first use).
pub(crate) fn compile_regexes() {
    LazyLock::force(&R_LEFT);
    LazyLock::force(&R_RIGHT);
    LazyLock::force(&UNITS_RE);
    LazyLock::force(&TO_REMOVE);
    LazyLock::force(&TO_REPLACE_RE);
    LazyLock::force(&COMMAND_SLASH_FIX);
    LazyLock::force(&PERMUTATION);
    LazyLock::force(&UNIT_SUPERSCRIPT);
    LazyLock::force(&VALID_SEPARATOR);
    LazyLock::force(&MALFORMED);
}

/// The matches of `re` (a regex that starts with `\G`) tried at each position where `start`
/// holds, left to right and non-overlapping: where `start` holds wherever a match can start,
/// the matches of a plain scan (`captures_iter`) of the regex without `\G`. Also whether the
/// regex gave up (backtracking limit); the matches before that are kept. With a budget, its
/// deadline is checked at each position tried.
fn anchored_matches<'t>(
    re: &FRegex,
    text: &'t str,
    budget: Option<&Budget>,
    mut start: impl FnMut(usize, char) -> bool,
) -> Result<(Vec<fancy_regex::Captures<'t>>, bool), Stop> {
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

/// Replaces every match of a lookaround regex (anchored by `\G`, tried where `start` holds: at
/// least wherever a match can start) by the result of `f`; the text unchanged when the regex
/// gives up.
fn fancy_replace_all(
    re: &FRegex,
    text: &str,
    start: impl FnMut(usize, char) -> bool,
    mut f: impl FnMut(&fancy_regex::Captures) -> String,
) -> String {
    let Ok((found, false)) = anchored_matches(re, text, None, start) else {
        return text.to_string();
    };
    if found.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for caps in &found {
        let m = caps.get(0).expect("group 0");
        out.push_str(&text[last..m.start()]);
        out.push_str(&f(caps));
        last = m.end();
    }
    out.push_str(&text[last..]);
    out
}

fn find_content_end(text: &[u8], open: usize, max_pos: usize) -> Option<usize> {
    let mut depth = 1usize;
    let mut i = open;
    while i + 1 < max_pos {
        i += 1;
        match text[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Extracts the contents of `\boxed{…}`/`\fbox{…}`, scanning from the right.
pub fn extract_boxed_content(text: &str, mode: BoxedMode) -> String {
    let bytes = text.as_bytes();
    let mut results: Vec<String> = Vec::new();
    let mut current = text.len();
    let mut last_boxed_start: Option<usize> = None;
    let mut max_pos = text.len();
    loop {
        let boxed = text[..current].rfind("\\boxed");
        let fbox = text[..current].rfind("\\fbox");
        let (start, cmd_len) = match (boxed, fbox) {
            (None, None) => break,
            (Some(b), None) => (b, 6),
            (None, Some(f)) => (f, 5),
            (Some(b), Some(f)) => {
                if b > f {
                    (b, 6)
                } else {
                    (f, 5)
                }
            }
        };
        let mut next = start + cmd_len;
        while next < max_pos {
            let c = text[next..].chars().next().expect("in bounds");
            if !c.is_whitespace() {
                break;
            }
            next += c.len_utf8();
        }
        if next >= max_pos {
            break;
        }
        if bytes[next] == b'{' {
            let Some(end) = find_content_end(bytes, next, max_pos) else {
                if results.is_empty() {
                    results.push(text[next..].to_string());
                }
                break;
            };
            let content = text[next + 1..end].trim().to_string();
            if mode == BoxedMode::Last {
                if let Some(lbs) = last_boxed_start {
                    let prev = results.last().map(String::as_str).unwrap_or("");
                    let between = if end < lbs { &text[end + 1..lbs] } else { "" };
                    let n = between.chars().count();
                    let ok =
                        n < 10 || (content != prev && n < 70 && VALID_SEPARATOR.is_match(between));
                    if !ok {
                        break;
                    }
                }
            }
            if results.last() != Some(&content) {
                results.push(content);
            }
            last_boxed_start = Some(start);
            max_pos = start;
        } else {
            if results.is_empty() {
                results.push(text[next..].to_string());
            }
            break;
        }
        current = start;
    }
    if results.is_empty() {
        return text.to_string();
    }
    results.reverse();
    results.join(",")
}

fn fix_fracs(text: &str) -> String {
    let mut parts = text.split("\\frac");
    let mut out = parts.next().unwrap_or("").to_string();
    for sub in parts {
        let sub = sub.trim_start();
        out.push_str("\\frac");
        let chars: Vec<char> = sub.chars().collect();
        if chars.first() == Some(&'{') {
            out.push_str(sub);
        } else if chars.len() < 2 {
            return text.to_string();
        } else {
            let (a, b) = (chars[0], chars[1]);
            let post: String = chars[2..].iter().collect();
            if b != '{' {
                out.push_str(&format!("{{{a}}}{{{b}}}{post}"));
            } else {
                out.push_str(&format!("{{{a}}}{b}{post}"));
            }
        }
    }
    out
}

fn canonical_int(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && s != "-0"
}

fn fix_a_slash_b(text: &str) -> String {
    let parts: Vec<&str> = text.split('/').collect();
    if parts.len() == 2 && canonical_int(parts[0]) && canonical_int(parts[1]) {
        return format!("\\frac{{{}}}{{{}}}", parts[0], parts[1]);
    }
    text.to_string()
}

fn fix_sqrt(text: &str) -> String {
    if !text.contains("\\sqrt") {
        return text.to_string();
    }
    let mut parts = text.split("\\sqrt");
    let mut out = parts.next().unwrap_or("").to_string();
    for split in parts {
        let split = split.trim_start();
        let mut chars = split.chars();
        match chars.next() {
            Some(c) if c != '{' && c != '[' => {
                out.push_str(&format!("\\sqrt{{{c}}}{}", chars.as_str()));
            }
            _ => {
                out.push_str("\\sqrt");
                out.push_str(split);
            }
        }
    }
    out
}

/// `text` with `from` replaced by `to`, without a copy when it does not occur.
fn replace_str(text: &mut String, from: &str, to: &str) {
    if text.contains(from) {
        *text = text.replace(from, to);
    }
}

/// `text` with every match of `re` replaced, without a copy when there is none; not run on a
/// text without `literal`, which every match contains.
fn replace_re(text: &mut String, re: &Regex, literal: &str, rep: &str) {
    if text.contains(literal) {
        if let std::borrow::Cow::Owned(s) = re.replace_all(text, rep) {
            *text = s;
        }
    }
}

/// Normalises a LaTeX answer with math-verify's default extraction settings (basic LaTeX, units,
/// nits and malformed operators on; `boxed` as given).
pub fn normalize_latex(text: &str, boxed: BoxedMode) -> String {
    let mut text = extract_boxed_content(text, boxed);
    // basic latex
    replace_str(&mut text, r"\mathrm{T}", "T");
    replace_str(&mut text, r"\mathrm{d}", "d");
    replace_str(&mut text, r"{\rm d}", "d");
    replace_str(&mut text, r"\left[\begin{matrix}", r"\begin{bmatrix}");
    replace_str(&mut text, r"\end{matrix}\right]", r"\end{bmatrix}");
    replace_re(&mut text, &R_LEFT, "left", "${1}");
    replace_re(&mut text, &R_RIGHT, "right", "${1}");
    replace_re(
        &mut text,
        &PERMUTATION,
        ")_{",
        r"\frac{(${1})!}{((${1})-(${2}))!}",
    );
    text = fancy_replace_all(
        &TO_REMOVE,
        &text,
        |_, c| to_remove_starts(c),
        |_| String::new(),
    );
    text = fancy_replace_all(
        &TO_REPLACE_RE,
        &text,
        |i, c| to_replace_starts(&text, i, c),
        |caps| {
            TO_REPLACE
                .iter()
                .find(|(n, _, _)| caps.name(n).is_some())
                .map(|(_, _, r)| (*r).to_string())
                .unwrap_or_default()
        },
    );
    if text.contains(['\n', '\t']) {
        text = text.replace(['\n', '\t'], " ");
    }
    if !text.contains("matrix") {
        let bytes = text.as_bytes().to_vec();
        let slash_pair = |i: usize, _| bytes[i] == b'\\' && bytes.get(i + 1) == Some(&b'\\');
        text = fancy_replace_all(&COMMAND_SLASH_FIX, &text, slash_pair, |_| "\\".to_string());
    }
    // units
    let t = UNIT_SUPERSCRIPT.replace(&text, "").trim().to_string();
    if !t.is_empty() && t != text {
        text = t;
    }
    for _ in 0..2 {
        let t = UNITS_RE.replace(&text, "${1}").into_owned();
        if !t.is_empty() && t != text {
            text = t;
        }
    }
    // nits
    if text.starts_with('.') {
        text.insert(0, '0');
    }
    if text == "0.5" {
        text = "\\frac{1}{2}".to_string();
    }
    // malformed operators
    for (re, literal, rep) in MALFORMED.iter() {
        replace_re(&mut text, re, literal, rep);
    }
    replace_str(&mut text, " sqrt", "\\sqrt");
    text = fix_sqrt(&text);
    text = fix_fracs(&text);
    fix_a_slash_b(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lookaround rewrites tried only where a match can start find the matches of a plain
    /// scan, on the answers of the committed case files and on strings made of their starts.
    #[test]
    fn anchored_rewrites_find_the_plain_matches() {
        let mut texts = vec![
            r#"a \\b \$ $ "x" 'y' \!  \text { } ,and or, {.5} .5 ~= \ldots infinity inf pct"#
                .to_string(),
            r" sqrt2 , \text{ or } { , } ,\ldots \dfrac12 \mathrm{x} \textbf{y} 5 percentage, 3\
            pct\ \cfrac ,  and\tor\u{a0}and x\u{3000}{.5}\~"
                .to_string(),
        ];
        for file in [
            include_str!("../tests/data/math_verify_real.jsonl"),
            include_str!("../tests/data/intent_labels.jsonl"),
        ] {
            for line in file.lines() {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                texts.push(v["gold"].as_str().unwrap().to_string());
                texts.push(v["pred"].as_str().unwrap().to_string());
            }
        }
        type Start = fn(&str, usize, char) -> bool;
        let starts: [(&FRegex, Start); 3] = [
            (&TO_REMOVE, |_, _, c| to_remove_starts(c)),
            (&TO_REPLACE_RE, to_replace_starts),
            (&COMMAND_SLASH_FIX, |t, i, _| t[i..].starts_with("\\\\")),
        ];
        for (re, start) in starts {
            let plain = fre(&re.as_str()[5..re.as_str().len() - 1]);
            for t in &texts {
                let fast: Vec<_> = anchored_matches(re, t, None, |i, c| start(t, i, c))
                    .unwrap()
                    .0
                    .iter()
                    .map(|c| (c.get(0).unwrap().range(), c.len()))
                    .collect();
                let slow: Vec<_> = plain
                    .captures_iter(t)
                    .map(|c| c.unwrap())
                    .map(|c| (c.get(0).unwrap().range(), c.len()))
                    .collect();
                assert_eq!(fast, slow, "{} on {t:?}", plain.as_str());
            }
        }
    }

    #[test]
    fn boxed_last_and_all() {
        assert_eq!(
            extract_boxed_content(r"\boxed{2}\boxed{3}", BoxedMode::Last),
            "2,3"
        );
        let far = r"\boxed{2} then after a long long long long digression we get \boxed{3}";
        assert_eq!(extract_boxed_content(far, BoxedMode::Last), "3");
        assert_eq!(extract_boxed_content(far, BoxedMode::All), "2,3");
        assert_eq!(
            extract_boxed_content(r"\boxed{\frac{1}{2}", BoxedMode::Last),
            r"{\frac{1}{2}"
        );
    }

    #[test]
    fn normalisation_rules() {
        assert_eq!(
            normalize_latex(r"\dfrac{1}{2}", BoxedMode::All),
            r"\frac{1}{2}"
        );
        assert_eq!(normalize_latex(r"15 \text{ cm}^2", BoxedMode::All), "15");
        assert_eq!(
            normalize_latex(r"\left( 1, 2 \right)", BoxedMode::All),
            "( 1, 2 )"
        );
        assert_eq!(normalize_latex("2/3", BoxedMode::All), r"\frac{2}{3}");
        assert_eq!(normalize_latex(r"\frac12", BoxedMode::All), r"\frac{1}{2}");
        assert_eq!(normalize_latex(r"\sqrt3", BoxedMode::All), r"\sqrt{3}");
        assert_eq!(normalize_latex("50 percent", BoxedMode::All), r"50\%");
        assert_eq!(normalize_latex(".5", BoxedMode::All), r"\frac{1}{2}");
    }
}
