"""The verl method config is parsed once per process, and rlkit's ``algorithm.<method>`` blocks are told from
verl's own keys by the registry (issue 35, item 2): the launch's checks (``compose.check_method_overrides``,
``compose.check_rlkit_names``), the trainer's ``MethodSetup.from_config`` and the estimators' look-ups
(``plugin._AlgorithmConfigs``) share one parse of each section (:data:`rlkit.verl.inputs._PARSED`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from rlkit import registry  # noqa: E402
from rlkit.verl import inputs  # noqa: E402

pytestmark = pytest.mark.verl


@pytest.fixture
def parses(monkeypatch):
    """Calls of :func:`rlkit.registry.check_settings` made by :func:`rlkit.verl.inputs.method_config` (one per parse
    of a section), counted from an empty cache."""
    inputs.clear_parsed()
    calls: list[str] = []
    real = registry.check_settings

    def counting(method, section=None):
        calls.append(method)
        return real(method, section)

    monkeypatch.setattr(registry, "check_settings", counting)
    yield calls
    inputs.clear_parsed()


def test_a_section_is_parsed_once_and_each_caller_gets_its_own_copy(parses):
    algorithm = {"dapo": {"overlong_buffer": 16}, "norm_adv_by_std_in_grpo": True}
    first, extras = inputs.method_config(algorithm, "dapo")
    for _ in range(5):
        again, again_extras = inputs.method_config(algorithm, "dapo")
        assert again == first and again is not first and again_extras == extras
    assert parses == ["dapo"]
    first.overlong_buffer = 99  # a caller changing its copy changes no one else's
    assert inputs.method_config(algorithm, "dapo")[0].overlong_buffer == 16
    inputs.method_config({"dapo": {"overlong_buffer": 8}}, "dapo")  # another section: parsed
    assert parses == ["dapo", "dapo"]
    with pytest.raises(ValueError):  # a refused section is refused every time, never kept
        inputs.method_config({"dapo": {"overlong_buffer": -1}}, "dapo")
    with pytest.raises(ValueError):
        inputs.method_config({"dapo": {"overlong_buffer": -1}}, "dapo")


def test_the_estimators_lookups_parse_no_section_twice(parses):
    from verl import DataProto
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn  # noqa: F401  (verl's registry is loaded)
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from rlkit.verl.plugin import ensure_registered

    ensure_registered()
    B, T = 8, 5
    mask = torch.ones(B, T)
    rewards = torch.zeros(B, T)
    rewards[:, -1] = torch.tensor([1.0, 0, 1, 1, 0, 0, 1, 0])
    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.asarray(["a"] * 4 + ["b"] * 4, dtype=object)})
    algorithm = {"norm_adv_by_std_in_grpo": True, "grpo": {"eps": 1e-5}}
    for _ in range(4):
        compute_advantage(data, adv_estimator="rlkit_grpo", num_repeat=1, norm_adv_by_std_in_grpo=True,
                          config=algorithm)
    assert parses.count("grpo") == 1, parses


@pytest.fixture
def composed(tmp_path, monkeypatch):
    """A composed GPU launch of GSPO (no model is built): the plan and verl's config."""
    pytest.importorskip("hydra")
    from rlkit.verl.launch import config as C
    from rlkit.verl import launch as L

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / "data" / "gsm8k" / name).write_bytes(b"")
    p = L.plan("gspo", "gsm8k", "Qwen/Qwen2.5-0.5B-Instruct", gpus=8, extra=["+algorithm.gspo.eps=1e-5"])
    return L, C, p


def test_a_launch_parses_each_block_once_and_the_trainer_reuses_it(parses, composed):
    """``rlkit launch``'s checks (the overrides, then the composed config: every rlkit block, then the run's
    ``MethodSetup``) parse each section once; the trainer's ``MethodSetup`` and every estimator look-up in the
    same process parse nothing again."""
    from rlkit.verl.plugin import _AlgorithmConfigs
    from rlkit.verl.trainer import MethodSetup

    L, C, p = composed
    cfg = L.check(p)
    once = list(parses)
    assert sorted(once) == sorted(set(once)) and "gspo" in once, once  # each method's section once
    setup = MethodSetup.from_config(cfg)
    configs = _AlgorithmConfigs(cfg.algorithm)
    for _ in range(3):
        assert configs["gspo"].eps == 1e-5 and configs[setup.name] is configs[setup.name]
    C.check_rlkit_names(cfg)
    assert parses == once, (parses, once)


def test_rlkit_blocks_are_told_from_verls_keys_by_the_registry(composed, monkeypatch):
    """A method the registry holds but no preset names is still read as rlkit's block (checked, and kept out of
    verl's schema check); verl's own keys never are."""
    from rlkit.verl.launch import presets

    L, C, p = composed
    cfg = L.check(p)
    verl_keys = [k for k in cfg.algorithm if k not in registry.list_methods()["method"]]
    assert "adv_estimator" in verl_keys and "filter_groups" in verl_keys  # verl's default dynamic-sampling block
    assert inputs.rlkit_blocks(cfg.algorithm) == [k for k in cfg.algorithm if k not in verl_keys]
    assert not set(inputs.rlkit_blocks(cfg.algorithm)) & set(verl_keys)

    zeta = registry.Method("zeta_blocks", registry.get_method("grpo").config, advantage="grpo", policy_loss="ppo")
    registry.register_method(zeta)
    try:
        assert "zeta_blocks" not in presets.METHODS
        extra = [*p.overrides, "+algorithm.zeta_blocks.eps=1e-4"]
        cfg = C.compose(extra)
        assert "zeta_blocks" in inputs.rlkit_blocks(cfg.algorithm)
        with pytest.raises(presets.LaunchError, match="algorithm.zeta_blocks is another method's section"):
            L.check(dataclasses.replace(p, overrides=tuple(extra)))  # read as rlkit's, not verl's schema
        bad = [*p.overrides, "+algorithm.zeta_blocks.eps=-1"]
        with pytest.raises(presets.LaunchError, match="zeta_blocks.eps"):  # and it is checked as rlkit's
            L.check(dataclasses.replace(p, overrides=tuple(bad)))
    finally:
        registry.unregister("zeta_blocks")
        inputs.clear_parsed()
