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

Metrics. verl's ``file`` logger writes ``{"step": N, "data": {...}}`` lines to ``$VERL_FILE_LOGGER_PATH``
(``verl/utils/tracking.py::FileLogger``). The logger lives in verl's trainer, a Ray actor, so the variable
travels in Ray's runtime environment (``ray_kwargs.ray_init.runtime_env.env_vars``), and a run's metrics land
in ``runs/<experiment>/metrics.jsonl`` — read by :mod:`rlkit.metrics` and ``rlkit plot`` like a tiny run's.
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
import math
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

from rlkit.verl import TRAINER
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
    # AEPO scripts, SPO train.sh, HAPO recipes (METHODS §2, §4, §5); verl's GSPO and GSM8K examples
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    # KL = 0: GSPO §5.1, SPO train.sh, HAPO recipes, AEPO scripts (METHODS §2–§5)
    "actor_rollout_ref.actor.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.entropy_coeff": 0,  # AEPO/ARLArena and HAPO: no entropy bonus (METHODS §2, §5)
    "actor_rollout_ref.rollout.temperature": 1.0,  # ASPO §4.1; HAPO's base temperature (METHODS §1, §5)
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
    """Tool-integrated: multi-turn rollouts with rlkit's sandboxed Python (:mod:`rlkit.verl.tools`)."""


# DAPO's mechanics (clip-higher, dynamic sampling, token-mean loss, overlong shaping), as verl's DAPO recipe
# and HAPO's recipes set them (METHODS §5: "filter_groups on acc, overlong buffer 4096 with penalty 1.0").
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


# AIME as SPO's recipe samples it (METHODS §4): 16 answers per problem, T 0.6, top-p 0.95, top-k 20.
_SPO_VAL = _val(16, 0.6, 0.95, 20)

# SPO's reward (seed 002, the recipe's compute_score): one </think>, no code block after it, then the answer.
_SPO_FORMAT = {"+reward.custom_reward_function.reward_kwargs.format_rule": True}

PRESETS: dict[str, Preset] = {
    # GRPO, the baseline: SPO's GRPO column (METHODS §4, recipe/spo/train.sh): 128 prompts × 8, mini-batch 16.
    "grpo": Preset(
        n=8, updates=8, dapo_prompts=128,
        keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_clip(0.2, 0.28, 10.0),  # SPO train.sh, shared by its GRPO runs (METHODS §4)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # SPO recipe (METHODS §4)
        },
        dapo={"data.max_response_length": 8192, **_SPO_VAL, **_SPO_FORMAT},  # SPO train.sh (METHODS §4)
    ),
    # GSPO (paper v2 §5.1): sequence-ratio loss on GRPO advantages, no critic (AEPO/GSPO integration guide).
    "gspo": Preset(
        n=16, updates=4,  # n = 16: verl's GSPO example on DAPO-Math; 4 mini-batches per batch: paper §5.1
        dapo_prompts=256,  # verl's examples/gspo_trainer/run_qwen30b_gspo.sh; the paper gives none
        keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_gspo",
            **_clip(3e-4, 4e-4, 10.0),  # ε_left 3e-4, ε_right 4e-4: paper §5.1; c = 10: verl's GSPO example
            "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean",  # Eq. 5's (1/G)Σ_i (METHODS §3)
        },
        # verl's GSPO example on DAPO-Math: 8k responses, overlong penalty, validation top-p 0.7 at T 1.0
        dapo={"data.max_response_length": 8192, **_overlong(), **_val(1, 1.0, 0.7)},
    ),
    # ASPO (§4.1): DAPO with a Python tool, 96 prompts × 8, max length 16,384, 3 epochs; Eq. 2's δ, k (§4.5).
    "aspo": Preset(
        n=8, updates=16,  # mini-batch not stated; DAPO's 16 steps per batch (512/32, METHODS §5)
        dapo_prompts=96,
        keys={
            "algorithm.adv_estimator": "rlkit_aspo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_clip(0.2, 0.28, 10.0),  # DAPO's clip-higher (verl's DAPO recipe, HAPO recipes: c = 10)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # DAPO's token-level loss
            **_DYNAMIC_SAMPLING,  # DAPO (METHODS §1: "DAPO dynamic sampling removes all-correct groups")
            "+algorithm.aspo.delta": -2.0,  # conservative setting, §4.5
            "+algorithm.aspo.k": 0.7,  # §4.5
        },
        # §4.1: 16,384 tokens, 3 epochs, evaluation at T 0.6; AIME scored avg@16 (§4.5)
        dapo={"data.max_response_length": 16384, **_overlong(), "trainer.total_epochs": 3, **_val(16, 0.6)},
        tools=True,  # the Python interpreter whose first call ASPO moves earlier (§4.1)
    ),
    # AEPO: GRPO advantages, the AEPO loss, no critic (AEPO/GSPO integration guide); ARLArena's math trainer
    # (examples/math_trainer/4B/train_aepo.sh, METHODS §2): 512 prompts × 4, mini-batch 128, 16k lengths.
    "aepo": Preset(
        n=4, updates=4, dapo_prompts=512,
        keys={
            "algorithm.adv_estimator": "rlkit_grpo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_aepo",
            **_clip(0.2, 0.28, 3.0),  # ARLArena math_agent_trainer.yaml (METHODS §2)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",  # both AEPO codes (METHODS §7)
        },
        dapo={"data.max_response_length": 16384},  # ARLArena's 4B script (its KL loss left off: coefficient?)
    ),
    # SPO (recipe/spo/train.sh, METHODS §4): one response per prompt, 1024 prompts, mini-batch 128, a tool.
    "spo": Preset(
        n=1, updates=8, dapo_prompts=1024,
        keys={
            "algorithm.adv_estimator": "rlkit_spo",
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_ppo",
            **_clip(0.2, 0.28, 10.0),  # train.sh (METHODS §4)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 8,  # train.sh (METHODS §4)
        },
        dapo={"data.max_response_length": 8192, **_SPO_VAL, **_SPO_FORMAT,  # train.sh (METHODS §4)
              "+algorithm.spo.offline_values": DataFile("offline_values.json")},  # rlkit data's SPO pipeline
        tools=True,  # the recipe's ReTool-style multi-turn Python agent (METHODS §4)
    ),
    # HAPO (recipes, METHODS §5): DAPO + the four components; 512 prompts × 16, mini-batch 32, 32×A100.
    "hapo": Preset(
        n=16, updates=16, dapo_prompts=512,
        keys={
            "algorithm.adv_estimator": "rlkit_hapo_tlga",  # B: token-level group average
            "actor_rollout_ref.actor.policy_loss.loss_mode": "rlkit_hapo",  # C, D: redistribution, clip
            **_clip(0.2, 0.28, 10.0),  # paper's clip-higher 0.28 (the recipes: 0.2), c = 10 (METHODS §5)
            "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
            **_DYNAMIC_SAMPLING,
            "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,  # recipes (METHODS §5)
            "actor_rollout_ref.actor.optim.weight_decay": 0.1,  # recipes (METHODS §5)
        },
        # Qwen3 recipes: 12,288 tokens, overlong 4096 with penalty 1.0; validation n 8, T 0.5, top-p 0.7
        dapo={"data.max_response_length": 12288, **_overlong(), **_val(8, 0.5, 0.7)},
    ),
}
METHODS = tuple(PRESETS)


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
    """Where the run's copy of rlkit's tool config goes (tool-integrated methods), written at launch."""

    @property
    def command(self) -> list[str]:
        """``python -m verl.trainer.main_ppo <overrides>`` as an argument list."""
        return [*ENTRY, *self.overrides]

    def shell(self, *, multiline: bool = False) -> str:
        """The command as one shell line (or one override per line, for reading)."""
        words = [shlex.quote(w) for w in self.command]
        if not multiline:
            return " ".join(words)
        return " \\\n    ".join([" ".join(words[: len(ENTRY)]), *words[len(ENTRY):]])


def default_experiment(method: str, dataset: str, model: str) -> str:
    """``<method>-<dataset>-<model name>``, e.g. ``grpo-gsm8k-qwen2.5-0.5b-instruct``."""
    return f"{method}-{dataset}-{Path(model.rstrip('/')).name.lower()}"


def plan(method: str, dataset: str, model: str, *, gpus: int, nodes: int = 1, ray_address: str | None = None,
         experiment: str | None = None, runs_dir: str = "runs", data_dir: str | None = None,
         extra: Sequence[str] = ()) -> Plan:
    """The overrides for one run (nothing is composed or checked here: see :func:`check`)."""
    preset, spec = _preset(method), _dataset(dataset)
    if gpus < 1 or nodes < 1:
        raise LaunchError(f"--gpus and --nodes must be ≥ 1, got gpus={gpus}, nodes={nodes}")
    experiment = experiment or default_experiment(method, dataset, model)
    run_dir = f"{runs_dir.rstrip('/')}/{experiment}"
    data_dir = (data_dir or f"data/{dataset}").rstrip("/")
    batch = scaled_batch(method, dataset, gpus * nodes)
    tool_config = f"{run_dir}/{TOOL_CONFIG_NAME}" if preset.tools else None
    tools = {"actor_rollout_ref.rollout.multi_turn.enable": True,
             "actor_rollout_ref.rollout.multi_turn.tool_config_path": tool_config,
             "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent"} if preset.tools else {}
    values: dict[str, Any] = {
        **COMMON, **spec.keys, **preset.keys, **(preset.dapo if dataset == "dapo" else {}), **tools,
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
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": f"{run_dir}/metrics.jsonl",
    }
    if ray_address:
        values["+ray_kwargs.ray_init.address"] = ray_address
    values = {k: f"{data_dir}/{v.name}" if isinstance(v, DataFile) else v for k, v in values.items()}
    overrides = [f"{key}={hydra_value(value)}" for key, value in values.items()]
    return Plan(method=method, dataset=dataset, model=model, gpus=gpus, nodes=nodes, experiment=experiment,
                run_dir=run_dir, data_dir=data_dir, overrides=tuple(merge_overrides(overrides, extra)),
                tool_config=tool_config)


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
    """Compose ``p``'s overrides with verl's config and :func:`validate` it; the composed config."""
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
    """verl prints banners and warns as it validates; the launcher's own output stays the command."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


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
            from rlkit.verl.tools import TOOL_CONFIG
        return str(TOOL_CONFIG)
    return path


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
        "grpo": ("Qwen/Qwen3-8B", 8, 1),  # SPO's GRPO baseline (METHODS §4)
        "gspo": ("Qwen/Qwen3-8B-Base", 8, 1),  # the paper's Qwen3-30B-A3B-Base is MoE: Megatron territory
        "aspo": ("Qwen/Qwen3-8B", 8, 1),  # ASPO §4.1
        "aepo": ("Qwen/Qwen3-4B", 8, 1),  # ARLArena's math trainer, 4B (METHODS §2)
        "spo": ("Qwen/Qwen3-8B", 8, 1),  # SPO (METHODS §4)
        "hapo": ("Qwen/Qwen3-8B-Base", 8, 4),  # v1 Table 1's Qwen3 row, 32×A100 (METHODS §5)
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


def write_run_files(p: Plan, cfg) -> Path:
    """``config.json`` (the launch, its command, the composed verl config) and ``env.json`` in the run dir."""
    from omegaconf import OmegaConf

    import rlkit

    run_dir = Path(p.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {"method": p.method, "dataset": p.dataset, "model": p.model, "scale": f"verl-{p.dataset}",
              "gpus": p.gpus, "nodes": p.nodes, "experiment": p.experiment, "command": p.command,
              "verl": OmegaConf.to_container(cfg, resolve=False)}
    versions = {}
    for name in ("verl", "torch", "vllm", "ray"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    env = {"rlkit": rlkit.__version__, "python": platform.python_version(), "platform": platform.platform(),
           **versions, "gpus": p.gpus * p.nodes, "seed": cfg.data.get("seed")}
    (run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str))
    (run_dir / "env.json").write_text(json.dumps(env, indent=2))
    return run_dir


def run(p: Plan, cfg) -> int:
    """Start ``p`` (after :func:`check`): keep a run's metrics, check its inputs, run ``main_ppo``."""
    metrics = Path(p.run_dir) / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size:
        raise LaunchError(f"{metrics} exists: verl's file logger would truncate it. Pick another "
                          "--experiment, or move the file away to resume the run from its checkpoints")
    inputs = {f"data.{key}": cfg.data[key] for key in ("train_files", "val_files")}
    if cfg.algorithm.get("spo") is not None and cfg.algorithm.spo.get("offline_values"):
        inputs["algorithm.spo.offline_values"] = cfg.algorithm.spo.offline_values
    for key, paths in inputs.items():
        for path in [paths] if isinstance(paths, str) else list(paths):
            if not Path(path).expanduser().exists():
                raise LaunchError(f"{key}: {path} not found; `rlkit data {p.dataset}` writes the data (and "
                                  f"SPO's offline values) into {p.data_dir}, or pass {key}=... after --")
    run_dir = write_run_files(p, cfg)
    source = _tool_source(p, cfg)
    if source is not None and cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path == p.tool_config:
        shutil.copyfile(source, run_dir / TOOL_CONFIG_NAME)
    return _execute([sys.executable, *p.command[1:]])


def _execute(argv: list[str]) -> int:
    """Run ``main_ppo`` in the foreground; its exit status."""
    return subprocess.run(argv, check=False).returncode


def main(args) -> int:
    """``rlkit launch``: plan, compose, validate, print the command; run it unless ``--dry-run``."""
    extra = list(args.overrides or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    p = plan(args.method, args.dataset, args.model, gpus=args.gpus, nodes=args.nodes,
             ray_address=args.ray_address, experiment=args.experiment, runs_dir=args.runs_dir,
             data_dir=args.data, extra=extra)
    cfg = check(p)
    print(p.shell(multiline=True), flush=True)
    if args.dry_run:
        return 0
    return run(p, cfg)
