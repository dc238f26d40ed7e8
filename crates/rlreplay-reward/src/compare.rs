//! Equivalence of a gold and a predicted expression, following math-verify's `sympy_expr_eq`:
//! assignments and equations, relations, sets/intervals/tuples, symbols, then numbers (6-decimal
//! rounding when a decimal literal is involved) and expressions (exact rational arithmetic, or
//! evaluation at several points for expressions with symbols).

use std::cmp::Ordering;
use std::collections::BTreeSet;

use num_rational::BigRational;
use num_traits::{One, Zero};

use crate::expr::{Budget, Complex, Expr, RelOp, SetOp, Stop, MAX_TREE_DEPTH};
use crate::latex::only_symbols;
use crate::sets;

/// Float comparisons round to this many decimals (math-verify's `float_rounding`).
const FLOAT_ROUNDING: i32 = 6;
/// Relative tolerance of a numeric zero test.
const REL_TOL: f64 = 1e-10;
/// Values substituted for free symbols, one column per symbol.
const POINTS: [[f64; 6]; 4] = [
    [
        0.731_891, 1.318_273, 2.117_463, 0.413_377, 1.733_161, 0.912_847,
    ],
    [
        1.271_149, 0.563_317, 1.891_237, 2.314_519, 0.649_713, 1.487_311,
    ],
    [
        2.413_307, 1.902_671, 0.381_553, 1.157_913, 2.671_119, 0.271_837,
    ],
    [
        0.517_283, 2.771_653, 1.333_717, 0.793_291, 1.117_371, 2.031_577,
    ],
];

/// True when `gold` and `pred` are equivalent answers.
pub fn expr_eq(gold: &Expr, pred: &Expr, b: &Budget) -> Result<bool, Stop> {
    b.check()?;
    let gold_assign = is_assignment(gold);
    let pred_assign = is_assignment(pred);
    let gold_eq = is_equation(gold);
    let pred_eq = is_equation(pred);
    let mut gold = if gold_assign {
        collapse_assignment(gold)
    } else {
        gold.clone()
    };
    let mut pred = if pred_assign {
        collapse_assignment(pred)
    } else {
        pred.clone()
    };
    if pred_eq && !gold_eq {
        pred = last_rhs(&pred);
    } else if gold_assign && !pred_eq {
        gold = last_rhs(&gold);
    }
    if is_relation(&gold) && is_set(&pred) {
        if let Some(s) = sets::solution_set(&gold, b)? {
            gold = s;
        } else if let Some(s) = relation_as_set(&gold, b)? {
            gold = s;
        }
    }
    if !matches!(gold, Expr::Float(f) if f.is_nan())
        && (gold == pred || canon(&gold) == canon(&pred))
    {
        return Ok(true);
    }
    if is_relation(&gold) && is_relation(&pred) {
        return compare_relations(&gold, &pred, b);
    }
    if is_set(&gold) || is_set(&pred) {
        return compare_sets(&gold, &pred, b);
    }
    if matches!(gold, Expr::Sym(_)) || matches!(pred, Expr::Sym(_)) {
        return Ok(compare_symbols(&gold, &pred));
    }
    // Numeric comparison and the symbolic fallback (`simplify(a - b) == 0`) in one: exact
    // rational arithmetic, or evaluation at sample points.
    numeric_eq(&gold, &pred, b)
}

fn is_relation(e: &Expr) -> bool {
    match e {
        Expr::Rel(..) => true,
        Expr::And(v) => !v.is_empty() && v.iter().all(|x| matches!(x, Expr::Rel(..))),
        _ => false,
    }
}

fn is_equation(e: &Expr) -> bool {
    match e {
        Expr::Rel(RelOp::Eq, ..) => true,
        Expr::And(v) => !v.is_empty() && v.iter().all(|x| matches!(x, Expr::Rel(RelOp::Eq, ..))),
        _ => false,
    }
}

fn is_assignment(e: &Expr) -> bool {
    match e {
        Expr::Rel(RelOp::Eq, l, _) => only_symbols(l),
        Expr::And(v) => {
            is_equation(e) && matches!(v.first(), Some(Expr::Rel(_, l, _)) if only_symbols(l))
        }
        _ => false,
    }
}

fn first_lhs(e: &Expr) -> Expr {
    match e {
        Expr::And(v) => v.first().map(first_lhs).unwrap_or_else(|| e.clone()),
        Expr::Rel(_, l, _) => (**l).clone(),
        _ => e.clone(),
    }
}

fn last_rhs(e: &Expr) -> Expr {
    match e {
        Expr::And(v) => v.last().map(last_rhs).unwrap_or_else(|| e.clone()),
        Expr::Rel(_, _, r) => (**r).clone(),
        _ => e.clone(),
    }
}

fn collapse_assignment(e: &Expr) -> Expr {
    Expr::Rel(RelOp::Eq, Box::new(first_lhs(e)), Box::new(last_rhs(e)))
}

fn is_set(e: &Expr) -> bool {
    matches!(
        e,
        Expr::Set(_) | Expr::Tuple(_) | Expr::Interval(..) | Expr::SetOp(..) | Expr::NamedSet(_)
    )
}

/// `x < 3` as `(-oo, 3)`, `x = 5` as `{5}`, `1 < x \le 2` as `(1, 2]`, `x \neq 2` as
/// `(-oo, 2) \cup (2, oo)`, for one variable (a symbol,
/// or a function application such as `f(x)`, which the parser reads as a product of symbols).
pub(crate) fn relation_as_set(e: &Expr, b: &Budget) -> Result<Option<Expr>, Stop> {
    let rels: Vec<&Expr> = match e {
        Expr::And(v) => v.iter().collect(),
        r => vec![r],
    };
    let is_var = |x: &Expr| match x {
        Expr::Sym(_) => true,
        Expr::Mul(v) => v.iter().all(|a| matches!(a, Expr::Sym(_))),
        _ => false,
    };
    let mut var: Option<&Expr> = None;
    let mut lo = (Expr::negate(Expr::Inf), true);
    let mut hi = (Expr::Inf, true);
    let mut point = None;
    let n = rels.len();
    for r in rels {
        let Expr::Rel(op, l, rr) = r else {
            return Ok(None);
        };
        let (v, op, bound) = match (&**l, &**rr) {
            (v, x) if is_var(v) && !has_symbols(x) => (v, *op, x.clone()),
            (x, v) if is_var(v) && !has_symbols(x) => (v, op.flipped(), x.clone()),
            _ => return Ok(None),
        };
        if var.is_some_and(|w| w != v) {
            return Ok(None);
        }
        var = Some(v);
        b.check()?;
        match op {
            RelOp::Lt => hi = (bound, true),
            RelOp::Le => hi = (bound, false),
            RelOp::Gt => lo = (bound, true),
            RelOp::Ge => lo = (bound, false),
            RelOp::Eq => point = Some(bound),
            // `x \neq a` alone is `(-oo, a) \cup (a, oo)`, as sympy's `as_set()` gives it.
            RelOp::Ne if n == 1 => {
                let below = Expr::Interval(Box::new(lo.0), Box::new(bound.clone()), true, true);
                let above = Expr::Interval(Box::new(bound), Box::new(hi.0), true, true);
                return Ok(Some(Expr::SetOp(
                    SetOp::Union,
                    Box::new(below),
                    Box::new(above),
                )));
            }
            RelOp::Ne => return Ok(None),
        }
    }
    if let Some(p) = point {
        return Ok(Some(Expr::Set(vec![p])));
    }
    Ok(Some(Expr::Interval(
        Box::new(lo.0),
        Box::new(hi.0),
        lo.1,
        hi.1,
    )))
}

fn has_symbols(e: &Expr) -> bool {
    let mut s = BTreeSet::new();
    e.symbols(&mut s);
    !s.is_empty()
}

fn compare_relations(gold: &Expr, pred: &Expr, b: &Budget) -> Result<bool, Stop> {
    match (gold, pred) {
        (Expr::And(g), Expr::And(p)) => {
            if g.len() != p.len() {
                return Ok(false);
            }
            for (x, y) in g.iter().zip(p) {
                if !compare_relations(x, y, b)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        (Expr::Rel(go, gl, gr), Expr::Rel(po, pl, pr)) => {
            let gd = Expr::minus((**gl).clone(), (**gr).clone());
            if go == po && expr_eq(&gd, &Expr::minus((**pl).clone(), (**pr).clone()), b)? {
                return Ok(true);
            }
            if go.flipped() == *po && expr_eq(&gd, &Expr::minus((**pr).clone(), (**pl).clone()), b)?
            {
                return Ok(true);
            }
            // Same solution set: for equations, the two sides' differences are proportional.
            if *go == RelOp::Eq && *po == RelOp::Eq {
                let pd = Expr::minus((**pl).clone(), (**pr).clone());
                return proportional(&gd, &pd, b);
            }
            Ok(false)
        }
        _ => Ok(false),
    }
}

/// `a = c·b` for a constant `c != 0` at every sample point (same zero set of linear forms).
fn proportional(a: &Expr, bb: &Expr, b: &Budget) -> Result<bool, Stop> {
    let mut syms = BTreeSet::new();
    a.symbols(&mut syms);
    bb.symbols(&mut syms);
    let (mut sa, mut sb) = (BTreeSet::new(), BTreeSet::new());
    a.symbols(&mut sa);
    bb.symbols(&mut sb);
    if sa != sb || syms.is_empty() {
        return Ok(false);
    }
    let syms: Vec<String> = syms.into_iter().collect();
    let mut ratio: Option<f64> = None;
    let mut valid = 0;
    for row in POINTS {
        let env = |s: &str| syms.iter().position(|x| x == s).map(|i| row[i % row.len()]);
        let (Ok(x), Ok(y)) = (a.eval(&env, b), bb.eval(&env, b)) else {
            continue;
        };
        if !x.is_finite() || !y.is_finite() || y == 0.0 {
            continue;
        }
        let r = x / y;
        if r == 0.0 {
            return Ok(false);
        }
        match ratio {
            None => ratio = Some(r),
            Some(r0) if close(r0, r) => {}
            Some(_) => return Ok(false),
        }
        valid += 1;
    }
    Ok(valid >= 2)
}

fn close(a: f64, b: f64) -> bool {
    if a == b {
        return true;
    }
    (a - b).abs() <= REL_TOL * a.abs().max(b.abs()).max(1.0)
}

fn sort_value(e: &Expr, b: &Budget) -> f64 {
    let e = if is_assignment(e) {
        last_rhs(e)
    } else {
        e.clone()
    };
    e.eval(&|_| None, b).unwrap_or(f64::NAN)
}

fn sorted(v: &[Expr], b: &Budget) -> Vec<Expr> {
    let mut keyed: Vec<(f64, String, Expr)> = v
        .iter()
        .map(|e| (sort_value(e, b), format!("{e:?}"), e.clone()))
        .collect();
    keyed.sort_by(|x, y| match (x.0.is_nan(), y.0.is_nan()) {
        (false, false) => {
            x.0.partial_cmp(&y.0)
                .unwrap_or(Ordering::Equal)
                .then(x.1.cmp(&y.1))
        }
        (false, true) => Ordering::Less,
        (true, false) => Ordering::Greater,
        (true, true) => x.1.cmp(&y.1),
    });
    keyed.into_iter().map(|k| k.2).collect()
}

/// The expression in a canonical form, as sympy's automatic evaluation would build it: nested
/// sums and products flattened, their rational literals folded, their terms and factors sorted,
/// set elements sorted and deduplicated. Canonical forms that are equal belong to expressions
/// sympy holds structurally equal (`x+11` and `11+x`, `F_k F_{n-k-1}` and `F_{n-k-1} F_k`); the
/// converse does not hold.
pub(crate) fn canon(e: &Expr) -> Expr {
    let sorted = |mut v: Vec<Expr>| {
        v.sort_by_cached_key(|x| format!("{x:?}"));
        v
    };
    match e {
        Expr::Add(v) | Expr::Mul(v) => {
            let add = matches!(e, Expr::Add(_));
            let mut terms = Vec::new();
            let mut num = if add {
                BigRational::zero()
            } else {
                BigRational::one()
            };
            let mut stack: Vec<Expr> = v.iter().map(canon).collect();
            stack.reverse();
            while let Some(t) = stack.pop() {
                match t {
                    Expr::Add(inner) if add => stack.extend(inner.into_iter().rev()),
                    Expr::Mul(inner) if !add => stack.extend(inner.into_iter().rev()),
                    Expr::Num(r) if add => num += r,
                    Expr::Num(r) => num *= r,
                    t => terms.push(t),
                }
            }
            if !add && num.is_zero() {
                return Expr::Num(num);
            }
            if terms.is_empty()
                || num
                    != if add {
                        BigRational::zero()
                    } else {
                        BigRational::one()
                    }
            {
                terms.push(Expr::Num(num));
            }
            if terms.len() == 1 {
                return terms.pop().expect("one");
            }
            let terms = sorted(terms);
            if add {
                Expr::Add(terms)
            } else {
                Expr::Mul(terms)
            }
        }
        Expr::Set(v) => {
            let mut v = sorted(v.iter().map(canon).collect());
            v.dedup();
            Expr::Set(v)
        }
        Expr::Tuple(v) => Expr::Tuple(v.iter().map(canon).collect()),
        Expr::And(v) => Expr::And(v.iter().map(canon).collect()),
        Expr::Func(n, v) => Expr::Func(n.clone(), v.iter().map(canon).collect()),
        Expr::Pow(a, x) => Expr::Pow(Box::new(canon(a)), Box::new(canon(x))),
        Expr::Rel(op, a, x) => Expr::Rel(*op, Box::new(canon(a)), Box::new(canon(x))),
        Expr::SetOp(op, a, x) => Expr::SetOp(*op, Box::new(canon(a)), Box::new(canon(x))),
        Expr::Interval(a, x, l, r) => {
            Expr::Interval(Box::new(canon(a)), Box::new(canon(x)), *l, *r)
        }
        Expr::Pct(a) => Expr::Pct(Box::new(canon(a))),
        Expr::Matrix(rows) => {
            Expr::Matrix(rows.iter().map(|r| r.iter().map(canon).collect()).collect())
        }
        other => other.clone(),
    }
}

fn dedup_set(v: &[Expr], b: &Budget) -> Result<Vec<Expr>, Stop> {
    let mut out: Vec<Expr> = Vec::new();
    for e in v {
        let mut dup = false;
        for o in &out {
            if o == e || canon(o) == canon(e) || (exact_eq(o, e, b)? == Some(true)) {
                dup = true;
                break;
            }
        }
        if !dup {
            out.push(e.clone());
        }
    }
    Ok(out)
}

fn exact_eq(a: &Expr, c: &Expr, b: &Budget) -> Result<Option<bool>, Stop> {
    if contains_float(a) || contains_float(c) {
        return Ok(None);
    }
    Ok(match (a.exact(b)?, c.exact(b)?) {
        (Some(x), Some(y)) => Some(x == y),
        _ => None,
    })
}

fn elementwise(g: &[Expr], p: &[Expr], b: &Budget) -> Result<bool, Stop> {
    if g.len() != p.len() {
        return Ok(false);
    }
    for (x, y) in g.iter().zip(p) {
        if !expr_eq(x, y, b)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn compare_sets(gold: &Expr, pred: &Expr, b: &Budget) -> Result<bool, Stop> {
    let wrap = |e: &Expr| {
        if is_set(e) {
            e.clone()
        } else {
            Expr::Set(vec![e.clone()])
        }
    };
    let (gs, ps) = (wrap(gold), wrap(pred));
    if sets::is_union_like(&gs) || sets::is_union_like(&ps) {
        if let Some(same) = sets::same_union(&gs, &ps, b, &|x, y| expr_eq(x, y, b))? {
            return Ok(same);
        }
    }
    // A tuple (or an open interval read as a pair) against a set compares with the set's
    // elements in written order (latex2sympy's `_unsorted_args`, duplicates included).
    let pair = |g: &Expr| match g {
        Expr::Tuple(g) => Some(g.clone()),
        Expr::Interval(l, h, true, true) => Some(vec![(**l).clone(), (**h).clone()]),
        _ => None,
    };
    if let (Some(g), Expr::Set(p)) = (pair(&gs), &ps) {
        if g.len() != p.len() || dedup_set(p, b)?.len() != p.len() {
            return Ok(false);
        }
        return elementwise(&g, p, b);
    }
    let (gs, ps) = match (gs, ps) {
        (Expr::Set(g), Expr::Set(p)) => {
            (Expr::Set(dedup_set(&g, b)?), Expr::Set(dedup_set(&p, b)?))
        }
        (Expr::Set(g), p) => (Expr::Set(dedup_set(&g, b)?), p),
        (g, Expr::Set(p)) => (g, Expr::Set(dedup_set(&p, b)?)),
        other => other,
    };
    match (&gs, &ps) {
        (Expr::Interval(gl, gh, glo, gho), Expr::Interval(pl, ph, plo, pho)) => {
            Ok(glo == plo && gho == pho && expr_eq(gl, pl, b)? && expr_eq(gh, ph, b)?)
        }
        (Expr::Set(g), Expr::Set(p)) => elementwise(&sorted(g, b), &sorted(p, b), b),
        (Expr::Set(g), Expr::Tuple(p)) => elementwise(&sorted(g, b), &sorted(p, b), b),
        (Expr::Tuple(g), Expr::Tuple(p)) => elementwise(g, p, b),
        (Expr::Interval(l, h, true, true), Expr::Tuple(p)) if p.len() == 2 => {
            elementwise(&[(**l).clone(), (**h).clone()], p, b)
        }
        (Expr::Set(g) | Expr::Tuple(g), Expr::Interval(l, h, true, true)) if g.len() == 2 => {
            let p = [(**l).clone(), (**h).clone()];
            match &gs {
                // A set against a pair sorts both (sympy's `ordered`).
                Expr::Set(_) => elementwise(&sorted(g, b), &sorted(&p, b), b),
                _ => elementwise(g, &p, b),
            }
        }
        (Expr::SetOp(go, ga, gb), Expr::SetOp(po, pa, pb)) => {
            Ok(go == po && compare_sets(ga, pa, b)? && compare_sets(gb, pb, b)?)
        }
        _ => Ok(false),
    }
}

/// sympy's `str()` of simple expressions (enough to compare a symbol with a number).
fn sympy_str(e: &Expr) -> String {
    match e {
        Expr::Sym(s) => s.clone(),
        Expr::Num(r) if r.is_integer() => r.numer().to_string(),
        Expr::Num(r) => format!("{}/{}", r.numer(), r.denom()),
        Expr::E => "E".into(),
        Expr::Pi => "pi".into(),
        Expr::Inf => "oo".into(),
        Expr::I => "I".into(),
        other => format!("{other:?}"),
    }
}

fn compare_symbols(gold: &Expr, pred: &Expr) -> bool {
    let is_e_sym = |x: &Expr| matches!(x, Expr::Sym(s) if s.to_lowercase() == "e");
    if (is_e_sym(gold) && *pred == Expr::E) || (is_e_sym(pred) && *gold == Expr::E) {
        return true;
    }
    let concat = |v: &[Expr]| -> Option<String> {
        v.iter()
            .map(|a| match a {
                Expr::Sym(s) => Some(s.clone()),
                Expr::E => Some("e".into()),
                _ => None,
            })
            .collect()
    };
    match (gold, pred) {
        (Expr::Sym(g), Expr::Mul(v)) => {
            if let Some(c) = concat(v) {
                return g.to_lowercase() == c.to_lowercase();
            }
        }
        (Expr::Mul(v), Expr::Sym(p)) => {
            if let Some(c) = concat(v) {
                return p.to_lowercase() == c.to_lowercase();
            }
        }
        (Expr::Sym(g), Expr::Sym(p)) => {
            let norm = |s: &str| {
                if s.chars().count() > 1 {
                    s.to_lowercase()
                } else {
                    s.to_string()
                }
            };
            return norm(g) == norm(p);
        }
        _ => {}
    }
    sympy_str(gold) == sympy_str(pred)
}

/// True when `e` holds a decimal literal.
pub(crate) fn contains_float(e: &Expr) -> bool {
    match e {
        Expr::Float(_) => true,
        Expr::Add(v) | Expr::Mul(v) | Expr::Func(_, v) => v.iter().any(contains_float),
        Expr::Pow(a, c) => contains_float(a) || contains_float(c),
        Expr::Pct(a) => contains_float(a),
        _ => false,
    }
}

/// A literal number, or a percentage of one.
fn atom(e: &Expr) -> Option<(&Expr, bool)> {
    match e {
        Expr::Num(_) | Expr::Float(_) => Some((e, false)),
        Expr::Pct(x) if matches!(**x, Expr::Num(_) | Expr::Float(_)) => Some((x, true)),
        _ => None,
    }
}

/// Most expression nodes in the entries of a multiplied-out matrix expression.
const MAX_MATRIX_NODES: usize = 100_000;

/// `Some(m)` when the entries of `m` are within [`MAX_TREE_DEPTH`] and have at most
/// [`MAX_MATRIX_NODES`] nodes in all; else `None`, counting the bound (each sum or product of
/// matrices nests the entries one or two levels deeper, and a product multiplies their sizes).
fn bounded_matrix(m: Vec<Vec<Expr>>, b: &Budget) -> Option<Vec<Vec<Expr>>> {
    let mut nodes = 0;
    for x in m.iter().flatten() {
        nodes += x.nodes_capped(MAX_MATRIX_NODES - nodes.min(MAX_MATRIX_NODES));
        if nodes > MAX_MATRIX_NODES || x.depth_capped(MAX_TREE_DEPTH) > MAX_TREE_DEPTH {
            b.bound();
            return None;
        }
    }
    Some(m)
}

/// The entries of a matrix expression: a matrix, or sums and products of matrices.
fn matrix_value(e: &Expr, b: &Budget) -> Option<Vec<Vec<Expr>>> {
    let matrix_value = |e: &Expr| matrix_value(e, b);
    match e {
        Expr::Matrix(m) => Some(m.clone()),
        Expr::Add(v) if v.len() > 1 => {
            let mut acc = matrix_value(&v[0])?;
            for t in &v[1..] {
                let m = matrix_value(t)?;
                if m.len() != acc.len() || m.iter().zip(&acc).any(|(x, y)| x.len() != y.len()) {
                    return None;
                }
                for (ra, rm) in acc.iter_mut().zip(m) {
                    for (a, x) in ra.iter_mut().zip(rm) {
                        *a = Expr::Add(vec![a.clone(), x]);
                    }
                }
                acc = bounded_matrix(acc, b)?;
            }
            Some(acc)
        }
        Expr::Mul(v) if v.len() > 1 => {
            let mut acc = matrix_value(&v[0])?;
            for t in &v[1..] {
                let m = matrix_value(t)?;
                let cols = m.first()?.len();
                if acc.first()?.len() != m.len() {
                    return None;
                }
                acc = acc
                    .iter()
                    .map(|row| {
                        (0..cols)
                            .map(|j| {
                                Expr::Add(
                                    row.iter()
                                        .zip(&m)
                                        .map(|(a, r)| Expr::Mul(vec![a.clone(), r[j].clone()]))
                                        .collect(),
                                )
                            })
                            .collect()
                    })
                    .collect();
                acc = bounded_matrix(acc, b)?;
            }
            Some(acc)
        }
        _ => None,
    }
}

fn round_to(x: f64, digits: i32) -> f64 {
    let s = 10f64.powi(digits);
    (x * s).round() / s
}

fn numeric_eq(gold: &Expr, pred: &Expr, b: &Budget) -> Result<bool, Stop> {
    if let (Some(g), Some(p)) = (matrix_value(gold, b), matrix_value(pred, b)) {
        if g.len() != p.len() || g.iter().zip(&p).any(|(x, y)| x.len() != y.len()) {
            return Ok(false);
        }
        for (x, y) in g.iter().flatten().zip(p.iter().flatten()) {
            if !expr_eq(x, y, b)? {
                return Ok(false);
            }
        }
        return Ok(true);
    }
    if !gold.is_scalar() || !pred.is_scalar() {
        return Ok(false);
    }
    let (ga, pa) = (atom(gold), atom(pred));
    if ga.is_some() || pa.is_some() {
        let is_float = |a: Option<(&Expr, bool)>| matches!(a, Some((Expr::Float(_), _)));
        if is_float(ga) || is_float(pa) {
            let none = |_: &str| None;
            return Ok(match (gold.eval(&none, b), pred.eval(&none, b)) {
                (Ok(x), Ok(y)) => round_to(x, FLOAT_ROUNDING) == round_to(y, FLOAT_ROUNDING),
                _ => false,
            });
        }
        if let (Some((Expr::Num(x), _)), Some((Expr::Num(y), _))) = (ga, pa) {
            if x.is_integer() && y.is_integer() {
                return Ok(x == y);
            }
        }
    }
    values_equal(gold, pred, b)
}

/// Mathematical equality: exact when both sides are rational, else numeric at sample points.
fn values_equal(gold: &Expr, pred: &Expr, b: &Budget) -> Result<bool, Stop> {
    if let Some(eq) = exact_eq(gold, pred, b)? {
        return Ok(eq);
    }
    let mut syms = BTreeSet::new();
    gold.symbols(&mut syms);
    pred.symbols(&mut syms);
    let syms: Vec<String> = syms.into_iter().collect();
    // Answers with the imaginary unit are evaluated as complex numbers.
    let complex = gold.has_i() || pred.has_i();
    let value = |e: &Expr, env: &dyn Fn(&str) -> Option<f64>| -> Result<Complex, Stop> {
        if complex {
            e.eval_complex(env, b)
        } else {
            e.eval(env, b).map(|re| Complex { re, im: 0.0 })
        }
    };
    let finite = |z: &Complex| z.re.is_finite() && z.im.is_finite();
    let near = |x: &Complex, y: &Complex| {
        let scale = x.re.hypot(x.im).max(y.re.hypot(y.im));
        close(x.re, y.re) && close(x.im, y.im)
            || (x.re - y.re).hypot(x.im - y.im) <= REL_TOL * scale.max(1.0)
    };
    if syms.is_empty() {
        let none = |_: &str| None;
        return Ok(match (value(gold, &none), value(pred, &none)) {
            // Undefined values (division by zero) are never equal, as sympy's `zoo` is not.
            (Ok(x), Ok(y)) => finite(&x) && finite(&y) && near(&x, &y),
            (Err(Stop::Timeout), _) | (_, Err(Stop::Timeout)) => return Err(Stop::Timeout),
            _ => false,
        });
    }
    let mut valid = 0;
    for row in POINTS {
        let env = |s: &str| syms.iter().position(|x| x == s).map(|i| row[i % row.len()]);
        match (value(gold, &env), value(pred, &env)) {
            (Ok(x), Ok(y)) if finite(&x) && finite(&y) => {
                if !near(&x, &y) {
                    return Ok(false);
                }
                valid += 1;
            }
            (Err(Stop::Timeout), _) | (_, Err(Stop::Timeout)) => return Err(Stop::Timeout),
            (Err(_), Err(_)) => {}
            _ => return Ok(false),
        }
    }
    Ok(valid >= 2)
}
