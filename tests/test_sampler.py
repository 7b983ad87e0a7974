"""Tiny engine sampler: batching, determinism, tool interception, log-probs, the temperature hook."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit.methods.hapo import adaptive_temperature, entropy_stats
from rlkit.tiny.model import ModelConfig, TinyDecoder, token_logprobs
from rlkit.tiny import sampler
from rlkit.tiny.sampler import _inverse_cdf_sample, sample
from rlkit.tiny.tokenizer import CharTokenizer

ALPHA = "0123456789+-*/ #=.abcdexyz?"
TOK = CharTokenizer(ALPHA)


def fake_tool(expr: str) -> str:
    """Sums '+'-separated integers (no eval); anything else is an error string."""
    try:
        return str(sum(int(x) for x in expr.split("+")))
    except ValueError:
        return "e!e"  # "!" is outside the alphabet: the sampler drops it


def small_model(seed: int = 0, **kw) -> TinyDecoder:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=TOK.vocab_size, d_model=32, n_layers=2, n_heads=4, max_len=96)
    cfg.update(kw)
    return TinyDecoder(ModelConfig(**cfg)).eval()


class Scripted(TinyDecoder):
    """A real decoder (so the cache is exercised) plus ``scale``·one-hot bigram logits: with a large scale the
    next token is a function of the current one; with a small one the bigram only biases a random model."""

    def __init__(self, script: dict[str, str], scale: float = 50.0, seed: int = 0):
        torch.manual_seed(seed)
        super().__init__(ModelConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=2, n_heads=4, max_len=96))
        nxt = torch.full((TOK.vocab_size,), TOK.eos_id)
        for a, b in script.items():
            nxt[TOK.encode(a)[0]] = TOK.encode(b)[0]
        self.register_buffer("bigram", torch.nn.functional.one_hot(nxt, TOK.vocab_size).float() * scale)
        self.eval()

    def forward(self, ids, last_only=False, **kw):
        return super().forward(ids, last_only=last_only, **kw) + self.bigram[ids[:, -1:] if last_only else ids]

    def forward_after_prefixes(self, prefix_ids, prefix_mask, prompt_of, ids):
        return super().forward_after_prefixes(prefix_ids, prefix_mask, prompt_of, ids) + self.bigram[ids]


# a → <code>1+2</code> … ' ' → # → <eos>;  b → <eos>;  c → 7 → 7 → … (never ends)
SCRIPT = {"a": "<code>", "<code>": "1", "1": "+", "+": "2", "2": "</code>", "</code>": "x", "</output>": " ",
          " ": "#", "#": "<eos>", "b": "<eos>", "c": "7", "7": "7"}


def test_tool_interception_hand_example():
    model = Scripted(SCRIPT)
    r = sample(model, TOK, ["x a", "x b", "x c"], max_new_tokens=14, greedy=True, tool=fake_tool)
    assert r.texts[0] == "<code>1+2</code><output>3</output> #"
    assert r.texts[1] == ""
    assert r.texts[2] == "7" * 14
    assert r.tokens.shape == (3, 14)
    assert r.mask[0, :11].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1]  # tool output masked; <eos> generated
    assert r.mask[0, 11:].sum() == 0 and r.mask[1].tolist() == [1] + [0] * 13 and r.mask[2].sum() == 14
    assert r.tokens[0, 5:8].tolist() == [TOK.output_id, TOK.encode("3")[0], TOK.end_output_id]
    assert r.tokens[0, 10] == TOK.eos_id and (r.tokens[0, 11:] == TOK.pad_id).all()
    assert r.lengths.tolist() == [11, 1, 14]
    assert r.finished.tolist() == [True, True, False]
    assert r.first_tool_pos.tolist() == [0, -1, -1]
    assert r.tool_calls.tolist() == [1, 0, 0]
    assert (r.logp[r.mask == 0] == 0).all() and (r.entropy[r.mask == 0] == 0).all()
    assert (r.temperature == 1).all()


def test_tool_call_cap_missing_opening_and_bad_output():
    loop = dict(SCRIPT, **{"</output>": "<code>"})  # call after call
    r = sample(Scripted(loop), TOK, ["a"], max_new_tokens=30, greedy=True, tool=fake_tool, max_tool_calls=2)
    call = "<code>1+2</code>"
    assert r.texts[0] == f"{call}<output>3</output>{call}<output>3</output>{call}x"  # third call unanswered
    assert r.tool_calls.tolist() == [2] and r.finished.tolist() == [True]
    # </code> without <code> in the response is not a call
    r = sample(Scripted({"a": "2", "2": "</code>"}), TOK, ["a"], max_new_tokens=5, greedy=True, tool=fake_tool)
    assert r.texts[0] == "2</code>" and r.tool_calls.tolist() == [0]
    # output characters outside the alphabet are dropped; a raising tool gives "error" (its letters filtered)
    weird = {"a": "<code>", "<code>": "x", "x": "</code>", "</output>": "<eos>"}
    r = sample(Scripted(weird), TOK, ["a"], max_new_tokens=12, greedy=True, tool=fake_tool)
    assert r.texts[0] == "<code>x</code><output>ee</output>"

    def boom(expr):
        raise RuntimeError(expr)

    r = sample(Scripted(weird), TOK, ["a"], max_new_tokens=12, greedy=True, tool=boom)
    assert r.texts[0] == "<code>x</code><output>e</output>"  # "error" → only 'e' is in ALPHA
    # a tool cannot inject tags: "<eos>" comes back as characters, filtered, never as the end token
    r = sample(Scripted(weird), TOK, ["a"], max_new_tokens=12, greedy=True, tool=lambda s: "<eos>1")
    assert r.texts[0] == "<code>x</code><output>e1</output>" and r.tool_calls.tolist() == [1]


def test_output_cut_at_max_new_tokens_and_max_tool_output():
    r = sample(Scripted(SCRIPT), TOK, ["a"], max_new_tokens=7, greedy=True, tool=lambda s: "123456")
    assert r.texts[0] == "<code>1+2</code><output>1" and r.lengths.tolist() == [7]
    r = sample(Scripted(SCRIPT), TOK, ["a"], max_new_tokens=20, greedy=True, tool=lambda s: "123456",
               max_tool_output=2)
    assert r.texts[0] == "<code>1+2</code><output>12</output> #"


def test_greedy_batch_equals_rows_alone_with_compaction():
    """Rows of different lengths finish at different steps (the batch is compacted on the way); every row
    matches the same prompt sampled alone, and duplicated prompts give duplicated responses."""
    model = small_model(3)
    prompts = ["12+3?", "a", "xyz 99 =", "7", "a", "b c"]
    r = sample(model, TOK, prompts, max_new_tokens=40, greedy=True)
    assert r.texts[1] == r.texts[4]
    for i, p in enumerate(prompts):
        alone = sample(model, TOK, [p], max_new_tokens=40, greedy=True)
        n = int(alone.lengths[0])
        assert r.tokens[i, :n].tolist() == alone.tokens[0, :n].tolist()
        torch.testing.assert_close(r.logp[i, :n], alone.logp[0, :n], atol=1e-5, rtol=1e-4)
    early = Scripted({"b": "<eos>", "c": "7", "7": "7"})
    r = sample(early, TOK, ["b"] * 6 + ["c"] * 2, max_new_tokens=20, greedy=True)  # compacts at step 4
    assert r.lengths.tolist() == [1] * 6 + [20, 20] and r.texts[6] == "7" * 20


def test_inverse_cdf_sampling_matches_the_distribution():
    """Frequencies of 40k draws match the probabilities (4 standard errors); zero-probability tokens never come,
    one-hot rows always give their token."""
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]]).repeat(20000, 1)
    draws = _inverse_cdf_sample(probs, torch.rand(40000, generator=torch.Generator().manual_seed(0)))
    first = torch.bincount(draws[0::2], minlength=6).float() / 20000
    se = (probs[0] * (1 - probs[0]) / 20000).sqrt()
    assert ((first - probs[0]).abs() <= 4 * se + 1e-9).all(), first
    assert (draws[1::2] == 5).all()
    unnormalised = torch.tensor([[1e-30, 2e-30, 0.0]]).repeat(1000, 1)  # scale-free: u is drawn up to the total
    assert set(_inverse_cdf_sample(unnormalised, torch.rand(1000)).tolist()) == {0, 1}
    edges = _inverse_cdf_sample(torch.tensor([[0.25, 0.0, 0.75]] * 3), torch.tensor([0.0, 0.25, 1 - 2**-24]))
    assert edges.tolist() == [0, 2, 2]


@pytest.mark.parametrize("how", ["greedy", "temperature", "fn"])
def test_dropping_finished_rows_changes_no_token(monkeypatch, how):
    """Row i's token t reads the uniform u[t, i] drawn up front, whichever rows still run: finished rows dropped at
    every step or never (nor at the default schedule) give the same tokens, tool calls and texts — rows ending at
    once (``b``), early or never (``c``), tool calls with forced tokens — and the generator ends in the same state,
    B·max_new_tokens numbers on. Log-probs agree to float rounding (a smaller batch may round its last bits)."""
    model = Scripted(SCRIPT, scale=3.0, seed=1)
    prompts = ["a", "b", "1+2 = ?", "c", "b", "a", "x", "b", "b", "b", "c", "a"] * 2
    kw = {"greedy": {"greedy": True}, "temperature": {"temperature": 0.8},
          "fn": {"temperature_fn": lambda z: 0.5 + torch.sigmoid(z[:, 0])}}[how]
    out, states = [], []
    for every, running in [(1, 1.0), (10**9, 0.0), (sampler.COMPACT_EVERY, sampler.COMPACT_RUNNING), (3, 0.5)]:
        monkeypatch.setattr(sampler, "COMPACT_EVERY", every)
        monkeypatch.setattr(sampler, "COMPACT_RUNNING", running)
        g = torch.Generator().manual_seed(7)
        out.append(sample(model, TOK, prompts, max_new_tokens=30, generator=g, tool=fake_tool, **kw))
        states.append(g.get_state())
    first = out[0]
    assert first.tool_calls.sum() > 0 and first.lengths.unique().numel() >= 3  # rows end at different steps
    for r, state in zip(out[1:], states[1:]):
        assert r.texts == first.texts
        for name in ("tokens", "mask", "lengths", "finished", "first_tool_pos", "tool_calls"):
            assert torch.equal(getattr(r, name), getattr(first, name)), name
        for name in ("logp", "entropy", "temperature"):
            torch.testing.assert_close(getattr(r, name), getattr(first, name), atol=1e-5, rtol=1e-5)
        assert torch.equal(state, states[0])
    if how != "greedy":  # the up-front draw is the per-step one: B uniforms a step, in row order
        g = torch.Generator().manual_seed(7)
        torch.rand(30 * len(prompts), generator=g)
        assert torch.equal(g.get_state(), states[0])


def test_seeded_sampling_is_reproducible():
    model = small_model(1)
    prompts = ["1+2", "abc", "1+2"]
    a = sample(model, TOK, prompts, max_new_tokens=30, generator=torch.Generator().manual_seed(5), tool=fake_tool)
    b = sample(model, TOK, prompts, max_new_tokens=30, generator=torch.Generator().manual_seed(5), tool=fake_tool)
    c = sample(model, TOK, prompts, max_new_tokens=30, generator=torch.Generator().manual_seed(6), tool=fake_tool)
    assert a.texts == b.texts and torch.equal(a.logp, b.logp) and torch.equal(a.tokens, b.tokens)
    assert a.texts != c.texts
    g1 = sample(model, TOK, prompts, max_new_tokens=30, greedy=True)
    assert g1.texts == sample(model, TOK, prompts, max_new_tokens=30, greedy=True).texts


@settings(max_examples=50, deadline=None)  # fewer: each example samples a batch and recomputes it
@given(st.integers(0, 2**16), st.sampled_from([1.0, 0.7, "fn"]), st.sampled_from([None, 1]),
       st.sampled_from([["a", "1+2 = ?", "c", "a"], ["a", "a", "1+2 = ?", "1+2 = ?", "c", "c"]]))
def test_sampled_logp_equals_recomputed(seed, temp, kv_heads, prompts):
    """logp stored at sampling time == token_logprobs of the same tokens at the same temperature (mask-1 tokens);
    entropy == the untempered entropy. A bigram bias makes tool calls (and forced tokens) frequent. The second
    prompt list is a GRPO layout (each prompt's samples side by side), the first shares a prompt out of order."""
    model = Scripted(SCRIPT, scale=3.0, seed=seed % 5)
    if kv_heads:
        model = small_model(seed % 5, n_kv_heads=kv_heads)
    g = torch.Generator().manual_seed(seed)
    kw = {"temperature_fn": lambda z: 0.5 + torch.sigmoid(z[:, 0])} if temp == "fn" else {"temperature": temp}
    r = sample(model, TOK, prompts, max_new_tokens=24, generator=g, tool=fake_tool, **kw)
    ids, att, start = r.sequences()
    with torch.no_grad():
        logp, ent = token_logprobs(model, ids, att, start, temperature=r.temperature)
    m = r.mask.bool()
    assert m.any()
    torch.testing.assert_close(logp[m], r.logp[m], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ent[m], r.entropy[m], atol=1e-4, rtol=1e-4)
    assert ((r.temperature[m] >= 0.5) & (r.temperature[m] <= 1.5)).all()
    # rollout tensors are ordinary tensors: the RL loss can backpropagate through a recompute
    logp_grad, _ = token_logprobs(model, ids, att, start)
    (logp_grad * r.mask).sum().backward()


@pytest.mark.parametrize("scale,seed", [(50.0, 0), (3.0, 1), (3.0, 2)])
def test_greedy_without_scores_is_the_same_rollout(scale, seed):
    """``scores=False`` (what greedy evaluation asks) skips log-probs and entropies and nothing else: every other
    field equals the scored greedy rollout's bit for bit — tool calls and their forced tokens, rows that end early and
    are dropped from the batch (``b`` ends at once, ``c`` never) — and the skipped ones are zeros."""
    model = Scripted(SCRIPT, scale=scale, seed=seed)
    prompts = ["a", "b", "1+2 = ?", "c", "b", "a", "x", "b", "b", "b"]
    full = sample(model, TOK, prompts, max_new_tokens=40, greedy=True, tool=fake_tool)
    bare = sample(model, TOK, prompts, max_new_tokens=40, greedy=True, tool=fake_tool, scores=False)
    assert full.tool_calls.sum() > 0 and not full.finished.all() and full.finished.any()
    assert (full.entropy.sum() > 1) == (scale < 10)  # a bigram of 50 leaves greedy steps ~no entropy
    for name, value in vars(full).items():
        if name in ("logp", "entropy"):
            assert torch.equal(getattr(bare, name), torch.zeros_like(value)), name
        elif isinstance(value, torch.Tensor):
            assert torch.equal(getattr(bare, name), value), name
        else:
            assert getattr(bare, name) == value, name
    sampled = [sample(model, TOK, prompts, max_new_tokens=40, generator=torch.Generator().manual_seed(0),
                      tool=fake_tool, scores=scores) for scores in (True, False)]  # greedy decoding's flag only
    assert all(torch.equal(getattr(sampled[0], k), getattr(sampled[1], k)) for k in ("tokens", "logp", "entropy"))


def test_temperature_hook_is_applied():
    model = small_model(2)
    prompts = ["1+2", "abc", "x"]
    greedy = sample(model, TOK, prompts, max_new_tokens=25, greedy=True)
    cold = sample(model, TOK, prompts, max_new_tokens=25, generator=torch.Generator().manual_seed(0),
                  temperature_fn=lambda z: torch.full(z.shape[:1], 1e-4))
    assert cold.texts == greedy.texts
    hot = sample(model, TOK, prompts, max_new_tokens=25, generator=torch.Generator().manual_seed(0),
                 temperature_fn=lambda z: torch.full(z.shape[:1], 50.0))
    assert hot.texts != greedy.texts
    assert torch.allclose(hot.temperature[hot.mask.bool()], torch.tensor(50.0))
    with pytest.raises(ValueError, match="temperature_fn must return"):
        sample(model, TOK, prompts, max_new_tokens=5, temperature_fn=lambda z: torch.ones(1))


def test_hapo_adaptive_temperature_plugs_in():
    model = small_model(4)
    prompts = ["1+2", "abc", "x", "7*3"]
    first = sample(model, TOK, prompts, max_new_tokens=20, generator=torch.Generator().manual_seed(0))
    stats = entropy_stats(first.entropy, first.mask)
    r = sample(model, TOK, prompts, max_new_tokens=20, generator=torch.Generator().manual_seed(1),
               temperature_fn=lambda z: adaptive_temperature(z, 1.0, stats, temperature_tau=0.3))
    t = r.temperature[r.mask.bool()]
    assert t.std() > 0 and (t >= 0.7 - 1e-6).all() and (t <= 1.3 + 1e-6).all()


def test_ignore_eos_and_errors():
    model = Scripted(SCRIPT)
    r = sample(model, TOK, ["b"], max_new_tokens=5, greedy=True, ignore_eos=True)
    assert r.lengths.tolist() == [5] and r.finished.tolist() == [False] and r.mask.sum() == 5
    with pytest.raises(ValueError, match="non-empty"):
        sample(model, TOK, [], max_new_tokens=5)
    with pytest.raises(ValueError, match="non-empty"):
        sample(model, TOK, "a", max_new_tokens=5)
    with pytest.raises(ValueError, match="temperature"):
        sample(model, TOK, ["a"], max_new_tokens=5, temperature=0.0)
    with pytest.raises(ValueError, match="max_len"):
        sample(model, TOK, ["a"], max_new_tokens=95)
    with pytest.raises(ValueError, match="vocab_size"):
        sample(model, CharTokenizer("ab"), ["a"], max_new_tokens=5)
    with pytest.raises(ValueError, match="alphabet"):
        sample(model, TOK, ["A"], max_new_tokens=5)
