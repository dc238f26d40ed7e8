"""rlreplay for Python: the math verifier, reward dispatch by data source, rollout datasets, the
RL algorithm layer over NumPy arrays (advantages, rollout correction, policy losses) and the
``rlreplay`` command.

See docs/PYTHON.md for verl (``custom_reward_function``) and TRL wiring.
"""

from ._rlreplay import (
    Dataset,
    __version__,
    compute_advantages,
    compute_score,
    open_dataset,
    policy_loss,
    rollout_correction,
    verify,
    verify_batch,
)

__all__ = [
    "Dataset",
    "__version__",
    "compute_advantages",
    "compute_score",
    "open_dataset",
    "policy_loss",
    "rollout_correction",
    "verify",
    "verify_batch",
]
