"""One RL step of the tiny engine, for every method: prompts → rollout → reward → advantage → loss → optimizer step.

:func:`rl_step` reads top to bottom, its stages numbered. Each step samples responses to prompts from a fixed
training pool (groups of ``group_size`` answers per prompt), scores them with rlkit's one answer rule, turns rewards
into advantages with the method's estimator, and takes ``mini_batches`` optimizer steps on the method's policy loss.
Estimator and loss are called by method name through :mod:`rlkit.registry` (:func:`~rlkit.registry.advantage`,
:func:`~rlkit.registry.policy_loss`) with the method's ``Config`` as keyword arguments — the *same* functions and
dispatch the verl plugin uses. What a method does besides — prompts it draws itself, a per-token temperature, rewards
it reshapes, groups it drops, state it keeps — are its hooks (:mod:`rlkit.hooks`), called at fixed points of the
step: the engine names no method. Metric names are verl's. The loop around the step (checkpoints, evaluation,
resuming) is :mod:`rlkit.tiny.rl`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from math import nan
from pathlib import Path
from typing import Any

import torch

from rlkit import registry
from rlkit.core.ops import masked_mean
from rlkit.core.rollout_correction import correction_for, mismatch_metrics
from rlkit.core.tool_use import tool_metrics
from rlkit.hooks import Recalled, StepBatch, checked, draw
from rlkit.tasks import arithmetic
from rlkit.tiny.checkpoint import RunState
from rlkit.tiny.config import RLConfig
from rlkit.tiny.mismatch import (
    MismatchedSampler, behaviour_policy, measures_mismatch, old_logp_source, policy_eval,
)
from rlkit.tiny.model import token_logprobs
from rlkit.tiny.sft import offline_scores
from rlkit.tiny.task import response_logprobs, rollout, score_rollout, select_rows

Tensor = torch.Tensor


@dataclass
class Run:
    """What every step of a run reads: its settings, model, tokenizer, optimizer and prompt pool."""

    cfg: RLConfig
    model: Any
    tokenizer: Any
    opt: torch.optim.Optimizer | None
    pool: list[arithmetic.Problem]
    max_new: int
    """Response budget in tokens."""
    form: str
    """Solution form of the SFT start (plain, tool, mixed)."""
    behaviour: Any = None
    """``staleness`` > 0: a second model holding the stale policy that samples the rollouts."""
    mismatched: MismatchedSampler | None = None
    """``rollout_dtype``/``rollout_top_p`` set: the sampler as another inference engine runs it (:mod:`mismatch`)."""
    hooks: Any = None
    """The method's hooks (:mod:`rlkit.hooks`)."""
    memory: dict = field(default_factory=dict)
    """Responses the hooks asked to keep (:meth:`remember`), by prompt id: tokens, mask, temperatures, log-probs."""
    sample_gen: torch.Generator | None = None
    """The sampling generator (the offline pass draws from it)."""
    sft_info: dict | None = None
    sft_cache: str | Path | None = None

    @property
    def configs(self) -> dict[str, Any]:
        """Method name → its ``Config``, for :mod:`rlkit.registry`'s dispatch."""
        return self.cfg.method_configs

    # ---- what the engine offers hooks (rlkit.hooks.Engine)
    @property
    def seed(self) -> int:
        return self.cfg.seed

    @property
    def pool_ids(self) -> list[int]:
        return list(range(len(self.pool)))

    def offline_scores(self, n: int) -> dict[int, list[float]]:
        return offline_scores(self, self.sample_gen, n, sft=self.sft_info, cache_dir=self.sft_cache)

    def remember(self, batch: StepBatch, rows: dict[int, int]) -> None:
        for pid, j in rows.items():
            n = int(batch.lengths[j])
            self.memory[pid] = {"tokens": batch.tokens[j, :n].cpu(), "mask": batch.mask[j, :n].cpu(),
                                "temperature": batch.temperature[j, :n].cpu(), "logp": batch.old_logp[j, :n].cpu()}

    def recall(self, prompt_ids: list) -> dict[int, Recalled]:
        seen = [pid for pid in prompt_ids if pid in self.memory]
        if not seen:
            return {}
        mem = [self.memory[pid] for pid in seen]
        with torch.no_grad():
            prompts = [arithmetic.prompt(self.pool[pid]) for pid in seen]
            now = response_logprobs(self.model, self.tokenizer, prompts, [e["tokens"] for e in mem],
                                    [e["temperature"] for e in mem]).cpu()
        return {pid: Recalled(logp_then=e["logp"], logp_now=now[row, :len(e["tokens"])], mask=e["mask"])
                for row, (pid, e) in enumerate(zip(seen, mem))}


def rl_step(run: Run, state: RunState) -> dict[str, float]:
    """One RL step of ``run`` from ``state`` (advanced in place): rollout, reward, advantage, update; its metrics."""
    cfg, model, tokenizer, opt, pool, hooks = run.cfg, run.model, run.tokenizer, run.opt, run.pool, run.hooks
    metrics: dict[str, float] = {}
    step = state.step + 1  # the step being taken (seeds the metrics' own draws: resumed runs draw the same)

    # ---- 1. choose prompts: the method's (hook), else groups of G answers to prompts drawn uniformly
    chosen = checked(hooks, "choose_prompts", hooks.choose_prompts(cfg.prompts_per_step, step),
                     rows=cfg.prompts_per_step)
    if chosen is not None:
        prompt_idx = torch.tensor(chosen)
    else:
        n_groups = checked(hooks, "groups_to_draw", hooks.groups_to_draw(cfg.prompts_per_step),
                           rows=cfg.prompts_per_step)
        prompt_idx = draw(len(pool), n_groups, state.prompt_gen)
    group_ids = prompt_idx.repeat_interleave(cfg.group_size)  # (B,) the prompt each response answers (CPU)
    problems = [pool[i] for i in group_ids.tolist()]

    # ---- 2. rollout, at the method's per-token temperature where it sets one (hook)
    t0 = time.perf_counter()
    temperature_fn = hooks.temperature_fn(cfg.temperature)
    policy = sampler = behaviour_policy(run, state)
    if run.mismatched is not None:  # the same weights as another inference engine holds them
        sampler = run.mismatched.follow(policy)
    ro = rollout(sampler, tokenizer, problems, max_new_tokens=run.max_new, form=run.form,
                 temperature=cfg.temperature, temperature_fn=temperature_fn, generator=state.sample_gen)
    scored = score_rollout(ro, problems)
    metrics["timing_s/gen"] = time.perf_counter() - t0
    metrics["rollout/response_tokens"] = ro.lengths.sum().item()  # all sampled, before any filtering
    if cfg.policy_eval_due(step):  # stale sampler: how the policy being trained does itself
        metrics.update(policy_eval(run, problems, temperature_fn, step))

    # ---- 3. reward: correctness; the method may keep only some groups and reshape the rewards (hooks)
    rows, kept = checked(hooks, "keep_groups", hooks.keep_groups(scored.rewards.cpu(), cfg.group_size,
                                                                cfg.prompts_per_step))
    if rows is not None:
        ro, scored = select_rows(ro, rows.to(ro.tokens.device)), _select_scored(scored, rows.to(ro.tokens.device))
        group_ids, problems = group_ids[rows], [problems[i] for i in rows.tolist()]
        metrics.update(kept)
    rewards = checked(hooks, "shape_rewards", hooks.shape_rewards(scored.rewards, ro.lengths, run.max_new),
                      rows=len(scored.rewards))
    correct = scored.rewards > 0
    mask = ro.mask
    ids, attn, start = ro.sequences()

    # ---- 4. old log-probs: the sampler's. verl recomputes them because vLLM's numerics differ from the trainer's;
    # here sampler and trainer are one float32 model, so they agree to ~1e-6 (tests/test_sampler.py) and a
    # forward pass is saved. The decoupled loss recomputes them with this step's policy (the proximal policy) and
    # keeps the sampler's as the behaviour policy's.
    old_logp, old_entropy, behav = ro.logp, ro.entropy, {}
    sampling = cfg.rollout_dtype, cfg.rollout_top_p, cfg.rollout_correction, cfg.old_logp_source
    if measures_mismatch(*sampling):  # the sampler is not the trainer, or not taken for it (rlkit.tiny.mismatch):
        with torch.no_grad():  # the trainer's own log-probs of the sampling weights (verl's old_log_prob)
            trainer_logp, trainer_entropy = token_logprobs(policy, ids, attn, start, temperature=ro.temperature)
        metrics.update(mismatch_metrics(trainer_logp, ro.logp, mask))
        if old_logp_source(*sampling) == "trainer":
            old_logp, old_entropy = trainer_logp, trainer_entropy
    if cfg.decoupled_loss:
        behav = {"behav_logp": old_logp, "behav_imp_weight_cap": cfg.behav_imp_weight_cap}
        with torch.no_grad():
            old_logp, _ = token_logprobs(model, ids, attn, start, temperature=ro.temperature)
    batch = StepBatch(step=step, prompt_ids=group_ids.tolist(), rewards=rewards, mask=mask, lengths=ro.lengths,
                      tokens=ro.tokens, old_logp=old_logp, entropy=old_entropy, temperature=ro.temperature)

    # ---- 5. advantage: the method's estimator (rlkit.registry), with the inputs its hooks add (e.g. baselines)
    extra = checked(hooks, "advantage_inputs", hooks.advantage_inputs(batch, run))
    inputs = registry.AdvantageInputs(rewards, group_ids, mask, correct=correct,
                                      first_code_pos=ro.first_tool_pos.float(),  # −1 = no call
                                      lengths=ro.lengths, code_pass=scored.code_pass, **extra)
    adv = registry.advantage(cfg.method, inputs, run.configs)
    metrics["critic/baseline_mse"] = _baseline_mse(rewards, group_ids, inputs.baselines)
    metrics.update(checked(hooks, "advantage_metrics", hooks.advantage_metrics(adv, inputs, batch)))
    loss_adv, loss_mask = adv, mask
    if cfg.rollout_correction:  # each token's advantage × its weight, rejected responses out of the loss's mask
        c = correction_for(cfg.rollout_correction, behav.get("behav_logp", old_logp), ro.logp, mask)
        loss_adv, loss_mask = (adv.unsqueeze(-1) if adv.dim() == 1 else adv) * c.weights, c.mask
        metrics.update(c.metrics)

    # ---- 6. policy update: ppo_epochs passes of mini_batches optimizer steps on the method's loss, each pass over
    # a new shuffled split of the batch's prompts (a group's responses stay in one mini-batch, as in verl, whose
    # mini-batches count prompts; token_logprobs then runs each prompt once per mini-batch)
    t0 = time.perf_counter()
    loss_metrics: dict[str, list[float]] = defaultdict(list)
    for group in opt.param_groups:
        group["lr"] = cfg.lr * min(1.0, (state.step + 1) / max(1, cfg.warmup_steps))
    device = mask.device
    passes = [_mini_batches(group_ids, cfg.mini_batches, state.prompt_gen) for _ in range(cfg.ppo_epochs)]
    silent = (loss_adv.abs() * loss_mask).sum(-1) == 0  # (B,) responses without a learning signal
    for rows in (rows for chunks in passes for rows in chunks):
        rows = rows.to(device)
        logp, entropy = token_logprobs(model, ids[rows], attn[rows], start, temperature=ro.temperature[rows],
                                       frozen=silent[rows])
        probe = logp.detach().requires_grad_()  # ∂loss/∂logp of every row, the silent ones' included
        extra = {k: v[rows] if isinstance(v, Tensor) else v for k, v in behav.items()}
        loss, lm = registry.policy_loss(cfg.method, probe, old_logp[rows], loss_adv[rows], loss_mask[rows],
                                        run.configs, entropy=entropy.detach(), **extra)
        opt.zero_grad(set_to_none=True)
        _backward(loss, probe, logp, silent[rows], lambda: token_logprobs(
            model, ids[rows], attn[rows], start, temperature=ro.temperature[rows])[0], model.parameters())
        lm["actor/grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
        opt.step()
        for k, v in lm.items():
            loss_metrics[k].append(v)
    metrics.update({k: max(v) if k.endswith("/max") else min(v) if k.endswith("/min") else sum(v) / len(v)
                    for k, v in loss_metrics.items()})  # extremes over the mini-batches, means otherwise
    metrics["timing_s/update"] = time.perf_counter() - t0

    # ---- 7. the method's state after the step (hook: e.g. a value tracker, the next temperatures)
    metrics.update(checked(hooks, "after_update", hooks.after_update(batch, run)))

    # ---- 8. metrics every method logs (verl's names; the tool metrics on the tool task)
    sample_adv = (adv.abs() * mask).sum(-1)
    metrics.update({
        "critic/score/mean": scored.rewards.mean().item(),
        "critic/rewards/mean": rewards.mean().item(),
        "response_length/mean": ro.lengths.float().mean().item(),
        "response_length/incorrect/mean": ro.lengths[~correct].float().mean().item() if (~correct).any() else nan,
        "actor/entropy": masked_mean(old_entropy, mask).item(),
        "adv/zero_frac": (sample_adv == 0).float().mean().item(),
        "_tokens": ro.lengths.sum().item(),
    })
    if run.form != "plain":  # the tool metrics of every method, so curves compare
        metrics.update(tool_metrics(ro.first_tool_pos.float().masked_fill(ro.first_tool_pos < 0, float("nan")),
                                    correct, ro.tool_calls, scored.code_pass))
    return metrics


def _backward(loss: Tensor, probe: Tensor, logp: Tensor, silent: Tensor, with_graph: Callable[[], Tensor],
              params) -> None:
    """``loss.backward()`` through the model, without the passes that would add exact zeros to the gradients.

    The loss reaches the parameters only through the log-probs, and was computed on ``probe``, a leaf copy of
    ``logp``: ``∂loss/∂logp`` is known for every row before any pass through the model. A row with a zero advantage
    (``silent``) adds nothing to any rlkit loss, and its ``logp`` came without autograd's graph
    (:func:`token_logprobs`'s ``frozen``); the others' backward goes on from ``logp`` with that gradient — the same
    sums in the same order as one ``loss.backward()``, less exact zeros (bit for bit, tests/test_tiny_rl.py). A zero
    gradient everywhere sets zeros; a loss with a gradient in a silent row (a KL or entropy term) gets the graph it
    needs from ``with_graph()``, the rows run again."""
    (grad,) = torch.autograd.grad(loss, probe)
    if (grad[silent] != 0).any():  # not rlkit's losses: correct, at the cost of a second forward
        logp = with_graph()
    if grad.any():
        logp.backward(grad)
    else:
        for p in params:
            p.grad = torch.zeros_like(p)


def _mini_batches(group_ids: Tensor, n: int, gen: torch.Generator) -> list[Tensor]:
    """Rows of each of ``n`` mini-batches: the prompts (``group_ids``) in a random order, split into ``n`` runs
    of near-equal size, each mini-batch the rows of its prompts (fewer than ``n`` when there are fewer prompts)."""
    prompts, index = torch.unique(group_ids, return_inverse=True)
    order = torch.randperm(len(prompts), generator=gen)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))  # each prompt's place in the shuffled order
    part = rank[index] * n // len(prompts)  # (B,) its mini-batch
    rows = torch.argsort(part * len(prompts) + rank[index], stable=True)  # by mini-batch, then prompt
    return [r for r in torch.split(rows, torch.bincount(part, minlength=n).tolist()) if len(r)]


def _baseline_mse(rewards: Tensor, group_ids: Tensor, baselines: Tensor | None) -> float:
    """Mean (r − b)² of the baseline each response's reward is compared with, independent of that reward: the
    baselines the hooks gave (a value tracker's v̂, taken before the update), else the mean reward of the
    response's *other* group members (NaN for groups of one). Both share the floor p(1 − p); the rest is the
    baseline's own error."""
    r = rewards.double().cpu()
    if baselines is not None:
        b = baselines.double().cpu()
    else:
        idx = group_ids.cpu()
        sums = torch.zeros(int(idx.max()) + 1, dtype=torch.float64).index_add_(0, idx, r)
        counts = torch.zeros_like(sums).index_add_(0, idx, torch.ones_like(r))
        others = counts[idx] - 1
        b = torch.where(others > 0, (sums[idx] - r) / others.clamp(min=1), torch.full_like(r, float("nan")))
    return ((r - b) ** 2).nanmean().item()


def _select_scored(scored, rows: Tensor):
    return type(scored)(rewards=scored.rewards[rows], code_pass=scored.code_pass[rows])
