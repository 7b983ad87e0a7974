"""The shared registry: every method's names are there and dispatch through one interface (the method's Config as
keyword arguments, by field name), duplicates fail, unknown names list the valid ones, and a seventh method
registered from outside runs in the tiny trainer without a line of the trainer changing."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlkit.methods
from conftest import make_inputs
from rlkit import registry
from rlkit.core.ops import group_advantage, masked_mean
from rlkit.methods import aepo, aspo, grpo, gspo, hapo, spo
from rlkit.methods.grpo import grpo_estimator, ppo_clip_loss
from rlkit.methods.gspo import gspo_loss
from rlkit.registry import AdvantageInputs, Method, MissingInputs, kwargs_for

D = torch.float64
METHOD_MODULES = sorted(p.stem for p in Path(rlkit.methods.__file__).parent.glob("*.py") if p.stem != "__init__")
"""The method modules in rlkit/methods: the methods, by file."""


def test_builtin_names_resolve_to_the_functions():
    assert registry.get_advantage("grpo") is grpo_estimator
    assert registry.get_policy_loss("ppo") is ppo_clip_loss
    assert registry.get_policy_loss("gspo") is gspo_loss
    names = registry.list_methods()
    assert {"grpo", "aspo", "spo", "hapo_tlga"} <= set(names["advantage"])
    assert {"ppo", "gspo", "aepo", "hapo"} <= set(names["policy_loss"])
    assert set(names["method"]) == set(METHOD_MODULES)  # each module of rlkit/methods registers its namesake
    m = registry.get_method("hapo")
    assert (m.config, m.advantage, m.policy_loss) == (hapo.Config, "hapo_tlga", "hapo")


def test_duplicate_registration_fails_and_leaves_the_original():
    with pytest.raises(ValueError, match="'gspo' is already registered to rlkit.methods.gspo.gspo_loss"):
        registry.register_policy_loss("gspo")(lambda *a, **k: None)
    assert registry.get_policy_loss("gspo") is gspo_loss
    with pytest.raises(ValueError, match="method 'gspo' is already registered"):
        registry.register_method(Method("gspo", gspo.Config, advantage="grpo", policy_loss="ppo"))
    assert registry.get_method("gspo").policy_loss == "gspo"


def test_unknown_name_lists_valid_ones():
    with pytest.raises(KeyError, match="unknown policy loss 'gpso'; valid names: .*gspo.*ppo"):
        registry.get_policy_loss("gpso")
    with pytest.raises(KeyError, match="valid names: .*grpo"):
        registry.get_advantage("gae")
    with pytest.raises(KeyError, match=re.escape(f"unknown method 'ppo2'; valid names: {', '.join(METHOD_MODULES)}")):
        registry.get_method("ppo2")
    with pytest.raises(KeyError, match="unknown method 'ppo2'"):
        registry.advantage("ppo2", AdvantageInputs(torch.ones(2), [0, 0], torch.ones(2, 3)))
    with pytest.raises(ValueError, match="non-empty string"):
        registry.register_advantage("")


ZETA = """from dataclasses import dataclass
from rlkit.registry import Method, register_method


@dataclass
class Config:
    pass


register_method(Method("zeta_mod", Config, advantage="grpo", policy_loss="ppo"))
"""


def test_a_method_module_needs_no_import_added(tmp_path, monkeypatch):
    """A module dropped into rlkit/methods registers its method: the registry imports every module of the
    package, not only those rlkit/methods/__init__.py names."""
    (tmp_path / "zeta_mod.py").write_text(ZETA)
    monkeypatch.setattr(rlkit.methods, "__path__", [*rlkit.methods.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "rlkit.methods.zeta_mod", raising=False)
    try:
        assert registry.import_method_modules() == ["rlkit.methods.zeta_mod"]
        assert registry.get_method("zeta_mod").policy_loss == "ppo"
        assert registry.import_method_modules() == []  # once
    finally:
        registry.unregister("zeta_mod")
        sys.modules.pop("rlkit.methods.zeta_mod", None)


def test_cli_lists_methods():
    out = subprocess.run([sys.executable, "-m", "rlkit.cli", "methods", "--json"], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == registry.list_methods()


# --------------------------------------------------------------------------- Config → keyword arguments


def test_kwargs_for_passes_the_fields_a_function_names_and_ignores_the_rest():
    cfg = hapo.Config(adv_beta=0.5, clip_alpha=0.7, entropy_pivot=0.6, use_adaptive_clip=False)
    kw = kwargs_for(hapo.hapo_loss, cfg)
    assert kw["adv_beta"] == 0.5 and kw["clip_alpha"] == 0.7 and kw["entropy_pivot"] == 0.6
    assert kw["use_adaptive_clip"] is False
    assert "fallback_threshold" not in kw and "temperature" not in kw  # the estimator's and the sampler's
    assert kwargs_for(hapo.entropy_stats, cfg) == {"entropy_pivot": 0.6}
    # positional parameters are data, never knobs: adaptive_temperature's `temperature` is not filled from Config
    assert kwargs_for(hapo.adaptive_temperature, cfg) == {"temperature_tau": 0.05, "release_compat": False}
    assert kwargs_for(spo.ValueTracker.weights, spo.Config(eps=0.1)) == {"eps": 0.1, "gamma": 0.0}
    assert kwargs_for(gspo_loss, None) == {}


def test_kwargs_for_refuses_what_it_cannot_map():
    with pytest.raises(TypeError, match="dataclass instance"):
        kwargs_for(gspo_loss, {"clip_low": 0.1})
    with pytest.raises(TypeError, match="dataclass instance"):
        kwargs_for(gspo_loss, gspo.Config)  # the class, not a Config
    with pytest.raises(TypeError, match=r"takes \*\*kwargs"):
        kwargs_for(lambda x, **knobs: x, gspo.Config())
    with pytest.raises(TypeError, match=r"takes \*\*kwargs"):
        registry.register_policy_loss("rlkit_test_catch_all")(lambda logp, old, adv, mask, **knobs: None)
    assert "rlkit_test_catch_all" not in registry.list_methods()["policy_loss"]


def test_every_registered_function_takes_its_home_configs_knobs_by_name():
    """One name per knob: each field of its home method's Config that a function takes has the same default."""
    import inspect

    homes = dict(registry._HOMES)
    assert {name for _, name in homes} == set(registry.list_methods()["advantage"]) | set(
        registry.list_methods()["policy_loss"])
    for (kind, name), method in homes.items():
        fn = registry._KINDS[kind][name]
        params = inspect.signature(fn).parameters
        knobs = kwargs_for(fn, registry.get_method(method).config())
        assert knobs, (kind, name)
        for field, value in knobs.items():
            assert params[field].default == value, (name, field)


# --------------------------------------------------------------------------- dispatch


def test_dispatch_is_the_direct_call_with_the_configs_fields():
    b, inputs, entropy = make_inputs(7)
    configs = {"hapo": hapo.Config(adv_beta=0.5, clip_alpha=0.7, entropy_pivot=0.6, clip_c=4.0, fallback_threshold=2.0,
                                   release_compat=True),
               "grpo": grpo.Config(eps=1e-3, clip_low=0.1, clip_high=0.3, clip_c=3.0),
               "spo": spo.Config(clip_low=0.15, clip_high=0.25, clip_c=5.0, adv_eps=1e-4),
               "aepo": aepo.Config(eps=1e-3, coef=0.3, use_entropy_advantage=False),
               "gspo": gspo.Config(eps=1e-3, clip_low=3e-3, clip_high=4e-3, variant="token"),
               "aspo": aspo.Config(clip_low=0.1, clip_high=0.3, clip_c=3.0)}
    tlga = hapo.tlga_advantage(inputs.rewards, inputs.group_ids, inputs.mask, fallback_threshold=2.0)
    assert torch.equal(registry.advantage("hapo", inputs, configs), tlga)
    grpo_adv = grpo.grpo_advantage(inputs.rewards, inputs.group_ids, inputs.mask, eps=1e-3)
    for method in ("grpo", "gspo", "aepo"):  # GRPO's estimator, with the knobs of the run's own Config
        assert torch.equal(registry.advantage(method, inputs, configs), grpo_adv)
    assert not torch.equal(registry.advantage("gspo", inputs, {"grpo": configs["grpo"]}), grpo_adv)  # not GRPO's
    no_tlga = {**configs, "hapo": dataclasses.replace(configs["hapo"], adv_estimator="grpo", eps=1e-3)}  # without B
    assert torch.equal(registry.advantage("hapo", inputs, no_tlga), grpo_adv)
    spo_adv = spo.spo_advantage(inputs.rewards, inputs.baselines, adv_eps=1e-4, mask=inputs.mask)
    assert torch.equal(registry.advantage("spo", inputs, configs), spo_adv)

    args = (b["logp"], b["old_logp"], b["adv"], b["mask"])

    def call(name, *args, **knobs):  # the loss by its own name, knobs given
        return registry.get_policy_loss(name)(*args, **knobs)

    cases = {
        "hapo": call("hapo", *args, entropy=entropy, adv_beta=0.5, clip_alpha=0.7, entropy_pivot=0.6, clip_c=4.0,
                     release_compat=True),
        "grpo": call("ppo", *args, clip_low=0.1, clip_high=0.3, clip_c=3.0),
        "aspo": call("ppo", *args, clip_low=0.1, clip_high=0.3, clip_c=3.0),  # GRPO's loss with its own clip
        "spo": call("ppo", *args, clip_low=0.15, clip_high=0.25, clip_c=5.0),
        "aepo": call("aepo", *args, coef=0.3),  # entropy switched off: ignored
        "gspo": call("gspo", *args, clip_low=3e-3, clip_high=4e-3, variant="token"),
    }
    for method, (ref, ref_metrics) in cases.items():
        loss, metrics = registry.policy_loss(method, *args, configs, entropy=entropy)
        assert torch.equal(loss, ref) and metrics == ref_metrics, method
    assert registry.loss_kwargs("spo", configs) == {"clip_low": 0.15, "clip_high": 0.25, "clip_c": 5.0,
                                                    "agg": "token-mean"}


def test_dispatch_refuses_missing_inputs_naming_them():
    b, inputs, _ = make_inputs(2)
    args = (b["logp"], b["old_logp"], b["adv"], b["mask"])
    with pytest.raises(MissingInputs, match="hapo's loss needs the token entropies .* for use_redistribution, "
                                            "use_adaptive_clip"):
        registry.policy_loss("hapo", *args)
    with pytest.raises(MissingInputs, match="for use_entropy_advantage") as e:
        registry.policy_loss("aepo", *args)
    assert e.value.names == ["use_entropy_advantage"]
    off = {"hapo": hapo.Config(use_redistribution=False, use_adaptive_clip=False)}
    loss, _ = registry.policy_loss("hapo", *args, off)  # both switches off: plain PPO, no entropy needed
    assert torch.equal(loss, hapo.hapo_loss(*args, use_redistribution=False, use_adaptive_clip=False)[0])
    # the entropy is optional: a loss without an entropy term ignores it; another input it cannot take is refused
    ignored = registry.policy_loss("grpo", *args, entropy=b["logp"])[0]
    assert torch.equal(ignored, registry.policy_loss("grpo", *args)[0])
    with pytest.raises(TypeError, match="policy loss 'ppo' takes no stats"):
        registry.policy_loss("grpo", *args, stats=object())
    with pytest.raises(MissingInputs, match="spo needs per-response baselines"):
        registry.advantage("spo", dataclasses.replace(inputs, baselines=None))
    with pytest.raises(MissingInputs, match="grpo needs per-response group_ids"):
        registry.advantage("grpo", dataclasses.replace(inputs, group_ids=None))
    # bad values still fail in the method, with its own message
    with pytest.raises(ValueError, match="one scalar per response"):
        registry.advantage("grpo", dataclasses.replace(inputs, rewards=torch.ones(len(inputs.rewards), 2)))
    wide = torch.ones(b["mask"].shape[0], b["mask"].shape[1] + 1, dtype=D)
    with pytest.raises(ValueError, match="adv has shape"):
        registry.policy_loss("grpo", b["logp"], b["old_logp"], wide, b["mask"])


# --------------------------------------------------------------------------- a seventh method


@dataclasses.dataclass
class ToyConfig:
    scale: float = 2.0
    """Multiplies the mean-centred group advantage."""
    clip: float = 0.2
    """Symmetric PPO clip."""
    steps_note: int = 0
    """A field no function takes: ignored."""


@pytest.fixture
def toy_method():
    @registry.register_advantage("toy_scaled_mean", method="toy")
    def toy_estimator(inputs: AdvantageInputs, *, scale: float = 1.0) -> torch.Tensor:
        inputs.require("toy", "group_ids")
        return scale * group_advantage(inputs.rewards, inputs.group_ids, inputs.mask, norm_by_std=False)

    @registry.register_policy_loss("toy_clip", method="toy")
    def toy_loss(logp, old_logp, adv, mask, *, clip: float = 0.2):
        ratio = (logp - old_logp).exp()
        loss_mat = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
        return masked_mean(loss_mat, mask), {"actor/pg_loss": 0.0, "toy/clip": clip,
                                             "toy/adv_abs": masked_mean(adv.abs(), mask).item()}

    registry.register_method(Method("toy", ToyConfig, advantage="toy_scaled_mean", policy_loss="toy_clip"))
    try:
        yield
    finally:
        registry.unregister("toy")
    assert "toy" not in registry.list_methods()["method"]
    assert "toy_clip" not in registry.list_methods()["policy_loss"]


def test_a_seventh_method_dispatches_with_its_config(toy_method):
    b, inputs, _ = make_inputs(4)
    adv = registry.advantage("toy", inputs, {"toy": ToyConfig(scale=3.0)})
    torch.testing.assert_close(adv, 3.0 * group_advantage(inputs.rewards, inputs.group_ids, inputs.mask,
                                                          norm_by_std=False))
    _, metrics = registry.policy_loss("toy", b["logp"], b["old_logp"], adv, b["mask"], {"toy": ToyConfig(clip=0.1)})
    assert metrics["toy/clip"] == 0.1
    _, metrics = registry.policy_loss("toy", b["logp"], b["old_logp"], adv, b["mask"])  # no Config: defaults
    assert metrics["toy/clip"] == 0.2


def test_a_seventh_method_runs_in_the_tiny_trainer_unchanged(toy_method, tmp_path):
    """Registered from here, the toy method trains through rlkit.tiny.rl's registry dispatch (its Config defaults:
    RLConfig has no section for it)."""
    from rlkit.metrics import read_metrics
    from rlkit.tiny.config import build_config
    from rlkit.tiny.rl import train

    out = train(build_config("toy", "smoke", {"steps": 2}), tmp_path / "toy", progress=False,
                sft_cache=tmp_path / "sft")
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert all(r["data"]["toy/clip"] == 0.2 for r in recs[1:])
    assert json.loads((out / "config.json").read_text())["method"] == "toy"


def test_a_methods_inputs_beyond_the_batch_are_declared_on_its_record():
    """Verl-only keys, verl's narrower choices and an offline pass are checked against the Config when registered;
    the offline pass's samples are read from the run's Config (0 without a pass)."""
    OfflinePass, VerlKey = registry.OfflinePass, registry.VerlKey
    bad = [({"verl_choices": {"scal": (1.0,)}}, "verl choice\\(s\\) scal are not Config fields"),
           ({"verl_keys": {"clip": VerlKey()}}, "verl key\\(s\\) clip are also Config fields"),
           ({"offline_pass": OfflinePass("n_offline", "values"), "verl_keys": {"values": VerlKey(file=True)}},
            "offline pass needs a Config field 'n_offline'"),
           ({"offline_pass": OfflinePass("steps_note", "values")}, "and a verl key 'values'")]
    for declared, why in bad:
        with pytest.raises(ValueError, match=f"method 'toy_inputs': .*{why}"):
            registry.register_method(Method("toy_inputs", ToyConfig, advantage="grpo", policy_loss="ppo", **declared))
        assert "toy_inputs" not in registry.list_methods()["method"]
    m = Method("toy_inputs", ToyConfig, advantage="grpo", policy_loss="ppo",
               offline_pass=OfflinePass("steps_note", "values"), verl_keys={"values": VerlKey(file=True)})
    assert m.offline_samples(ToyConfig(steps_note=5)) == 5
    assert registry.get_method("grpo").offline_samples(grpo.Config()) == 0
    spo_m = registry.get_method("spo")
    assert spo_m.offline_samples(spo.Config(offline_N=3)) == 3 and spo_m.offline_pass.verl_key in spo_m.verl_keys


