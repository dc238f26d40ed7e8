//! A recursive-descent parser from (normalised) LaTeX to [`Expr`], following the conventions of
//! latex2sympy2_extended: lower-cased symbols, `e` as Euler's number, comma lists as sets, `(a,b)`
//! as an open interval (a tuple when `b <= a`), `x \in S` as an equation, `\approx` keeping the
//! exact side, `^\circ` ignored, mixed fractions, matrices.

use std::sync::LazyLock;

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Zero};
use regex::Regex;

use crate::expr::{Budget, Expr, RelOp, SetOp, Stop, MAX_TREE_DEPTH};

/// Deepest recursion of the parser (bounds its stack on adversarial input).
const MAX_DEPTH: usize = 200;
/// Longest integer literal accepted, in digits (Python's default `int` conversion limit).
const MAX_DIGITS: usize = 4300;

static COMMA_NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*-?\d{1,3}(,\d{3})+(\.\d+)?\s*$").expect("static regex"));

const GREEK: &[&str] = &[
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "varrho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Upsilon",
    "Phi",
    "Psi",
    "Omega",
];

const FUNCS: &[(&str, &str)] = &[
    ("sin", "sin"),
    ("cos", "cos"),
    ("tan", "tan"),
    ("cot", "cot"),
    ("sec", "sec"),
    ("csc", "csc"),
    ("arcsin", "asin"),
    ("arccos", "acos"),
    ("arctan", "atan"),
    ("sinh", "sinh"),
    ("cosh", "cosh"),
    ("tanh", "tanh"),
    ("ln", "ln"),
    ("exp", "exp"),
];

/// Command names the parser knows besides [`FUNCS`] and [`GREEK`]. As in latex2sympy's lexer, a
/// known command is recognised even when letters follow it (`\cotx` is `\cot x`, `\pix` is
/// `\pi x`): an unknown name is read as its longest known prefix.
const COMMANDS: &[&str] = &[
    "frac",
    "dfrac",
    "tfrac",
    "cfrac",
    "sqrt",
    "binom",
    "dbinom",
    "tbinom",
    "pi",
    "infty",
    "infin",
    "emptyset",
    "varnothing",
    "mathbb",
    "text",
    "mbox",
    "textrm",
    "operatorname",
    "lfloor",
    "rfloor",
    "lceil",
    "rceil",
    "log",
    "max",
    "min",
    "gcd",
    "lcm",
    "begin",
    "end",
    "imath",
    "jmath",
    "cdot",
    "times",
    "ast",
    "div",
    "le",
    "leq",
    "leqslant",
    "leqq",
    "ge",
    "geq",
    "geqslant",
    "geqq",
    "lt",
    "gt",
    "ne",
    "neq",
    "approx",
    "in",
    "cup",
    "cap",
    "setminus",
    "pm",
    "mp",
    "circ",
    "quad",
    "qquad",
    "enspace",
    "thinspace",
    "right",
    "sum",
    "prod",
];

fn known_command(name: &str) -> bool {
    COMMANDS.contains(&name) || FUNCS.iter().any(|(n, _)| *n == name) || GREEK.contains(&name)
}

const SPACES: &[&str] = &[
    ",",
    ";",
    ":",
    "!",
    "quad",
    "qquad",
    " ",
    "enspace",
    "thinspace",
];

/// Parses normalised LaTeX into an expression. `complex` makes `i` the imaginary unit.
pub fn parse_latex(text: &str, complex: bool, budget: &Budget) -> Result<Expr, Stop> {
    parse_with(text, complex, false, budget)
}

/// Parses a plain arithmetic expression in Python syntax (`**` or `^` for powers).
pub fn parse_python(text: &str, budget: &Budget) -> Result<Expr, Stop> {
    parse_with(&text.replace("**", "^"), false, true, budget)
}

fn parse_with(text: &str, complex: bool, python: bool, budget: &Budget) -> Result<Expr, Stop> {
    if COMMA_NUMBER.is_match(text) {
        let t = text.trim();
        // "0,111" is a decimal with a comma; otherwise commas separate thousands.
        let t: String = if t.starts_with('0') {
            t.replace(',', ".")
        } else {
            t.chars().filter(|c| *c != ',').collect()
        };
        return number_from_str(&t);
    }
    let s = if python {
        text.chars().collect()
    } else {
        lexer_unicode(text)
    };
    let mut p = Parser {
        s,
        pos: 0,
        depth: 0,
        complex,
        python,
        budget,
    };
    let e = match p.set_elements_relation()? {
        Some(e) => e,
        None => {
            p.pos = 0;
            p.depth = 0;
            let elems = p.top_elements(false)?;
            p.skip_ws();
            if p.pos != p.s.len() || elems.is_empty() {
                return Err(Stop::Fail);
            }
            one_or_set(elems)
        }
    };
    if e.depth_capped(MAX_TREE_DEPTH) > MAX_TREE_DEPTH {
        return Err(budget.bound());
    }
    Ok(e)
}

/// The LaTeX that latex2sympy's lexer reads a Unicode character as, for the characters it has a
/// token for (operators, relations, Greek letters, sets); any other character is kept.
fn unicode_token(c: char) -> Option<&'static str> {
    Some(match c {
        '\u{2212}' | '\u{2238}' => "-",
        '\u{2214}' | '\u{2295}' | '\u{229e}' => "+",
        '\u{d7}' | '\u{2217}' | '\u{2218}' | '\u{2219}' | '\u{2297}' | '\u{22a0}' | '\u{22a1}'
        | '\u{22c4}' | '\u{22c5}' | '\u{22c6}' | '\u{22c8}' | '\u{22c9}' | '\u{22ca}' => "*",
        '\u{f7}' | '\u{2215}' => "/",
        '\u{2264}' | '\u{2266}' | '\u{2272}' | '\u{227e}' => "\\le ",
        '\u{2265}' | '\u{2267}' | '\u{2273}' | '\u{227f}' => "\\ge ",
        '\u{226a}' | '\u{227a}' | '\u{22d6}' => "<",
        '\u{226b}' | '\u{227b}' | '\u{22d7}' => ">",
        '\u{2260}' | '\u{2241}' | '\u{2244}' | '\u{2247}' | '\u{2249}' | '\u{2262}' => "\\ne ",
        '\u{2243}' | '\u{2245}' | '\u{2248}' | '\u{224a}' | '\u{224b}' => "\\approx ",
        '\u{224e}'..='\u{2257}' | '\u{225f}' | '\u{2261}' | '\u{2263}' => "=",
        '\u{b1}' | '\u{2213}' => "\\pm ",
        '\u{2205}' => "\\emptyset ",
        '\u{211d}' => "\\mathbb{R}",
        '\u{2124}' => "\\mathbb{Z}",
        '\u{2115}' => "\\mathbb{N}",
        '\u{211a}' => "\\mathbb{Q}",
        '\u{2102}' => "\\mathbb{C}",
        '\u{222a}' => "\\cup ",
        '\u{2229}' => "\\cap ",
        '\u{2216}' => "\\setminus ",
        _ => return greek_letter(c),
    })
}

/// The command of a Greek letter latex2sympy's lexer reads as one (its symbol names).
fn greek_letter(c: char) -> Option<&'static str> {
    Some(match c {
        'α' => "\\alpha ",
        'β' => "\\beta ",
        'γ' => "\\gamma ",
        'Γ' => "\\Gamma ",
        'δ' => "\\delta ",
        'Δ' => "\\Delta ",
        'ε' => "\\epsilon ",
        'ϵ' => "\\varepsilon ",
        'ζ' => "\\zeta ",
        'η' => "\\eta ",
        'θ' => "\\theta ",
        'Θ' => "\\Theta ",
        'ϑ' => "\\vartheta ",
        'ι' => "\\iota ",
        'κ' => "\\kappa ",
        'λ' => "\\lambda ",
        'Λ' => "\\Lambda ",
        'μ' => "\\mu ",
        'ν' => "\\nu ",
        'ξ' => "\\xi ",
        'Ξ' => "\\Xi ",
        'ο' => "\\omicron ",
        'π' => "\\pi ",
        'Π' => "\\Pi ",
        'ϖ' => "\\varpi ",
        'ρ' => "\\rho ",
        'ϱ' => "\\varrho ",
        'σ' => "\\sigma ",
        'Σ' => "\\Sigma ",
        'ς' => "\\varsigma ",
        'τ' => "\\tau ",
        'υ' => "\\upsilon ",
        'Υ' => "\\Upsilon ",
        'φ' => "\\phi ",
        'Φ' => "\\Phi ",
        'ϕ' => "\\varphi ",
        'χ' => "\\chi ",
        'ψ' => "\\psi ",
        'Ψ' => "\\Psi ",
        'ω' => "\\omega ",
        'Ω' => "\\Omega ",
        _ => return None,
    })
}

/// `text` as latex2sympy's lexer reads it: each character with a Unicode token as its LaTeX.
fn lexer_unicode(text: &str) -> Vec<char> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unicode_token(c) {
            Some(t) => out.extend(t.chars()),
            None => out.push(c),
        }
    }
    out
}

/// The element of a one-element list, else the set of the elements.
fn one_or_set(elems: Vec<Expr>) -> Expr {
    if elems.len() == 1 {
        elems.into_iter().next().expect("one")
    } else {
        Expr::Set(elems)
    }
}

/// Parses a plain decimal or integer literal ("12", "-0.5", "1e3").
pub fn number_from_str(t: &str) -> Result<Expr, Stop> {
    let (neg, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t),
    };
    if digits.is_empty() || digits.len() > MAX_DIGITS {
        return Err(Stop::Fail);
    }
    let e = if digits.contains(['.', 'e', 'E']) {
        Expr::Float(digits.parse::<f64>().map_err(|_| Stop::Fail)?)
    } else {
        let v: BigInt = digits.parse().map_err(|_| Stop::Fail)?;
        Expr::Num(BigRational::from_integer(v))
    };
    Ok(if neg { Expr::negate(e) } else { e })
}

struct Parser<'a> {
    s: Vec<char>,
    pos: usize,
    depth: usize,
    complex: bool,
    /// Python syntax: exponents are whole operands, not single characters.
    python: bool,
    budget: &'a Budget,
}

fn div(a: Expr, b: Expr) -> Expr {
    match (&a, &b) {
        (Expr::Num(x), Expr::Num(y)) if !y.is_zero() => Expr::Num(x / y),
        _ => Expr::Mul(vec![a, Expr::Pow(Box::new(b), Box::new(Expr::int(-1)))]),
    }
}

fn relation(op: RelOp, lhs: Expr, rhs: Expr) -> Expr {
    match lhs {
        Expr::And(mut v) => {
            let last = match v.last() {
                Some(Expr::Rel(_, _, r)) => (**r).clone(),
                _ => Expr::int(0),
            };
            v.push(Expr::Rel(op, Box::new(last), Box::new(rhs)));
            Expr::And(v)
        }
        Expr::Rel(o, l, r) => {
            let last = (*r).clone();
            Expr::And(vec![
                Expr::Rel(o, l, r),
                Expr::Rel(op, Box::new(last), Box::new(rhs)),
            ])
        }
        lhs => Expr::Rel(op, Box::new(lhs), Box::new(rhs)),
    }
}

/// True when the expression is made only of symbols (an assignment target such as `x` or `ab`).
pub fn only_symbols(e: &Expr) -> bool {
    match e {
        Expr::Sym(_) => true,
        Expr::Pow(b, x) if **x == Expr::int(-1) => only_symbols(b),
        Expr::Add(v) | Expr::Mul(v) | Expr::Tuple(v) | Expr::Func(_, v) => {
            !v.is_empty() && v.iter().all(only_symbols)
        }
        Expr::Interval(a, b, ..) => only_symbols(a) && only_symbols(b),
        Expr::Pow(a, b) => only_symbols(a) && only_symbols(b),
        _ => false,
    }
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.pos).copied()
    }

    fn rest_starts(&self, lit: &str) -> bool {
        let n = lit.chars().count();
        self.s.len() >= self.pos + n
            && self.s[self.pos..self.pos + n]
                .iter()
                .copied()
                .eq(lit.chars())
    }

    /// The command name at the cursor (after `\`), without consuming it.
    fn peek_cmd(&self) -> Option<String> {
        if self.peek() != Some('\\') {
            return None;
        }
        let mut i = self.pos + 1;
        let mut name = String::new();
        while let Some(&c) = self.s.get(i) {
            if c.is_ascii_alphabetic() {
                name.push(c);
                i += 1;
            } else {
                break;
            }
        }
        if name.is_empty() {
            if let Some(&c) = self.s.get(i) {
                name.push(c);
            }
        } else if !known_command(&name) {
            if let Some(n) = (1..name.len()).rev().find(|&n| known_command(&name[..n])) {
                name.truncate(n);
            }
        }
        Some(name)
    }

    fn eat_cmd(&mut self, name: &str) -> bool {
        if self.peek_cmd().as_deref() == Some(name) {
            self.pos += 1 + name.chars().count();
            true
        } else {
            false
        }
    }

    fn skip_ws(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => self.pos += 1,
                Some('\\') => {
                    let Some(cmd) = self.peek_cmd() else { return };
                    if SPACES.contains(&cmd.as_str()) {
                        self.pos += 1 + cmd.chars().count();
                    } else if let Some(sp) = ["qquad", "quad"].iter().find(|q| cmd.starts_with(**q))
                    {
                        // `\quadx` is a space followed by `x`.
                        self.pos += 1 + sp.len();
                    } else {
                        return;
                    }
                }
                _ => return,
            }
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), Stop> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(Stop::Fail)
        }
    }

    fn enter(&mut self) -> Result<(), Stop> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.budget.bound());
        }
        self.budget.check()
    }

    /// `d` when it is within [`MAX_TREE_DEPTH`]; else the (counted) bound. Every loop that nests
    /// its accumulator (postfix operators, divisions, set operations, relations) checks the depth
    /// of what it builds, so that long chains cannot make a tree deeper than the bound.
    fn within(&self, d: usize) -> Result<usize, Stop> {
        if d > MAX_TREE_DEPTH {
            Err(self.budget.bound())
        } else {
            Ok(d)
        }
    }

    /// latex2sympy's first reading of a whole answer (`set_elements_relation`): one symbol (a
    /// letter other than `e`, a Greek letter or `\text{…}`, with an optional sub- or
    /// superscript, or a parenthesised list of them), `=` or `\in`, then elements holding no
    /// relation: `x = 1, 2` is `x = \{1, 2\}`, `x = \pm 2` is `x = \{-2, 2\}`. `None` when the
    /// text is not of that shape (it is then read as [`Self::top_elements`]).
    fn set_elements_relation(&mut self) -> Result<Option<Expr>, Stop> {
        self.skip_ws();
        let starts = match self.peek() {
            Some(c) if c.is_ascii_alphabetic() => c != 'e' && c != 'E',
            Some('(') => true,
            Some('\\') => {
                let cmd = self.peek_cmd().unwrap_or_default();
                GREEK.contains(&cmd.as_str()) || matches!(cmd.as_str(), "text" | "mbox" | "textrm")
            }
            _ => false,
        };
        if !starts {
            return Ok(None);
        }
        let symbol = |e: &Expr| matches!(e, Expr::Sym(n) if !n.starts_with('e'));
        let lhs = match self.postfix() {
            Ok(e) => e,
            Err(Stop::Timeout) => return Err(Stop::Timeout),
            Err(Stop::Fail) => return Ok(None),
        };
        let target = match &lhs {
            Expr::Pow(b, _) => matches!(**b, Expr::Sym(_)),
            Expr::Interval(a, b, true, true) => symbol(a) && symbol(b),
            Expr::Tuple(v) => v.iter().all(symbol),
            e => matches!(e, Expr::Sym(_)),
        };
        self.skip_ws();
        let assign = match self.peek() {
            Some('=') => {
                self.pos += 1;
                self.peek() != Some('=')
            }
            _ => self.eat_cmd("in"),
        };
        if !target || !assign {
            return Ok(None);
        }
        let elems = match self.top_elements(true) {
            Ok(v) => v,
            Err(Stop::Timeout) => return Err(Stop::Timeout),
            Err(Stop::Fail) => return Ok(None),
        };
        self.skip_ws();
        if self.pos != self.s.len() || elems.is_empty() {
            return Ok(None);
        }
        Ok(Some(Expr::Rel(
            RelOp::Eq,
            Box::new(lhs),
            Box::new(one_or_set(elems)),
        )))
    }

    /// The elements of a whole answer: as [`Self::elements`], except that `;` separates groups
    /// of comma-separated elements, which become tuples when any group has more than one
    /// element (`p=5,q=2;p=7,q=2` is two pairs of equations, `1,2;3` is `(1,2)` and `(3,)`).
    /// With `no_relation`, an element may hold no relation and no set operation.
    fn top_elements(&mut self, no_relation: bool) -> Result<Vec<Expr>, Stop> {
        let mut groups: Vec<Vec<Expr>> = vec![Vec::new()];
        loop {
            groups
                .last_mut()
                .expect("a group")
                .extend(self.element(no_relation)?);
            self.skip_ws();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(';') => {
                    self.pos += 1;
                    groups.push(Vec::new());
                }
                _ => break,
            }
        }
        if groups.len() > 1 && groups.iter().any(|g| g.len() > 1) {
            return Ok(groups.into_iter().map(Expr::Tuple).collect());
        }
        Ok(groups.into_iter().flatten().collect())
    }

    /// Comma- or semicolon-separated elements.
    fn elements(&mut self) -> Result<Vec<Expr>, Stop> {
        let mut out = Vec::new();
        loop {
            out.extend(self.element(false)?);
            self.skip_ws();
            match self.peek() {
                Some(',') | Some(';') => self.pos += 1,
                _ => return Ok(out),
            }
        }
    }

    /// One element: a set expression, a relation chain, or a `±` pair.
    fn element(&mut self, no_relation: bool) -> Result<Vec<Expr>, Stop> {
        self.enter()?;
        let first = self.additive_pm()?;
        let mut lhs = match first {
            Alt::One(e) => e,
            Alt::Two(a, b) => {
                self.depth -= 1;
                return Ok(vec![a, b]);
            }
        };
        // Tree depth of `lhs` (an upper bound), computed at the first operator.
        let mut depth = None;
        loop {
            self.skip_ws();
            if no_relation {
                let save = self.pos;
                if self.set_op().is_some() || self.rel_op().is_some() {
                    return Err(Stop::Fail);
                }
                self.pos = save;
                break;
            }
            if let Some(op) = self.set_op() {
                let rhs = self.additive()?;
                let d = *depth.get_or_insert_with(|| depth_of(&lhs));
                depth = Some(self.within(1 + d.max(depth_of(&rhs)))?);
                lhs = Expr::SetOp(op, Box::new(lhs), Box::new(rhs));
                continue;
            }
            let Some(op) = self.rel_op() else { break };
            let rhs = if matches!(op, Rel::In) {
                // `x \in A \cup B` is `x \in (A \cup B)`.
                self.set_expr()?
            } else {
                self.additive()?
            };
            let d = *depth.get_or_insert_with(|| depth_of(&lhs));
            let dr = depth_of(&rhs);
            let (new, nd) = match op {
                Rel::Op(op) => {
                    // `relation` appends to a chain, starts one, or makes one relation.
                    let nd = match lhs {
                        Expr::And(_) => d.max(2 + dr),
                        Expr::Rel(..) => 1 + d.max(1 + dr),
                        _ => 1 + d.max(dr),
                    };
                    (relation(op, lhs, rhs), nd)
                }
                Rel::Approx => {
                    if only_symbols(&lhs) {
                        (rhs, dr)
                    } else {
                        (lhs, d)
                    }
                }
                Rel::In => (
                    Expr::Rel(RelOp::Eq, Box::new(lhs), Box::new(rhs)),
                    1 + d.max(dr),
                ),
            };
            depth = Some(self.within(nd)?);
            lhs = new;
        }
        self.depth -= 1;
        Ok(vec![lhs])
    }

    /// An additive expression followed by set operations (the right side of `\in`).
    fn set_expr(&mut self) -> Result<Expr, Stop> {
        let mut lhs = self.additive()?;
        let mut depth = None;
        loop {
            self.skip_ws();
            let Some(op) = self.set_op() else {
                return Ok(lhs);
            };
            let rhs = self.additive()?;
            let d = *depth.get_or_insert_with(|| depth_of(&lhs));
            depth = Some(self.within(1 + d.max(depth_of(&rhs)))?);
            lhs = Expr::SetOp(op, Box::new(lhs), Box::new(rhs));
        }
    }

    fn set_op(&mut self) -> Option<SetOp> {
        for (cmd, op) in [
            ("cup", SetOp::Union),
            ("cap", SetOp::Intersection),
            ("setminus", SetOp::Minus),
        ] {
            if self.eat_cmd(cmd) {
                return Some(op);
            }
        }
        None
    }

    fn rel_op(&mut self) -> Option<Rel> {
        self.skip_ws();
        let c = self.peek()?;
        let simple = match c {
            '=' => Some(Rel::Op(RelOp::Eq)),
            '!' if self.s.get(self.pos + 1) == Some(&'=') => {
                self.pos += 1;
                Some(Rel::Op(RelOp::Ne))
            }
            '<' if self.s.get(self.pos + 1) == Some(&'=') => {
                self.pos += 1;
                Some(Rel::Op(RelOp::Le))
            }
            '>' if self.s.get(self.pos + 1) == Some(&'=') => {
                self.pos += 1;
                Some(Rel::Op(RelOp::Ge))
            }
            '<' => Some(Rel::Op(RelOp::Lt)),
            '>' => Some(Rel::Op(RelOp::Gt)),
            _ => None,
        };
        if simple.is_some() {
            self.pos += 1;
            return simple;
        }
        let cmd = self.peek_cmd()?;
        let r = match cmd.as_str() {
            "le" | "leq" | "leqslant" | "leqq" => Rel::Op(RelOp::Le),
            "ge" | "geq" | "geqslant" | "geqq" => Rel::Op(RelOp::Ge),
            "lt" => Rel::Op(RelOp::Lt),
            "gt" => Rel::Op(RelOp::Gt),
            "ne" | "neq" => Rel::Op(RelOp::Ne),
            "approx" => Rel::Approx,
            "in" => Rel::In,
            _ => return None,
        };
        self.pos += 1 + cmd.chars().count();
        Some(r)
    }

    /// An additive expression that may contain one top-level `±`.
    fn additive_pm(&mut self) -> Result<Alt, Stop> {
        self.skip_ws();
        if self.eat_cmd("pm") {
            let e = self.additive()?;
            return Ok(Alt::Two(Expr::negate(e.clone()), e));
        }
        let a = self.additive()?;
        self.skip_ws();
        if self.eat_cmd("pm") {
            let b = self.additive()?;
            return Ok(Alt::Two(
                Expr::Add(vec![a.clone(), b.clone()]),
                Expr::Add(vec![a, Expr::negate(b)]),
            ));
        }
        Ok(Alt::One(a))
    }

    fn additive(&mut self) -> Result<Expr, Stop> {
        self.enter()?;
        let mut terms = vec![self.term(false)?];
        loop {
            self.skip_ws();
            match self.peek() {
                Some('+') => {
                    self.pos += 1;
                    terms.push(self.term(false)?);
                }
                Some('-') => {
                    self.pos += 1;
                    let t = self.term(false)?;
                    terms.push(Expr::negate(t));
                }
                _ => break,
            }
        }
        self.depth -= 1;
        Ok(if terms.len() == 1 {
            terms.pop().expect("one")
        } else {
            Expr::Add(terms)
        })
    }

    /// A product or quotient of signed implicit products (latex2sympy's `mp`); with `nofunc`,
    /// an unparenthesised function argument (`mp_nofunc`), whose implicit factors after the
    /// first are no functions: `\sin x\cos x` is `\sin(x)\cos(x)`, `\sin 2x` is
    /// `\sin(2x)`, `\sin x \cdot \cos x` is `\sin(x\cos(x))`.
    fn term(&mut self, nofunc: bool) -> Result<Expr, Stop> {
        let mut acc = self.unary(nofunc)?;
        // Tree depth of `acc`, computed at the first operator: a division nests it.
        let mut depth = None;
        loop {
            self.skip_ws();
            let c = self.peek();
            let product = if c == Some('*') {
                self.pos += 1;
                true
            } else if c == Some('/') || c == Some(':') {
                self.pos += 1;
                false
            } else if self.eat_cmd("cdot") || self.eat_cmd("times") || self.eat_cmd("ast") {
                true
            } else if self.eat_cmd("div") {
                false
            } else {
                return Ok(acc);
            };
            let rhs = self.unary(nofunc)?;
            let d = *depth.get_or_insert_with(|| depth_of(&acc));
            let dr = depth_of(&rhs);
            if product {
                let nd = if matches!(acc, Expr::Mul(_)) {
                    d.max(1 + dr)
                } else {
                    1 + d.max(dr)
                };
                depth = Some(self.within(nd)?);
                acc = mul(acc, rhs);
            } else {
                acc = div(acc, rhs);
                // A folded rational, or `acc · rhs^-1`.
                let nd = if matches!(acc, Expr::Num(_)) {
                    1
                } else {
                    1 + d.max(2 + dr)
                };
                depth = Some(self.within(nd)?);
            }
        }
    }

    fn unary(&mut self, nofunc: bool) -> Result<Expr, Stop> {
        self.enter()?;
        self.skip_ws();
        let r = match self.peek() {
            Some('-') => {
                self.pos += 1;
                Expr::negate(self.unary(nofunc)?)
            }
            Some('+') => {
                self.pos += 1;
                self.unary(nofunc)?
            }
            _ => self.implicit(nofunc)?,
        };
        self.depth -= 1;
        Ok(r)
    }

    /// Can an atom start at the cursor (for implicit multiplication)?
    fn atom_starts(&mut self) -> bool {
        self.skip_ws();
        match self.peek() {
            None => false,
            Some(c) if c.is_ascii_alphanumeric() || c == '.' => true,
            Some('(') | Some('[') | Some('{') | Some('|') => true,
            Some('\\') => {
                let cmd = self.peek_cmd().unwrap_or_default();
                !matches!(
                    cmd.as_str(),
                    "cdot"
                        | "times"
                        | "div"
                        | "ast"
                        | "le"
                        | "leq"
                        | "leqslant"
                        | "leqq"
                        | "ge"
                        | "geq"
                        | "geqslant"
                        | "geqq"
                        | "lt"
                        | "gt"
                        | "ne"
                        | "neq"
                        | "approx"
                        | "in"
                        | "cup"
                        | "cap"
                        | "setminus"
                        | "pm"
                        | "mp"
                        | "}"
                        | "rfloor"
                        | "rceil"
                        | "end"
                        | "%"
                        | "right"
                        | "\\"
                        | ")"
                        | "]"
                )
            }
            _ => false,
        }
    }

    /// Can a function start at the cursor (`\sin`, `\log`, `\sqrt`, `\sum`, `\max`, `e`, ...)?
    fn func_starts(&mut self) -> bool {
        self.skip_ws();
        match self.peek() {
            // latex2sympy lexes a lone `e` as the exponential function.
            Some('e') => self.s.get(self.pos + 1) != Some(&'_'),
            Some('\\') => {
                let cmd = self.peek_cmd().unwrap_or_default();
                FUNCS.iter().any(|(n, _)| *n == cmd)
                    || matches!(
                        cmd.as_str(),
                        "log" | "sqrt" | "sum" | "prod" | "max" | "min" | "gcd" | "lcm"
                    )
            }
            _ => false,
        }
    }

    /// Implicit products (`2x`, `x\sin y`); with `nofunc`, they stop before a function.
    fn implicit(&mut self, nofunc: bool) -> Result<Expr, Stop> {
        let mut acc = self.postfix()?;
        while self.atom_starts() && !(nofunc && self.func_starts()) {
            let save = self.pos;
            // `|` closes an absolute value as often as it opens one: stop on it.
            if self.peek() == Some('|') {
                break;
            }
            let next = self.postfix()?;
            if self.pos == save {
                break;
            }
            acc = match (&acc, &next) {
                // Mixed numbers: 2\frac{1}{2} = 5/2.
                (Expr::Num(a), Expr::Num(b))
                    if a.is_integer()
                        && !b.is_integer()
                        && self.s[save..].starts_with(&['\\', 'f']) =>
                {
                    Expr::Num(a + b)
                }
                _ => mul(acc, next),
            };
        }
        Ok(acc)
    }

    fn postfix(&mut self) -> Result<Expr, Stop> {
        let mut base = self.atom()?;
        // Tree depth of `base`, computed at the first operator: each one nests it.
        let mut depth = None;
        loop {
            self.skip_ws();
            match self.peek() {
                Some('!') if self.s.get(self.pos + 1) != Some(&'=') => {
                    self.pos += 1;
                    let d = *depth.get_or_insert_with(|| depth_of(&base));
                    depth = Some(self.within(d + 1)?);
                    base = Expr::Func("factorial".into(), vec![base]);
                }
                Some('^') => {
                    self.pos += 1;
                    match self.superscript()? {
                        Some(e) => {
                            let d = *depth.get_or_insert_with(|| depth_of(&base));
                            depth = Some(self.within(1 + d.max(depth_of(&e)))?);
                            base = Expr::Pow(Box::new(base), Box::new(e));
                        }
                        None => continue,
                    }
                }
                Some('%') => {
                    self.pos += 1;
                    let d = *depth.get_or_insert_with(|| depth_of(&base));
                    depth = Some(self.within(d + 1)?);
                    base = Expr::Pct(Box::new(base));
                }
                Some('\\') if self.rest_starts("\\%") => {
                    self.pos += 2;
                    let d = *depth.get_or_insert_with(|| depth_of(&base));
                    depth = Some(self.within(d + 1)?);
                    base = Expr::Pct(Box::new(base));
                }
                Some('\\') if self.rest_starts("\\circ") => {
                    self.pos += 5;
                }
                _ => return Ok(base),
            }
        }
    }

    /// The exponent after `^`; `None` for a degree sign.
    fn superscript(&mut self) -> Result<Option<Expr>, Stop> {
        self.skip_ws();
        if self.python {
            return Ok(Some(self.unary(false)?));
        }
        match self.peek() {
            Some('{') => {
                let save = self.pos;
                self.pos += 1;
                self.skip_ws();
                if self.eat_cmd("circ") && self.eat('}') {
                    return Ok(None);
                }
                self.pos = save;
                Ok(Some(self.group()?))
            }
            Some('\\') if self.rest_starts("\\circ") => {
                self.pos += 5;
                Ok(None)
            }
            Some(c) if c.is_ascii_digit() => {
                self.pos += 1;
                Ok(Some(number_from_str(&c.to_string())?))
            }
            Some('-') => {
                self.pos += 1;
                Ok(Some(Expr::negate(self.atom()?)))
            }
            _ => Ok(Some(self.atom()?)),
        }
    }

    /// `{ … }` holding one expression (a set when it holds a comma list).
    fn group(&mut self) -> Result<Expr, Stop> {
        self.expect('{')?;
        let elems = self.elements()?;
        self.expect('}')?;
        Ok(if elems.len() == 1 {
            elems.into_iter().next().expect("one")
        } else {
            Expr::Set(elems)
        })
    }

    /// The raw text of a `{…}` group.
    fn raw_group(&mut self) -> Result<String, Stop> {
        self.expect('{')?;
        let mut depth = 1;
        let mut out = String::new();
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(out);
                    }
                }
                _ => {}
            }
            out.push(c);
        }
        Err(Stop::Fail)
    }

    fn number(&mut self) -> Result<Expr, Stop> {
        let start = self.pos;
        while matches!(self.peek(), Some(c) if c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.peek() == Some('.')
            && matches!(self.s.get(self.pos + 1), Some(c) if c.is_ascii_digit())
        {
            self.pos += 1;
            while matches!(self.peek(), Some(c) if c.is_ascii_digit()) {
                self.pos += 1;
            }
        }
        if self.python && self.peek() == Some('.') && self.pos > start {
            // Python's `3.` is the float 3.0.
            self.pos += 1;
            let t: String = self.s[start..self.pos].iter().collect();
            return number_from_str(&format!("{t}0"));
        }
        if self.pos == start {
            // A lone `.` is no number.
            return Err(Stop::Fail);
        }
        let mut t: String = self.s[start..self.pos].iter().collect();
        // Leading zeros are dropped from integers ("004" is 4).
        if !t.contains('.') {
            let trimmed = t.trim_start_matches('0');
            t = if trimmed.is_empty() {
                "0".into()
            } else {
                trimmed.into()
            };
        } else if t.starts_with('.') {
            t.insert(0, '0');
        }
        if !self.python {
            // A base subscript is dropped, as latex2sympy does: `2112_6` is 2112.
            self.subscript_text()?;
        }
        number_from_str(&t)
    }

    fn atom(&mut self) -> Result<Expr, Stop> {
        self.enter()?;
        self.skip_ws();
        let c = self.peek().ok_or(Stop::Fail)?;
        let r = if c.is_ascii_digit() || c == '.' {
            self.number()?
        } else if c.is_ascii_alphabetic() {
            self.pos += 1;
            self.letter(c)?
        } else if c == '(' || c == '[' {
            self.pos += 1;
            self.bracketed(c == '(')?
        } else if c == '{' {
            self.group()?
        } else if c == '|' {
            self.pos += 1;
            let e = self.additive()?;
            self.expect('|')?;
            Expr::Func("abs".into(), vec![e])
        } else if c == '\\' {
            self.command()?
        } else {
            return Err(Stop::Fail);
        };
        self.depth -= 1;
        Ok(r)
    }

    fn subscript_text(&mut self) -> Result<String, Stop> {
        self.skip_ws();
        if self.peek() != Some('_') {
            return Ok(String::new());
        }
        self.pos += 1;
        self.skip_ws();
        let inner: String = match self.peek() {
            Some('{') => self.raw_group()?.trim().to_string(),
            Some(c) => {
                self.pos += 1;
                c.to_string()
            }
            None => return Err(Stop::Fail),
        };
        Ok(if inner.chars().count() > 1 {
            format!("_{{{inner}}}")
        } else {
            format!("_{inner}")
        })
    }

    fn letter(&mut self, c: char) -> Result<Expr, Stop> {
        let sub = self.subscript_text()?;
        if sub.is_empty() {
            if c == 'e' {
                return Ok(Expr::E);
            }
            if c == 'i' && self.complex {
                return Ok(Expr::I);
            }
        }
        Ok(Expr::Sym(format!("{c}{sub}").to_lowercase()))
    }

    /// After `(` or `[`: a grouping, an interval or a tuple.
    fn bracketed(&mut self, open_left: bool) -> Result<Expr, Stop> {
        let elems = self.elements()?;
        self.skip_ws();
        let open_right = match self.peek() {
            Some(')') => true,
            Some(']') => false,
            Some('\\') if self.rest_starts("\\)") => {
                self.pos += 1;
                true
            }
            Some('\\') if self.rest_starts("\\]") => {
                self.pos += 1;
                false
            }
            _ => return Err(Stop::Fail),
        };
        self.pos += 1;
        match elems.len() {
            0 => Err(Stop::Fail),
            1 => {
                if open_left != open_right {
                    return Err(Stop::Fail);
                }
                Ok(elems.into_iter().next().expect("one"))
            }
            2 => {
                let mut it = elems.into_iter();
                let (lo, hi) = (it.next().expect("two"), it.next().expect("two"));
                let degenerate = match (self.value(&lo), self.value(&hi)) {
                    (Some(a), Some(b)) => {
                        (open_left && open_right && b <= a) || (!open_left && !open_right && b < a)
                    }
                    _ => false,
                };
                if degenerate {
                    Ok(Expr::Tuple(vec![lo, hi]))
                } else {
                    Ok(Expr::Interval(
                        Box::new(lo),
                        Box::new(hi),
                        open_left,
                        open_right,
                    ))
                }
            }
            _ => {
                if open_left != open_right {
                    return Err(Stop::Fail);
                }
                Ok(Expr::Tuple(elems))
            }
        }
    }

    fn value(&self, e: &Expr) -> Option<f64> {
        if !e.is_scalar() {
            return None;
        }
        let v = e.eval(&|_| None, self.budget).ok()?;
        (!v.is_nan()).then_some(v)
    }

    /// A function argument: `(…)`, or the unparenthesised argument that follows ([`Self::term`]).
    fn func_arg(&mut self) -> Result<Expr, Stop> {
        self.skip_ws();
        match self.peek() {
            Some('(') => {
                self.pos += 1;
                let e = self.additive()?;
                self.expect(')')?;
                Ok(e)
            }
            _ => self.term(true),
        }
    }

    fn command(&mut self) -> Result<Expr, Stop> {
        let cmd = self.peek_cmd().ok_or(Stop::Fail)?;
        self.pos += 1 + cmd.chars().count();
        Ok(match cmd.as_str() {
            "frac" | "dfrac" | "tfrac" | "cfrac" => {
                let a = self.group_or_char()?;
                let b = self.group_or_char()?;
                div(a, b)
            }
            "sqrt" => {
                self.skip_ws();
                let index = if self.peek() == Some('[') {
                    self.pos += 1;
                    let e = self.additive()?;
                    self.expect(']')?;
                    Some(e)
                } else {
                    None
                };
                let x = self.group_or_char()?;
                let exp = match index {
                    None => Expr::Num(BigRational::new(BigInt::one(), BigInt::from(2))),
                    Some(Expr::Num(n)) if !n.is_zero() => Expr::Num(n.recip()),
                    Some(n) => div(Expr::int(1), n),
                };
                Expr::Pow(Box::new(x), Box::new(exp))
            }
            "binom" | "dbinom" | "tbinom" => {
                let n = self.group_or_char()?;
                let k = self.group_or_char()?;
                // sympy evaluates `binomial(n, 0)` to 1 and `binomial(n, 1)` to `n`.
                match &k {
                    Expr::Num(v) if v.is_zero() => Expr::int(1),
                    Expr::Num(v) if v.is_one() => n,
                    _ => Expr::Func("binomial".into(), vec![n, k]),
                }
            }
            "pi" => Expr::Pi,
            "infty" | "infin" => Expr::Inf,
            "emptyset" => Expr::NamedSet("empty"),
            // latex2sympy has no `\varnothing`: it is read as a symbol.
            "varnothing" => Expr::Sym("varnothing".into()),
            "mathbb" => {
                let name = self.raw_group()?;
                Expr::NamedSet(match name.trim() {
                    "R" => "reals",
                    "Z" => "integers",
                    "N" => "naturals",
                    "Q" => "rationals",
                    "C" => "complexes",
                    _ => return Err(Stop::Fail),
                })
            }
            "text" | "mbox" | "textrm" | "operatorname" => {
                let raw = self.raw_group()?;
                let t: String = raw
                    .chars()
                    .filter(|c| !c.is_whitespace() && *c != '(' && *c != ')')
                    .collect();
                if t.is_empty() {
                    return Err(Stop::Fail);
                }
                let sub = self.subscript_text()?;
                let name = format!("{t}{sub}").to_lowercase();
                // latex2sympy names the symbol by its text: `\text{i}` is the letter `i`.
                if name == "i" && self.complex {
                    Expr::I
                } else {
                    Expr::Sym(name)
                }
            }
            "{" => {
                self.skip_ws();
                if self.eat_cmd("}") {
                    return Ok(Expr::NamedSet("empty"));
                }
                let elems = self.elements()?;
                self.skip_ws();
                if !self.eat_cmd("}") {
                    return Err(Stop::Fail);
                }
                Expr::Set(elems)
            }
            "lfloor" | "lceil" => {
                let e = self.additive()?;
                self.skip_ws();
                let close = if cmd == "lfloor" { "rfloor" } else { "rceil" };
                if !self.eat_cmd(close) {
                    return Err(Stop::Fail);
                }
                Expr::Func(
                    if cmd == "lfloor" { "floor" } else { "ceil" }.into(),
                    vec![e],
                )
            }
            "log" => {
                let base = if self.eat('_') {
                    Some(self.group_or_char()?)
                } else {
                    None
                };
                let pow = self.func_power()?;
                let x = self.func_arg()?;
                let f = match base {
                    Some(b) => Expr::Func("log".into(), vec![x, b]),
                    None => Expr::Func("log".into(), vec![x, Expr::int(10)]),
                };
                apply_pow(f, pow)
            }
            "max" | "min" | "gcd" | "lcm" => {
                self.expect('(')?;
                let args = self.elements()?;
                self.expect(')')?;
                Expr::Func(cmd.clone(), args)
            }
            "sum" | "prod" => self.big_operator(if cmd == "sum" { "sum" } else { "product" })?,
            "begin" => self.environment()?,
            "(" => self.bracketed(true)?,
            "[" => self.bracketed(false)?,
            "imath" | "jmath" => Expr::I,
            name => {
                if let Some((_, f)) = FUNCS.iter().find(|(n, _)| *n == name) {
                    let pow = self.func_power()?;
                    let x = self.func_arg()?;
                    return Ok(apply_pow(Expr::Func((*f).into(), vec![x]), pow));
                }
                if GREEK.contains(&name) {
                    let sub = self.subscript_text()?;
                    return Ok(Expr::Sym(format!("\\{name}{sub}").to_lowercase()));
                }
                return Err(Stop::Fail);
            }
        })
    }

    /// `\sum`/`\prod` after the command: `_{k=a}` and `^{b}` (either order), then the
    /// multiplicative body: `Func(name, [body, k, a, b])`.
    fn big_operator(&mut self, name: &str) -> Result<Expr, Stop> {
        let (mut var, mut upper) = (None, None);
        for _ in 0..2 {
            self.skip_ws();
            match self.peek() {
                Some('_') if var.is_none() => {
                    self.pos += 1;
                    self.expect('{')?;
                    let v = self.additive()?;
                    if !matches!(v, Expr::Sym(_)) || !self.eat('=') {
                        return Err(Stop::Fail);
                    }
                    let lo = self.additive()?;
                    self.expect('}')?;
                    var = Some((v, lo));
                }
                Some('^') if upper.is_none() => {
                    self.pos += 1;
                    upper = self.superscript()?;
                }
                _ => return Err(Stop::Fail),
            }
        }
        let ((v, lo), Some(hi)) = (var.ok_or(Stop::Fail)?, upper) else {
            return Err(Stop::Fail);
        };
        let body = self.term(false)?;
        Ok(Expr::Func(name.into(), vec![body, v, lo, hi]))
    }

    fn func_power(&mut self) -> Result<Option<Expr>, Stop> {
        self.skip_ws();
        if self.peek() == Some('^') {
            self.pos += 1;
            return self.superscript();
        }
        Ok(None)
    }

    /// `{…}` or a single character/command argument (`\frac12`, `\sqrt3`).
    fn group_or_char(&mut self) -> Result<Expr, Stop> {
        self.skip_ws();
        match self.peek() {
            Some('{') => self.group(),
            Some(c) if c.is_ascii_digit() => {
                self.pos += 1;
                number_from_str(&c.to_string())
            }
            _ => self.atom(),
        }
    }

    fn environment(&mut self) -> Result<Expr, Stop> {
        let name = self.raw_group()?;
        if !name.contains("matrix") && name != "array" {
            return Err(Stop::Fail);
        }
        if name == "array" {
            self.skip_ws();
            if self.peek() == Some('{') {
                self.raw_group()?;
            }
        }
        let mut rows: Vec<Vec<Expr>> = vec![vec![]];
        loop {
            self.skip_ws();
            if self.eat_cmd("end") {
                let end = self.raw_group()?;
                if end != name {
                    return Err(Stop::Fail);
                }
                break;
            }
            if self.eat_cmd("\\") {
                rows.push(vec![]);
                continue;
            }
            let before = self.pos;
            let e = self.additive()?;
            rows.last_mut().expect("a row").push(e);
            self.skip_ws();
            if self.peek() == Some('&') {
                self.pos += 1;
            } else if self.pos == before {
                // An entry that consumed nothing would be read again forever.
                return Err(Stop::Fail);
            }
        }
        rows.retain(|r| !r.is_empty());
        if rows.is_empty() || rows.iter().any(|r| r.len() != rows[0].len()) {
            return Err(Stop::Fail);
        }
        Ok(Expr::Matrix(rows))
    }
}

/// The tree depth of `e`, capped just above [`MAX_TREE_DEPTH`].
fn depth_of(e: &Expr) -> usize {
    e.depth_capped(MAX_TREE_DEPTH)
}

fn apply_pow(f: Expr, pow: Option<Expr>) -> Expr {
    match pow {
        Some(p) => Expr::Pow(Box::new(f), Box::new(p)),
        None => f,
    }
}

fn mul(a: Expr, b: Expr) -> Expr {
    match a {
        Expr::Mul(mut v) => {
            v.push(b);
            Expr::Mul(v)
        }
        a => Expr::Mul(vec![a, b]),
    }
}

enum Alt {
    One(Expr),
    Two(Expr, Expr),
}

enum Rel {
    Op(RelOp),
    Approx,
    In,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn p(s: &str) -> Result<Expr, Stop> {
        parse_latex(
            s,
            false,
            &Budget::new(Instant::now() + Duration::from_secs(1)),
        )
    }

    #[test]
    fn shapes() {
        assert!(matches!(p("(1,2)"), Ok(Expr::Interval(..))));
        assert!(matches!(p("(2,1)"), Ok(Expr::Tuple(_))));
        assert!(matches!(p("1,2"), Ok(Expr::Set(_))));
        assert!(matches!(p("1,000,000"), Ok(Expr::Num(_))));
        assert!(matches!(p("x=5"), Ok(Expr::Rel(RelOp::Eq, ..))));
        assert!(matches!(p("1<x<2"), Ok(Expr::And(_))));
        assert_eq!(
            p(r"\frac{1}{3}"),
            Ok(Expr::Num(BigRational::new(1.into(), 3.into())))
        );
        assert_eq!(
            p(r"2\frac{1}{2}"),
            Ok(Expr::Num(BigRational::new(5.into(), 2.into())))
        );
        assert!(matches!(
            p(r"\begin{pmatrix}1 & 2\\3 & 4\end{pmatrix}"),
            Ok(Expr::Matrix(_))
        ));
        assert!(p(r"\frac{1}{").is_err());
    }

    /// Shown by each input's latex2sympy 1.11 reading (sympy's printing).
    #[test]
    fn readings_of_latex2sympy() {
        let same = |a: &str, b: &str| assert_eq!(p(a), p(b), "{a} vs {b}");
        // An unparenthesised function argument takes no function after its first factor.
        same(r"\sin x\cos x", r"\sin(x)\cos(x)");
        same(r"\sin 2x", r"\sin(2x)");
        same(r"\sin x \cdot \cos x", r"\sin(x\cos(x))");
        same(r"\sin x / 2", r"\sin(x/2)");
        same(r"\sin{x}y", r"\sin(xy)");
        same(r"\sin -x \cos x", r"\sin(-x)\cos(x)");
        same(r"\sin x \sqrt{2}", r"\sin(x)\sqrt{2}");
        same(r"\sin 2e", r"\sin(2)e");
        same(r"\log x \sin y", r"\log(x)\sin(y)");
        // One symbol assigned a list of elements without relations: an equation with a set.
        same(r"x = \pm 2", r"x = \{-2, 2\}");
        same(r"x = 1, 2", r"x = \{1, 2\}");
        same(r"x_1 \in 1; 2", r"x_1 = \{1, 2\}");
        same(r"x = 1 \pm 2", r"x = \{1 + 2, 1 - 2\}");
        assert!(matches!(p("x = 3, y = 2"), Ok(Expr::Set(_))));
        assert!(matches!(p("2x = 1, 2"), Ok(Expr::Set(_))));
        assert!(matches!(p("e = 1, 2"), Ok(Expr::Set(_))));
    }

    /// latex2sympy's lexer has tokens for some Unicode characters and rejects the others.
    #[test]
    fn unicode_tokens() {
        let same = |a: &str, b: &str| assert_eq!(p(a), p(b), "{a} vs {b}");
        same("\u{2212}12", "-12");
        same("x \u{2212} 1", "x - 1");
        same("x^{\u{2212}2}", "x^{-2}");
        same("2\u{d7}3", r"2\times 3");
        same("2\u{22c5}3", r"2\cdot 3");
        same("6\u{f7}2", r"6\div 2");
        same("x\u{2264}3", r"x\le 3");
        same("x\u{2260}3", r"x\ne 3");
        same("\u{b1}2", r"\pm 2");
        same("2\u{3c0}", r"2\pi");
        same("\u{3b1}+1", r"\alpha+1");
        same("\u{211d}", r"\mathbb{R}");
        same("(1,2)\u{222a}(3,4)", r"(1,2)\cup(3,4)");
        // Checked on the raw text, as latex2sympy does: a set of -1 and 234.
        assert!(matches!(p("\u{2212}1,234"), Ok(Expr::Set(_))));
        assert!(p("2\u{b7}3").is_err());
        assert!(p("\u{221e}").is_err());
        assert!(p("\u{2013}5").is_err());
    }

    #[test]
    fn upright_i_and_binomials() {
        let b = Budget::new(Instant::now() + Duration::from_secs(1));
        assert_eq!(parse_latex(r"\text{i}", true, &b), Ok(Expr::I));
        assert_eq!(p(r"\text{i}"), Ok(Expr::Sym("i".into())));
        assert_eq!(p(r"\binom{n}{1}"), Ok(Expr::Sym("n".into())));
        assert_eq!(p(r"\binom{n}{0}"), Ok(Expr::int(1)));
        assert!(matches!(p(r"\binom{n}{2}"), Ok(Expr::Func(..))));
    }

    /// Found by fuzzing: a lone `.` parsed as the number 0 without being consumed, so the matrix
    /// entry `3.` (`3`, then `.`) was read again and again until the time limit.
    #[test]
    fn entries_that_consume_nothing_fail() {
        let far = Budget::new(Instant::now() + Duration::from_secs(60));
        let parse = |s: &str| parse_latex(s, false, &far);
        assert_eq!(parse(r"\begin{pmatrix}3.\end{pmatrix}"), Err(Stop::Fail));
        assert_eq!(parse(r"\begin{pmatrix}1 & .\end{pmatrix}"), Err(Stop::Fail));
        assert_eq!(parse("."), Err(Stop::Fail));
        assert!(matches!(parse(".5"), Ok(Expr::Float(v)) if v == 0.5));
    }
}
