from typing import Any, Optional, Sequence, TypedDict, Union

import numpy
import numpy.typing
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

    def audit(
        self,
        steps: Union[None, int, str] = None,
        eos: Optional[Sequence[int]] = None,
        lenient: bool = False,
    ) -> list[dict[str, Any]]:
        """Per-step statistics as ``rlreplay audit PATH --json`` prints them.

        One dict per step (``step``, ``file``, ``rows``, ``groups``, ``group_size``,
        ``score_mean``, ``solve_none``, ``solve_all``, ``prompt_len_mean``, ``resp_len_mean``,
        ``resp_len_max``, ``truncated``, ``logprob_mean``, ``rows_skipped``), then the summary
        (``summary: True``, ``steps`` and the same statistics over all steps). ``steps``: None
        (all), one step, or ``"A..B"``, ``"A.."``, ``"..B"``. ``eos``: the end-of-sequence ids
        (None or empty: those the shards name; ``truncated`` is None when none is known).
        ``lenient`` skips bad rows (counted in ``rows_skipped``) instead of raising.
        Raises ``ValueError`` for a bad range or an invalid shard.
        """

def open_dataset(path: str) -> Dataset:
    """Opens a rollout dataset: a directory in the published layout, a directory of shards,
    one file, a glob or a hub id (``hf://datasets/OWNER/NAME``). Nothing is read until a step
    is asked for. Raises ``ValueError`` when no shard is found.
    """

FloatArray = numpy.typing.NDArray[numpy.float64]
ArrayLike = numpy.typing.ArrayLike

class Advantages(TypedDict):
    advantages: FloatArray
    token_advantages: FloatArray
    metrics: dict[str, float]

class RolloutCorrection(TypedDict):
    is_weights: Optional[FloatArray]
    mask: numpy.typing.NDArray[numpy.bool_]
    metrics: dict[str, float]

class PolicyLoss(TypedDict):
    loss: float
    grad_logprobs: FloatArray
    token_advantages: FloatArray
    valid_tokens: int
    metrics: dict[str, float]

def compute_advantages(
    scores: ArrayLike,
    uids: Union[Sequence[Union[str, int]], ArrayLike],
    lengths: ArrayLike,
    *,
    mask: Optional[ArrayLike] = None,
    **config: Any,
) -> Advantages:
    """Advantages of a batch grouped by ``uids``, as ``rlreplay compute`` computes them.

    ``scores`` and ``uids`` (strings or integers) hold one value per row, ``lengths`` each row's
    token count; ``mask`` (one bool per token) marks valid tokens. ``config``: the algorithm
    keys of ``rlreplay compute`` (``adv_estimator``, ``norm_adv_by_std_in_grpo``, ``gamma``,
    ``truncate_order``, ``pass_k``, ``singleton_groups``, ...). Returns the per-row and
    per-token advantages (float64) and the metrics. Raises ``ValueError`` naming the argument or
    key: lengths that do not match, an unknown estimator or key, NaN or infinite scores. Needs
    NumPy.
    """

def rollout_correction(
    old_logprobs: ArrayLike,
    rollout_logprobs: ArrayLike,
    lengths: ArrayLike,
    *,
    mask: Optional[ArrayLike] = None,
    **config: Any,
) -> RolloutCorrection:
    """Importance weights and rejection mask between the trainer's and the rollout engine's
    per-token log-probs, with the ``rollout_corr/*`` metrics, as ``rlreplay compute``.

    ``config``: ``rollout_is`` (``token``, ``sequence``, ``geometric``; None: no weights),
    ``rollout_is_threshold``, ``rollout_is_threshold_lower``, ``rollout_is_mode``,
    ``rollout_is_batch_normalize``, ``rollout_rs``, ``rollout_rs_threshold``. In bypass mode pass
    the rollout log-probs as both. Raises ``ValueError`` naming the argument or key. Needs NumPy.
    """

def policy_loss(
    logprobs: ArrayLike,
    token_advantages: ArrayLike,
    lengths: ArrayLike,
    *,
    old_logprobs: Optional[ArrayLike] = None,
    rollout_logprobs: Optional[ArrayLike] = None,
    is_weights: Optional[ArrayLike] = None,
    mask: Optional[ArrayLike] = None,
    teacher_logprobs: Optional[ArrayLike] = None,
    ref_logprobs: Optional[ArrayLike] = None,
    sd_active: Optional[ArrayLike] = None,
    correct: Optional[ArrayLike] = None,
    **config: Any,
) -> PolicyLoss:
    """The policy loss of a batch (one mini-batch) and its per-token coefficients dL/dlogprob,
    as ``rlreplay compute`` evaluates it.

    Per-token arrays: ``logprobs`` (the variable), ``token_advantages``, ``old_logprobs`` (None:
    on-policy), ``rollout_logprobs``, ``is_weights``, ``mask``, ``teacher_logprobs`` (``rlsd``,
    ``rlrt``), ``ref_logprobs`` (``use_kl_loss``); per-row: ``sd_active``, ``correct`` (``rlrt``).
    ``config``: ``loss_mode``, ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``,
    ``clip_ratio_c``, ``loss_agg_mode``, ``loss_scale_factor``, ``loss_agg_normalizer``,
    ``ppo_micro_batch_size_per_gpu``, ``use_kl_loss``, ``kl_loss_coef``, ``kl_loss_type``,
    ``bypass_mode``, ``token_reweight_*``, ... ``grad_logprobs`` is dL/dlogprob per token: with a
    framework's log-probs ``lp``, ``(grad_logprobs * lp).sum()`` has the loss's gradient.
    Raises ``ValueError`` naming the argument or key. Needs NumPy.
    """

def cli_main(argv: Sequence[str]) -> int:
    """Runs the ``rlreplay`` command line ``argv`` (program name first) and returns its exit
    code; present when the module was built with the ``cli`` feature (the wheel's default)."""
