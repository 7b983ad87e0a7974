"""The SFT start rlkit ships (rlkit/tiny/start/): runs begin from it on any machine, its hash is checked, retraining
is explicit, and every run's env.json says which start and which machine made it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import rlkit.tiny.sft as sft_mod
from rlkit.metrics import read_metrics
from rlkit.numerics import weights_sha256
from rlkit.tiny.config import build_config
from rlkit.tiny.rl import train
from rlkit.tiny.sft import SFTConfig, shipped_manifest, warm_start
from rlkit.tiny.task import build_tokenizer


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A shipped-start folder holding the smoke scale's SFT start (trained once into a cache, then 'shipped')."""
    cfg = build_config("grpo", "smoke").sft
    cache = tmp_path / "cache"
    _, _, info = warm_start(cfg, cache_dir=cache, progress=False, retrain=True)
    folder = tmp_path / "start"
    folder.mkdir()
    name = f"sft-{cfg.key(build_tokenizer())}.pt"
    shutil.copy(cache / name, folder / name)
    (folder / "MANIFEST.json").write_text(json.dumps({name: {"sha256": info["sha256"]}}))
    (cache / name).unlink()  # only the shipped copy remains
    monkeypatch.setattr(sft_mod, "SHIPPED_DIR", folder)
    return folder, name, info


def test_runs_start_from_the_shipped_weights_and_record_them(shipped, tmp_path):
    folder, name, info = shipped
    model, _, got = warm_start(build_config("grpo", "smoke").sft, cache_dir=tmp_path / "empty", progress=False)
    assert got["source"] == "shipped" and got["sha256"] == info["sha256"]
    assert not (tmp_path / "empty").exists()  # nothing trained, nothing cached
    out = train(build_config("grpo", "smoke", {"steps": 1}), tmp_path / "run", progress=False,
                sft_cache=tmp_path / "empty")
    env = json.loads((out / "env.json").read_text())
    assert env["sft_start"] == {"source": "shipped", "sha256": info["sha256"], "val_acc": info["val/acc"]}
    assert env["processor"] and len(env["fingerprint"]) == 12 and env["kernels"]["aten_cpu_capability"]


def test_a_damaged_shipped_start_is_refused_by_its_hash(shipped, tmp_path):
    folder, name, _ = shipped
    state = torch.load(folder / name, weights_only=True)
    first = next(iter(state["model"]))
    state["model"][first].view(-1)[0] += 1e-3
    torch.save(state, folder / name)
    with pytest.raises(RuntimeError, match="damaged"):
        warm_start(build_config("grpo", "smoke").sft, cache_dir=tmp_path / "c", progress=False)


def test_retraining_is_explicit_and_trains_here(shipped, tmp_path, monkeypatch, capsys):
    cfg = build_config("grpo", "smoke").sft
    monkeypatch.setenv("RLKIT_RETRAIN_SFT", "1")
    _, _, got = warm_start(cfg, cache_dir=tmp_path / "c", progress=True)
    assert got["source"] == "trained"
    assert "depend on this CPU" in capsys.readouterr().err
    _, _, again = warm_start(cfg, cache_dir=tmp_path / "c", progress=False)
    assert again["source"] == "cache" and again["sha256"] == got["sha256"]


def test_a_start_trained_on_a_gpu_is_announced_without_the_cpu_estimate(tmp_path, monkeypatch, capsys):
    """The estimate is one CPU thread's (the gpu scale: ~85 min there, ~3 min on an H200): on a GPU it is not given."""
    cfg = build_config("grpo", "smoke").sft
    trained = sft_mod.train(cfg, progress=False)
    monkeypatch.setattr(sft_mod, "train", lambda cfg, device, progress: trained)  # the GPU's training, on the CPU
    warm_start(cfg, device="cuda", cache_dir=tmp_path / "c", progress=True, retrain=True)
    err = capsys.readouterr().err
    assert "on cuda (the time estimate is for CPUs only)" in err and "CPU thread" not in err, err
    assert "depend on this GPU's kernels" in err, err


def test_the_spo_offline_pass_is_found_beside_the_shipped_start(shipped, tmp_path, monkeypatch):
    folder, _, _ = shipped
    cfg = build_config("spo", "smoke", {"steps": 1, "spo.offline_N": 2})
    first = train(cfg, tmp_path / "first", progress=False, sft_cache=tmp_path / "c1")
    (passed,) = (tmp_path / "c1").glob("offline-*.pt")
    shutil.move(passed, folder / passed.name)  # 'ship' it

    from rlkit.tiny import sft, step

    sizes, real = [], step.rollout  # the same function in both modules
    for module in (step, sft):  # the training's rollouts, and the offline pass's
        monkeypatch.setattr(module, "rollout", lambda *a, **k: sizes.append(len(a[2])) or real(*a, **k))
    second = train(cfg, tmp_path / "second", progress=False, sft_cache=tmp_path / "c2")
    assert sizes and cfg.pool_size * cfg.spo.offline_N not in sizes  # the shipped pass was not sampled again
    strip = [(r["step"], {k: v for k, v in r["data"].items() if not k.startswith(("timing", "perf"))})
             for r in read_metrics(first / "metrics.jsonl")]
    assert strip == [(r["step"], {k: v for k, v in r["data"].items() if not k.startswith(("timing", "perf"))})
                     for r in read_metrics(second / "metrics.jsonl")]
    assert not (tmp_path / "c2").exists()


def test_the_shipped_cpu_scale_start_matches_its_manifest():
    """The file in the repository is the start of the default SFT config, and its weights are the recorded ones:
    changing the SFT recipe without shipping its start fails here."""
    name = f"sft-{SFTConfig().key(build_tokenizer())}.pt"
    manifest = shipped_manifest()
    assert name in manifest, f"no shipped start for the default SFT config ({name}); make it: rlkit/tiny/start/"
    state = torch.load(sft_mod.SHIPPED_DIR / name, weights_only=True)
    assert weights_sha256(state["model"]) == manifest[name]["sha256"]
    assert state["info"]["val/acc"] == manifest[name]["val_acc"]


def test_ship_start_writes_the_start_its_manifest_and_spos_offline_passes(tmp_path, monkeypatch):
    from rlkit.lab.reproduce import ship_start

    monkeypatch.setattr(sft_mod, "SHIPPED_DIR", tmp_path / "start")
    entry = ship_start("smoke", progress=False, cache_dir=tmp_path / "trained")
    manifest = shipped_manifest()
    (name,) = manifest
    assert manifest[name]["sha256"] == entry["sha256"] and entry["fingerprint"] and entry["processor"]
    assert len(entry["spo_offline"]) >= 3  # the SPO runs' seeds (variants sharing a pass share its file)
    assert all((tmp_path / "start" / f).exists() for f in entry["spo_offline"])
    # an SPO run of a planned seed (the second) from the shipped start finds its pass: nothing sampled offline,
    # nothing cached
    from rlkit.lab.runs import FIRST_SEED
    from rlkit.tiny import sft, step

    cfg = build_config("spo", "smoke", {"seed": FIRST_SEED + 1, "steps": 1})
    sizes, real = [], step.rollout
    for module in (step, sft):  # the training's rollouts, and the offline pass's
        monkeypatch.setattr(module, "rollout", lambda *a, **k: sizes.append(len(a[2])) or real(*a, **k))
    train(cfg, tmp_path / "run", progress=False, sft_cache=tmp_path / "cache")
    assert cfg.pool_size * cfg.spo.offline_N not in sizes and not (tmp_path / "cache").exists()


def test_a_damaged_cached_offline_pass_is_named_and_sampled_again(tmp_path, capsys):
    cfg = build_config("spo", "smoke", {"steps": 1, "spo.offline_N": 2})
    first = train(cfg, tmp_path / "first", progress=False, sft_cache=tmp_path / "c")
    (cached,) = (tmp_path / "c").glob("offline-*.pt")
    cached.write_bytes(b"not a torch file")
    capsys.readouterr()
    second = train(cfg, tmp_path / "second", progress=False, sft_cache=tmp_path / "c")
    err = capsys.readouterr().err
    assert cached.name in err and "sampling the offline pass again" in err
    strip = lambda run: [(r["step"], {k: v for k, v in r["data"].items() if not k.startswith(("timing", "perf"))})
                         for r in read_metrics(run / "metrics.jsonl")]  # noqa: E731
    assert strip(first) == strip(second)  # the pass sampled again is the same pass
    assert torch.load(cached, weights_only=True)["scores"].shape == (cfg.pool_size, 2)  # and cached whole again
