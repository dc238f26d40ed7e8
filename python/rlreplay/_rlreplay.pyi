from typing import Any, Optional, Sequence

import pyarrow

__version__: str

def verify(gold: str, answer: str, mode: str = "maxrl", timeout: float = 1.0) -> float:
    """Grades ``answer`` against ``gold`` with the math verifier: 1.0 when equivalent, else 0.0.

    ``mode`` is that of ``rlreplay verify --mode``: ``maxrl``, ``default`` or ``intent``;
    ``timeout`` the time limit in seconds (an answer over it is graded 0.0).
    Raises ``ValueError`` for an unknown mode or a non-positive timeout.
    """

def verify_batch(
    golds: Sequence[str],
    answers: Sequence[str],
    mode: str = "maxrl",
    threads: Optional[int] = None,
    timeout: float = 1.0,
) -> list[float]:
    """Grades ``answers[i]`` against ``golds[i]`` in parallel, the GIL released; rewards in input order.

    ``threads`` caps the worker threads (default: one per core). Raises ``ValueError`` for an
    unknown mode, lengths that differ, ``threads=0`` or a non-positive timeout.
    """

def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str | int | float,
    extra_info: Optional[dict[str, Any]] = None,
    *,
    rules: Optional[str] = None,
    timeout: float = 1.0,
) -> float:
    """verl's custom reward function: the reward of ``solution_str`` by ``data_source``'s reward function.

    Multiple-choice sources go to the MCQ grader, ``basic_arithmetic`` to the numeric-answer
    reward, every other source to the math verifier (``maxrl``), as the trainer scores.
    ``rules`` overrides the dispatch (``"source=kind,*=kind"``, as ``[reward] rules``).
    Raises ``ValueError`` for bad rules, a ground truth that is neither a string nor a number,
    or a non-positive timeout.
    """

class Dataset:
    """A rollout dataset opened by :func:`open_dataset`; steps are read one at a time."""

    @property
    def steps(self) -> list[int]:
        """The dataset's steps, increasing."""

    def read_step(self, step: int) -> "pyarrow.Table":
        """Reads and validates one step as a ``pyarrow.Table`` in the canonical schema.

        Raises ``ValueError`` for a step the dataset lacks or a shard that fails validation.
        Needs pyarrow.
        """

def open_dataset(path: str) -> Dataset:
    """Opens a rollout dataset: a directory in the published layout, a directory of shards,
    one file, a glob or a hub id (``hf://datasets/OWNER/NAME``). Nothing is read until a step
    is asked for. Raises ``ValueError`` when no shard is found.
    """
