"""The `rlreplay` command installed with the module, and `Dataset.audit` against `rlreplay audit`."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlreplay

AUDIT = Path(__file__).resolve().parents[2] / "crates" / "rlreplay-cli" / "tests" / "data" / "audit"


@pytest.fixture(scope="module")
def exe():
    path = shutil.which("rlreplay", path=str(Path(sys.executable).parent))
    if path is None or not hasattr(rlreplay._rlreplay, "cli_main"):
        pytest.skip("no rlreplay command installed with the module (built without `cli`)")
    return path


def run(*args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)


def test_version(exe):
    out = run(exe, "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"rlreplay {rlreplay.__version__}\n"
    assert run(sys.executable, "-m", "rlreplay", "--version").stdout == out.stdout


def test_verify(exe, tmp_path):
    pairs = [("\\frac{1}{2}", "so $\\boxed{0.5}$"), ("4", "\\boxed{5}"), ("12", "\\boxed{12}")]
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps({"gold": g, "pred": p}) + "\n" for g, p in pairs))
    out = run(exe, "verify", "--input", path)
    assert out.returncode == 0, out.stderr
    rewards = [json.loads(line)["reward"] for line in out.stdout.splitlines()]
    assert rewards == [rlreplay.verify(g, p) for g, p in pairs] == [1.0, 0.0, 1.0]
    assert "3 answers" in out.stderr
    # Standard input, as the binary reads it.
    out = run(exe, "verify", "--input", "-", input=path.read_text())
    assert [json.loads(line)["reward"] for line in out.stdout.splitlines()] == rewards


def test_exit_codes_and_streams(exe, tmp_path):
    out = run(exe, "no-such-command")
    assert out.returncode == 2 and out.stdout == "" and "error" in out.stderr
    out = run(exe, "verify", "--input", tmp_path / "missing.jsonl")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: opening ")
    out = run(exe, "--help")
    assert out.returncode == 0 and "Usage: rlreplay" in out.stdout


def test_audit_of_a_fixture():
    ds = rlreplay.open_dataset(str(AUDIT))
    lines = ds.audit()
    assert [line["step"] for line in lines[:-1]] == [1, 2, 3]
    summary = lines[-1]
    assert summary["summary"] is True and summary["steps"] == 3
    assert summary["rows"] == sum(line["rows"] for line in lines[:-1])
    assert [line["step"] for line in ds.audit(steps="2..")[:-1]] == [2, 3]
    assert [line["step"] for line in ds.audit(steps=1)[:-1]] == [1]
    assert ds.audit(steps="5..")[-1]["steps"] == 0
    for bad in ["1..x", 1.5, True]:
        with pytest.raises(ValueError, match="^steps"):
            ds.audit(steps=bad)


def test_audit_matches_the_command(exe, tmp_path):
    data = tmp_path / "synth"
    out = run(
        exe, "synth", "--out", data, "--steps", 3, "--prompts", 4, "--group", 4, "--vocab", 500,
        "--mean-len", 30, "--max-len", 40, "--prompt-len", 8, "--eos", 7, "--seed", 3,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ds = rlreplay.open_dataset(str(data))
    for kw, args in [
        ({}, []),
        ({"steps": "2..3"}, ["--steps", "2..3"]),
        ({"steps": 1, "eos": [7, 9]}, ["--steps", "1", "--eos", "7,9"]),
        ({"eos": [499]}, ["--eos", "499"]),
    ]:
        cli = run(exe, "audit", data, "--json", *args)
        assert cli.returncode == 0, cli.stderr
        want = [json.loads(line) for line in cli.stdout.splitlines()]
        assert ds.audit(**kw) == want, kw
    # The dataset names its end-of-sequence id: some responses are truncated at --max-len.
    assert 0.0 < ds.audit()[-1]["truncated"] < 1.0
