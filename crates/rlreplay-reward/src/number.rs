//! The numeric-answer reward: the response's final number against a gold number, with no
//! evaluation of expressions.
//!
//! The math verifier evaluates the expression it extracts, so for a problem that *is* an
//! expression (`Calculate 86 - 1 =`) a response that restates it (`86 - 1 is \boxed{}.`) is graded
//! right: a policy trained on that reward learns to copy the question. This reward grades only a
//! number the response states.

use std::sync::LazyLock;

use regex::Regex;

use crate::normalize::{extract_boxed_content, BoxedMode};

/// A number literal: optional sign, digits (optionally grouped by commas of three), optional
/// decimals.
static NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"-?\d+(?:,\d{3})*(?:\.\d+)?").expect("static regex"));

/// The whole of a boxed answer as one number literal.
static WHOLE_NUMBER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[+-]?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$").expect("static regex")
});

/// A number literal in canonical form: no sign for zero, no `+`, no commas or spaces, no
/// trailing zero decimals (`1,200.50` -> `1200.5`); `None` when `s` is not one number.
pub fn canonical_number(s: &str) -> Option<String> {
    let s = s.trim().replace('\u{2212}', "-");
    if !WHOLE_NUMBER.is_match(&s) {
        return None;
    }
    let s: String = s
        .chars()
        .filter(|c| !matches!(c, ',' | '+') && !c.is_whitespace())
        .collect();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.as_str()),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    let mut out = String::new();
    let zero = int.is_empty() && frac.is_empty();
    if neg && !zero {
        out.push('-');
    }
    out.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    Some(out)
}

/// The number `response` answers, in canonical form ([`canonical_number`]): the content of its
/// last `\boxed{}` when that holds anything but braces, dollar signs and a final period (and then
/// only when it is one number), else the last number literal of the text.
pub fn number_answer(response: &str) -> Option<String> {
    if response.contains("\\boxed") || response.contains("\\fbox") {
        let boxed = extract_boxed_content(response, BoxedMode::Last);
        let inner: String = boxed
            .chars()
            .filter(|c| !matches!(c, '{' | '}' | '$'))
            .collect();
        let inner = inner.trim().trim_end_matches('.');
        if !inner.is_empty() {
            return canonical_number(inner);
        }
    }
    let text = response.replace('\u{2212}', "-");
    let last = NUMBER.find_iter(&text).last()?;
    canonical_number(last.as_str())
}

/// The score of one response against a gold number: 1.0 when [`number_answer`] equals the gold
/// number in canonical form, else 0.0; an error when the gold answer is not a number.
pub fn number_reward(response: &str, gold: &str) -> Result<f64, String> {
    let gold = canonical_number(gold)
        .ok_or_else(|| format!("the ground truth {gold:?} is not a number"))?;
    Ok(f64::from(u8::from(
        number_answer(response).as_deref() == Some(&gold),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        for (s, want) in [
            ("96", Some("96")),
            ("-42", Some("-42")),
            ("+7", Some("7")),
            ("1,200.50", Some("1200.5")),
            ("007", Some("7")),
            ("-0", Some("0")),
            ("0.0", Some("0")),
            ("\u{2212}3", Some("-3")),
            ("- 3", Some("-3")),
            ("86 - 1", None),
            ("1,20", None),
            ("12a", None),
            ("", None),
        ] {
            assert_eq!(canonical_number(s).as_deref(), want, "{s:?}");
        }
    }

    #[test]
    fn restating_the_expression_is_not_an_answer() {
        // The math verifier evaluates `86 - 1`; this reward does not.
        assert_eq!(number_reward("86 - 1 is \\boxed{{}}.", "85"), Ok(0.0));
        assert_eq!(number_reward("\\boxed{86 - 1}", "85"), Ok(0.0));
        assert_eq!(number_reward("Calculate 86 - 1 =", "85"), Ok(0.0));
        assert_eq!(number_reward("86 - 1 = 85", "85"), Ok(1.0));
        assert_eq!(
            number_reward("86 - 1 = 85. The answer is \\boxed{}.", "85"),
            Ok(1.0)
        );
    }

    #[test]
    fn boxed_answers_win_over_the_text() {
        assert_eq!(number_reward("5 + 91 = 97, so \\boxed{96}", "96"), Ok(1.0));
        assert_eq!(number_reward("5 + 91 = 96, so \\boxed{97}", "96"), Ok(0.0));
        assert_eq!(number_reward("$\\boxed{-42}$.", "-42"), Ok(1.0));
        assert_eq!(number_reward("\\boxed{1,200}", "1200"), Ok(1.0));
        assert_eq!(number_reward("0 - 42 = -42", "-42"), Ok(1.0));
        assert_eq!(number_reward("0 - 42 = 42", "-42"), Ok(0.0));
        assert_eq!(number_reward("no digits here", "1"), Ok(0.0));
        assert_eq!(number_reward("", "1"), Ok(0.0));
        assert!(number_reward("1", "x + 1").is_err());
    }
}
