"""The Python module against the math-verify fixtures of rlreplay-reward and the reward dispatch."""

import json
from pathlib import Path

import pytest

import rlreplay

DATA = Path(__file__).resolve().parents[2] / "crates" / "rlreplay-reward" / "tests" / "data"
FIXTURES = ["math_verify_cases", "math_verify_real", "intent_labels"]


def cases(name):
    with open(DATA / f"{name}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize("mode", ["maxrl", "default"])
def test_verify_batch_reproduces_math_verify(name, mode):
    rows = cases(name)
    rewards = rlreplay.verify_batch([r["gold"] for r in rows], [r["pred"] for r in rows], mode=mode)
    assert len(rewards) == len(rows)
    bad = [(r["gold"], r["pred"][-80:]) for r, x in zip(rows, rewards) if x != float(r[mode])]
    assert not bad, f"{len(bad)} verdicts differ from math-verify's, first: {bad[:3]}"


@pytest.mark.parametrize("name", FIXTURES)
def test_verify_reproduces_maxrl(name):
    for r in cases(name):
        assert rlreplay.verify(r["gold"], r["pred"]) == float(r["maxrl"]), (r["gold"], r["pred"])


def test_verify_batch_threads_and_order():
    golds = [str(i) for i in range(200)]
    answers = [f"\\boxed{{{i if i % 3 else i + 1}}}" for i in range(200)]
    expected = [rlreplay.verify(g, a) for g, a in zip(golds, answers)]
    assert rlreplay.verify_batch(golds, answers, threads=2) == expected
    assert rlreplay.verify_batch(golds, answers) == expected
    assert rlreplay.verify_batch([], []) == []


def test_modes():
    assert rlreplay.verify("\\frac{1}{2}", "so $\\boxed{0.5}$") == 1.0
    assert rlreplay.verify("4", "$\\boxed{\\text{four}}$", mode="maxrl") == 0.0
    assert rlreplay.verify("4", "$\\boxed{\\text{four}}$", mode="intent") == 1.0


def test_compute_score_dispatch():
    # A math source: the math verifier (maxrl).
    assert rlreplay.compute_score("polaris", "so \\boxed{12}", "12") == 1.0
    assert rlreplay.compute_score("aime25", "so \\boxed{13}", "12") == 0.0
    assert rlreplay.compute_score("gsm8k", "so \\boxed{12}", 12, {"index": 0}) == 1.0
    # A multiple-choice source: the MCQ grader (exact letter in the last <answer>).
    assert rlreplay.compute_score("mmlu", "<answer>\nC\n</answer>", "C") == 1.0
    assert rlreplay.compute_score("sciknoweval", "<answer>B</answer>", "C") == 0.0
    # The MCQ grader would not read a boxed answer; a rule routes the source to the verifier.
    assert rlreplay.compute_score("mmlu", "\\boxed{C}", "C") == 0.0
    assert rlreplay.compute_score("mmlu", "\\boxed{C}", "C", rules="mmlu=math") == 1.0
    # The numeric-answer reward.
    assert rlreplay.compute_score("basic_arithmetic", "86 - 1 = 85", "85") == 1.0
    # verl's keyword call.
    kw = dict(data_source="math", solution_str="\\boxed{3}", ground_truth="3", extra_info=None)
    assert rlreplay.compute_score(**kw) == 1.0
    # An unparsable ground truth grades 0, as in the trainer.
    assert rlreplay.compute_score("basic_arithmetic", "1", "x") == 0.0


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: rlreplay.verify("1", "1", mode="sympy"), "mode"),
        (lambda: rlreplay.verify("1", "1", timeout=0.0), "timeout"),
        (lambda: rlreplay.verify("1", "1", timeout=float("nan")), "timeout"),
        (lambda: rlreplay.verify_batch(["1"], ["1"], mode="x"), "mode"),
        (lambda: rlreplay.verify_batch(["1", "2"], ["1"]), "answers"),
        (lambda: rlreplay.verify_batch(["1"], ["1"], threads=0), "threads"),
        (lambda: rlreplay.verify_batch(["1"], ["1"], threads=-1), "threads"),
        (lambda: rlreplay.compute_score("math", "1", "1", rules="math=nope"), "rules"),
        (lambda: rlreplay.compute_score("math", "1", "1", rules="nonsense"), "rules"),
        (lambda: rlreplay.compute_score("math", "1", ["1"]), "ground_truth"),
        (lambda: rlreplay.compute_score("math", "1", True), "ground_truth"),
    ],
)
def test_bad_arguments_raise_value_error(call, arg):
    with pytest.raises(ValueError, match=f"^{arg}"):
        call()


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match="gold"):
        rlreplay.verify(1, "1")
    with pytest.raises(TypeError, match="golds"):
        rlreplay.verify_batch("12", ["1", "2"])
    with pytest.raises(TypeError, match="threads"):
        rlreplay.verify_batch(["1"], ["1"], threads=1.5)


def test_hostile_input_is_graded_not_raised():
    assert rlreplay.verify("1" * 100_000, "1") == 0.0
    assert rlreplay.verify("1", "{" * 50_000 + "\\boxed{1}") in (0.0, 1.0)
    assert rlreplay.verify("\x00", "\ud7ff") == 0.0


AUDIT = Path(__file__).resolve().parents[2] / "crates" / "rlreplay-cli" / "tests" / "data" / "audit"


def test_dataset_steps_as_arrow_tables():
    pa = pytest.importorskip("pyarrow")
    ds = rlreplay.open_dataset(str(AUDIT))
    assert ds.steps == [1, 2, 3]
    table = ds.read_step(2)
    assert isinstance(table, pa.Table)
    assert table.num_rows > 0
    assert set(table.column("step").to_pylist()) == {2}
    for name in ["uid", "prompt_token_ids", "response_token_ids", "rollout_log_probs", "score"]:
        assert name in table.schema.names
    responses = table.column("response_token_ids").to_pylist()
    log_probs = table.column("rollout_log_probs").to_pylist()
    assert [len(r) for r in responses] == [len(lp) for lp in log_probs]
    with pytest.raises(ValueError, match="^step"):
        ds.read_step(9)
    with pytest.raises(ValueError, match="^path"):
        rlreplay.open_dataset(str(AUDIT / "missing"))
