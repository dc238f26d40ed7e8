//! Sets of real numbers as unions of intervals: the solution set of a one-variable relation (what
//! sympy's `as_set()` gives for `x < 3`, `1 \le |z| \le \frac32`, `|x-1| > 2`), and the
//! comparison of unions of intervals (`[1,2] \cup [2,3]` is `[1,3]`, `\mathbb{R}` is
//! `(-\infty, \infty)`).

use num_rational::BigRational;
use num_traits::{One, Signed, Zero};

use crate::expr::{Budget, Expr, RelOp, SetOp, Stop};

/// One interval with numeric ends (their values order and merge the intervals).
#[derive(Debug, Clone)]
struct Span {
    lo: Expr,
    hi: Expr,
    lo_open: bool,
    hi_open: bool,
    lo_v: f64,
    hi_v: f64,
}

fn neg_inf() -> Expr {
    Expr::negate(Expr::Inf)
}

fn value(e: &Expr, b: &Budget) -> Result<Option<f64>, Stop> {
    match e.eval(&|_| None, b) {
        Ok(v) if !v.is_nan() => Ok(Some(v)),
        Ok(_) | Err(Stop::Fail) => Ok(None),
        Err(Stop::Timeout) => Err(Stop::Timeout),
    }
}

impl Span {
    /// The interval, `Ok(None)` when an end is not a number; an empty interval is `Some(None)`.
    fn new(
        lo: Expr,
        lo_open: bool,
        hi: Expr,
        hi_open: bool,
        b: &Budget,
    ) -> Result<Option<Option<Span>>, Stop> {
        let (Some(lo_v), Some(hi_v)) = (value(&lo, b)?, value(&hi, b)?) else {
            return Ok(None);
        };
        // Infinite ends are open.
        let lo_open = lo_open || lo_v.is_infinite();
        let hi_open = hi_open || hi_v.is_infinite();
        if lo_v > hi_v || (lo_v == hi_v && (lo_open || hi_open)) {
            return Ok(Some(None));
        }
        Ok(Some(Some(Span {
            lo,
            hi,
            lo_open,
            hi_open,
            lo_v,
            hi_v,
        })))
    }

    fn everything() -> Span {
        Span {
            lo: neg_inf(),
            hi: Expr::Inf,
            lo_open: true,
            hi_open: true,
            lo_v: f64::NEG_INFINITY,
            hi_v: f64::INFINITY,
        }
    }
}

/// Sorts and merges overlapping or touching intervals.
fn normalize(mut v: Vec<Span>) -> Vec<Span> {
    v.sort_by(|a, c| {
        a.lo_v
            .total_cmp(&c.lo_v)
            .then((a.lo_open as u8).cmp(&(c.lo_open as u8)))
    });
    let mut out: Vec<Span> = Vec::new();
    for s in v {
        if let Some(last) = out.last_mut() {
            let touches =
                s.lo_v < last.hi_v || (s.lo_v == last.hi_v && !(s.lo_open && last.hi_open));
            if touches {
                if s.hi_v > last.hi_v || (s.hi_v == last.hi_v && !s.hi_open) {
                    last.hi = s.hi;
                    last.hi_v = s.hi_v;
                    last.hi_open = s.hi_open;
                }
                continue;
            }
        }
        out.push(s);
    }
    out
}

fn intersect(a: &[Span], c: &[Span]) -> Vec<Span> {
    let mut out = Vec::new();
    for x in a {
        for y in c {
            let (lo, lo_v, lo_open) = if x.lo_v > y.lo_v || (x.lo_v == y.lo_v && x.lo_open) {
                (&x.lo, x.lo_v, x.lo_open)
            } else {
                (&y.lo, y.lo_v, y.lo_open)
            };
            let (hi, hi_v, hi_open) = if x.hi_v < y.hi_v || (x.hi_v == y.hi_v && x.hi_open) {
                (&x.hi, x.hi_v, x.hi_open)
            } else {
                (&y.hi, y.hi_v, y.hi_open)
            };
            if lo_v < hi_v || (lo_v == hi_v && !lo_open && !hi_open) {
                out.push(Span {
                    lo: lo.clone(),
                    hi: hi.clone(),
                    lo_open,
                    hi_open,
                    lo_v,
                    hi_v,
                });
            }
        }
    }
    normalize(out)
}

/// The intervals of an interval, a union of intervals, `\mathbb{R}` or `\emptyset`.
fn spans(e: &Expr, b: &Budget) -> Result<Option<Vec<Span>>, Stop> {
    Ok(match e {
        Expr::Interval(lo, hi, lo_open, hi_open) => {
            Span::new((**lo).clone(), *lo_open, (**hi).clone(), *hi_open, b)?
                .map(|s| s.into_iter().collect())
        }
        Expr::SetOp(SetOp::Union, x, y) => match (spans(x, b)?, spans(y, b)?) {
            (Some(mut x), Some(y)) => {
                x.extend(y);
                Some(normalize(x))
            }
            _ => None,
        },
        Expr::SetOp(op @ (SetOp::Intersection | SetOp::Minus), x, y) => {
            match (spans(x, b)?, spans_or_points(y, b)?) {
                (Some(x), Some(y)) if *op == SetOp::Intersection => Some(intersect(&x, &y)),
                (Some(x), Some(y)) => Some(intersect(&x, &complement(&y))),
                _ => None,
            }
        }
        Expr::NamedSet("reals") => Some(vec![Span::everything()]),
        Expr::NamedSet("empty") => Some(Vec::new()),
        _ => None,
    })
}

/// [`spans`], or a finite set of numbers as one-point intervals (what `\mathbb{R} \setminus
/// \{2\}` removes).
fn spans_or_points(e: &Expr, b: &Budget) -> Result<Option<Vec<Span>>, Stop> {
    let Expr::Set(v) = e else {
        return spans(e, b);
    };
    let mut out = Vec::new();
    for x in v {
        match Span::new(x.clone(), false, x.clone(), false, b)? {
            Some(Some(s)) if s.lo_v.is_finite() => out.push(s),
            _ => return Ok(None),
        }
    }
    Ok(Some(normalize(out)))
}

/// The real numbers outside merged intervals.
fn complement(v: &[Span]) -> Vec<Span> {
    let mut out = Vec::new();
    let (mut lo, mut lo_v, mut lo_open) = (neg_inf(), f64::NEG_INFINITY, true);
    for s in v {
        let hi_open = !s.lo_open;
        if lo_v < s.lo_v || (lo_v == s.lo_v && !lo_open && !hi_open) {
            out.push(Span {
                lo: lo.clone(),
                hi: s.lo.clone(),
                lo_open,
                hi_open,
                lo_v,
                hi_v: s.lo_v,
            });
        }
        (lo, lo_v, lo_open) = (s.hi.clone(), s.hi_v, !s.hi_open);
    }
    if lo_v < f64::INFINITY {
        out.push(Span {
            lo,
            hi: Expr::Inf,
            lo_open,
            hi_open: true,
            lo_v,
            hi_v: f64::INFINITY,
        });
    }
    out
}

/// True when `e` is a union of intervals written as such (not a single interval): a set
/// operation, `\mathbb{R}` or `\emptyset`.
pub(crate) fn is_union_like(e: &Expr) -> bool {
    matches!(
        e,
        Expr::SetOp(..) | Expr::NamedSet("reals") | Expr::NamedSet("empty")
    )
}

/// Compares two unions of intervals as sets: the same merged intervals, with the same open and
/// closed ends and equal end points (by `ends_eq`). `None` when either side is not one.
pub(crate) fn same_union(
    gold: &Expr,
    pred: &Expr,
    b: &Budget,
    ends_eq: &dyn Fn(&Expr, &Expr) -> Result<bool, Stop>,
) -> Result<Option<bool>, Stop> {
    let (Some(g), Some(p)) = (spans(gold, b)?, spans(pred, b)?) else {
        return Ok(None);
    };
    if g.len() != p.len() {
        return Ok(Some(false));
    }
    for (x, y) in g.iter().zip(&p) {
        if x.lo_open != y.lo_open || x.hi_open != y.hi_open {
            return Ok(Some(false));
        }
        let lo_eq = (x.lo_v.is_infinite() && x.lo_v == y.lo_v) || ends_eq(&x.lo, &y.lo)?;
        let hi_eq = (x.hi_v.is_infinite() && x.hi_v == y.hi_v) || ends_eq(&x.hi, &y.hi)?;
        if !lo_eq || !hi_eq {
            return Ok(Some(false));
        }
    }
    Ok(Some(true))
}

/// The union of sets of reals no two of which meet (what alternatives joined by `or` describe:
/// `x < -1` or `x > 2`), `None` when one is not a union of intervals or a finite set of numbers,
/// or when two meet.
pub(crate) fn disjoint_union(parts: &[Expr], b: &Budget) -> Result<Option<Expr>, Stop> {
    let mut each = Vec::with_capacity(parts.len());
    for p in parts {
        let Some(s) = spans_or_points(p, b)? else {
            return Ok(None);
        };
        if each
            .iter()
            .any(|t: &Vec<Span>| !intersect(t, &s).is_empty())
        {
            return Ok(None);
        }
        each.push(s);
    }
    Ok(Some(to_expr(normalize(each.concat()))))
}

/// `a·x + c` with rational `a`, `c` when `e` is linear in the symbol `x`.
fn linear(e: &Expr, x: &str) -> Option<(BigRational, BigRational)> {
    match e {
        Expr::Sym(s) if s == x => Some((BigRational::one(), BigRational::zero())),
        Expr::Num(r) => Some((BigRational::zero(), r.clone())),
        Expr::Add(v) => v
            .iter()
            .try_fold((BigRational::zero(), BigRational::zero()), |(a, c), t| {
                linear(t, x).map(|(ta, tc)| (a + ta, c + tc))
            }),
        Expr::Mul(v) => {
            let mut acc = (BigRational::zero(), BigRational::one());
            let mut has_x = false;
            for t in v {
                let (ta, tc) = linear(t, x)?;
                if !ta.is_zero() {
                    if has_x {
                        return None;
                    }
                    has_x = true;
                    acc = (acc.1.clone() * ta, acc.1 * tc);
                } else if has_x {
                    acc = (acc.0 * tc.clone(), BigRational::zero());
                } else {
                    acc.1 *= tc;
                }
            }
            Some(if has_x {
                acc
            } else {
                (BigRational::zero(), acc.1)
            })
        }
        _ => None,
    }
}

/// `(k - c) / a`, exact when `k` is a rational literal.
fn solve_for(k: &Expr, a: &BigRational, c: &BigRational) -> Expr {
    match k {
        Expr::Num(r) => Expr::Num((r - c) / a),
        _ if c.is_zero() && a.is_one() => k.clone(),
        _ => Expr::Mul(vec![
            Expr::Add(vec![k.clone(), Expr::Num(-c.clone())]),
            Expr::Num(a.recip()),
        ]),
    }
}

/// The solutions in `x` of `u op k`, `u = a·x + c` (`a != 0`).
fn solve_linear(
    a: &BigRational,
    c: &BigRational,
    op: RelOp,
    k: &Expr,
    b: &Budget,
) -> Result<Option<Vec<Span>>, Stop> {
    let op = if a.is_negative() { op.flipped() } else { op };
    let p = solve_for(k, a, c);
    let (lo, lo_open, hi, hi_open) = match op {
        RelOp::Lt => (neg_inf(), true, p, true),
        RelOp::Le => (neg_inf(), true, p, false),
        RelOp::Gt => (p, true, Expr::Inf, true),
        RelOp::Ge => (p, false, Expr::Inf, true),
        RelOp::Eq => (p.clone(), false, p, false),
        RelOp::Ne => return Ok(None),
    };
    Ok(Span::new(lo, lo_open, hi, hi_open, b)?.map(|s| s.into_iter().collect()))
}

/// The solutions in `x` of `|u| op k`, `u = a·x + c` (`a != 0`).
fn solve_abs(
    a: &BigRational,
    c: &BigRational,
    op: RelOp,
    k: &Expr,
    b: &Budget,
) -> Result<Option<Vec<Span>>, Stop> {
    let minus_k = Expr::negate(k.clone());
    let parts = match op {
        RelOp::Lt | RelOp::Le => {
            let strict = op == RelOp::Lt;
            let (Some(below), Some(above)) = (
                solve_linear(a, c, if strict { RelOp::Lt } else { RelOp::Le }, k, b)?,
                solve_linear(
                    a,
                    c,
                    if strict { RelOp::Gt } else { RelOp::Ge },
                    &minus_k,
                    b,
                )?,
            ) else {
                return Ok(None);
            };
            intersect(&below, &above)
        }
        RelOp::Gt | RelOp::Ge | RelOp::Eq => {
            let (lower, upper) = match op {
                RelOp::Gt => (RelOp::Lt, RelOp::Gt),
                RelOp::Ge => (RelOp::Le, RelOp::Ge),
                _ => (RelOp::Eq, RelOp::Eq),
            };
            let (Some(mut x), Some(y)) = (
                solve_linear(a, c, lower, &minus_k, b)?,
                solve_linear(a, c, upper, k, b)?,
            ) else {
                return Ok(None);
            };
            if value(k, b)?.is_some_and(|v| v < 0.0) && op == RelOp::Eq {
                return Ok(Some(Vec::new()));
            }
            x.extend(y);
            normalize(x)
        }
        RelOp::Ne => return Ok(None),
    };
    Ok(Some(parts))
}

/// The solution set of a relation or chain of relations in one symbol, when every relation is
/// linear in it or compares `|a·x + c|` with a constant: an interval, a union of intervals, or
/// `\emptyset`. `None` for anything else (other shapes keep their own handling).
pub(crate) fn solution_set(e: &Expr, b: &Budget) -> Result<Option<Expr>, Stop> {
    solve(e, false, b)
}

/// The solution set of a relation or chain of relations in one symbol, every relation linear in
/// it or comparing `|a·x + c|` with a constant, plain bounds included (the `intent` mode reads
/// `-1 < x < 3` against `|x-1| < 2` this way).
pub(crate) fn real_solution_set(e: &Expr, b: &Budget) -> Result<Option<Expr>, Stop> {
    solve(e, true, b)
}

fn solve(e: &Expr, plain: bool, b: &Budget) -> Result<Option<Expr>, Stop> {
    let rels: Vec<&Expr> = match e {
        Expr::And(v) => v.iter().collect(),
        r => vec![r],
    };
    let mut var: Option<String> = None;
    let mut acc = vec![Span::everything()];
    let mut any_abs = false;
    for r in rels {
        let Expr::Rel(op, l, rr) = r else {
            return Ok(None);
        };
        let constant = |x: &Expr| {
            let mut s = std::collections::BTreeSet::new();
            x.symbols(&mut s);
            s.is_empty()
        };
        let (f, op, k) = if constant(rr) {
            (&**l, *op, &**rr)
        } else if constant(l) {
            (&**rr, op.flipped(), &**l)
        } else {
            return Ok(None);
        };
        let mut s = std::collections::BTreeSet::new();
        f.symbols(&mut s);
        if s.len() != 1 {
            return Ok(None);
        }
        let x = s.into_iter().next().expect("one symbol");
        if var.as_ref().is_some_and(|v| *v != x) {
            return Ok(None);
        }
        let part = match f {
            Expr::Func(name, args) if name == "abs" && args.len() == 1 => {
                any_abs = true;
                match linear(&args[0], &x) {
                    Some((a, c)) if !a.is_zero() => solve_abs(&a, &c, op, k, b)?,
                    _ => None,
                }
            }
            f => match linear(f, &x) {
                Some((a, c)) if !a.is_zero() => solve_linear(&a, &c, op, k, b)?,
                _ => None,
            },
        };
        let Some(part) = part else {
            return Ok(None);
        };
        var = Some(x);
        acc = intersect(&acc, &part);
    }
    if !any_abs && !plain {
        // Plain bounds on a variable keep their original ends (see `relation_as_set`).
        return Ok(None);
    }
    Ok(Some(to_expr(acc)))
}

fn to_expr(v: Vec<Span>) -> Expr {
    if !v.is_empty() && v.iter().all(|s| s.lo_v == s.hi_v) {
        return Expr::Set(v.into_iter().map(|s| s.lo).collect());
    }
    let mut it = v.into_iter().map(|s| {
        if s.lo_v == s.hi_v {
            Expr::Set(vec![s.lo])
        } else {
            Expr::Interval(Box::new(s.lo), Box::new(s.hi), s.lo_open, s.hi_open)
        }
    });
    let Some(first) = it.next() else {
        return Expr::NamedSet("empty");
    };
    it.fold(first, |acc, x| {
        Expr::SetOp(SetOp::Union, Box::new(acc), Box::new(x))
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::latex::parse_latex;

    fn budget() -> Budget {
        Budget::new(Instant::now() + Duration::from_secs(5))
    }

    fn set_of(relation: &str) -> Option<Vec<(f64, bool, f64, bool)>> {
        let b = budget();
        let e = parse_latex(relation, false, &b).unwrap();
        let s = solution_set(&e, &b).unwrap()?;
        let v = spans(&s, &b).unwrap()?;
        Some(
            v.iter()
                .map(|s| (s.lo_v, s.lo_open, s.hi_v, s.hi_open))
                .collect(),
        )
    }

    #[test]
    fn absolute_value_relations() {
        let inf = f64::INFINITY;
        assert_eq!(set_of("|x| < 2"), Some(vec![(-2.0, true, 2.0, true)]));
        assert_eq!(
            set_of("|x-1| \\le 3"),
            Some(vec![(-2.0, false, 4.0, false)])
        );
        assert_eq!(
            set_of("|2x+1| \\ge 5"),
            Some(vec![(-inf, true, -3.0, false), (2.0, false, inf, true)])
        );
        assert_eq!(
            set_of("1 \\le |z| \\le \\frac{3}{2}"),
            Some(vec![(-1.5, false, -1.0, false), (1.0, false, 1.5, false)])
        );
        assert_eq!(set_of("|x| > -1"), Some(vec![(-inf, true, inf, true)]));
        assert_eq!(set_of("|x| < -1"), Some(vec![]));
        // Plain bounds keep their own handling.
        assert_eq!(set_of("x < 3"), None);
    }

    #[test]
    fn unions_compare_as_sets() {
        let b = budget();
        let p = |s: &str| parse_latex(s, false, &b).unwrap();
        let eq = |x: &Expr, y: &Expr| Ok(x == y);
        let same = |g: &str, q: &str| same_union(&p(g), &p(q), &b, &eq).unwrap();
        assert_eq!(same("[1,2] \\cup [2,3]", "[1,3]"), Some(true));
        assert_eq!(same("(1,2) \\cup (2,3)", "(1,3)"), Some(false));
        assert_eq!(same("\\mathbb{R}", "(-\\infty, \\infty)"), Some(true));
        assert_eq!(same("\\{1\\}", "[1,1]"), None);
        // Differences and intersections with intervals and finite sets of numbers.
        let r2 = "(-\\infty,2) \\cup (2,\\infty)";
        assert_eq!(same(r2, "\\mathbb{R} \\setminus \\{2\\}"), Some(true));
        assert_eq!(same(r2, "\\mathbb{R} \\setminus \\{3\\}"), Some(false));
        assert_eq!(same("[0,1)", "[0,2] \\setminus [1,2]"), Some(true));
        assert_eq!(same("[1,2]", "[0,2] \\cap [1,3]"), Some(true));
        assert_eq!(same(r2, "\\mathbb{R} \\setminus \\{x\\}"), None);
    }

    #[test]
    fn disjoint_unions() {
        let b = budget();
        let p = |s: &str| parse_latex(s, false, &b).unwrap();
        let eq = |x: &Expr, y: &Expr| Ok(x == y);
        let union = |parts: &[&str]| {
            let parts: Vec<Expr> = parts.iter().map(|s| p(s)).collect();
            disjoint_union(&parts, &b).unwrap()
        };
        let u = union(&["(-\\infty,-1)", "(2,\\infty)"]).unwrap();
        let want = p("(-\\infty,-1) \\cup (2,\\infty)");
        assert_eq!(same_union(&u, &want, &b, &eq).unwrap(), Some(true));
        assert!(union(&["(-\\infty,3)", "(1,\\infty)"]).is_none());
        assert!(union(&["(-\\infty,1]", "[1,\\infty)"]).is_none());
        assert!(union(&["\\{1\\}", "(2,3)"]).is_some());
    }
}
