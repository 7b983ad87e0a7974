"""A tiny-engine run in verl: the same task, starting checkpoint and settings (``rlkit launch --tiny-scale S``).

:func:`overrides` turns the tiny engine's :class:`~rlkit.tiny.config.RLConfig` of a method and scale into verl keys,
and :func:`prepare` writes what the run reads, so that verl's ``main_ppo`` and ``rlkit train`` train the same
model on the same problems with the same hyperparameters:

- **model** — the SFT start of that scale (the checkpoint every tiny run starts from, cached by its config),
  exported as a Llama model directory (:func:`rlkit.tiny.hf.export_sft`);
- **data** — ``train.parquet`` holds the tiny engine's prompt pool (:func:`rlkit.tasks.arithmetic.make_pool`), in
  pool order, and ``test.parquet`` its held-out problems (``make_split(eval_size, "test", seed=0)``); verl keeps
  the pool whole (``train_max_samples=-1``) and validates on every held-out problem, greedily, with the calculator;
- **a method's offline pass** (:attr:`rlkit.registry.Method.offline_pass`, SPO's values) — the tiny engine's own
  pass (its samples per pool prompt from the SFT model with its sampler and seed), keyed by prompt id, in the file
  the method's verl key names: both engines' hooks start from the same numbers;
- **settings** — prompts per step and responses per prompt, optimizer steps per batch, learning rate and warm-up,
  Adam's betas (no weight decay), gradient clip, sampling temperature, the response budget, the steps and the
  validation schedule, every method's clip range, aggregation and options (``+algorithm.<method>.*`` with the
  field names of its ``Config``: the run's own section alone, :func:`_section`), and no DAPO mechanics unless the
  tiny run has them (dynamic sampling, kept by correctness; the overlong penalty, by verl's reward manager for it
  (:func:`rlkit.verl.launch.presets.overlong`) on the response's length as verl counts it: every token after the
  prompt, the calculator's results included, as the tiny engine counts them).

What cannot be matched is listed with the comparison (the book's *Two engines* page): verl's AdamW runs a warm-up
from 0 where the tiny engine's starts at lr/warmup, its sampler is vLLM (so the old log-probs are recomputed by the
trainer, not the sampler's), its loss runs in micro-batches, and a stray ``</code>`` ends a verl response.

This module is also the bridge: the only one of :mod:`rlkit.verl` that imports :mod:`rlkit.tiny`
(``tests/test_layering.py`` holds the rest to it). What they need of the tiny engine is here —
:data:`VLLM_HEAD_SIZES` and :func:`parse_sets` — and importing it loads only :mod:`rlkit.tiny.hf` (it runs in
every verl and vLLM process through :mod:`rlkit.verl.cpu`); the rest of the tiny engine is imported where used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.tiny.hf import VLLM_HEAD_SIZES

if TYPE_CHECKING:
    from rlkit.tiny.config import RLConfig

DATA_FORM = "mixed"
"""Reference solutions kept in the rows (the tiny engine's default form)."""


def run_config(method: str, scale: str, overrides: dict[str, Any] | None = None) -> RLConfig:
    """The tiny engine's configuration of ``method`` at ``scale`` (``rlkit train --set`` style ``overrides``)."""
    from rlkit.tiny.config import build_config

    return build_config(method, scale, overrides)


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``--set KEY=VALUE`` items as :func:`run_config`'s ``overrides`` (:func:`rlkit.tiny.config.parse_sets`)."""
    from rlkit.tiny.config import parse_sets

    return parse_sets(items)


def cache_key(cfg: RLConfig) -> str:
    """Name of the prepared files: the SFT start, the pool and the held-out set depend on these fields only."""
    from rlkit.tiny.task import build_tokenizer

    extra = {"pool": cfg.pool_size, "eval": cfg.eval_size}
    blob = json.dumps({"sft": cfg.sft.key(build_tokenizer()), **extra}, sort_keys=True)
    return f"{cfg.scale}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _method_options(name: str, config: Any) -> dict[str, Any]:
    """``+algorithm.<name>.<field>`` for every field verl does not own (its own keys carry the rest)."""
    from rlkit.verl import VERL_OWNED

    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in VERL_OWNED or dataclasses.is_dataclass(value):
            continue
        out[f"+algorithm.{name}.{f.name}"] = list(value) if isinstance(value, tuple) else value
    return out


def overrides(cfg: RLConfig) -> dict[str, Any]:
    """verl keys reproducing ``cfg`` (module doc), applied after the method's preset and the CPU preset."""
    from rlkit import registry
    from rlkit.tasks import arithmetic

    if cfg.sft.form != DATA_FORM:
        raise ValueError(f"the verl twin of a tiny run uses the {DATA_FORM!r} form's calculator; sft.form is "
                         f"{cfg.sft.form!r}")
    loss = registry.loss_kwargs(cfg.method, cfg.method_configs)  # the clip range and aggregation of its loss
    options = cfg.method_configs[cfg.method]
    prompts = cfg.prompts_per_step
    if prompts % cfg.mini_batches:
        raise ValueError(f"prompts_per_step {prompts} is not a multiple of mini_batches {cfg.mini_batches}")
    actor = "actor_rollout_ref.actor."
    micro = math.gcd(16, prompts // cfg.mini_batches * cfg.group_size)  # ≤ 16 rows a forward, dividing a mini-batch
    keys: dict[str, Any] = {
        "data.train_batch_size": prompts,
        "actor_rollout_ref.rollout.n": cfg.group_size,
        actor + "ppo_mini_batch_size": prompts // cfg.mini_batches,
        actor + "ppo_epochs": cfg.ppo_epochs,
        actor + "ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        actor + "optim.lr": cfg.lr,
        actor + "optim.lr_warmup_steps": cfg.warmup_steps,
        actor + "optim.weight_decay": 0.0,  # the tiny engine's Adam
        "+" + actor + "optim.betas": [0.9, 0.99],
        actor + "grad_clip": cfg.grad_clip,
        "actor_rollout_ref.rollout.temperature": cfg.temperature,
        "data.max_response_length": cfg.max_new,
        "data.max_prompt_length": arithmetic.MAX_QUESTION_CHARS + 2,
        "data.train_max_samples": -1,
        "data.val_max_samples": -1,
        "data.shuffle": True,
        "data.seed": cfg.seed,
        "trainer.total_training_steps": cfg.steps,
        "trainer.test_freq": cfg.eval_every,
        "trainer.save_freq": cfg.eval_every,
        "trainer.val_before_train": True,
        **{actor + key: loss[knob] for knob, key in (("clip_low", "clip_ratio_low"), ("clip_high", "clip_ratio_high"))
           if loss.get(knob) is not None},  # a loss without a clip range (SAPO's gate) leaves verl's unread defaults
        actor + "loss_agg_mode": loss["agg"],
        "algorithm.norm_adv_by_std_in_grpo": _norm_by_std(cfg),
        "algorithm.filter_groups.enable": bool(getattr(options, "dynamic_sampling", False)),
    }
    if loss.get("clip_c") is not None:
        keys[actor + "clip_ratio_c"] = loss["clip_c"]
    if cfg.rollout_top_p < 1:  # the tiny sampler's nucleus is vLLM's top-p
        keys["actor_rollout_ref.rollout.top_p"] = cfg.rollout_top_p
    if cfg.rollout_correction:
        from rlkit.core.rollout_correction import verl_overrides

        keys.update(verl_overrides(cfg.rollout_correction))
    if cfg.rollout_dtype != "float32":
        raise ValueError(f"the verl twin samples with vLLM's own weights; rollout_dtype={cfg.rollout_dtype!r} "
                         "(the tiny engine's stand-in for them) has no verl key")
    if getattr(options, "overlong_buffer", 0):  # verl's overlong reward manager: the same penalty over the budget
        from rlkit.verl.launch.presets import overlong

        keys.update(overlong(options.overlong_buffer, options.overlong_penalty))
        if keys["algorithm.filter_groups.enable"]:  # groups kept by correctness, before the shaping (as the tiny's)
            keys["algorithm.filter_groups.metric"] = "acc"
    run, section = _section(cfg)
    keys.update(_method_options(run, section))
    keys.pop(f"+algorithm.{run}.base_advantage", None)  # the tiny engine's base: the registry's default
    return keys


def _section(cfg: RLConfig) -> tuple[str, Any]:
    """``(method, Config)`` of the one ``+algorithm.<method>`` section the verl run reads: a verl run reads its own
    method's section alone (:func:`rlkit.verl.inputs.run_method`), as a tiny run reads its own ``Config``. That
    method is the tiny run's, but for a method verl trains as another (that one's estimator and loss, the rest of
    its mechanics verl's own keys above), whose ``Config`` then gets the tiny run's values of the fields it has."""
    from rlkit import registry
    from rlkit.verl.inputs import run_method

    own = cfg.method_configs[cfg.method]
    m = registry.get_method(cfg.method)
    run = run_method(f"rlkit_{m.estimator(own)}", f"rlkit_{m.policy_loss}")
    if run == cfg.method:
        return run, own
    fields = {f.name for f in dataclasses.fields(registry.get_method(run).config)}
    return run, registry.get_method(run).config(**{f.name: getattr(own, f.name) for f in dataclasses.fields(own)
                                                   if f.name in fields})


def _norm_by_std(cfg: RLConfig) -> bool:
    """The run's ``norm_by_std`` (True where its method's Config has none: verl's default)."""
    return bool(getattr(cfg.method_configs[cfg.method], "norm_by_std", True))


def prepare(cfg: RLConfig, root: str | os.PathLike, *, device: str = "cpu", progress: bool = True) -> dict[str, Path]:
    """Write the model, the data and the method's offline pass (:attr:`rlkit.registry.Method.offline_pass`) of
    ``cfg`` under ``root/<cache_key>``, once; returns their paths: ``model``, ``data``, and the pass's file under
    the verl key that reads it (:func:`method_overrides`)."""
    from rlkit import registry
    from rlkit.tasks import arithmetic
    from rlkit.tiny.hf import export_sft
    from rlkit.tiny.rl import offline_scores, side_run
    from rlkit.tiny.sft import warm_start
    from rlkit.verl.launch.data import arithmetic_rows, prompt_id, write_rows

    home = Path(root) / cache_key(cfg)
    model_dir, data_dir = home / "model", home / "data"
    knobs = dataclasses.asdict(cfg.sft.task)
    if not (model_dir / "config.json").exists():
        export_sft(model_dir, cfg.sft, scale=cfg.scale, device=device, progress=progress)
    if not (data_dir / "test.parquet").exists():
        pool = cfg.pool()
        held_out = arithmetic.make_split(cfg.eval_size, "test", seed=0, **knobs)
        write_rows(arithmetic_rows(pool, "train"), data_dir / "train.parquet")
        write_rows(arithmetic_rows(held_out, "test"), data_dir / "test.parquet")
    out = {"model": model_dir, "data": data_dir}
    method = registry.get_method(cfg.method)
    n = method.offline_samples(cfg.method_configs[cfg.method])
    if n:
        key = method.offline_pass.verl_key
        path = data_dir / f"{key}-N{n}-seed{cfg.seed}.json"
        if not path.exists():
            model, tokenizer, sft = warm_start(cfg.sft, device=device, progress=progress)
            run, gen = side_run(cfg, model, tokenizer, device=device)  # as the tiny run samples it
            scores = offline_scores(run, gen, n, sft=sft)
            values = {prompt_id(run.pool[i].question): s for i, s in scores.items()}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(values))
            os.replace(tmp, path)
        out[key] = path
    return out


def method_overrides(method: str, prepared: dict[str, Path]) -> list[str]:
    """``+algorithm.<method>.<key>=<path>`` for each verl key of ``method`` (:attr:`rlkit.registry.Method.verl_keys`)
    whose file :func:`prepare` wrote."""
    from rlkit import registry

    return [f"+algorithm.{method}.{key}={prepared[key]}" for key in registry.get_method(method).verl_keys
            if key in prepared]


__all__ = ["DATA_FORM", "VLLM_HEAD_SIZES", "cache_key", "method_overrides", "overrides", "parse_sets", "prepare",
           "run_config"]
