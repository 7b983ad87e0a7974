"""The RL stage of the tiny engine: :func:`train` runs :func:`rlkit.tiny.step.rl_step` ``steps`` times, evaluating
on held-out problems. After each step its metrics line, then the whole state (:mod:`rlkit.tiny.checkpoint`) are
written atomically: ``resume=True`` truncates the metrics to the checkpoint's step and redoes the rest bit for bit.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlkit import environ, registry
from rlkit.errors import CannotResume, DamagedFile, ResumeMismatch, RunExists
from rlkit.core.rollout_correction import correction_for, mismatch_metrics
from rlkit.files import TRAINING_RUN, claim_dir, lock_dir, os_errors, read_json, write_text
from rlkit.metrics import MetricsWriter, read_metrics
from rlkit.tasks import arithmetic
from rlkit.tiny.checkpoint import RunState, environment, load_checkpoint, restore_checkpoint, save_checkpoint
from rlkit.tiny.config import REGIMES, RLConfig, estimated_minutes, flat_settings
from rlkit.tiny.mismatch import MismatchedSampler, measures_mismatch, mismatched
from rlkit.tiny.sft import roughly, start_source, warm_start
from rlkit.tiny.step import Run, rl_step
from rlkit.tiny.task import accuracy, evaluate

Tensor = torch.Tensor

# ------------------------------------------------------------------------------------------------ what a run logs
LOGGED_BY_EVERY_METHOD = frozenset({
    "val/acc", "val/acc_final", "sft/val_acc", "timing_s/init", "timing_s/gen", "timing_s/update", "timing_s/step",
    "perf/throughput", "rollout/response_tokens", "critic/score/mean", "critic/rewards/mean", "critic/baseline_mse",
    "response_length/mean", "response_length/incorrect/mean", "actor/entropy", "adv/zero_frac", "actor/grad_norm",
    "actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "tool/first_code_pos/mean",
    "tool/code_ratio", "tool/code_rounds/mean", "tool/correct_code_ratio", "tool/code_pass_ratio"})
LOGGED_WHEN_STALE = frozenset({"policy/entropy", "policy/score/mean", "timing_s/policy_eval"})
"""What a run with ``staleness`` > 0 adds: the current policy's own rollout (``RLConfig.policy_eval_due``)."""


def logged_metrics(method: str, *, regime: str = "standard", overrides: dict | None = None) -> frozenset[str]:
    """Every metric a tiny-engine run of ``method`` in ``regime`` logs, with top-level ``overrides``."""
    logs = registry.get_method(method).logs  # a KeyError naming the valid methods
    if regime not in REGIMES:
        raise KeyError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    settings = {**REGIMES[regime], **(overrides or {})}
    stale = settings.get("staleness", 0) > 0
    return LOGGED_BY_EVERY_METHOD | logs | (LOGGED_WHEN_STALE if stale else frozenset()) | _mismatch_logs(settings)


def _mismatch_logs(settings: dict) -> frozenset[str]:
    """The rollout-correction metrics ``settings`` log (:func:`mismatch_metrics`', :func:`correction_for`'s)."""
    mode = settings.get("rollout_correction")
    if not measures_mismatch(settings.get("rollout_dtype", "float32"), settings.get("rollout_top_p", 1.0), mode,
                             settings.get("old_logp_source")):
        return frozenset()
    one = torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1)
    return frozenset(mismatch_metrics(*one)) | (frozenset(correction_for(mode, *one).metrics) if mode else frozenset())


# ------------------------------------------------------------------------------------------------ the loop
RUN_FILES = ("metrics.jsonl", "eval.jsonl", "config.json", "env.json", "checkpoint.pt")
"""What :func:`train` writes into a run directory (besides :data:`rlkit.files.MARKER`)."""
_OLD_TEMPORARY = ("checkpoint.tmp", "metrics.jsonl.tmp", "eval.jsonl.tmp")
"""Temporary files an older rlkit could leave in a run directory (removed when the run is next opened)."""


def train(cfg: RLConfig, out_dir: str | Path, *, device: str = "cpu", resume: bool = False, progress: bool = True,
          sft_cache: str | Path | None = None, stop_after: int | None = None, force: bool = False) -> Path:
    """Run ``cfg`` into ``out_dir`` (:data:`RUN_FILES`), locked for the whole run (a directory rlkit did not write
    needs ``force``). ``resume`` continues from its checkpoint, exactly or not at all (:func:`_resume_point`);
    ``stop_after`` returns after that step, as if the run had been killed there."""
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
    """The steps of ``path``'s lines (none if missing); bad lines or order: :class:`~rlkit.errors.CannotResume`."""
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
    """Dotted keys whose values differ; a method section only one side has (a method registered since) is not."""
    fa, fb = flat_settings(a), flat_settings(b)
    one_sided = ({k.split(".", 1)[0] for k in fa} ^ {k.split(".", 1)[0] for k in fb})
    ignored = one_sided & set(registry.list_methods()["method"])  # looked up once, not per key
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k, "<unset>") != fb.get(k, "<unset>")
                  and k.split(".", 1)[0] not in ignored)


def _resume_point(out: Path, config: dict) -> tuple[dict | None, dict[str, Any]]:
    """What ``train(resume=True)`` continues from: the checkpoint (None: start over) and its torn lines to re-log;
    other settings are :class:`~rlkit.errors.ResumeMismatch`, a run that cannot continue exactly ``CannotResume``."""
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


# ------------------------------------------------------------------------------------------------ helpers
def _sft_correct(sft_info: dict, n: int, max_new: int, device: str) -> Tensor | None:
    """The SFT start's own greedy results on the first ``n`` held-out problems (the same split and weights), when
    they cover them with the same token budget on the same device; else None."""
    correct = sft_info.get("val/correct")
    if (correct is None or len(correct) < n or sft_info.get("val/max_new_tokens") != max_new
            or sft_info.get("val/device") != str(device)):
        return None
    return torch.tensor(correct[:n], dtype=torch.float32)


def side_run(cfg: RLConfig, model: Any, tokenizer: Any, *, device: str = "cpu") -> tuple[Run, torch.Generator]:
    """``cfg``'s run without an optimizer, and a sampling generator seeded as training seeds its own (for work
    outside training: an offline pass when shipping the start or preparing the verl twin's data)."""
    run = Run(cfg, model, tokenizer, None, cfg.pool(), cfg.max_new, cfg.sft.form)
    return run, torch.Generator(device=device).manual_seed(cfg.sampling_seed)
