"""The verl twin of a tiny-engine run (``rlkit launch --tiny-scale``): its settings are the tiny run's, its config
composes and validates with verl's own checks, its data are the tiny engine's pool and held-out problems, and a
model whose tokenizer splits the calculator's tags is refused before anything starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("verl")

from rlkit import cli  # noqa: E402
from rlkit.tiny.config import METHODS, build_config  # noqa: E402
from rlkit.verl import VERL_OWNED  # noqa: E402
from rlkit.verl.inputs import run_method  # noqa: E402
from rlkit.verl.launch import from_tiny  # noqa: E402
from rlkit.verl import launch as L  # noqa: E402

ACTOR = "actor_rollout_ref.actor."


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("method", METHODS)
def test_overrides_carry_the_tiny_runs_settings(method):
    cfg = build_config(method, "cpu", {"steps": "20"})
    keys = from_tiny.overrides(cfg)
    from rlkit import registry

    knobs = registry.loss_kwargs(method, cfg.method_configs)
    assert keys["data.train_batch_size"] == cfg.prompts_per_step  # SPO: 128 prompts × 1
    assert keys["actor_rollout_ref.rollout.n"] == cfg.group_size
    assert keys[ACTOR + "ppo_mini_batch_size"] * cfg.mini_batches == cfg.prompts_per_step
    rows = cfg.prompts_per_step // cfg.mini_batches * cfg.group_size
    assert rows % keys[ACTOR + "ppo_micro_batch_size_per_gpu"] == 0  # micro-batches divide a mini-batch
    assert (keys[ACTOR + "optim.lr"], keys[ACTOR + "optim.lr_warmup_steps"], keys[ACTOR + "grad_clip"]) == \
        (cfg.lr, cfg.warmup_steps, cfg.grad_clip)
    assert (keys.get(ACTOR + "clip_ratio_low"), keys.get(ACTOR + "clip_ratio_high"), keys[ACTOR + "loss_agg_mode"]) \
        == (knobs.get("clip_low"), knobs.get("clip_high"), knobs["agg"])  # no clip range (SAPO): no clip keys
    assert keys["trainer.total_training_steps"] == 20 and keys["trainer.test_freq"] == cfg.eval_every
    assert keys["actor_rollout_ref.rollout.temperature"] == cfg.temperature
    m = registry.get_method(method)
    run = run_method(f"rlkit_{m.estimator(cfg.method_configs[method])}", f"rlkit_{m.policy_loss}")
    sections = {k.split(".")[2] for k in keys if k.startswith("+algorithm.") and k.split(".")[2] in METHODS}
    assert sections <= {run}, sections  # one section, the verl run's own
    options = getattr(cfg, method)
    if run != method:  # DAPO, a GRPO run in verl (its mechanics verl's own keys): GRPO's section, DAPO's values
        assert (run, keys[f"+algorithm.{run}.eps"]) == ("grpo", options.eps)
        return
    for f in dataclasses.fields(options):  # every option the tiny run has that verl does not own
        key = f"+algorithm.{method}.{f.name}"
        if f.name in VERL_OWNED or f.name == "base_advantage":
            assert key not in keys
        elif not dataclasses.is_dataclass(getattr(options, f.name)):
            value = getattr(options, f.name)
            assert keys[key] == (list(value) if isinstance(value, tuple) else value), key


def test_the_twin_carries_dapos_overlong_penalty_and_filters_on_correctness():
    """The tiny engine's Eq. 13 (L_cache, factor) as verl's dapo reward manager's keys over the same budget, and the
    groups kept by correctness before the shaping (the tiny DapoHooks filter the scored rewards)."""
    keys = from_tiny.overrides(build_config("dapo", "cpu", {"dapo.overlong_buffer": "16",
                                                             "dapo.overlong_penalty": "0.5"}))
    assert keys["reward.reward_manager.name"] == "dapo"
    assert keys["+reward.reward_kwargs.overlong_buffer_cfg.enable"] is True
    assert (keys["+reward.reward_kwargs.overlong_buffer_cfg.len"],
            keys["+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor"]) == (16, 0.5)
    assert keys["+reward.reward_kwargs.max_resp_len"] == "${data.max_response_length}"
    assert keys["algorithm.filter_groups.enable"] is True and keys["algorithm.filter_groups.metric"] == "acc"
    off = from_tiny.overrides(build_config("dapo", "cpu", {"dapo.overlong_buffer": "0"}))
    assert "reward.reward_manager.name" not in off and "algorithm.filter_groups.metric" not in off
    plain = from_tiny.overrides(build_config("grpo", "cpu"))
    assert not any(k.startswith(("reward.reward_manager", "+reward.reward_kwargs")) for k in plain)


def test_what_the_twin_cannot_carry_is_refused():
    with pytest.raises(ValueError, match="mixed"):
        from_tiny.overrides(build_config("grpo", "cpu", {"sft.form": "tool"}))
    with pytest.raises(ValueError, match="rollout_dtype='bfloat16'"):  # the tiny engine's stand-in for vLLM's weights
        from_tiny.overrides(build_config("grpo", "cpu", {"rollout_dtype": "bfloat16"}))


def test_the_twin_carries_the_samplers_top_p_and_the_rollout_correction():
    from rlkit.core.rollout_correction import verl_overrides

    plain = from_tiny.overrides(build_config("grpo", "cpu"))
    assert "actor_rollout_ref.rollout.top_p" not in plain and not any("rollout_correction" in k for k in plain)
    keys = from_tiny.overrides(build_config("grpo", "cpu", {"rollout_top_p": 0.9, "rollout_correction": "icepop"}))
    assert keys["actor_rollout_ref.rollout.top_p"] == 0.9
    assert verl_overrides("icepop").items() <= keys.items()


@pytest.fixture
def tiny_model(cache):
    """An exported (untrained) tiny model with heads of 32: what ``prepare`` writes, without minutes of SFT."""
    from rlkit.tiny.hf import save_random_model
    from rlkit.tiny.task import build_tokenizer

    return save_random_model(cache / "model", build_tokenizer(), d_model=64, n_heads=2)


@pytest.mark.parametrize("method", METHODS)
def test_twin_composes_and_validates(method, cache, tiny_model):
    tiny = build_config(method, "cpu", {"steps": "20"})  # DAPO's with its overlong penalty (verl's dapo manager)
    p = L.plan(method, None, str(tiny_model), device="cpu", tiny=tiny, data_dir=str(cache / "data"))
    cfg = L.check(p)
    assert cfg.trainer.total_training_steps == 20 and cfg.data.train_batch_size == tiny.prompts_per_step
    assert p.tool == "calculator" and cfg.actor_rollout_ref.rollout.multi_turn.format == "rlkit_code"
    assert p.experiment == f"{method}-tiny-cpu-seed0-cpu"


def test_prepare_writes_the_pool_and_held_out_split(cache, monkeypatch):
    import pandas as pd

    from rlkit.tasks import arithmetic

    cfg = build_config("spo", "smoke", {"sft.d_model": "64"})
    out = from_tiny.prepare(cfg, cache / "from-tiny", progress=False)
    train = pd.read_parquet(Path(out["data"]) / "train.parquet")
    test = pd.read_parquet(Path(out["data"]) / "test.parquet")
    knobs = dataclasses.asdict(cfg.sft.task)
    pool = arithmetic.make_pool(cfg.pool_size, seed=cfg.sft.seed, **knobs)
    held_out = arithmetic.make_split(cfg.eval_size, "test", seed=0, **knobs)
    assert len(train) == len(pool) and len(test) == len(held_out)
    assert [r["ground_truth"] for r in train["reward_model"]] == [str(p.answer) for p in pool]
    assert (Path(out["model"]) / "tokenizer.json").exists()
    assert Path(out["offline_values"]).exists()  # SPO: the tiny engine's offline pass, keyed by prompt id
    # the launch passes it under the verl key SPO's record declares for its offline pass
    assert from_tiny.method_overrides("spo", out) == [f"+algorithm.spo.offline_values={out['offline_values']}"]


def test_a_tokenizer_without_the_tool_tags_is_refused_before_launch(cache, tiny_model, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlkit.tiny.task import build_tokenizer

    alphabet = sorted(set(build_tokenizer().to_dict()["alphabet"]) | set("<>/"))
    chars = {c: i for i, c in enumerate(alphabet)}  # characters only: every tag becomes several tokens
    core = Tokenizer(models.BPE(vocab=chars, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=core).save_pretrained(tiny_model)  # replaces the exported tokenizer
    started = []
    monkeypatch.setattr(L, "_execute", lambda *a, **k: started.append(a))
    with pytest.raises(SystemExit, match="splits <code>.*single tokens.*rlkit export"):
        cli.main(["launch", "--method", "grpo", "--device", "cpu", "--model", str(tiny_model), "--dry-run"])
    assert started == []


def test_a_tiny_scale_launch_passes_the_offline_pass_its_method_declares(cache, capsys):
    """``rlkit launch --tiny-scale`` hands the prepared offline pass to verl under the key SPO's record declares
    (:attr:`rlkit.registry.OfflinePass.verl_key`), and a method without one gets no such key."""
    args = ["launch", "--device", "cpu", "--tiny-scale", "smoke", "--set", "sft.d_model=64", "--dry-run",
            "--runs-dir", str(cache / "runs")]
    assert cli.main([*args[:1], "--method", "spo", *args[1:]]) == 0
    printed = capsys.readouterr().out
    (path,) = (cache / "cache" / "from-tiny").glob("*/data/offline_values-N*-seed*.json")
    assert f"+algorithm.spo.offline_values={path}" in printed
    assert cli.main([*args[:1], "--method", "grpo", *args[1:]]) == 0
    assert "offline_values" not in capsys.readouterr().out
