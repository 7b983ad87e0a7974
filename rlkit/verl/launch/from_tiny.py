"""A tiny-engine run in verl: the same task, start and settings (``rlkit launch --tiny-scale S``).

:func:`overrides` turns the tiny engine's ``RLConfig`` into verl keys, :func:`prepare` writes what the run
reads; what cannot be matched is on the book's *Two engines* page. The only module of :mod:`rlkit.verl` that
imports :mod:`rlkit.tiny`; importing it loads only :mod:`rlkit.tiny.hf`.
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
        "algorithm.norm_adv_by_std_in_grpo": bool(getattr(options, "norm_by_std", True)),  # verl's default
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
    keys.update(_method_options(cfg))
    return keys


def _method_options(cfg: RLConfig) -> dict[str, Any]:
    """``+algorithm.<method>.<field>`` of the one section the verl run reads, with the tiny run's values:
    every field verl does not own, bar ``base_advantage`` (the tiny engine's base: the registry's default)."""
    from rlkit import registry
    from rlkit.verl import VERL_OWNED
    from rlkit.verl.inputs import run_method

    config = cfg.method_configs[cfg.method]
    m = registry.get_method(cfg.method)
    run = run_method(f"rlkit_{m.estimator(config)}", f"rlkit_{m.policy_loss}")
    if run != cfg.method:
        fields = {f.name for f in dataclasses.fields(registry.get_method(run).config)}
        config = registry.get_method(run).config(**{f.name: getattr(config, f.name)
                                                    for f in dataclasses.fields(config) if f.name in fields})
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return {f"+algorithm.{run}.{key}": list(value) if isinstance(value, tuple) else value
            for key, value in values.items()
            if key not in VERL_OWNED and key != "base_advantage" and not dataclasses.is_dataclass(value)}


def prepare(cfg: RLConfig, root: str | os.PathLike, *, device: str = "cpu", progress: bool = True) -> dict[str, Path]:
    """Write ``cfg``'s model, data and offline pass under ``root/<cache_key>``, once; their paths."""
    from rlkit import registry
    from rlkit.files import write_text
    from rlkit.tasks import arithmetic
    from rlkit.tiny.hf import export_sft
    from rlkit.tiny.rl import side_run
    from rlkit.tiny.sft import offline_scores, warm_start
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
            write_text(path, json.dumps(values))
        out[key] = path
    return out


def method_overrides(method: str, prepared: dict[str, Path]) -> list[str]:
    """``+algorithm.<method>.<key>=<path>`` for each verl key of ``method`` with a file by :func:`prepare`."""
    from rlkit import registry

    return [f"+algorithm.{method}.{key}={prepared[key]}" for key in registry.get_method(method).verl_keys
            if key in prepared]


__all__ = ["DATA_FORM", "VLLM_HEAD_SIZES", "cache_key", "method_overrides", "overrides", "parse_sets", "prepare",
           "run_config"]
