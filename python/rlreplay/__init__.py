"""rlreplay's math verifier, reward dispatch by data source and rollout datasets, for Python.

See docs/PYTHON.md for verl (``custom_reward_function``) and TRL wiring.
"""

from ._rlreplay import Dataset, __version__, compute_score, open_dataset, verify, verify_batch

__all__ = ["Dataset", "__version__", "compute_score", "open_dataset", "verify", "verify_batch"]
