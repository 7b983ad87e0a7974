"""The tiny engine's task plumbing: the tokenizer for the arithmetic problems, SFT batches, rollouts → rewards and
tool statistics, and greedy evaluation — shared by :mod:`rlkit.tiny.sft` and :mod:`rlkit.tiny.rl`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlkit.tasks import arithmetic
from rlkit.tasks.calculator import run_tool
from rlkit.tasks.protocol import OUTPUT, TOOL_ERROR
from rlkit.tiny.model import TinyDecoder, token_logprobs
from rlkit.tiny.sampler import Rollout, sample
from rlkit.tiny.tokenizer import CharTokenizer

Tensor = torch.Tensor


def build_tokenizer() -> CharTokenizer:
    """The character tokenizer of every arithmetic text (questions, both solution forms, calculator errors)."""
    return CharTokenizer(arithmetic.ALPHABET)


def max_response_tokens(task: arithmetic.TaskConfig, form: str) -> int:
    """A response budget that fits every gold solution of ``task`` in ``form`` (characters bound tokens) + ``<eos>``."""
    return task.max_solution_chars(form) + 1


def sft_batch(tokenizer: CharTokenizer, problems: Sequence[arithmetic.Problem], form: str) -> tuple[Tensor, Tensor]:
    """Right-padded ``(ids, target_mask)`` for next-token training on ``<bos> prompt solution <eos>``: a target is
    ``ids[:, j+1]`` (not the prompt, nor the environment's ``<output>…</output>`` spans)."""
    rows, targets = [], []
    for p in problems:
        prompt_ids = tokenizer.encode(arithmetic.prompt(p))
        solution_ids = tokenizer.encode(p.solution(form)) + [tokenizer.eos_id]
        inside, wanted = False, []
        for tok in solution_ids:  # tool output spans are the environment's, not the model's
            if tok == tokenizer.output_id:
                inside = True
            wanted.append(not inside)
            if tok == tokenizer.end_output_id:
                inside = False
        rows.append([tokenizer.bos_id] + prompt_ids + solution_ids)
        targets.append([False] * len(prompt_ids) + wanted)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    for i, (r, t) in enumerate(zip(rows, targets)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(t)] = torch.tensor(t)
    return ids, mask


@dataclass
class Scored:
    """A rollout's rewards and tool statistics, one value per response."""

    rewards: Tensor  # (B,) float32 task reward (1.0 correct, else 0.0) before any length penalty.
    code_pass: Tensor  # (B,) bool: the response called the calculator and no call returned an error.


def score_rollout(rollout: Rollout, problems: Sequence[arithmetic.Problem]) -> Scored:
    """Rewards by rlkit's one answer rule, and whether every calculator call of a response succeeded."""
    device = rollout.tokens.device
    rewards = torch.tensor([arithmetic.reward(p, t) for p, t in zip(problems, rollout.texts)], dtype=torch.float32,
                           device=device)
    failed = torch.tensor([OUTPUT + TOOL_ERROR in t for t in rollout.texts], device=device)
    return Scored(rewards=rewards, code_pass=(rollout.tool_calls > 0) & ~failed)


def rollout(model: TinyDecoder, tokenizer: CharTokenizer, problems: Sequence[arithmetic.Problem], *,
            max_new_tokens: int, form: str = "tool", **sample_kwargs) -> Rollout:
    """Sample one response per problem (repeat problems for groups), with the calculator wired in for the tool form."""
    tool = None if form == "plain" else run_tool  # tool and mixed forms: the calculator answers calls
    prompts = [arithmetic.prompt(p) for p in problems]
    return sample(model, tokenizer, prompts, max_new_tokens=max_new_tokens, tool=tool, **sample_kwargs)


def evaluate(model: TinyDecoder, tokenizer: CharTokenizer, problems: Sequence[arithmetic.Problem], *,
             max_new_tokens: int, form: str = "tool", batch_size: int = 256) -> Tensor:
    """Greedy correctness (1/0, float, on the CPU) of each of ``problems``, in their order (its mean: ``val/acc``);
    run in batches of ``batch_size`` in stable prompt-length order, so a batch carries little padding."""
    was_training = model.training
    model.eval()
    lengths = [len(tokenizer.encode(arithmetic.prompt(p))) for p in problems]
    order = sorted(range(len(problems)), key=lengths.__getitem__)  # sorted() is stable
    correct = torch.zeros(len(problems))
    for i in range(0, len(problems), batch_size):
        picked = order[i : i + batch_size]
        chunk = [problems[j] for j in picked]
        out = rollout(model, tokenizer, chunk, max_new_tokens=max_new_tokens, form=form, greedy=True, scores=False)
        correct[picked] = score_rollout(out, chunk).rewards.float().cpu()
    model.train(was_training)
    return correct


def accuracy(correct: Tensor) -> float:
    """The share of 1s in :func:`evaluate`'s result, as ``correct/n`` in Python floats (exact for the counts)."""
    return correct.sum().item() / max(len(correct), 1)


def select_rows(ro: Rollout, rows: Tensor) -> Rollout:
    """The responses ``rows`` (a 1-D index) of a rollout, every per-response field kept aligned."""
    index = rows.tolist()
    return Rollout(**{name: [value[i] for i in index] if isinstance(value, list) else value[rows]
                      for name, value in vars(ro).items()})


def response_logprobs(model: TinyDecoder, tokenizer: CharTokenizer, prompts: Sequence[str],
                      responses: Sequence[Tensor], temperatures: Sequence[Tensor]) -> Tensor:
    """Log-probs ``(n, T)`` of stored responses (1-D token tensors) under ``model``; padding positions are 0."""
    prompt_ids, prompt_mask = tokenizer.encode_batch(list(prompts), bos=True, pad_left=True)
    lengths = torch.tensor([len(r) for r in responses])
    T = int(lengths.max())
    tokens = torch.full((len(responses), T), tokenizer.pad_id, dtype=torch.long)
    temps = torch.ones(len(responses), T)
    for i, (r, t) in enumerate(zip(responses, temperatures)):
        tokens[i, : len(r)], temps[i, : len(t)] = r, t
    valid = torch.arange(T) < lengths.unsqueeze(1)
    device = next(model.parameters()).device
    ids = torch.cat([prompt_ids, tokens], dim=1).to(device)
    attn = torch.cat([prompt_mask, valid], dim=1).to(device)
    logp, _ = token_logprobs(model, ids, attn, prompt_ids.shape[1], temperature=temps.to(device))
    return torch.where(valid.to(device), logp, torch.zeros_like(logp))
