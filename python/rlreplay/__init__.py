"""rlreplay's math verifier and reward dispatch by data source, for Python trainers.

See docs/PYTHON.md for verl (``custom_reward_function``) and TRL wiring.
"""

from ._rlreplay import __version__, compute_score, verify, verify_batch

__all__ = ["__version__", "compute_score", "verify", "verify_batch"]
