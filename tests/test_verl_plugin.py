"""rlkit's verl plugin: its names in verl's registries, and verl's own dispatch calling rlkit's functions.

Every loss is fetched with verl's ``get_policy_loss_fn(name)`` and every estimator runs through verl's
``compute_advantage`` on a real ``DataProto``; values and gradients must equal rlkit's functions called directly.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import make_batch, make_groups
from rlkit.methods import aepo, aspo, grpo, gspo, hapo, spo
from rlkit.registry import get_policy_loss
from rlkit.tasks.tools import CodeDetection

pytestmark = pytest.mark.verl
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY  # noqa: E402
from verl.workers.config.actor import ActorConfig  # noqa: E402

from rlkit.verl import ADV_ESTIMATORS, POLICY_LOSSES, TRAINER  # noqa: E402
from rlkit.verl import plugin  # noqa: E402

SEEDS = range(12)


def actor_config(clip_low=0.2, clip_high=0.28, clip_c=3.0, **batch_info):
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                      clip_ratio_low=clip_low, clip_ratio_high=clip_high, clip_ratio_c=clip_c)
    cfg.global_batch_info.update(batch_info)
    return cfg


def loss_and_grad(fn, logp):
    logp = logp.clone().requires_grad_()
    loss, metrics = fn(logp)
    return loss, metrics, torch.autograd.grad(loss, logp)[0]


def entropy_like(b, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b["mask"].shape, generator=g, dtype=torch.float64) * 3 + 0.01


# --------------------------------------------------------------------------- registration


def in_a_fresh_process(code: str) -> dict:
    """The JSON that ``code`` prints last, run by a fresh Python with verl's plugins on."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_names_registered_in_a_fresh_import_verl_process():
    """verl loads the entry point itself: nothing but ``import verl`` runs before the lookup."""
    code = (
        "import json, verl\n"
        "from verl.trainer.ppo import core_algos\n"
        "from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY\n"
        "print(json.dumps({'loss': {n: f.__module__ for n, f in core_algos.POLICY_LOSS_REGISTRY.items()},\n"
        "                  'adv': {n: f.__module__ for n, f in core_algos.ADV_ESTIMATOR_REGISTRY.items()},\n"
        "                  'trainer': {n: c.__module__ for n, c in TRAINER_REGISTRY.items()}}))\n"
    )
    names = in_a_fresh_process(code)
    hint = "the verl.plugins entry point is missing: reinstall rlkit (pip install -e .) to refresh its metadata"
    for name in POLICY_LOSSES:
        assert names["loss"].get(name) == "rlkit.verl.plugin", hint
    for name in ADV_ESTIMATORS:
        assert names["adv"].get(name) == "rlkit.verl.plugin", hint
    assert names["trainer"].get(TRAINER) == "rlkit.verl.trainer", hint


def test_registered_functions_are_the_plugins():
    for name in POLICY_LOSSES:
        assert core_algos.get_policy_loss_fn(name) is plugin.POLICY_LOSS_FUNCTIONS[name]
    for name in ADV_ESTIMATORS:
        assert core_algos.get_adv_estimator_fn(name) is plugin.ESTIMATOR_FUNCTIONS[name]
    assert TRAINER_REGISTRY[TRAINER].__name__ == "RlkitTrainer"
    assert plugin.missing_names() == []


def test_ensure_registered_restores_names_a_skipped_plugin_left_out(monkeypatch):
    # what VERL_USE_EXTERNAL_PLUGINS=none (or a stale install without the entry point) leaves behind
    for name in POLICY_LOSSES:
        monkeypatch.delitem(core_algos.POLICY_LOSS_REGISTRY, name)
    monkeypatch.delitem(core_algos.ADV_ESTIMATOR_REGISTRY, "rlkit_spo")
    assert "policy loss rlkit_ppo" in plugin.missing_names()
    plugin.ensure_registered()
    assert plugin.missing_names() == []


def test_a_failing_registration_is_logged_as_an_error_not_swallowed(monkeypatch, caplog):
    def broken():
        raise RuntimeError("simulated registration failure")

    # a module already imported runs its hook at once, as a fresh process does on importing it
    monkeypatch.setitem(plugin.ON_IMPORT, "verl.trainer.ppo.core_algos", broken)
    with caplog.at_level(logging.ERROR, logger="rlkit.verl"), pytest.raises(RuntimeError, match="simulated"):
        plugin._load()
    assert any(r.levelno == logging.ERROR and "failed to register" in r.getMessage()
               and "verl.trainer.ppo.core_algos" in r.getMessage() for r in caplog.records)


def test_import_verl_leaves_verls_trainer_and_agent_loop_to_the_processes_that_use_them():
    # each registration waits for its verl module (plugin.ON_IMPORT): a process that never looks a name up does not
    # import verl's trainer, agent loop or vLLM for rlkit
    code = (
        "import json, sys, verl\n"
        "before = sorted(m for m in ('verl.trainer.ppo.core_algos', 'verl.trainer.ppo.v1.trainer_base',\n"
        "    'verl.experimental.agent_loop', 'rlkit.verl.trainer', 'rlkit.verl.tools', 'vllm') if m in sys.modules)\n"
        "from verl.trainer.ppo import core_algos\n"
        "from verl.experimental.agent_loop.tool_parser import ToolParser\n"
        "print(json.dumps({'before': before, 'loss': 'rlkit_ppo' in core_algos.POLICY_LOSS_REGISTRY,\n"
        "                  'parser': 'rlkit_code' in ToolParser._registry}))\n"
    )
    seen = in_a_fresh_process(code)
    assert seen["before"] == [], f"imported by `import verl` alone: {seen['before']}"
    assert seen["loss"] and seen["parser"], seen


def test_a_name_held_by_another_function_is_refused(monkeypatch):
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "rlkit_gspo", core_algos.get_policy_loss_fn("vanilla"))
    with pytest.raises(ValueError, match="already registered"):
        plugin.register()


# --------------------------------------------------------------------------- +algorithm.<method>.* options


def test_method_config_reads_the_config_field_names():
    algo = {"aspo": {"delta": -2.5, "k": 0.9, "code_detection": {"markdown_backticks": False,
                                                                 "result_fences": ["output", "stdout"]}},
            "hapo": {"temperature_tau": 0.1, "stats_path": "/x/stats.json"}}
    cfg, extras = plugin.method_config(algo, "aspo")
    assert (cfg.delta, cfg.k) == (-2.5, 0.9)
    assert extras == {"code_detection": CodeDetection(markdown_backticks=False, result_fences=("output", "stdout"))}
    assert plugin.method_config({}, "aspo")[1] == {"code_detection": None}  # None: every detector (the default)
    cfg, extras = plugin.method_config(algo, "hapo")
    assert cfg.temperature_tau == 0.1 and extras == {"stats_path": "/x/stats.json"}
    assert plugin.method_config(None, "spo") == (spo.Config(), {"offline_values": None})


def test_a_methods_declared_verl_inputs_are_handled_by_name_of_no_method(tmp_path):
    """A method registered here with verl-only keys, a narrower verl choice and an offline pass: the plugin reads
    its keys with their defaults and checks the choice, the launch finds its files, the verl twin passes its pass's
    file — each from the declaration (rlkit/verl names no method for it)."""
    import dataclasses

    from omegaconf import OmegaConf

    from rlkit import registry
    from rlkit.verl import launch
    from rlkit.verl.launch import from_tiny

    @dataclasses.dataclass
    class Config:
        mode: str = "a"
        samples: int = 2

    Config.CHOICES = {"mode": ("a", "b")}
    registry.register_method(registry.Method(
        "toy_verl", Config, advantage="grpo", policy_loss="ppo", verl_choices={"mode": ("a",)},
        verl_keys={"values": registry.VerlKey(file=True), "note": registry.VerlKey(default=3)},
        offline_pass=registry.OfflinePass("samples", "values")))
    try:
        assert plugin.method_config(None, "toy_verl") == (Config(), {"values": None, "note": 3})
        cfg, extras = plugin.method_config({"toy_verl": {"values": "/v.json", "samples": 4}}, "toy_verl")
        assert cfg == Config(samples=4) and extras == {"values": "/v.json", "note": 3}
        with pytest.raises(ValueError, match=r"^algorithm\.toy_verl\.mode 'b'; valid: a$"):
            plugin.method_config({"toy_verl": {"mode": "b"}}, "toy_verl")
        with pytest.raises(ValueError, match=r"unknown key algorithm\.toy_verl\.valus; valid: mode, note, samples, "
                                             r"values$"):
            plugin.method_config({"toy_verl": {"valus": 1}}, "toy_verl")
        composed = OmegaConf.create({"algorithm": {"toy_verl": {"values": "/v.json", "note": "/not/a/file"}}})
        assert launch.method_files(composed) == {"algorithm.toy_verl.values": "/v.json"}
        assert launch.method_files(OmegaConf.create({"algorithm": {"toy_verl": {"note": 4}}})) == {}
        prepared = {"model": tmp_path, "data": tmp_path, "values": tmp_path / "v.json"}
        assert from_tiny.method_overrides("toy_verl", prepared) == [f"+algorithm.toy_verl.values={tmp_path / 'v.json'}"]
        assert from_tiny.method_overrides("grpo", prepared) == []
    finally:
        registry.unregister("toy_verl")


def test_method_config_refuses_unknown_and_verl_owned_keys():
    with pytest.raises(ValueError, match=r"unknown key algorithm\.aepo\.coeff; valid: .*coef"):
        plugin.method_config({"aepo": {"coeff": 0.3}}, "aepo")
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.clip_ratio_high"):
        plugin.method_config({"gspo": {"clip_high": 4e-4}}, "gspo")
    with pytest.raises(ValueError, match=r"algorithm\.norm_adv_by_std_in_grpo"):
        plugin.method_config({"hapo": {"norm_by_std": False}}, "hapo")
    with pytest.raises(ValueError, match=r"code_detection\.html_tags; valid: .*html_code_tags"):
        plugin.method_config({"aspo": {"code_detection": {"html_tags": False}}}, "aspo")
    with pytest.raises(ValueError, match=r"^aepo\.variant=both: must be one of paper, arlarena$"):
        plugin.method_config({"aepo": {"variant": "both"}}, "aepo")
    with pytest.raises(KeyError, match=re.escape("valid: " + ", ".join(sorted(plugin.CONFIGS)))):
        plugin.method_config({}, "ppo2")


# --------------------------------------------------------------------------- policy losses through verl's registry


def test_rlkit_ppo_equals_rlkit_and_verl_vanilla():
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    ours = core_algos.get_policy_loss_fn("rlkit_ppo")
    for seed in SEEDS:
        b = make_batch(seed, noise=0.4)
        cfg = actor_config(0.2, 0.28, 3.0)
        via_verl = loss_and_grad(lambda lp: ours(b["old_logp"], lp, b["adv"], b["mask"], "token-mean", cfg), b["logp"])
        direct = loss_and_grad(lambda lp: get_policy_loss("ppo")(lp, b["old_logp"], b["adv"], b["mask"],
                                                           clip_low=0.2, clip_high=0.28, clip_c=3.0), b["logp"])
        peer = loss_and_grad(lambda lp: vanilla(b["old_logp"], lp, b["adv"], b["mask"], "token-mean", cfg), b["logp"])
        torch.testing.assert_close(via_verl[0], direct[0], rtol=0, atol=0)
        torch.testing.assert_close(via_verl[2], direct[2], rtol=0, atol=0)
        torch.testing.assert_close(via_verl[0], peer[0])
        torch.testing.assert_close(via_verl[2], peer[2])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_global_batch_normalisation_is_verls(mode):
    """With verl's global batch info (dp size, global tokens/sequences) the loss is verl's agg_loss, exactly."""
    vanilla = core_algos.get_policy_loss_fn("vanilla")
    verl_gspo = core_algos.get_policy_loss_fn("gspo")
    for seed in SEEDS:
        b = make_batch(seed, noise=0.4, empty_rows=seed % 3 == 0)
        info = dict(dp_size=4, batch_num_tokens=int(b["mask"].sum()) * 3 + 7, global_batch_size=len(b["mask"]) * 4,
                    loss_scale_factor=37 if mode.endswith("norm") else None)
        cfg = actor_config(0.2, 0.28, 3.0, **info)
        seq_adv = b["adv"][:, :1].expand_as(b["adv"]).contiguous()
        for name, peer, adv in (("rlkit_ppo", vanilla, b["adv"]), ("rlkit_gspo", verl_gspo, seq_adv)):
            fn = core_algos.get_policy_loss_fn(name)
            gspo_cfg = actor_config(3e-3, 4e-3, **info) if name == "rlkit_gspo" else cfg
            ours = loss_and_grad(lambda lp: fn(b["old_logp"], lp, adv, b["mask"], mode, gspo_cfg,
                                               options=gspo.Config(variant="token")), b["logp"])
            ref = loss_and_grad(lambda lp: peer(b["old_logp"], lp, adv, b["mask"], mode, gspo_cfg), b["logp"])
            torch.testing.assert_close(ours[0], ref[0], rtol=1e-7, atol=1e-9)
            torch.testing.assert_close(ours[2], ref[2], rtol=1e-7, atol=1e-9)


def test_rlkit_gspo_equals_rlkit_in_both_variants():
    fn = core_algos.get_policy_loss_fn("rlkit_gspo")
    for seed in SEEDS:
        b = make_batch(seed, noise=0.01)
        cfg = actor_config(3e-3, 4e-3)
        for variant in gspo.VARIANTS:
            opts = gspo.Config(variant=variant)
            ours = loss_and_grad(lambda lp: fn(b["old_logp"], lp, b["adv"], b["mask"], "seq-mean-token-mean", cfg,
                                               options=opts), b["logp"])
            ref = loss_and_grad(lambda lp: get_policy_loss("gspo")(lp, b["old_logp"], b["adv"], b["mask"],
                                                            clip_low=3e-3, clip_high=4e-3, variant=variant),
                                b["logp"])
            torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=0)
            torch.testing.assert_close(ours[2], ref[2], rtol=0, atol=0)
            assert ours[1] == ref[1]


@pytest.mark.parametrize("variant", aepo.VARIANTS)
def test_rlkit_aepo_equals_rlkit_with_entropies_from_the_loss_context(variant):
    fn = core_algos.get_policy_loss_fn("rlkit_aepo")
    opts = aepo.Config(coef=0.3, variant=variant)
    for seed in SEEDS:
        b = make_batch(seed, noise=0.5)
        h = entropy_like(b, seed)
        cfg = actor_config(0.2, 0.28, 3.0)
        with plugin.loss_inputs(entropy=h, options={"aepo": opts}):
            ours = loss_and_grad(lambda lp: fn(b["old_logp"], lp, b["adv"], b["mask"], "token-mean", cfg), b["logp"])
        ref = loss_and_grad(lambda lp: get_policy_loss("aepo")(lp, b["old_logp"], b["adv"], b["mask"], entropy=h,
                                                        coef=0.3, clip_low=0.2, clip_high=0.28, clip_c=3.0,
                                                        variant=variant), b["logp"])
        torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=0)
        torch.testing.assert_close(ours[2], ref[2], rtol=0, atol=0)
        assert ours[1] == ref[1]


def test_rlkit_hapo_equals_rlkit_with_entropies_and_options():
    fn = core_algos.get_policy_loss_fn("rlkit_hapo")
    opts = hapo.Config(adv_beta=0.5, clip_alpha=0.7, entropy_pivot=0.6, release_compat=True)
    for seed in SEEDS:
        b = make_batch(seed, noise=0.5)
        h = entropy_like(b, seed)
        cfg = actor_config(0.2, 0.28, 10.0)
        ours = loss_and_grad(lambda lp: fn(b["old_logp"], lp, b["adv"], b["mask"], "token-mean", cfg, entropy=h,
                                           options=opts), b["logp"])
        ref = loss_and_grad(lambda lp: get_policy_loss("hapo")(lp, b["old_logp"], b["adv"], b["mask"], entropy=h,
                                                        clip_low=0.2, clip_high=0.28, clip_c=10.0, adv_beta=0.5,
                                                        clip_alpha=0.7, entropy_pivot=0.6, release_compat=True),
                            b["logp"])
        torch.testing.assert_close(ours[0], ref[0], rtol=0, atol=0)
        torch.testing.assert_close(ours[2], ref[2], rtol=0, atol=0)
        assert ours[1] == ref[1]


def test_losses_refuse_what_verls_stock_call_cannot_give_them():
    b = make_batch(3)
    cfg = actor_config()
    args = (b["old_logp"], b["logp"], b["adv"], b["mask"], "token-mean", cfg)
    with pytest.raises(ValueError, match="trainer.v1.trainer_mode=rlkit"):
        core_algos.get_policy_loss_fn("rlkit_hapo")(*args)
    with pytest.raises(ValueError, match="use_entropy_advantage=false"):
        core_algos.get_policy_loss_fn("rlkit_aepo")(*args)
    with pytest.raises(ValueError, match="valid modes"):
        core_algos.get_policy_loss_fn("rlkit_ppo")(*args[:4], "token-sum", cfg)
    # AEPO's clip-only form (the released ARPO scripts) needs no entropy
    loss, _ = core_algos.get_policy_loss_fn("rlkit_aepo")(*args, options=aepo.Config(use_entropy_advantage=False))
    ref, _ = get_policy_loss("aepo")(b["logp"], b["old_logp"], b["adv"], b["mask"], clip_high=0.28)
    torch.testing.assert_close(loss, ref, rtol=0, atol=0)


# --------------------------------------------------------------------------- estimators through verl's compute_advantage


def outcome_batch(seed, kind="numpy"):
    b = make_batch(seed)
    B = len(b["mask"])
    ids, rewards = make_groups(seed, B, kind=kind)
    mask = b["mask"].float()
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(B), b["lengths"] - 1] = rewards.float()
    data = DataProto.from_dict(tensors={"token_level_rewards": token_rewards, "response_mask": mask},
                               non_tensors={"uid": np.asarray(ids, dtype=object)})
    return data, rewards.float(), mask, ids


def run_estimator(data, name, algorithm):
    return compute_advantage(data, adv_estimator=name, num_repeat=1,
                             norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
                             config=algorithm).batch["advantages"]


@pytest.mark.parametrize("norm", [True, False])
def test_rlkit_grpo_and_tlga_through_verls_compute_advantage(norm):
    for seed in SEEDS:
        data, rewards, mask, ids = outcome_batch(seed)
        algo = {"norm_adv_by_std_in_grpo": norm, "grpo": {"eps": 1e-5}, "hapo": {"fallback_threshold": 3.0}}
        torch.testing.assert_close(run_estimator(data, "rlkit_grpo", algo),
                                   grpo.grpo_advantage(rewards, ids, mask, norm_by_std=norm, eps=1e-5), rtol=0, atol=0)
        torch.testing.assert_close(run_estimator(data, "rlkit_hapo_tlga", algo),
                                   hapo.tlga_advantage(rewards, ids, mask, norm_by_std=norm, fallback_threshold=3.0),
                                   rtol=0, atol=0)
        verl_grpo = compute_advantage(data, adv_estimator="grpo", norm_adv_by_std_in_grpo=norm).batch["advantages"]
        torch.testing.assert_close(run_estimator(data, "rlkit_grpo", {"norm_adv_by_std_in_grpo": norm}), verl_grpo)


class Unread:
    """Another method's Config, which must not be read."""

    def __getattr__(self, name):
        raise AssertionError(f"another method's Config was read ({name})")


def test_in_a_run_each_function_reads_the_run_methods_section_alone():
    """Told the run's method (the rlkit trainer's contexts), ``rlkit_grpo`` in a GSPO run reads ``algorithm.gspo``
    and ``rlkit_ppo`` in an ASPO run ASPO's Config; verl's stock calls, which tell nothing, read the home method's.
    A function the run's method does not train with is refused."""
    for seed in SEEDS[:3]:
        data, rewards, mask, ids = outcome_batch(seed)
        algo = {"grpo": {"eps": 1e-5}, "gspo": {"eps": 0.5}}
        with plugin.estimator_inputs(method="gspo"):
            torch.testing.assert_close(run_estimator(data, "rlkit_grpo", algo),
                                       grpo.grpo_advantage(rewards, ids, mask, eps=0.5), rtol=0, atol=0)
        torch.testing.assert_close(run_estimator(data, "rlkit_grpo", algo),
                                   grpo.grpo_advantage(rewards, ids, mask, eps=1e-5), rtol=0, atol=0)
    with plugin.estimator_inputs(method="spo"), pytest.raises(ValueError, match="rlkit_grpo called in a run of spo, "
                                                              "which trains with rlkit_spo"):
        run_estimator(data, "rlkit_grpo", algo)
    fn, b, cfg = core_algos.get_policy_loss_fn("rlkit_ppo"), make_batch(0, noise=0.1), actor_config()
    args = (b["old_logp"], b["logp"], b["adv"], b["mask"], "token-mean", cfg)
    with plugin.loss_inputs(options={"aspo": aspo.Config(), "grpo": Unread()}, method="aspo"):
        in_run = fn(*args)
    assert torch.equal(in_run[0], fn(*args)[0]) and in_run[1] == fn(*args)[1]
    with plugin.loss_inputs(method="gspo"), pytest.raises(ValueError, match="rlkit_ppo called in a run of gspo"):
        fn(*args)


def test_rlkit_aspo_shapes_its_base_advantage_with_the_trainers_inputs():
    for seed in SEEDS:
        data, rewards, mask, ids = outcome_batch(seed)
        B = len(rewards)
        g = torch.Generator().manual_seed(seed)
        lengths = mask.sum(-1) + torch.randint(0, 5, (B,), generator=g)
        pos = torch.where(torch.rand(B, generator=g) < 0.7, torch.floor(torch.rand(B, generator=g) * lengths),
                          torch.tensor(float("nan")))
        passed = torch.rand(B, generator=g) < 0.8
        algo = {"aspo": {"delta": -2.5, "k": 0.9, "require_code_pass": True}}
        with plugin.estimator_inputs(correct=rewards > 0, first_code_pos=pos, lengths=lengths, code_pass=passed):
            ours = run_estimator(data, "rlkit_aspo", algo)
        base = grpo.grpo_advantage(rewards, ids, mask)
        ref = aspo.aspo_shape(base, ids, rewards > 0, pos, lengths, delta=-2.5, k=0.9, code_pass=passed, mask=mask)
        torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    with pytest.raises(ValueError, match="correct, first_code_pos, lengths.*response_lengths.*trainer_mode=rlkit"):
        run_estimator(data, "rlkit_aspo", {})
    # disabled: the base advantage, unshaped
    torch.testing.assert_close(run_estimator(data, "rlkit_aspo", {"aspo": {"enabled": False}}),
                               grpo.grpo_advantage(rewards, ids, mask), rtol=0, atol=0)


def test_rlkit_spo_reads_reward_baselines_the_way_verl_passes_them():
    for seed in SEEDS:
        data, rewards, mask, _ = outcome_batch(seed)
        baselines = torch.rand(len(rewards), generator=torch.Generator().manual_seed(seed))
        data.batch["reward_baselines"] = baselines  # verl's compute_advantage forwards this field
        torch.testing.assert_close(run_estimator(data, "rlkit_spo", {"spo": {"adv_eps": 1e-6}}),
                                   spo.spo_advantage(rewards, baselines, adv_eps=1e-6, mask=mask), rtol=0, atol=0)
    del data.batch["reward_baselines"]
    with pytest.raises(ValueError, match="reward_baselines"):
        run_estimator(data, "rlkit_spo", {})
