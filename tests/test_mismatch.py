"""The tiny engine's mismatched sampler (rlkit.tiny.mismatch): weights as a bf16 or int8 engine holds them, top-p
truncation, and the run that logs the mismatch and corrects for it."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.errors import InvalidSetting
from rlkit.tiny.config import build_config
from rlkit.tiny.mismatch import MASKED, MismatchedSampler, mismatched, nucleus, quantized_int8, rounded
from rlkit.tiny.model import ModelConfig, TinyDecoder, token_logprobs
from rlkit.tiny.sampler import sample
from rlkit.tiny.task import build_tokenizer


def test_nucleus_by_hand():
    """p = (0.5, 0.3, 0.15, 0.05): top-p 0.8 keeps the first two (0.5 + 0.3 reaches 0.8), 0.81 the first three,
    0.4 the first alone; the order of the vocabulary does not matter."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    kept = lambda p, x=logits: (nucleus(x, p) > MASKED).tolist()  # noqa: E731
    assert kept(0.8) == [True, True, False, False]
    assert kept(0.81) == [True, True, True, False]
    assert kept(0.4) == [True, False, False, False]
    assert kept(1.0) == [True] * 4
    perm = torch.tensor([2, 0, 3, 1])
    assert kept(0.8, logits[perm]) == [False, True, False, True]
    probs = nucleus(logits, 0.8).softmax(-1)
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))  # renormalised over the nucleus
    assert probs[2] == 0 and probs[3] == 0  # exactly: never sampled


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-8, 8), min_size=2, max_size=12), st.floats(0.05, 1.0))
def test_nucleus_is_the_smallest_top_set_reaching_p(values, top_p):
    logits = torch.tensor(values)
    probs = logits.softmax(-1)
    kept = nucleus(logits, top_p) > MASKED
    assert kept[probs.argmax()]  # the most probable token always stays
    assert probs[kept].sum() >= top_p - 1e-6 or kept.all()
    if kept.sum() > 1:  # without its least probable token the nucleus would not reach p
        assert probs[kept].sum() - probs[kept].min() < top_p + 1e-6
    if not kept.all():  # the top of the distribution
        assert probs[~kept].max() <= probs[kept].min() + 1e-7


def test_rounded_weights_are_a_bf16_or_w8_engines():
    torch.manual_seed(0)
    model = TinyDecoder(ModelConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=2, max_len=32))
    state = model.state_dict()
    bf16 = rounded(model, "bfloat16")
    assert all(torch.equal(bf16[k], v.bfloat16().float()) for k, v in state.items())
    assert any(not torch.equal(bf16[k], v) for k, v in state.items())
    assert all(torch.equal(v, state[k]) for k, v in rounded(model, "float32").items())
    w8 = rounded(model, "int8")
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linear and all(torch.equal(w8[k], v) for k, v in state.items() if k not in linear)  # embeddings, norms kept
    for k in linear:
        w, q = state[k], w8[k]
        scale = w.abs().amax(-1, keepdim=True) / 127
        assert (q - w).abs().le(scale / 2 + 1e-7).all()  # to the nearest level
        assert all(len(row.unique()) <= 255 for row in q)
    with pytest.raises(ValueError, match="rollout_dtype must be one of"):
        rounded(model, "fp8")


def test_int8_by_hand():
    w = torch.tensor([[1.0, -0.5, 0.26], [0.0, 0.0, 0.0]])
    q = quantized_int8(w)
    assert q[0, 0] == 1.0 and q[0, 1] == pytest.approx(-64 / 127) and q[0, 2] == pytest.approx(33 / 127)
    assert torch.equal(q[1], torch.zeros(3))


def test_a_float32_sampler_without_top_p_samples_what_the_model_samples_and_others_differ():
    torch.manual_seed(1)
    tok = build_tokenizer()
    model = TinyDecoder(ModelConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=2, max_len=64))
    prompts = ["12+7=", "3*4=", "9-5="] * 2

    def draw(m):
        return sample(m, tok, prompts, max_new_tokens=12, temperature=1.0, generator=torch.Generator().manual_seed(3))

    plain, same = draw(model), draw(MismatchedSampler(TinyDecoder(model.config), "float32").follow(model))
    assert torch.equal(plain.tokens, same.tokens) and torch.equal(plain.logp, same.logp)
    assert not mismatched("float32", 1.0) and mismatched("bfloat16", 1.0) and mismatched("float32", 0.9)
    for dtype, top_p in (("bfloat16", 1.0), ("int8", 1.0), ("float32", 0.7)):
        ro = draw(MismatchedSampler(TinyDecoder(model.config), dtype, top_p).follow(model))
        ids, attn, start = ro.sequences()
        with torch.no_grad():
            trainer, _ = token_logprobs(model, ids, attn, start)
        gap = ((trainer - ro.logp) * ro.mask).abs().max()
        assert gap > 1e-4, (dtype, top_p)  # the sampler's log-probs are not the trainer's
        if top_p < 1:  # a truncated distribution gives each kept token more probability, never less
            assert ((ro.logp - trainer) * ro.mask).min() > -1e-5


def test_a_run_with_a_bf16_top_p_sampler_logs_the_mismatch_and_its_correction(tmp_path):
    from rlkit.tiny.rl import _mismatch_logs, train

    settings_ = {"rollout_dtype": "bfloat16", "rollout_top_p": 0.9, "rollout_correction": "token_tis"}
    train(build_config("grpo", "smoke", settings_), tmp_path, progress=False)
    steps = [json.loads(line)["data"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]
    for data in steps:
        assert _mismatch_logs(settings_) <= data.keys()
        assert data["rollout_corr/kl"] > 0.01  # top-p 0.9: every sampled token gains probability
        assert 0 < data["rollout_corr/rollout_is_mean"] < 1
    assert json.loads((tmp_path / "config.json").read_text())["rollout_dtype"] == "bfloat16"


@pytest.mark.parametrize("key, value, message", [
    ("rollout_dtype", "fp8", "rollout_dtype: 'fp8' is not one of float32, bfloat16, int8"),
    ("rollout_top_p", 1.5, "rollout_top_p must be in (0, 1]"),
    ("rollout_top_p", 0.0, "rollout_top_p must be > 0"),
    ("rollout_correction", "tis", "rollout_correction: 'tis' is not one of None, token_tis"),
    ("old_logp_source", "vllm", "old_logp_source: 'vllm' is not one of None, sampler, trainer"),
])
def test_mismatch_settings_are_checked_before_any_work(key, value, message):
    with pytest.raises(InvalidSetting, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_config("grpo", "smoke", {key: value})


def test_a_correction_takes_the_trainers_old_log_probs():
    with pytest.raises(InvalidSetting, match="set old_logp_source=trainer"):
        build_config("grpo", "smoke", {"rollout_correction": "seq_tis", "old_logp_source": "sampler"})


@pytest.mark.parametrize("source", ["sampler", "trainer"])
def test_the_old_log_probs_come_from_where_the_run_says(tmp_path, source):
    """With a top-p sampler, ``sampler`` keeps the sampler's log-probs as the old ones (the first mini-batch's ratio
    then carries the mismatch: actor/ppo_kl far from 0), ``trainer`` recomputes them (that ratio starts at 1)."""
    from rlkit.tiny.rl import train

    cfg = build_config("grpo", "smoke", {"rollout_top_p": 0.8, "old_logp_source": source, "steps": 1,
                                         "mini_batches": 1})
    train(cfg, tmp_path, progress=False)
    data = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])["data"]
    assert data["rollout_corr/kl"] > 1e-3  # the mismatch is there either way, and logged
    one_minibatch_kl = abs(data["actor/ppo_kl"])  # one mini-batch, one epoch: π_θ is the sampling weights' policy
    assert (one_minibatch_kl < 1e-5) == (source == "trainer") and one_minibatch_kl < 1, one_minibatch_kl
