"""The tiny engine's greedy evaluation: problems run in prompt-length order, results come back in problem order."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlkit.tasks import arithmetic
from rlkit.tiny import task
from rlkit.tiny.model import ModelConfig, TinyDecoder

TOK = task.build_tokenizer()
PROBLEMS = arithmetic.make_split(40, "test", seed=0, max_ops=3)


def prompt_len(p) -> int:
    return len(TOK.encode(arithmetic.prompt(p)))


def test_results_come_back_in_problem_order(monkeypatch):
    """A stand-in rollout answers every third problem correctly: the result is each problem's own, whatever order
    the batches ran in; batches run shortest prompts first (equal lengths in problem order), each at most
    ``batch_size`` problems."""
    right = {id(p) for p in PROBLEMS[::3]}
    batches = []

    def fake_rollout(model, tokenizer, chunk, **kw):
        batches.append(list(chunk))
        texts = [p.solution("tool") if id(p) in right else "no" for p in chunk]
        return SimpleNamespace(texts=texts, tool_calls=torch.zeros(len(chunk), dtype=torch.long),
                               tokens=torch.zeros(len(chunk), 1))

    monkeypatch.setattr(task, "rollout", fake_rollout)
    model = TinyDecoder(ModelConfig(vocab_size=TOK.vocab_size, d_model=16, n_layers=1, n_heads=2, max_len=64))
    model.train()
    correct = task.evaluate(model, TOK, PROBLEMS, max_new_tokens=8, batch_size=16)
    assert correct.tolist() == [1.0 if i % 3 == 0 else 0.0 for i in range(len(PROBLEMS))]
    assert model.training  # the model's mode is given back
    assert [len(b) for b in batches] == [16, 16, 8]
    ran = [p for b in batches for p in b]
    expected = sorted(PROBLEMS, key=prompt_len)  # stable: equal lengths keep the problems' order
    assert [id(p) for p in ran] == [id(p) for p in expected]
    assert len({prompt_len(p) for p in PROBLEMS}) > 5  # the order is not the split's
    assert [id(p) for p in ran] != [id(p) for p in PROBLEMS]
    assert task.evaluate(model, TOK, [], max_new_tokens=8).shape == (0,)


def test_greedy_texts_equal_an_evaluation_in_problem_order(monkeypatch):
    """On a small random model (tool form: the calculator answers any call), every problem's greedy response in the
    length-sorted batches equals the one of an evaluation in problem order, one batch, and so does its score."""
    torch.manual_seed(0)
    model = TinyDecoder(ModelConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=2, n_heads=4, max_len=256))
    with torch.no_grad():  # weights of a larger scale than the init's: varied responses, some calling the tool
        for w in model.parameters():
            if w.dim() > 1:
                w.normal_(0, 1.0)
    model.eval()
    real, texts = task.rollout, {}

    def recording(model, tokenizer, chunk, **kw):
        out = real(model, tokenizer, chunk, **kw)
        texts.update({id(p): t for p, t in zip(chunk, out.texts)})
        return out

    monkeypatch.setattr(task, "rollout", recording)
    correct = task.evaluate(model, TOK, PROBLEMS, max_new_tokens=40, batch_size=8)
    reference = real(model, TOK, PROBLEMS, max_new_tokens=40, greedy=True)  # problem order, no sort
    assert [texts[id(p)] for p in PROBLEMS] == reference.texts
    assert len(set(reference.texts)) > 30 and reference.tool_calls.sum() > 0 and reference.finished.any()
    assert torch.equal(correct, task.score_rollout(reference, PROBLEMS).rewards)
