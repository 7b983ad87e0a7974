"""Hydra overrides and verl's config: write them, compose them as ``main_ppo`` does, validate the result on CPU.

Every failure is a :class:`~rlkit.verl.LaunchError` naming the bad key or value and what would be valid.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import io
import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlkit.tasks.protocol import TOOL_TAGS
from rlkit.verl import TRAINER, LaunchError
from rlkit.verl.launch.from_tiny import VLLM_HEAD_SIZES


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
    if text.startswith("${") and text.endswith("}"):
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
    """``base`` with each of ``extra`` replacing its key's entry (keeping the ``+``), or appended."""
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


def check_method_overrides(overrides: Sequence[str]) -> None:
    """Check ``overrides``' ``+algorithm.<method>.*`` items against the method's ``Config``, first of all."""
    from rlkit import registry
    from rlkit.verl.inputs import method_config

    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException
    except ImportError:  # without verl the launch is refused when it composes
        return
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return
    methods = set(registry.list_methods()["method"])
    sections: dict[str, dict[str, Any]] = {}
    for o in parsed:
        path = o.key_or_group.split(".")
        value = None if o.is_delete() else o.value()
        if len(path) == 3 and path[0] == "algorithm" and path[1] in methods and not o.is_delete() \
                and not (isinstance(value, str) and "${" in value):
            sections.setdefault(path[1], {})[path[2]] = value
    for method, section in sections.items():
        try:
            method_config({method: section}, method)
        except (KeyError, ValueError, TypeError) as e:
            raise LaunchError(str(e.args[0] if e.args else e)) from None


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


def validate(cfg, *, tool_config: str | None = None) -> None:
    """Everything checkable without GPUs: verl's checks, :func:`check_batch`, rlkit's names, the logger."""
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
    with quiet():
        _verl_checks(cfg)
        check_tools(cfg, tool_config)
        check_batch(cfg)
        check_rlkit_names(cfg)
    loggers = cfg.trainer.logger
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    if "file" not in loggers:
        raise LaunchError(f"trainer.logger={loggers} lacks 'file', the logger that writes metrics.jsonl")
    if not (cfg.ray_kwargs.ray_init.runtime_env.get("env_vars") or {}).get("VERL_FILE_LOGGER_PATH"):
        raise LaunchError("ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH is not set")


@contextlib.contextmanager
def quiet():
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
    # verl never builds AlgoConfig from the whole block: rlkit's algorithm.<method> blocks are checked apart
    rollout = cfg.actor_rollout_ref.rollout
    from rlkit.verl.inputs import rlkit_blocks

    own = rlkit_blocks(cfg.algorithm)
    sections = {"algorithm": OmegaConf.masked_copy(cfg.algorithm, [k for k in cfg.algorithm if k not in own]),
                "actor_rollout_ref.rollout": rollout,
                "actor_rollout_ref.rollout.checkpoint_engine": rollout.checkpoint_engine}
    for key, node in sections.items():
        try:
            omega_conf_to_dataclass(node)
        except Exception as e:  # hydra.utils.instantiate wraps the dataclass's own error
            cause = e.__cause__ or e
            raise LaunchError(f"verl rejects {key}: {type(cause).__name__}: {cause}") from None
    try:  # the reward manager and custom score function, by name, with the manager's own checks
        load_reward_manager(cfg, tokenizer=None)
    except Exception as e:
        raise LaunchError(f"verl's reward setup fails (reward.*): {type(e).__name__}: {e}") from None


def check_tools(cfg, tool_config: str | None) -> None:
    """Multi-turn runs: verl builds the tools of ``tool_config`` as its agent loop will and knows the loop."""
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


def check_tool_tags(model: str) -> None:
    """The calculator protocol needs the tool tags as single tokens of the model's tokenizer."""
    from transformers import AutoTokenizer

    try:
        with quiet():
            tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception as e:
        raise LaunchError(f"cannot load the tokenizer of --model {model} to check its tool tags: {e}") from None
    split = [tag for tag in TOOL_TAGS if len(tokenizer.encode(tag, add_special_tokens=False)) != 1]
    if split:
        raise LaunchError(f"--model {model}: its tokenizer splits {', '.join(split)}; the word problems' calculator "
                          f"needs {', '.join(TOOL_TAGS)} as single tokens (models from `rlkit export` have them)")


WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")


def is_local_model(model: str) -> bool:
    """Whether ``--model`` names a local directory (not a hub id ``owner/name``)."""
    return Path(model).expanduser().exists() or model.startswith((".", "/", "~")) or model.count("/") != 1


def check_model_dir(model: str) -> dict[str, Any]:
    """A local ``--model`` directory's parsed ``config.json`` (it must hold weights); ``{}`` for a hub id."""
    if not is_local_model(model):
        return {}
    path = Path(model).expanduser()
    if not path.is_dir():
        raise LaunchError(f"--model {model}: no such directory (a local Hugging Face model directory, or a hub id "
                          "such as Qwen/Qwen2.5-0.5B-Instruct)")
    config_file = path / "config.json"
    if not config_file.exists():
        raise LaunchError(f"--model {model}: no config.json, so not a Hugging Face model directory")
    try:
        config = json.loads(config_file.read_text())
    except ValueError as e:
        raise LaunchError(f"--model {model}: config.json is not valid JSON ({e}); re-export or re-download the "
                          "model") from None
    if not isinstance(config, dict):
        raise LaunchError(f"--model {model}: config.json is not a JSON object")
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise LaunchError(f"--model {model}: no weights (*.safetensors or pytorch_model*.bin); re-export or "
                          "re-download the model")
    return config


def check_cpu_model(model: str) -> None:
    """A CPU run's ``--model``: a local HF model directory whose attention heads vLLM's CPU build takes."""
    path = Path(model).expanduser()
    if not path.is_dir():
        raise LaunchError(f"--model {model}: not a directory. CPU runs load local HF model directories only "
                          "(config.json, weights, tokenizer); nothing is downloaded")
    config = check_model_dir(model)
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if head is None:
        raise LaunchError(f"--model {model}: config.json gives neither head_dim nor hidden_size/num_attention_heads")
    if head not in VLLM_HEAD_SIZES:
        raise LaunchError(f"--model {model}: attention head size {head}, which vLLM's CPU attention refuses; it "
                          f"takes {', '.join(map(str, VLLM_HEAD_SIZES))}")
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise LaunchError(f"--model {model}: no tokenizer files (tokenizer.json / tokenizer_config.json)")


def check_batch(cfg) -> None:
    """The batch arithmetic verl 0.9.1 asserts only inside its GPU workers: mini-batch samples over the dp
    ranks, the batch a multiple of the mini-batch (rlkit's rule), fixed micro-batches dividing a GPU's share,
    vLLM's tensor parallelism a node's GPUs."""
    arr, trainer = cfg.actor_rollout_ref, cfg.trainer
    n_gpus = trainer.n_gpus_per_node * trainer.nnodes
    prompts, mini, n = cfg.data.train_batch_size, arr.actor.ppo_mini_batch_size, arr.rollout.n
    dp = n_gpus // arr.actor.get("ulysses_sequence_parallel_size", 1)
    tp = arr.rollout.tensor_model_parallel_size
    problems = []
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
    """rlkit's trainer, estimator and loss are in verl's registries, its ``algorithm.<method>`` valid."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from rlkit.verl.plugin import ensure_registered, method_config, rlkit_blocks
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
        for method in rlkit_blocks(cfg.algorithm):
            if cfg.algorithm.get(method) is not None:
                method_config(cfg.algorithm, method)
        if cfg.trainer.v1.trainer_mode == TRAINER:
            MethodSetup.from_config(cfg)
    except LaunchError:
        raise
    except (KeyError, ValueError, TypeError) as e:
        raise LaunchError(str(e.args[0] if e.args else e)) from None
