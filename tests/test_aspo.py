"""ASPO (Eq. 2 of arXiv 2508.19201): hand-worked numbers, a loop reference, invariants, validation."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_batch, make_groups
from rlkit.methods.aspo import Config, aspo_metrics, aspo_shape
from rlkit.methods.grpo import Config as GRPOConfig
from rlkit.methods.grpo import grpo_advantage
from rlkit.registry import AdvantageInputs, MissingInputs, advantage

NAN = float("nan")

# Two groups. Group "a": s0, s1, s2 eligible (correct, code); s3 correct without code (NaN); s4 incorrect with
# code; s5 correct with a negative position (no code). Group "b": nobody eligible.
HAND = {
    "adv": torch.tensor([0.5, 0.5, 0.5, 0.5, -0.8, 0.5, -0.5, 0.5, 0.5], dtype=torch.float64),
    "ids": ["a", "a", "a", "a", "a", "a", "b", "b", "b"],
    "correct": torch.tensor([1, 1, 1, 1, 0, 1, 0, 1, 1]),
    "pos": torch.tensor([100.0, 900.0, 650.0, NAN, 50.0, -1.0, 10.0, NAN, -3.0]),
    "lengths": torch.tensor([1000, 1400, 600, 800, 300, 700, 100, 100, 100]),
}


def shape_hand(ids=None, **kw):
    h = HAND
    return aspo_shape(h["adv"], h["ids"] if ids is None else ids, h["correct"], h["pos"], h["lengths"], **kw)


def test_aspo_by_hand_two_groups():
    # group a, eligible s0..s2: p̄ = (100 + 900 + 650)/3 = 550, L̄ = (1000 + 1400 + 600)/3 = 1000
    # δ = −2, k = 0.7, |A| = 0.5 → window ±0.35
    # s0: −2·(100 − 550)/1000 = +0.9 → clipped at +0.35 → 0.85
    # s1: −2·(900 − 550)/1000 = −0.7 → clipped at −0.35 → 0.15
    # s2: −2·(650 − 550)/1000 = −0.2 → inside        → 0.30
    # s3 (no code), s4 (incorrect), s5 (p < 0) and all of group b are untouched
    expected = torch.tensor([0.85, 0.15, 0.30, 0.5, -0.8, 0.5, -0.5, 0.5, 0.5], dtype=torch.float64)
    torch.testing.assert_close(shape_hand(), expected)


@pytest.mark.parametrize(
    "ids",
    [
        np.array(["a", "a", "a", "a", "a", "a", "b", "b", "b"], dtype=object),  # verl's uid array
        torch.tensor([7, 7, 7, 7, 7, 7, 3, 3, 3]),
        [("p", 1)] * 6 + [("p", 2)] * 3,
    ],
)
def test_aspo_group_id_types_give_the_same_result(ids):
    torch.testing.assert_close(shape_hand(ids), shape_hand())


def test_aspo_code_pass_gates_eligibility():
    # s1's code failed: eligible s0, s2 → p̄ = (100 + 650)/2 = 375, L̄ = (1000 + 600)/2 = 800; δ = −0.5
    # s0: −0.5·(100 − 375)/800 = +0.171875 (window ±0.35) → 0.671875
    # s2: −0.5·(650 − 375)/800 = −0.171875               → 0.328125;  s1 keeps 0.5
    code_pass = torch.tensor([True, False, True, True, True, True, True, True, True])
    out = shape_hand(delta=-0.5, code_pass=code_pass)
    expected = torch.tensor([0.671875, 0.5, 0.328125, 0.5, -0.8, 0.5, -0.5, 0.5, 0.5], dtype=torch.float64)
    torch.testing.assert_close(out, expected)
    # all passed = no gate: p̄ = 550, L̄ = 1000 → −0.5·(−450, 350, 100)/1000 = +0.225, −0.175, −0.05
    all_passed = shape_hand(delta=-0.5, code_pass=[1] * 9)
    torch.testing.assert_close(all_passed[:3], torch.tensor([0.725, 0.325, 0.45], dtype=torch.float64))


def test_aspo_token_level_advantages_use_the_token_mean_and_valid_tokens_only():
    # base A = token means over the mask: (1+2+3)/3 = 2, (0.5+0.5)/2 = 0.5, −1 (incorrect)
    # eligible s0, s1: p̄ = (2 + 6)/2 = 4, L̄ = (4 + 8)/2 = 6
    # s0: −2·(2 − 4)/6 = +2/3, window ±1.4  → +2/3 on its 3 valid tokens; the padded 9.0 stays
    # s1: −2·(6 − 4)/6 = −2/3, window ±0.35 → −0.35 on its 2 valid tokens
    f64 = torch.float64
    adv = torch.tensor([[1.0, 2.0, 3.0, 9.0], [0.5, 0.5, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0]], dtype=f64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=f64)
    out = aspo_shape(adv, [0, 0, 0], [True, True, False], torch.tensor([2.0, 6.0, 1.0]), [4, 8, 4], mask=mask)
    b = 2.0 / 3.0
    expected = torch.tensor([[1 + b, 2 + b, 3 + b, 9.0], [0.15, 0.15, 0.0, 0.0], [-1.0] * 4], dtype=f64)
    torch.testing.assert_close(out, expected)
    # the shaped token mean is base + bias
    token_mean = (out * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(token_mean, torch.tensor([2 + b, 0.15, -1.0], dtype=f64))


def test_aspo_window_uses_abs_of_a_negative_base_advantage():
    # PPO/GAE can give a correct response A < 0. p̄ = 5, L̄ = 10:
    # s0: −2·(0 − 5)/10 = +1, window ±0.7 → −1 + 0.7 = −0.3;  s1: −1 → −0.7 → 1 − 0.7 = 0.3
    out = aspo_shape(torch.tensor([-1.0, 1.0]), [0, 0], [1, 1], [0.0, 10.0], [10, 10])
    torch.testing.assert_close(out, torch.tensor([-0.3, 0.3]))


def test_aspo_degenerate_groups_and_int_positions_are_handled():
    # group 0: eligible lengths all 0 → L̄ = 0 → skipped; group 1: L̄ = NaN → skipped; group 2 is shaped
    # (int positions, −1 = no code). Group 2: p̄ = (0 + 4)/2 = 2, L̄ = 8, raw ±0.5, window ±0.7
    adv = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    out = aspo_shape(
        adv, [0, 0, 1, 1, 2, 2, 2], [1] * 7, torch.tensor([3, 5, 1, 2, 0, 4, -1]),
        torch.tensor([0.0, 0.0, NAN, 5.0, 8.0, 8.0, 8.0]),
    )
    torch.testing.assert_close(out, torch.tensor([1.0, 1.0, 1.0, 1.0, 1.5, 0.5, 1.0]))


def test_aspo_returns_a_new_detached_tensor():
    adv = torch.tensor([1.0, -1.0], requires_grad=True)
    out = aspo_shape(adv, [0, 0], [1, 0], [1.0, 2.0], [4, 4])
    assert not out.requires_grad and out.data_ptr() != adv.data_ptr()
    torch.testing.assert_close(out, adv.detach())  # a single eligible sample sits at p̄ → bias 0


# ------------------------------------------------------------------ loop reference (plain Python, Eq. 2)


def aspo_reference(adv, ids, correct, pos, lengths, delta, k, code_pass=None, mask=None):
    a = adv.tolist()
    out = [row[:] if isinstance(row, list) else row for row in a]
    m = None if mask is None else mask.tolist()
    base = []
    for i in range(len(a)):
        if m is None:
            base.append(a[i])
        else:
            valid = [a[i][t] for t in range(len(a[i])) if m[i][t]]
            base.append(sum(valid) / len(valid) if valid else 0.0)
    for g in dict.fromkeys(ids):
        elig = [
            i for i in range(len(a))
            if ids[i] == g and bool(correct[i]) and math.isfinite(pos[i]) and pos[i] >= 0
            and (code_pass is None or bool(code_pass[i]))
        ]
        if not elig:
            continue
        p_bar = sum(pos[i] for i in elig) / len(elig)
        l_bar = sum(lengths[i] for i in elig) / len(elig)
        if not (math.isfinite(l_bar) and l_bar > 0):
            continue
        for i in elig:
            bias = min(max(delta * (pos[i] - p_bar) / l_bar, -k * abs(base[i])), k * abs(base[i]))
            if m is None:
                out[i] = a[i] + bias
            else:
                out[i] = [a[i][t] + bias if m[i][t] else a[i][t] for t in range(len(a[i]))]
    return torch.tensor(out, dtype=adv.dtype)


def random_case(seed: int):
    g = np.random.default_rng(seed)
    B = int(g.integers(1, 20))
    raw_ids = g.integers(0, max(1, B // 3), size=B)
    kind = seed % 3
    ids = raw_ids.tolist() if kind == 0 else (
        [f"uid-{i}" for i in raw_ids] if kind == 1 else np.array([f"u{i}" for i in raw_ids], dtype=object))
    correct = g.random(B) < 0.7
    pos = g.uniform(0, 3000, size=B).round()
    pos[g.random(B) < 0.2] = np.nan
    pos[g.random(B) < 0.1] = -1
    lengths = pos + g.uniform(1, 3000, size=B).round()
    lengths[np.isnan(lengths)] = 500.0
    if seed % 5 == 0:
        lengths[:] = 0.0  # every group degenerate
    code_pass = (g.random(B) < 0.8) if seed % 2 else None
    delta, k = -g.uniform(0.1, 4.0), g.uniform(0.0, 0.99)
    if seed % 4 < 2:
        adv, mask = torch.tensor(g.normal(size=B)), None
    else:
        T = int(g.integers(1, 7))
        adv = torch.tensor(g.normal(size=(B, T)))
        mask = torch.tensor((g.random((B, T)) < 0.7).astype(np.float64))
    return adv, ids, correct, pos, lengths, delta, k, code_pass, mask


@pytest.mark.parametrize("seed", range(30))
def test_aspo_matches_loop_reference(seed):
    adv, ids, correct, pos, lengths, delta, k, code_pass, mask = random_case(seed)
    out = aspo_shape(
        adv, ids, torch.tensor(correct), torch.tensor(pos), torch.tensor(lengths),
        delta=delta, k=k, code_pass=None if code_pass is None else torch.tensor(code_pass), mask=mask,
    )
    ref = aspo_reference(adv, list(ids), correct, pos.tolist(), lengths.tolist(), delta, k, code_pass, mask)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_loop_reference_is_not_trivial():
    # the seeds above must actually shape something (otherwise the equivalence would prove nothing)
    changed = 0
    for seed in range(30):
        adv, ids, correct, pos, lengths, delta, k, code_pass, mask = random_case(seed)
        ref = aspo_reference(adv, list(ids), correct, pos.tolist(), lengths.tolist(), delta, k, code_pass,
                             mask)
        changed += int(not torch.equal(ref, adv))
    assert changed >= 10


# ------------------------------------------------------------------ properties


@st.composite
def batches(draw, token_level: bool):
    B = draw(st.integers(1, 12))
    ids = draw(st.lists(st.sampled_from(["x", "y", "z", "w"]), min_size=B, max_size=B))
    correct = draw(st.lists(st.booleans(), min_size=B, max_size=B))
    pos = draw(st.lists(st.one_of(st.floats(0, 5000), st.just(NAN), st.just(-1.0)), min_size=B, max_size=B))
    lengths = draw(st.lists(st.floats(0, 8000), min_size=B, max_size=B))
    code_pass = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=B, max_size=B)))
    delta = draw(st.floats(-10.0, -1e-3))
    k = draw(st.floats(0.0, 0.999))
    vals = st.floats(-5, 5, allow_nan=False, allow_subnormal=False)
    if token_level:
        T = draw(st.integers(1, 5))
        adv = torch.tensor(draw(st.lists(st.lists(vals, min_size=T, max_size=T), min_size=B, max_size=B)),
                           dtype=torch.float64)
        mask = torch.tensor(draw(st.lists(st.lists(st.integers(0, 1), min_size=T, max_size=T),
                                          min_size=B, max_size=B)), dtype=torch.float64)
    else:
        adv = torch.tensor(draw(st.lists(vals, min_size=B, max_size=B)), dtype=torch.float64)
        mask = None
    return {
        "adv": adv, "ids": ids, "correct": torch.tensor(correct),
        "pos": torch.tensor(pos, dtype=torch.float64),
        "lengths": torch.tensor(lengths, dtype=torch.float64), "delta": delta, "k": k,
        "code_pass": None if code_pass is None else torch.tensor(code_pass), "mask": mask,
    }


def call(b):
    return aspo_shape(b["adv"], b["ids"], b["correct"], b["pos"], b["lengths"], delta=b["delta"], k=b["k"],
                      code_pass=b["code_pass"], mask=b["mask"])


def base_of(adv, mask):
    return adv if mask is None else (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


@settings(max_examples=200, deadline=None)
@given(st.booleans().flatmap(batches))
def test_prop_inputs_are_never_modified(b):
    before = {name: v.clone() for name, v in b.items() if isinstance(v, torch.Tensor)}
    out = call(b)
    for name, v in before.items():
        assert torch.equal(b[name].nan_to_num(7.5), v.nan_to_num(7.5)), f"{name} was modified in place"
    assert out.data_ptr() != b["adv"].data_ptr()


@settings(max_examples=200, deadline=None)
@given(st.booleans().flatmap(batches))
def test_prop_bias_is_within_k_abs_base_and_result_is_finite(b):
    out = call(b)
    assert torch.isfinite(out).all()
    base = base_of(b["adv"], b["mask"])
    moved = (base_of(out, b["mask"]) - base).abs()
    assert (moved <= b["k"] * base.abs() + 1e-9 * (1 + base.abs())).all()


@settings(max_examples=200, deadline=None)
@given(st.booleans().flatmap(batches))
def test_prop_samples_that_are_not_eligible_are_bit_identical(b):
    out = call(b)
    pos = b["pos"]
    eligible = b["correct"] & torch.isfinite(pos) & (pos >= 0)
    if b["code_pass"] is not None:
        eligible &= b["code_pass"]
    assert torch.equal(out[~eligible], b["adv"][~eligible])
    if b["mask"] is not None:  # padding and tool-output tokens are never shaped
        invalid = b["mask"] == 0
        assert torch.equal(out[invalid], b["adv"][invalid])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.floats(0, 4000)), min_size=1, max_size=12),
    st.floats(-10.0, -1e-3),
    st.floats(0.0, 0.999),
)
def test_prop_all_correct_grpo_groups_are_unchanged(samples, delta, k):
    # every response correct → GRPO advantage 0 in every group → window [0, 0] → nothing moves
    # (a lone response keeps A = r under verl's GRPO, but it sits at p̄ itself, so its bias is 0 as well)
    ids = [g for g, _ in samples]
    mask = torch.ones(len(samples), 3)
    adv = grpo_advantage(torch.ones(len(samples)), ids, mask)
    pos = torch.tensor([p for _, p in samples])
    out = aspo_shape(adv, ids, [True] * len(samples), pos, pos + 100.0, delta=delta, k=k, mask=mask)
    assert torch.equal(out, adv)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.floats(0, 4000)), min_size=2, max_size=12),
    st.floats(-10.0, -1e-3),
    st.floats(0.0, 0.999),
)
def test_prop_earlier_code_never_gets_a_smaller_advantage_in_a_grpo_group(samples, delta, k):
    # correct responses of one GRPO group share A; with δ < 0 the shaped A is non-increasing in p
    ids = [g for g, _, _ in samples]
    correct = torch.tensor([c for _, c, _ in samples])
    pos = torch.tensor([p for _, _, p in samples], dtype=torch.float64)
    adv = grpo_advantage(correct.double(), ids, torch.ones(len(samples), 1))[:, 0]
    out = aspo_shape(adv, ids, correct, pos, torch.full_like(pos, 4000.0), delta=delta, k=k)
    for i in range(len(samples)):
        for j in range(len(samples)):
            if ids[i] == ids[j] and correct[i] and correct[j] and pos[i] < pos[j]:
                assert out[i] >= out[j] - 1e-12


# ------------------------------------------------------------------ validation, registry, config, metrics


def test_aspo_validation():
    def run(adv=None, ids=(0, 0, 1), correct=(1, 1, 1), pos=(1.0, 2.0, 3.0), lengths=(5, 5, 5), **kw):
        adv = torch.ones(3) if adv is None else adv
        return aspo_shape(adv, list(ids), list(correct), list(pos), list(lengths), **kw)

    for bad_k in (1.0, -0.1, 1.5, NAN):
        with pytest.raises(ValueError, match=r"k must be in \[0, 1\)"):
            run(k=bad_k)
    with pytest.warns(UserWarning, match="delta = 1.0 >= 0"):
        run(delta=1.0)
    with pytest.warns(UserWarning, match=">= 0"):
        run(delta=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(delta=-2.5, k=0.9)  # the paper's settings do not warn
    with pytest.raises(ValueError, match="delta must be finite"):
        run(delta=-math.inf)
    with pytest.raises(ValueError, match=r"lengths must have one value per sample, shape \(3,\); got \(2,\)"):
        run(lengths=[5, 5])
    with pytest.raises(ValueError, match="first_code_pos must have one value per sample"):
        run(pos=[[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="2 group ids for 3 advantages"):
        run(ids=[0, 0])
    with pytest.raises(ValueError, match="correct must be boolean or 0/1"):
        run(correct=[1, -1, 1])  # ±1 rewards passed as correctness
    with pytest.raises(ValueError, match="code_pass must be boolean or 0/1"):
        run(code_pass=[0.5, 1, 1])
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        run(lengths=[5, -1, 5])
    with pytest.raises(ValueError, match=r"need mask=: the base advantage A_i is their token mean"):
        run(adv=torch.ones(3, 4))
    with pytest.raises(ValueError, match="mask is only used with"):
        run(mask=torch.ones(3, 4))
    with pytest.raises(ValueError, match="adv has shape"):
        run(adv=torch.ones(3, 4), mask=torch.ones(3, 5))
    with pytest.raises(ValueError, match=r"adv must be \(B,\) or \(B, T\)"):
        run(adv=torch.ones(3, 4, 2))


def test_aspo_config_mirrors_the_recipe():
    cfg = Config()
    assert (cfg.enabled, cfg.delta, cfg.k, cfg.require_code_pass, cfg.base_advantage) == (
        True, -2.0, 0.7, False, "grpo")
    # the verl trainer's code detection is not a method setting (rlkit.verl.plugin's algorithm.aspo.code_detection)
    assert "code_detection" not in {f.name for f in dataclasses.fields(cfg)}


def test_estimator_shapes_its_base_advantage_through_the_registry():
    b = make_batch(5)
    B = len(b["mask"])
    ids, rewards = make_groups(5, B)
    g = torch.Generator().manual_seed(5)
    lengths = b["mask"].sum(-1)
    pos = torch.where(torch.rand(B, generator=g) < 0.6, torch.floor(torch.rand(B, generator=g) * lengths), -1.0)
    passed = torch.rand(B, generator=g) < 0.7
    inputs = AdvantageInputs(rewards, ids, b["mask"], correct=rewards > 0, first_code_pos=pos,
                             lengths=lengths, code_pass=passed)
    base = grpo_advantage(rewards, ids, b["mask"], eps=1e-4)
    configs = {"aspo": Config(delta=-2.5, k=0.9, require_code_pass=True, eps=1e-4)}  # its base's eps: its own
    expected = aspo_shape(base, ids, rewards > 0, pos, lengths, delta=-2.5, k=0.9, code_pass=passed, mask=b["mask"])
    assert torch.equal(advantage("aspo", inputs, configs), expected)
    assert torch.equal(advantage("aspo", inputs, {**configs, "grpo": GRPOConfig(eps=1e-2)}), expected)  # not GRPO's
    assert torch.equal(advantage("aspo", inputs, {"aspo": Config(enabled=False, eps=1e-4)}), base)
    with pytest.raises(MissingInputs, match="aspo needs per-response correct, first_code_pos, lengths"):
        advantage("aspo", AdvantageInputs(rewards, ids, b["mask"]), configs)


def test_aspo_metrics_by_hand():
    # positions: 120, none (NaN), 40, none (−1) → 2 of 4 use code, mean first position (120 + 40)/2 = 80
    # calls 3 + 0 + 1 + 0 = 4 over 4 responses → 1.0; correct ∧ code: only sample 0 → 1/4
    # code_pass over the 2 responses with code: sample 0 failed, sample 2 passed → 1/2
    m = aspo_metrics(torch.tensor([120.0, NAN, 40.0, -1.0]), [True, True, False, False], [3, 0, 1, 0],
                     code_pass=[False, True, True, True])
    assert m == {
        "tool/first_code_pos/mean": 80.0, "tool/code_ratio": 0.5, "tool/code_rounds/mean": 1.0,
        "tool/correct_code_ratio": 0.25, "tool/code_pass_ratio": 0.5,
    }
    none = aspo_metrics([NAN, -1.0], [True, True], [0, 0])
    assert math.isnan(none["tool/first_code_pos/mean"]) and none["tool/code_ratio"] == 0.0
    assert "tool/code_pass_ratio" not in none
    with pytest.raises(ValueError, match="code_calls must have one value per sample"):
        aspo_metrics([1.0, 2.0], [True, True], [1])
