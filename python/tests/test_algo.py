"""The algorithm layer over NumPy against the hand-derived test vectors of the algorithm spec
(§9; the same vectors and tolerances as crates/rlreplay-algo/tests/vectors.rs) and against
`rlreplay compute` on the same batches."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

import rlreplay  # noqa: E402

E = math.e
COMPUTE = Path(__file__).resolve().parents[2] / "crates" / "rlreplay-cli" / "tests" / "data" / "compute"


def close(a, b, tol):
    return abs(a - b) <= tol * (1.0 + abs(b))


def assert_all_close(got, want, tol):
    got = list(got)
    assert len(got) == len(want), (got, want)
    assert all(close(g, w, tol) for g, w in zip(got, want)), (got, want)


def adv(scores, **config):
    """Advantages of one group, one token per row; singleton groups as the reference code."""
    config.setdefault("singleton_groups", "verl")
    n = len(scores)
    out = rlreplay.compute_advantages(scores, ["g"] * n, [1] * n, **config)
    assert out["advantages"].dtype == np.float64
    return out["advantages"]


def group(g, k):
    return [1.0 if i < k else 0.0 for i in range(g)]


# §9.1 Advantage estimators.


def test_grpo():  # TV-A1
    assert_all_close(adv([1, 0, 0, 1]), [0.866024, -0.866024, -0.866024, 0.866024], 1e-6)
    assert_all_close(adv([1, 0, 0, 0]), [1.499997, -0.499999, -0.499999, -0.499999], 1e-6)
    assert list(adv([0.0] * 4)) == [0.0] * 4
    assert list(adv([1.0] * 4)) == [0.0] * 4
    assert_all_close(adv([1]), [0.999999], 1e-6)
    a = adv(group(16, 1))
    assert_all_close([a[0], a[1]], [3.749985, -0.249999], 1e-6)
    a = adv(group(16, 4))
    assert_all_close([a[0], a[4]], [1.677047, -0.559016], 1e-6)


def test_dr_grpo():  # TV-A2
    c = dict(norm_adv_by_std_in_grpo=False)
    assert_all_close(adv([1, 0, 0, 0], **c), [0.75, -0.25, -0.25, -0.25], 1e-12)
    assert list(adv([1], **c)) == [1.0]
    assert list(adv([1, 1, 1], **c)) == [0.0] * 3


def test_rloo():  # TV-A3
    t = 1 / 3
    assert_all_close(adv([1, 0, 0, 0], adv_estimator="rloo"), [1, -t, -t, -t], 1e-12)
    t = 2 / 3
    assert_all_close(adv([1, 1, 0, 0], adv_estimator="rloo"), [t, t, -t, -t], 1e-12)
    assert list(adv([1], adv_estimator="rloo")) == [1.0]


def test_maxrl():  # TV-A4
    c = dict(adv_estimator="maxrl")
    assert_all_close(adv([1, 0, 0, 0], **c), [2.999988, -0.999996, -0.999996, -0.999996], 1e-6)
    assert_all_close(adv([1, 1, 0, 0], **c), [0.999998, 0.999998, -0.999998, -0.999998], 1e-6)
    assert list(adv([0.0] * 4, **c)) == [0.0] * 4
    assert list(adv([1.0] * 4, **c)) == [0.0] * 4
    assert_all_close(adv([1], **c), [1e6], 1e-12)
    assert list(adv([0], **c)) == [0.0]
    a = adv(group(16, 1), **c)
    assert_all_close([a[0], a[1]], [14.999760, -0.999984], 1e-6)
    a = adv(group(16, 4), **c)
    assert_all_close([a[0], a[4]], [2.999988, -0.999996], 1e-6)


def family(estimator, successes, order, n=4):
    """(w_succ, w_fail) of a MaxRL-family estimator: the advantages of a group of `n` rollouts
    with `successes` successes (TV-A6 to TV-A8)."""
    a = adv(group(n, successes), adv_estimator=estimator, truncate_order=order)
    return (a[0] if successes else None, a[-1] if successes < n else None)


@pytest.mark.parametrize(
    "estimator, c, t, want",
    [
        ("maclaurin", 1, 4, (0.25, -0.25)),  # TV-A6
        ("maclaurin", 0, 4, (None, -0.75)),
        ("maclaurin", 2, 4, (0.25, -0.083333)),
        ("maclaurin", 4, 4, (0.25, None)),
        ("maclaurin", 0, 2, (None, -0.25)),
        ("oversample_subset_vr", 1, 2, (0.25, -0.25)),  # TV-A7
        ("oversample_subset_vr", 2, 2, (0.416667 - 0.25, -0.25)),
        ("oversample_subset_vr", 2, 4, (0.25, -0.25)),
        ("oversample_subset_vr", 0, 2, (None, -0.25)),
        ("maclaurin_baseline", 1, 4, (0.483333, -0.077778)),  # TV-A8
        ("maclaurin_baseline", 2, 4, (0.3, -0.05)),
        ("maclaurin_baseline", 0, 4, (None, -0.25)),
        ("vr_cond", 1, 16, (0.75, -0.25)),
    ],
)
def test_maxrl_family_weights(estimator, c, t, want):
    got = family(estimator, c, t)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            assert close(g, w, 1e-6), (got, want)


def test_pkpo():  # TV-A9
    c = dict(adv_estimator="pkpo", pass_k=2)
    t = 1 / 3
    assert_all_close(adv([1, 0, 0, 0], **c), [1, -t, -t, -t], 1e-12)
    t = 4 / 9
    assert_all_close(adv([1, 1, 0, 0], **c), [t, t, -t, -t], 1e-12)
    assert list(adv([1.0] * 4, **c)) == [0.0] * 4


def test_grpo_passk():  # TV-A10
    assert_all_close(adv([1, 0, 0, 0], adv_estimator="grpo_passk"), [1.999996, 0, 0, 0], 1e-6)
    assert list(adv([1, 1, 0, 0], adv_estimator="grpo_passk")) == [0.0] * 4


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus_baseline", "reinforce_plus_plus"])
def test_reinforce_plus_plus_whitening(estimator):  # TV-A11
    out = rlreplay.compute_advantages(
        [1.0, 0.0], ["g", "g"], [2, 1], adv_estimator=estimator, singleton_groups="verl"
    )
    assert_all_close(out["token_advantages"], [0.577350, 0.577350, -1.154701], 1e-6)


def test_singleton_groups_default_to_zero_and_are_counted():
    for est in ["grpo", "rloo", "maxrl", "opo", "pkpo", "maclaurin", "vr_cond"]:
        out = rlreplay.compute_advantages([1.0, 1.0, 0.0], ["a", "b", "b"], [1, 1, 1], adv_estimator=est)
        assert out["advantages"][0] == 0.0, est
        assert out["metrics"]["advantage/singleton_groups"] == 1.0
        assert out["metrics"]["advantage/groups"] == 2.0


# §9.2 to §9.9 Losses, aggregation, rollout correction, RLSD.


@pytest.mark.parametrize(
    "mode, want",
    [
        ("token-mean", 2.5 / 3),
        ("seq-mean-token-sum", 1.25),
        ("seq-mean-token-mean", 0.125),
        ("seq-mean-token-sum-norm", 0.625),
    ],
)
def test_aggregation_modes(mode, want):  # TV-L1
    out = rlreplay.policy_loss(
        [-0.5, -1.0, -2.0],
        [3.0, 3.0, -1.0],
        [2, 1],
        loss_mode="reinforce",
        loss_agg_mode=mode,
        loss_scale_factor=4.0,
    )
    assert close(out["loss"], want, 1e-12), out["loss"]
    if mode == "token-mean":
        assert_all_close(out["grad_logprobs"], [-1.0, -1.0, 1 / 3], 1e-12)


@pytest.mark.parametrize(
    "a, rho, loss, clip, lower",
    [
        (1.0, 1.5, -1.28, True, False),
        (1.0, 1.1, -1.1, False, False),
        (1.0, 0.5, -0.5, False, False),
        (1.0, 0.7, -0.7, False, False),
        (-1.0, 0.5, 0.8, True, False),
        (-1.0, 1.1, 1.1, False, False),
        (-1.0, 1.4, 1.4, False, False),
        (-1.0, 4.0, 3.0, False, True),
        (0.0, 2.0, 0.0, False, False),
    ],
)
def test_ppo_dual_clip_table(a, rho, loss, clip, lower):  # TV-L2
    out = rlreplay.policy_loss(
        [math.log(rho) - 1.0],
        [a],
        [1],
        old_logprobs=[-1.0],
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )
    assert close(out["loss"], loss, 1e-9), out["loss"]
    assert out["metrics"]["actor/pg_clipfrac"] == float(clip)
    assert out["metrics"]["actor/pg_clipfrac_lower"] == float(lower)


def test_token_tis_weights():  # TV-L3
    out = rlreplay.rollout_correction(
        [-1.0, -0.2, -2.0], [-1.5, -1.2, -1.0], [1, 1, 1], rollout_is="token", rollout_is_threshold=2.0
    )
    assert_all_close(out["is_weights"], [1.648721, 2.0, 0.367879], 1e-6)


def test_rollout_correction_metrics():  # TV-L4
    old, roll = [-1.0, -0.5, -2.0], [-1.5, -1.5, -1.0]
    out = rlreplay.rollout_correction(old, roll, [3], rollout_is="token", rollout_is_threshold=2.0)
    m = out["metrics"]
    for k, v in [
        ("rollout_is_mean", 1.578294),
        ("rollout_is_max", E),
        ("rollout_is_min", 0.367879),
        ("rollout_is_ratio_fraction_high", 1 / 3),
        ("rollout_is_ratio_fraction_low", 1 / 3),
        ("rollout_is_std", 0.640569),
        ("rollout_is_eff_sample_size", 0.823344),
        ("kl", -0.166667),
        ("k3_kl", 0.411628),
        ("chi2_token", 2.414224),
        ("chi2_seq", 1.718282),
        ("training_ppl", 3.211271),
        ("rollout_ppl", 3.793668),
        ("log_ppl_diff", -0.166667),
        ("ppl_ratio", 0.846482),
    ]:
        assert close(m[f"rollout_corr/{k}"], v, 2e-6), (k, m[f"rollout_corr/{k}"], v)
    assert_all_close(out["is_weights"], [1.648721, 2.0, 0.367879], 1e-6)
    assert out["mask"].dtype == np.bool_ and out["mask"].all()
    seq = rlreplay.rollout_correction(old, roll, [3], rollout_is="sequence", rollout_is_threshold=2.0)
    assert_all_close(seq["is_weights"], [1.648721] * 3, 1e-6)
    geo = rlreplay.rollout_correction(old, roll, [3], rollout_is="geometric", rollout_is_threshold=2.0)
    assert_all_close(geo["is_weights"], [1.181360] * 3, 1e-6)
    assert rlreplay.rollout_correction(old, roll, [3])["is_weights"] is None


def test_rejection_sampling_masks_tokens():
    out = rlreplay.rollout_correction(
        [-1.0, -1.0, -1.0], [-1.0, -0.1, -2.0], [3], rollout_rs="token_k1", rollout_rs_threshold=2.0
    )
    assert list(out["mask"]) == [True, False, False]
    assert close(out["metrics"]["rollout_corr/rollout_rs_masked_fraction"], 2 / 3, 1e-12)
    assert out["metrics"]["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0
    out = rlreplay.rollout_correction(
        [-1.0, -1.0, -1.0],
        [-1.0, -0.1, -2.0],
        [3],
        rollout_rs="seq_max_k2,token_k3",
        rollout_rs_threshold="0.5,10",
    )
    assert list(out["mask"]) == [True, True, True]


@pytest.mark.parametrize(
    "a, lt, l, ah",
    [
        (0.5, -1.0, -2.0, 0.55),
        (0.5, -2.1, -2.0, 0.476209),
        (-0.5, -1.0, -2.0, -0.45),
        (-0.5, -2.1, -2.0, -0.526293),
        (0.0, -1.0, -2.0, 0.0),
        (2.0, -1.0, -2.0, 2.2),
        (-2.0, -3.0, -2.0, -2.2),
    ],
)
def test_rlsd_reweighting_table(a, lt, l, ah):  # TV-L5, λ = 0.5, ε_w = 0.2
    out = rlreplay.policy_loss([l], [a], [1], teacher_logprobs=[lt], loss_mode="rlsd")
    assert close(out["token_advantages"][0], ah, 1e-6), out["token_advantages"]


def test_rlsd_inactive_rows_and_decay():
    out = rlreplay.policy_loss(
        [-1.0], [0.5], [1], teacher_logprobs=[-7.0], sd_active=[False], loss_mode="rlsd"
    )
    assert out["token_advantages"][0] == 0.5
    # λ decay: λ0 = 1, D = 10, step 6 → λ = 0.5; ℓ = −1, ℓ_T = 0, A = 1, ε_w = 10.
    out = rlreplay.policy_loss(
        [-1.0],
        [1.0],
        [1],
        teacher_logprobs=[0.0],
        loss_mode="rlsd",
        token_reweight_lambda=1.0,
        token_reweight_decay_steps=10,
        global_step=6,
        token_reweight_eps_w=10.0,
    )
    assert close(out["token_advantages"][0], 1.859141, 1e-6)


def test_rlsd_loss_metrics():
    out = rlreplay.policy_loss(
        [-2.0, -2.0], [2.0, -2.0], [1, 1], teacher_logprobs=[-1.0, -3.0], loss_mode="rlsd"
    )
    assert_all_close(out["token_advantages"], [2.2, -2.2], 1e-12)
    assert out["metrics"]["self_distillation/token_reweight_w_clip_frac"] == 1.0


def test_rlrt_variant():
    out = rlreplay.policy_loss(
        [-1.0, -3.0, -1.0, -3.0],
        [2.0] * 4,
        [2, 2],
        teacher_logprobs=[-2.0] * 4,
        correct=[True, False],
        loss_mode="rlrt",
        token_reweight_lambda=1.0,
        token_reweight_eps_w=10.0,
    )
    assert_all_close(out["token_advantages"], [5.436564, 0.735759, 2.0, 2.0], 1e-6)


@pytest.mark.parametrize("normalizer, want", [("global", 1.8), ("verl", 1.5)])
def test_micro_batch_vs_global_token_mean(normalizer, want):  # TV-L7
    out = rlreplay.policy_loss(
        [-1.0] * 10,
        [1, 1] + [2] * 8,
        [1, 1, 4, 4],
        loss_mode="reinforce",
        loss_agg_normalizer=normalizer,
        ppo_micro_batch_size_per_gpu=2,
    )
    assert close(out["loss"], want, 1e-12), out["loss"]


def test_rlsd_tr_end_to_end():  # TV-L8
    c = dict(
        adv_estimator="grpo",
        norm_adv_by_std_in_grpo=False,
        loss_mode="rlsd",
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )
    a = rlreplay.compute_advantages([1.0, 0.0, 0.0, 0.0], ["g"] * 4, [1] * 4, **c)
    assert_all_close(a["advantages"], [0.75, -0.25, -0.25, -0.25], 1e-12)
    out = rlreplay.policy_loss(
        [-1.5, -2.0, -1.0],
        a["token_advantages"][:3],
        [1, 1, 1],
        is_weights=[1.0, 2.0, 0.5],
        teacher_logprobs=[-9.0, -1.0, -2.0],
        sd_active=[False, True, True],
        **c,
    )
    assert_all_close(out["token_advantages"], [0.75, -0.225, -0.275], 1e-12)
    assert close(out["loss"], -0.054167, 1e-5), out["loss"]
    assert_all_close(out["grad_logprobs"], [-0.25, 0.15, 0.045833], 1e-5)


def test_zero_valid_tokens_give_zero_loss():
    for mode in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        out = rlreplay.policy_loss([-1.0, -2.0], [1.0, 1.0], [2, 0], mask=[False, False], loss_agg_mode=mode)
        assert out["loss"] == 0.0
        assert list(out["grad_logprobs"]) == [0.0, 0.0]
        assert out["valid_tokens"] == 0
        assert out["metrics"]["actor/empty_micro_batches"] == 1.0


# Inputs.


def test_array_likes_and_dtypes():
    want = rlreplay.compute_advantages([1.0, 0.0, 0.0, 1.0], ["a", "a", "b", "b"], [2, 1, 1, 3])
    for scores, uids, lengths in [
        (np.array([1, 0, 0, 1], dtype=np.float32), np.array([7, 7, 8, 8]), np.array([2, 1, 1, 3], dtype=np.int32)),
        (np.array([1, 0, 0, 1]), np.array(["a", "a", "b", "b"]), np.array([2, 1, 1, 3], dtype=np.uint64)),
        ((1, 0, 0, 1), ("x", "x", 3, 3), (2, 1, 1, 3)),
        (np.array([1.0, 9.0, 0.0, 9.0, 0.0, 9.0, 1.0])[::2], [0, 0, 1, 1], [np.int64(2), 1, 1, 3]),
    ]:
        got = rlreplay.compute_advantages(scores, uids, lengths)
        assert list(got["advantages"]) == list(want["advantages"])
        assert list(got["token_advantages"]) == list(want["token_advantages"])
    empty = rlreplay.compute_advantages([], [], [])
    assert empty["advantages"].shape == (0,) and empty["token_advantages"].shape == (0,)


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: rlreplay.compute_advantages([1, 0], ["a"], [1, 1]), "uids"),
        (lambda: rlreplay.compute_advantages([1], ["a", "a"], [1, 1]), "scores"),
        (lambda: rlreplay.compute_advantages([1, float("nan")], ["a", "a"], [1, 1]), "scores"),
        (lambda: rlreplay.compute_advantages([1, math.inf], ["a", "a"], [1, 1]), "scores"),
        (lambda: rlreplay.compute_advantages([[1.0]], ["a"], [1]), "scores"),
        (lambda: rlreplay.compute_advantages("ab", ["a", "b"], [1, 1]), "scores"),
        (lambda: rlreplay.compute_advantages([1], [1.5], [1]), "uids"),
        (lambda: rlreplay.compute_advantages([1], "a", [1]), "uids"),
        (lambda: rlreplay.compute_advantages([1], ["a"], [1.5]), "lengths"),
        (lambda: rlreplay.compute_advantages([1], ["a"], np.array([1.0])), "lengths"),
        (lambda: rlreplay.compute_advantages([1], ["a"], [-1]), "lengths"),
        (lambda: rlreplay.compute_advantages([1], ["a"], [1], mask=[True, False]), "mask"),
        (lambda: rlreplay.compute_advantages([1], ["a"], [1], adv_estimator="ppo"), "adv_estimator"),
        (lambda: rlreplay.compute_advantages([1], ["a"], [1], estimator="grpo"), "estimator"),
        (lambda: rlreplay.compute_advantages([1], ["a"], [1], gamma=float("nan")), "gamma"),
        (lambda: rlreplay.compute_advantages([1], ["a"], [1], gamma=2.0), "gamma"),
        (lambda: rlreplay.compute_advantages([1], ["a"], [1], truncate_order=2.5), "truncate_order"),
        (
            lambda: rlreplay.compute_advantages(
                [1], ["a"], [1], adv_estimator="grpo_passk", singleton_groups="verl"
            ),
            "adv_estimator",
        ),
        (lambda: rlreplay.compute_advantages([1e308, -1e308], ["u", "u"], [1, 1]), "scores"),
        (lambda: rlreplay.rollout_correction([-1.0], [-1.0, -2.0], [1]), "rollout_logprobs"),
        (lambda: rlreplay.rollout_correction([float("nan")], [-1.0], [1]), "old_logprobs"),
        (lambda: rlreplay.rollout_correction([-1.0], [-1.0], [1], rollout_is="row"), "rollout_is"),
        (lambda: rlreplay.rollout_correction([-1.0], [-1.0], [1], rollout_rs="token_k1"), "rollout_rs_threshold"),
        (lambda: rlreplay.policy_loss([-1.0], [1.0, 2.0], [1]), "token_advantages"),
        (lambda: rlreplay.policy_loss([-1.0], [1.0], [1], old_logprobs=[math.nan]), "old_logprobs"),
        (lambda: rlreplay.policy_loss([-1.0], [1.0], [1], loss_mode="dpo"), "loss_mode"),
        (lambda: rlreplay.policy_loss([-1.0], [1.0], [1], clip_ratio_c=1.0), "clip_ratio_c"),
        (lambda: rlreplay.policy_loss([-1.0], [1.0], [1], loss_mode="rlsd"), "teacher_logprobs"),
        (
            lambda: rlreplay.policy_loss([-1.0], [1.0], [1], loss_mode="rlrt", teacher_logprobs=[-1.0]),
            "correct",
        ),
        (lambda: rlreplay.policy_loss([-1.0], [1.0], [1], use_kl_loss=True), "ref_logprobs"),
        (lambda: rlreplay.policy_loss([-1.0], [1.0], [1], bypass_mode=True), "rollout_logprobs"),
        (lambda: rlreplay.policy_loss([-1.0], [1.0], [1], sd_active=[True, True]), "sd_active"),
        (
            lambda: rlreplay.policy_loss([-1.0], [1.0], [1], loss_agg_normalizer="verl"),
            "ppo_micro_batch_size_per_gpu",
        ),
    ],
)
def test_bad_input_raises_value_error_naming_it(call, arg):
    with pytest.raises(ValueError, match=f"^{arg}: "):
        call()


def test_wrong_types_raise_type_error_naming_them():
    with pytest.raises(TypeError, match="^scores: "):
        rlreplay.compute_advantages({}, ["a"], [1])
    with pytest.raises(TypeError, match="^clip_ratio: "):
        rlreplay.policy_loss([-1.0], [1.0], [1], clip_ratio=[0.2])


# Against `rlreplay compute`.


def rlreplay_command():
    exe = shutil.which("rlreplay", path=str(Path(sys.executable).parent))
    if exe is None or not hasattr(rlreplay._rlreplay, "cli_main"):
        pytest.skip("no rlreplay command installed with the module")
    return exe


def compute_like_the_cli(doc):
    """`rlreplay compute`'s pipeline (crates/rlreplay-cli/src/commands/compute.rs) through the
    module: rollout correction, advantages on its mask, the loss of the whole batch."""
    config = doc.get("config", {})
    rows = doc["rows"]
    lengths = [len(r["logprobs"]) for r in rows]
    flat = lambda key, default=None: (  # noqa: E731
        [x for r in rows for x in r.get(key, r["logprobs"] if default else [])]
        if any(key in r for r in rows)
        else None
    )
    logprobs = flat("logprobs")
    old = flat("old_logprobs", True) or logprobs
    rollout = flat("rollout_logprobs")
    teacher = flat("teacher_logprobs", True)
    ref = flat("ref_logprobs")
    threshold = config.get("success_reward_threshold", 0.5)
    sd_active = [r.get("sd_active", "teacher_logprobs" in r) for r in rows]
    correct = [r["score"] >= threshold for r in rows]
    metrics, is_weights, mask = {}, None, None
    if rollout is not None:
        bypass = config.get("bypass_mode", False)
        c = rlreplay.rollout_correction(rollout if bypass else old, rollout, lengths, **config)
        metrics.update(c["metrics"])
        is_weights = None if bypass else c["is_weights"]
        mask = c["mask"]
    a = rlreplay.compute_advantages(
        [r["score"] for r in rows], [r["uid"] for r in rows], lengths, mask=mask, **config
    )
    metrics.update(a["metrics"])
    loss = rlreplay.policy_loss(
        logprobs,
        a["token_advantages"],
        lengths,
        old_logprobs=old,
        rollout_logprobs=rollout,
        is_weights=is_weights,
        mask=mask,
        teacher_logprobs=teacher,
        ref_logprobs=ref,
        sd_active=sd_active,
        correct=correct,
        **config,
    )
    metrics.update(loss["metrics"])
    split = lambda xs: [list(xs[s : s + n]) for s, n in zip(np.cumsum([0] + lengths), lengths)]  # noqa: E731
    return {
        "advantages": list(a["advantages"]),
        "token_advantages": split(a["token_advantages"]),
        "is_weights": None if is_weights is None else split(is_weights),
        "loss": loss["loss"],
        "grad_logprobs": split(loss["grad_logprobs"]),
        "metrics": metrics,
    }


def random_batch(seed, config):
    """A batch of 4 groups of 4 rows with random log-probs. Values are multiples of 2^-10, which
    the command's JSON parser reads exactly (it may round a long decimal to a neighbouring
    float)."""
    rng = np.random.default_rng(seed)
    q = lambda xs: [round(float(x) * 1024) / 1024 for x in xs]  # noqa: E731
    rows = []
    for g in range(4):
        for _ in range(4):
            n = int(rng.integers(0, 6))
            lp = q(-rng.exponential(1.0, n))
            rows.append(
                {
                    "uid": f"p{g}",
                    "score": float(rng.integers(0, 2)),
                    "logprobs": lp,
                    "old_logprobs": q(lp + rng.normal(0, 0.1, n)),
                    "rollout_logprobs": q(lp + rng.normal(0, 0.3, n)),
                    "teacher_logprobs": q(lp + rng.normal(0, 0.5, n)),
                    "ref_logprobs": q(lp + rng.normal(0, 0.2, n)),
                }
            )
    return {"config": config, "rows": rows}


CONFIGS = [
    {"adv_estimator": "maxrl", "loss_mode": "ppo", "clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
    {"adv_estimator": "grpo", "loss_mode": "reinforce", "rollout_is": "token", "loss_agg_mode": "seq-mean-token-mean"},
    {"adv_estimator": "rloo", "rollout_is": "sequence", "rollout_is_mode": "mask", "use_kl_loss": True},
    {"adv_estimator": "reinforce_plus_plus", "rollout_rs": "token_k1", "rollout_rs_threshold": 1.5},
    {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False, "loss_mode": "rlsd", "rollout_is": "token"},
    {"adv_estimator": "maclaurin_baseline", "truncate_order": 4, "loss_mode": "rlrt"},
    {"adv_estimator": "opo", "loss_agg_normalizer": "verl", "ppo_micro_batch_size_per_gpu": 3},
    {"adv_estimator": "pkpo", "pass_k": 2, "bypass_mode": True, "rollout_is": "geometric", "loss_mode": "reinforce"},
]


@pytest.mark.parametrize("case", ["example.json", "rlsd_tr.json"] + [f"random-{i}" for i in range(len(CONFIGS))])
def test_same_numbers_as_rlreplay_compute(case, tmp_path):
    exe = rlreplay_command()
    if case.startswith("random-"):
        i = int(case.split("-")[1])
        path = tmp_path / "batch.json"
        path.write_text(json.dumps(random_batch(i, CONFIGS[i])))
    else:
        path = COMPUTE / case
    out = subprocess.run([exe, "compute", "--input", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    want = json.loads(out.stdout)
    got = compute_like_the_cli(json.loads(path.read_text()))
    assert got == want


def test_without_numpy_an_import_error_not_a_panic():
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "import rlreplay\n"
        "try:\n"
        "    rlreplay.compute_advantages([1.0], ['a'], [1])\n"
        "except ImportError as e:\n"
        "    print('ImportError', e)\n"
        "print(rlreplay.verify('1', '1'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ImportError rlreplay's algorithm functions need NumPy"), out.stdout
    assert out.stdout.endswith("1.0\n")
