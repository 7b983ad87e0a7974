"""The RL stage of the tiny engine: rollout → reward → advantage → loss → step, for every method.

:func:`train` reads top to bottom. Each step samples responses to prompts from a fixed training pool (groups of
``group_size`` answers per prompt), scores them with rlkit's one answer rule, turns rewards into advantages with
the method's estimator, and takes ``mini_batches`` optimizer steps on the method's policy loss. Estimator and loss
are called by method name through :mod:`rlkit.registry` (:func:`~rlkit.registry.advantage`,
:func:`~rlkit.registry.policy_loss`), with the method's ``Config`` as keyword arguments — the *same* functions and
the same dispatch the verl plugin uses. What a method does besides — prompts it draws itself, a per-token sampling
temperature, rewards it reshapes, groups it drops, state it keeps — are its hooks (:mod:`rlkit.hooks`), called at
fixed points of the step: the engine names no method. Metric names are verl's, written to ``metrics.jsonl`` in
verl's ``file`` logger format. The run's settings are :mod:`rlkit.tiny.config`; its state and checkpoints
:mod:`rlkit.tiny.checkpoint`.

Nothing is lost when a run is killed: after every step the model, the optimizer, every random generator, the
responses the method asked the engine to keep and the method's own state are written atomically, and the metrics
line of a step is written before its checkpoint, so ``resume=True`` truncates the metrics to the checkpoint's
step and redoes the rest bit for bit.
"""

from __future__ import annotations

import copy
from math import nan
import hashlib
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlkit import environ, registry
from rlkit.core.masked import masked_mean
from rlkit.core.tool_use import tool_metrics
from rlkit.errors import CannotResume, DamagedFile, ResumeMismatch, RunExists
from rlkit.core.rollout_correction import correction_for, mismatch_metrics
from rlkit.hooks import Recalled, StepBatch, checked, draw, side_generator
from rlkit.files import (
    TRAINING_RUN, atomic_write, claim_dir, lock_dir, os_errors, read_json, read_torch, write_text,
)
from rlkit.metrics import MetricsWriter, read_metrics
from rlkit.tasks import arithmetic
from rlkit.tiny.checkpoint import RunState, environment, load_checkpoint, restore_checkpoint, save_checkpoint
# METHODS, build_config, parse_sets: re-exported for importers not moved yet (rlkit.verl.launch,
# tests/test_reproduce.py, notebooks/07_comparison.md); new code imports them from rlkit.tiny.config
from rlkit.tiny.config import METHODS, REGIMES, RLConfig, build_config, flat_settings, parse_sets  # noqa: F401
from rlkit.tiny.config import estimated_minutes
from rlkit.tiny.mismatch import MismatchedSampler, measures_mismatch, mismatched, old_logp_source
from rlkit.tiny.model import token_logprobs
from rlkit.tiny import sft as starts
from rlkit.tiny.sft import default_cache_dir, roughly, start_source, warm_start
from rlkit.tiny.task import (
    accuracy, evaluate, response_logprobs, rollout, score_rollout, select_rows,
)

Tensor = torch.Tensor

# ------------------------------------------------------------------------------------------------ what a run logs
LOGGED_BY_EVERY_METHOD = frozenset({
    "val/acc", "val/acc_final", "sft/val_acc", "timing_s/init", "timing_s/gen", "timing_s/update", "timing_s/step",
    "perf/throughput", "rollout/response_tokens", "critic/score/mean", "critic/rewards/mean", "critic/baseline_mse",
    "response_length/mean", "response_length/incorrect/mean", "actor/entropy", "adv/zero_frac", "actor/grad_norm",
    "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "aspo/first_code_pos/mean",
    "aspo/code_ratio", "aspo/code_rounds/mean", "aspo/correct_code_ratio", "aspo/code_pass_ratio",
})
LOGGED_WHEN_STALE = frozenset({"policy/entropy", "policy/score/mean", "timing_s/policy_eval"})
"""What a run with ``staleness`` > 0 adds: the current policy's own rollout on the step's problems
(:func:`_policy_eval`, at the steps ``RLConfig.policy_eval_due`` gives)."""


def logged_metrics(method: str, *, regime: str = "standard", overrides: dict | None = None) -> frozenset[str]:
    """Every metric a tiny-engine run of ``method`` in ``regime`` (:data:`rlkit.tiny.config.REGIMES`) logs, with the
    run's top-level ``overrides`` on the regime's settings (a mismatched sampler's run logs the mismatch; claims are
    checked against this when a spec loads)."""
    logs = registry.get_method(method).logs  # a KeyError naming the valid methods
    if regime not in REGIMES:
        raise KeyError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    settings = {**REGIMES[regime], **(overrides or {})}
    stale = settings.get("staleness", 0) > 0
    return LOGGED_BY_EVERY_METHOD | logs | (LOGGED_WHEN_STALE if stale else frozenset()) | _mismatch_logs(settings)


def _mismatch_logs(settings: dict) -> frozenset[str]:
    """The rollout-correction metrics a regime with a mismatched sampler, recomputed old log-probs or a correction
    logs (their names: those :func:`mismatch_metrics` and :func:`correction_for` return, asked on one token)."""
    mode = settings.get("rollout_correction")
    if not measures_mismatch(settings.get("rollout_dtype", "float32"), settings.get("rollout_top_p", 1.0), mode,
                             settings.get("old_logp_source")):
        return frozenset()
    one = torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1)
    return frozenset(mismatch_metrics(*one)) | (frozenset(correction_for(mode, *one).metrics) if mode else frozenset())


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


# ------------------------------------------------------------------------------------------------ the loop
RUN_FILES = ("metrics.jsonl", "eval.jsonl", "config.json", "env.json", "checkpoint.pt")
"""What :func:`train` writes into a run directory (besides :data:`rlkit.files.MARKER`)."""
_OLD_TEMPORARY = ("checkpoint.tmp", "metrics.jsonl.tmp", "eval.jsonl.tmp")
"""Temporary files an older rlkit could leave in a run directory (removed when the run is next opened)."""


def train(cfg: RLConfig, out_dir: str | Path, *, device: str = "cpu", resume: bool = False,
          progress: bool = True, sft_cache: str | Path | None = None, stop_after: int | None = None,
          force: bool = False) -> Path:
    """Run ``cfg`` into ``out_dir`` (``metrics.jsonl``, ``config.json``, ``env.json``, ``checkpoint.pt``).

    ``resume`` continues the run in ``out_dir`` from its checkpoint, exactly or not at all
    (:func:`_resume_point`); ``stop_after`` returns after that step (a run in stages: resume it later), as if the
    run had been killed there. The directory is locked for the whole run, SFT included (one writer:
    :func:`rlkit.files.lock_dir`); one rlkit did not write is refused unless ``force``
    (:func:`rlkit.files.claim_dir`).
    """
    out = Path(out_dir)
    environ.check()  # before any work: the environment, and where the SFT start comes from (a cache it can write)
    start_source(cfg.sft, cache_dir=sft_cache)
    claim_dir(out, TRAINING_RUN, force=force, writes=RUN_FILES + _OLD_TEMPORARY)
    with lock_dir(out, TRAINING_RUN), os_errors():
        for name in _OLD_TEMPORARY:
            (out / name).unlink(missing_ok=True)
        return _train(cfg, out, device=device, resume=resume, progress=progress, sft_cache=sft_cache,
                      stop_after=stop_after)


def _train(cfg: RLConfig, out: Path, *, device: str, resume: bool, progress: bool, sft_cache: str | Path | None,
           stop_after: int | None) -> Path:
    ckpt_path, metrics_path = out / "checkpoint.pt", out / "metrics.jsonl"
    config = json.loads(json.dumps(asdict(cfg), default=list))
    blob, relog = _resume_point(out, config) if resume else (None, {})
    if not resume and (ckpt_path.exists() or _steps(metrics_path)):
        raise RunExists(f"{out} already holds a run: pass --resume (resume=True) to continue it, or choose another "
                        "--out")
    resumed = blob is not None
    if not resumed:
        write_text(out / "config.json", json.dumps(config, indent=2))

    # --- the SFT warm start (shared by every method), the prompt pool and the held-out problems
    model, tokenizer, sft_info = warm_start(cfg.sft, device=device, cache_dir=sft_cache, progress=progress)
    if not resumed:
        write_text(out / "env.json", json.dumps(environment(cfg, device, sft_info), indent=2))
    else:
        try:
            read_json(out / "env.json")  # the run's record of where it ran: resuming keeps it, so it must be whole
        except DamagedFile as e:
            raise CannotResume(f"cannot resume {out}: {e}; delete the run to start it afresh") from None
    model.train()
    knobs, form = asdict(cfg.sft.task), cfg.sft.form
    pool = cfg.pool()
    held_out = arithmetic.make_split(cfg.eval_size, "test", seed=0, **knobs)
    final_held_out = arithmetic.make_split(cfg.final_eval_size, "test", seed=0, **knobs)
    max_new = cfg.max_new
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))
    state = RunState(sample_gen=torch.Generator(device=device))
    run = Run(cfg, model, tokenizer, opt, pool, max_new, form,
              behaviour=copy.deepcopy(model) if cfg.staleness > 0 else None,
              mismatched=MismatchedSampler(copy.deepcopy(model), cfg.rollout_dtype, cfg.rollout_top_p)
              if mismatched(cfg.rollout_dtype, cfg.rollout_top_p) else None,
              hooks=registry.make_hooks(cfg.method, cfg.method_configs), sample_gen=state.sample_gen,
              sft_info=sft_info, sft_cache=sft_cache)

    t_init = time.perf_counter()
    state.prompt_gen.manual_seed(cfg.seed)
    state.sample_gen.manual_seed(cfg.sampling_seed)
    run.hooks.start(run, resumed=resumed)  # e.g. an offline pass over the pool (a resumed run restores instead)

    if resumed:
        restore_checkpoint(blob, model, opt, state)
        run.hooks.load_state_dict(state.method_state)
        run.memory = state.memory
        del blob
    writer = MetricsWriter.open(metrics_path, resume_after=state.step if resumed else None)
    per_problem = MetricsWriter.open(out / "eval.jsonl", resume_after=state.step if resumed else None)
    for log, name in ((writer, "metrics"), (per_problem, "eval")):  # a torn line of the checkpoint's step
        if name in relog:
            log.log(relog[name], state.step)
    if not resumed:  # step 0: the SFT start (its own evaluation, when it was of these problems)
        start_correct = _sft_correct(sft_info, len(held_out), max_new, device)
        if start_correct is None:
            start_correct = evaluate(model, tokenizer, held_out, max_new_tokens=max_new, form=form)
        acc = accuracy(start_correct)
        writer.log({"val/acc": acc, "sft/val_acc": sft_info["val/acc"],
                    "timing_s/init": time.perf_counter() - t_init}, step=0)  # hooks' start (offline pass), eval

    last = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    if progress and device == "cpu" and (minutes := estimated_minutes(cfg, last - state.step)) >= 1:
        print(f"RL: {last - state.step:,} steps of {cfg.samples_per_step} responses, {roughly(minutes)} on one CPU "
              "thread (progress below; Ctrl-C stops it, --resume continues it)", file=sys.stderr, flush=True)
    bar = tqdm(range(state.step + 1, last + 1), desc=f"{cfg.method} seed {cfg.seed}", disable=not progress)
    for step in bar:
        environ.hold_before_step(step)  # test support only (RLKIT_TEST_HOLD): nothing unless a test asks for it
        t0 = time.perf_counter()
        metrics = rl_step(run, state)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            val = evaluate(model, tokenizer, held_out, max_new_tokens=max_new, form=form)
            metrics["val/acc"] = accuracy(val)
        final = None
        if step == cfg.steps:  # the larger final evaluation, per problem: what accuracy claims are judged on
            # its first problems are the held-out ones (make_split extends a smaller split), just evaluated
            shared = min(len(held_out), len(final_held_out))
            rest = evaluate(model, tokenizer, final_held_out[shared:], max_new_tokens=max_new, form=form)
            correct = torch.cat([val[:shared], rest])
            metrics["val/acc_final"] = accuracy(correct)
            final = {"correct": correct.int().tolist()}
            per_problem.log(final, step)
        metrics["timing_s/step"] = time.perf_counter() - t0
        metrics["perf/throughput"] = metrics.pop("_tokens") / metrics["timing_s/step"]
        state.step = step
        state.method_state, state.memory = run.hooks.state_dict(), run.memory
        writer.log(metrics, step)  # the lines first, then the checkpoint: a kill in between redoes the step
        save_checkpoint(ckpt_path, model, opt, state, logged={"metrics": metrics, "eval": final}, config=config)
        bar.set_postfix(score=f"{metrics['critic/score/mean']:.2f}",
                        acc=f"{metrics['val/acc']:.2f}" if "val/acc" in metrics else "")
    writer.close()
    per_problem.close()
    return out


def _steps(path: Path) -> list[int]:
    """The steps of ``path``'s whole lines (none when it is missing); a line that is not one, or steps that are not
    one line each in order (a line copied or moved by hand), are :class:`~rlkit.errors.CannotResume` naming the
    file."""
    if not path.exists():
        return []
    try:
        steps = [r["step"] for r in read_metrics(path)]
    except ValueError as e:
        raise CannotResume(f"{e}: the run's {path.name} is damaged; restore it, or start the run again in another "
                           "--out") from None
    for before, after in zip(steps, steps[1:]):
        if after <= before:
            what = f"step {after} twice" if after == before else f"step {after} after step {before}"
            raise CannotResume(f"{path} holds {what}, where a run writes one line per step in order (a line copied "
                               "or moved by hand?): restore the file, or start the run again in another --out")
    return steps


def differing_settings(a: dict, b: dict) -> list[str]:
    """Dotted keys whose values differ; a method section only one side has (a method registered since) is not a
    difference, a setting of the engine or of a method both have that one side lacks is."""
    fa, fb = flat_settings(a), flat_settings(b)
    one_sided = ({k.split(".", 1)[0] for k in fa} ^ {k.split(".", 1)[0] for k in fb})
    ignored = one_sided & set(registry.list_methods()["method"])  # looked up once, not per key
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, "<unset>") != fb.get(k, "<unset>")
                  and k.split(".", 1)[0] not in ignored)


def _resume_point(out: Path, config: dict) -> tuple[dict | None, dict[str, Any]]:
    """What ``train(resume=True)`` continues from: the checkpoint's contents (None: nothing to continue, the run
    starts over) and the lines of its step to re-log (``{"metrics": ..., "eval": ...}``, those torn by a kill).

    Refuses (:class:`~rlkit.errors.ResumeMismatch`) settings that differ from ``config.json`` or from those the
    checkpoint was trained with, naming each nested key; and (:class:`~rlkit.errors.CannotResume`) a run that
    cannot continue exactly: metrics without a checkpoint, a damaged checkpoint or config, or metrics lacking a
    step the checkpoint took that it cannot re-log."""
    ckpt_path, metrics_path, config_path = out / "checkpoint.pt", out / "metrics.jsonl", out / "config.json"
    steps, eval_steps = _steps(metrics_path), _steps(out / "eval.jsonl")  # both read whole before any work
    if config_path.exists():
        try:
            saved = read_json(config_path)  # a JSON object, or the damage named
        except DamagedFile as e:
            raise CannotResume(f"{e}: the run's settings are unreadable; restore it, or start the run again in "
                               "another --out") from None
        if changed := differing_settings(saved, config):
            raise ResumeMismatch(f"{out} was started with other settings ({', '.join(changed)} differ from "
                                 f"{config_path}): resume it with the same --method/--scale/--regime/--seed/--set")
    elif ckpt_path.exists():
        raise CannotResume(f"{out} has a checkpoint but no config.json: the run's settings are unknown; start it "
                           "again in another --out")
    if not ckpt_path.exists():
        if any(s > 0 for s in steps):
            raise CannotResume(f"{metrics_path} holds steps up to {max(steps)} but {out} has no checkpoint.pt: it "
                               "cannot resume exactly; start again in another --out (or delete metrics.jsonl)")
        return None, {}  # killed before its first step finished: start over
    blob = load_checkpoint(ckpt_path)
    if blob.get("config") is not None and (changed := differing_settings(blob["config"], config)):
        raise ResumeMismatch(f"{ckpt_path} was trained with other settings than these ({', '.join(changed)} "
                             f"differ; was config.json edited?): resume with the settings the run was started with")
    k = blob["step"]
    done = [s for s in steps if s <= k]
    logged = blob.get("logged") or {}
    if done == list(range(k + 1)):
        relog = {}
    elif done == list(range(k)) and logged.get("metrics") is not None:
        relog = {"metrics": logged["metrics"]}  # the checkpoint's own line was torn by a kill: write it again
    else:
        missing = sorted(set(range(k + 1)) - set(done))
        raise CannotResume(f"{metrics_path} lacks step(s) {missing[:5]} that {ckpt_path.name} (step {k}) has taken, "
                           "and the checkpoint cannot re-log them: start the run again in another --out")
    if logged.get("eval") is not None and k not in eval_steps:
        relog["eval"] = logged["eval"]
    return blob, relog


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
    policy = sampler = _behaviour_policy(run, state)
    if run.mismatched is not None:  # the same weights as another inference engine holds them
        sampler = run.mismatched.follow(policy)
    ro = rollout(sampler, tokenizer, problems, max_new_tokens=run.max_new, form=run.form,
                 temperature=cfg.temperature, temperature_fn=temperature_fn, generator=state.sample_gen)
    scored = score_rollout(ro, problems)
    metrics["timing_s/gen"] = time.perf_counter() - t0
    metrics["rollout/response_tokens"] = ro.lengths.sum().item()  # all sampled, before any filtering
    if cfg.policy_eval_due(step):  # stale sampler: how the policy being trained does itself
        metrics.update(_policy_eval(run, problems, temperature_fn, step))

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


# ------------------------------------------------------------------------------------------------ helpers
def _behaviour_policy(run: Run, state: RunState):
    """The model that samples this step: the policy itself, or with ``staleness`` k the policy as it was k steps
    earlier (the SFT start while fewer than k steps have passed)."""
    if run.behaviour is None:
        return run.model
    state.policies.append({k: v.detach().clone() for k, v in run.model.state_dict().items()})
    del state.policies[: -(run.cfg.staleness + 1)]
    run.behaviour.load_state_dict(state.policies[0])
    return run.behaviour


def _sft_correct(sft_info: dict, n: int, max_new: int, device: str) -> Tensor | None:
    """The SFT start's per-problem greedy results on the first ``n`` held-out problems, from its own evaluation
    (:func:`rlkit.tiny.sft.train`) when that covered them with the same token budget on the same device; else None.
    The SFT evaluates the same split (seed 0, its task knobs), and RL runs load the very weights it evaluated."""
    correct = sft_info.get("val/correct")
    if (correct is None or len(correct) < n or sft_info.get("val/max_new_tokens") != max_new
            or sft_info.get("val/device") != str(device)):
        return None
    return torch.tensor(correct[:n], dtype=torch.float32)


def _backward(loss: Tensor, probe: Tensor, logp: Tensor, silent: Tensor, with_graph: Callable[[], Tensor],
              params) -> None:
    """``loss.backward()`` through the model, without the passes that would add exact zeros to the gradients.

    The loss reaches the parameters only through the log-probs (old log-probs, advantages, entropies enter it as
    constants); it was computed on ``probe``, a leaf copy of ``logp``, so ``∂loss/∂logp`` is known for every row
    before any pass through the model. A row with a zero advantage (``silent``) adds nothing to a loss that has no
    term without the advantage — every rlkit loss: −A·r, clipped or gated, A reshaped by entropy multiplicatively —
    and its ``logp`` came without autograd's graph (:func:`token_logprobs`'s ``frozen``, chunks of silent rows); the
    others' backward goes on from ``logp`` with that gradient: the same products and sums, in the same order, as one
    ``loss.backward()`` over every row, less the chunks whose contribution was exactly zero (x + 0 = x: bit for bit,
    tests/test_tiny_rl.py). When the gradient is zero everywhere (every response of a stress run's one-group
    mini-batch silent, half of them) zeros are set (the optimizer still steps, as it did). A loss with a gradient in
    a silent row (a KL or entropy term) gets the graph it needs: ``with_graph()`` runs the rows again with it."""
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


def _policy_eval(run: Run, problems: list, temperature_fn, step: int) -> dict[str, float]:
    """With a stale sampler (``staleness`` > 0): one rollout of the current policy (``run.model``, before this
    step's update) on ``problems``, at the training's temperature (and the hooks' ``temperature_fn``), with its own
    generator (:func:`_side_generator`). ``policy/entropy`` is its masked-mean token entropy (``actor/entropy``'s
    definition), ``policy/score/mean`` its mean correctness (``critic/score/mean``'s). No gradient is taken."""
    t0 = time.perf_counter()
    device = next(run.model.parameters()).device
    with torch.no_grad():
        ro = rollout(run.model, run.tokenizer, problems, max_new_tokens=run.max_new, form=run.form,
                     temperature=run.cfg.temperature, temperature_fn=temperature_fn,
                     generator=side_generator(run.cfg.seed, step, "policy-eval", device))
        scored = score_rollout(ro, problems)
        out = {"policy/entropy": masked_mean(ro.entropy, ro.mask).item(),
               "policy/score/mean": scored.rewards.mean().item()}
    out["timing_s/policy_eval"] = time.perf_counter() - t0
    return out


def _select_scored(scored, rows: Tensor):
    return type(scored)(rewards=scored.rewards[rows], code_pass=scored.code_pass[rows])


def side_run(cfg: RLConfig, model: Any, tokenizer: Any, *, device: str = "cpu") -> tuple[Run, torch.Generator]:
    """``cfg``'s run as work outside its training reads it (SPO's offline pass when shipping the start or preparing
    the verl twin's data): no optimizer, the run's pool and budget, and a sampling generator seeded as training
    seeds its own."""
    run = Run(cfg, model, tokenizer, None, cfg.pool(), cfg.max_new, cfg.sft.form)
    return run, torch.Generator(device=device).manual_seed(cfg.sampling_seed)


def offline_scores(run: Run, gen: torch.Generator, n: int, *, sft: dict | None = None,
                   cache_dir: str | Path | None = None) -> dict[int, list[float]]:
    """An offline value estimate: ``n`` scored samples per pool prompt from the SFT model.

    With ``sft`` (:func:`~rlkit.tiny.sft.warm_start`'s info, naming the start's weights by their SHA-256) the scores
    and ``gen``'s state after the pass are looked up, keyed by everything the pass reads — the start's weights, the
    pool, the sampling settings and ``gen``'s state before it — among the passes rlkit ships beside its SFT starts,
    then in ``cache_dir`` (default: the SFT cache), where a new pass is written. Runs that share them (a method's
    ablations on one seed, or a user's run on any CPU from a shipped start) continue bit for bit as if they had
    sampled the pass themselves.
    """
    if n == 0:
        return {}
    path = None
    if sft is not None:
        key = hashlib.sha256(json.dumps({
            "sft": sft["sha256"], "pool": [asdict(p) for p in run.pool], "n": n, "temperature": run.cfg.temperature,
            "max_new": run.max_new, "form": run.form,
            "gen": hashlib.sha256(gen.get_state().numpy().tobytes()).hexdigest(),
        }, sort_keys=True, default=str).encode()).hexdigest()[:16]
        name = f"offline-{key}.pt"
        path = Path(cache_dir or default_cache_dir()) / name
        for found in (starts.SHIPPED_DIR / name, path):  # the module's, read now: a test may point it elsewhere
            if not found.exists():
                continue
            try:
                saved = read_torch(found, ("scores", "gen_after"))
            except DamagedFile as e:
                if found != path:  # a shipped file is part of the package: refused, never replaced
                    raise
                print(f"rlkit: {e}; sampling the offline pass again", file=sys.stderr)
                break
            gen.set_state(saved["gen_after"])
            return {i: row.tolist() for i, row in enumerate(saved["scores"])}
    problems = [p for p in run.pool for _ in range(n)]
    rewards = []
    for i in range(0, len(problems), 512):
        chunk = problems[i : i + 512]
        ro = rollout(run.model, run.tokenizer, chunk, max_new_tokens=run.max_new, form=run.form,
                     temperature=run.cfg.temperature, generator=gen)
        rewards.append(score_rollout(ro, chunk).rewards)
    per_prompt = torch.cat(rewards).view(len(run.pool), n)
    if path is not None:  # written atomically: two runs of one seed side by side may both write it
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, "wb") as f:
            torch.save({"scores": per_prompt.cpu(), "gen_after": gen.get_state()}, f)
    return {i: per_prompt[i].tolist() for i in range(len(run.pool))}


