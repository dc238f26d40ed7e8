//! Step selections such as `--steps 1..50`.

use std::fmt;
use std::str::FromStr;

/// An inclusive range of trainer steps: `A..B` selects steps A to B, both included (like the
/// published shards `step-0001` … `step-1000`); `A..` and `..B` leave one end open, `A` alone
/// selects one step, and `..` (or an empty string) selects every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepRange {
    /// First selected step, if bounded.
    pub start: Option<i64>,
    /// Last selected step (inclusive), if bounded.
    pub end: Option<i64>,
}

impl StepRange {
    /// Every step.
    pub const ALL: StepRange = StepRange {
        start: None,
        end: None,
    };

    /// Steps `start..=end`.
    pub fn new(start: i64, end: i64) -> Self {
        Self {
            start: Some(start),
            end: Some(end),
        }
    }

    /// Whether `step` is selected.
    pub fn contains(&self, step: i64) -> bool {
        self.start.is_none_or(|s| step >= s) && self.end.is_none_or(|e| step <= e)
    }
}

impl FromStr for StepRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let parse = |x: &str| -> Result<Option<i64>, String> {
            let x = x.trim();
            if x.is_empty() {
                return Ok(None);
            }
            x.parse::<i64>().map(Some).map_err(|_| {
                format!("invalid step `{x}` in step range `{s}` (expected A..B, A.., ..B or A)")
            })
        };
        let (start, end) = match s.split_once("..") {
            Some((a, b)) => (parse(a)?, parse(b.strip_prefix('=').unwrap_or(b))?),
            None => {
                let v = parse(s)?;
                (v, v)
            }
        };
        if let (Some(a), Some(b)) = (start, end) {
            if a > b {
                return Err(format!("empty step range `{s}`: {a} > {b}"));
            }
        }
        Ok(Self { start, end })
    }
}

impl fmt::Display for StepRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = self.start {
            write!(f, "{s}")?;
        }
        f.write_str("..")?;
        if let Some(e) = self.end {
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!("1..50".parse::<StepRange>().unwrap(), StepRange::new(1, 50));
        assert_eq!(
            "1..=50".parse::<StepRange>().unwrap(),
            StepRange::new(1, 50)
        );
        assert_eq!("7".parse::<StepRange>().unwrap(), StepRange::new(7, 7));
        assert_eq!("..".parse::<StepRange>().unwrap(), StepRange::ALL);
        assert_eq!("".parse::<StepRange>().unwrap(), StepRange::ALL);
        let r: StepRange = "3..".parse().unwrap();
        assert!(r.contains(3) && r.contains(1000) && !r.contains(2));
        let r: StepRange = "..3".parse().unwrap();
        assert!(r.contains(3) && !r.contains(4));
        assert!(StepRange::new(1, 50).contains(50));
        assert!("5..2".parse::<StepRange>().is_err());
        assert!("a..2".parse::<StepRange>().unwrap_err().contains("`a`"));
        assert_eq!(StepRange::new(1, 5).to_string(), "1..5");
    }
}
