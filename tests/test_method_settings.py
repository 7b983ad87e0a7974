"""A method's settings are checked once, the same on both engines (issue 35, item 1): the registry's
messages (:func:`rlkit.registry.check_settings`) by hand, a method whose defaults break its own rules, and
``rlkit train`` and ``rlkit launch --dry-run`` refusing an out-of-range method setting before any work. That
every range and choice each method declares is refused by both engines and its defaults pass:
tests/test_method_contract.py."""

from __future__ import annotations

import dataclasses
import math

import pytest

from rlkit import cli, registry, settings
from rlkit.errors import InvalidSetting, UnknownSetting
from rlkit.tiny.config import build_config


def test_values_inside_the_range_pass_and_bounds_read_as_written():
    assert registry.check_settings("hapo", {"temperature_tau": 0.5, "adv_beta": 1.0}).temperature_tau == 0.5
    assert registry.check_settings("spo", {"rho_value": None, "rho_type": "constant"}).rho_value is None
    assert str(settings.Range(gt=0)) == "> 0" and str(settings.Range(ge=0, lt=1)) == "in [0, 1)"
    assert str(settings.Range(le=1)) == "≤ 1" and str(settings.Range(gt=0, le=1)) == "in (0, 1]"
    with pytest.raises(InvalidSetting, match=r"^hapo\.temperature_tau=abc: must be a number in \(0, 1\)$"):
        registry.check_settings("hapo", {"temperature_tau": "abc"})
    with pytest.raises(InvalidSetting, match=r"^spo\.d_half=null: must be a number > 0$"):
        registry.check_settings("spo", {"d_half": None})
    with pytest.raises(InvalidSetting, match=r"^aspo\.delta=inf: must be a finite number$"):  # any number
        registry.check_settings("aspo", {"delta": math.inf})
    with pytest.raises(UnknownSetting, match=r"^hapo\.temprature_tau: hapo has no such setting"):
        registry.check_settings("hapo", {"temprature_tau": 0.1})


def test_a_method_whose_defaults_break_its_own_rules_is_not_registered():
    @dataclasses.dataclass
    class Config:
        width: float = settings.knob(-1.0, gt=0)

    with pytest.raises(ValueError, match=r"method 'toy_bad': its default toy_bad\.width=-1: must be > 0"):
        registry.register_method(registry.Method("toy_bad", Config, advantage="grpo", policy_loss="ppo"))
    assert "toy_bad" not in registry.list_methods()["method"]
    with pytest.raises(ValueError, match="one lower bound"):
        settings.Range(gt=0, ge=0)


# ------------------------------------------------------------------------------------------------ the commands
THE_LAUNCHES = [("hapo", "temperature_tau", "-1", "hapo.temperature_tau=-1: must be in (0, 1)"),
                ("spo", "rho_type", "bogus", "spo.rho_type=bogus: must be one of kl, constant"),
                ("dr_grpo", "loss_scale_factor", "-5", "dr_grpo.loss_scale_factor=-5: must be > 0")]


def refused(argv, capsys) -> str:
    """The one-line message of a refused command (exit 2, nothing on stdout)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    captured = capsys.readouterr()
    assert info.value.code == 2 and not captured.out, (info.value.code, captured.out)
    assert "\n" not in captured.err.strip(), captured.err
    return captured.err.strip()


@pytest.mark.parametrize("method, name, value, message", THE_LAUNCHES)
def test_train_and_launch_refuse_the_setting_with_one_message(method, name, value, message, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused(["train", "--method", method, "--out", str(tmp_path / "run"), "--set", f"{method}.{name}={value}"],
                  capsys)
    assert err == f"rlkit train: {message}"
    pytest.importorskip("verl")
    pytest.importorskip("hydra")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing here may reach the hub
    err = refused(["launch", "--method", method, "--dataset", "gsm8k", "--model", "Qwen/Qwen2.5-0.5B-Instruct",
                   "--gpus", "8", "--runs-dir", str(tmp_path / "runs"), "--dry-run", "--",
                   f"+algorithm.{method}.{name}={value}"], capsys)
    assert err == f"rlkit launch: {message}"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # before any work: nothing written
    from rlkit.verl import launch as L
    from rlkit.verl.launch.presets import LaunchError

    p = L.plan(method, "gsm8k", "Qwen/Qwen2.5-0.5B-Instruct", gpus=8, extra=[f"+algorithm.{method}.{name}={value}"])
    with pytest.raises(LaunchError) as composed:  # the composed config's own check says the same
        L.check(p)
    assert str(composed.value) == message


def test_a_tiny_scale_launch_refuses_before_preparing_anything(tmp_path, capsys, monkeypatch):
    pytest.importorskip("hydra")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    err = refused(["launch", "--method", "hapo", "--device", "cpu", "--tiny-scale", "smoke", "--runs-dir",
                   str(tmp_path / "runs"), "--dry-run", "--", "+algorithm.hapo.temperature_tau=-1"], capsys)
    assert err == "rlkit launch: hapo.temperature_tau=-1: must be in (0, 1)"
    assert list(tmp_path.iterdir()) == []  # no SFT start, no data, no run directory


def test_verl_runs_the_methods_own_check_of_the_engines_settings_as_the_tiny_engine_does():
    """:meth:`rlkit.hooks.Hooks.check` on verl's settings (its response budget, its rollout temperature)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from rlkit.methods import dapo, hapo
    from rlkit.verl.inputs import check_hooks
    from rlkit.verl.launch.presets import LaunchError

    with pytest.raises(InvalidSetting) as tiny:
        build_config("dapo", "smoke", {"dapo.overlong_buffer": 64})  # smoke's budget: 48 tokens
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"temperature": 0.7}}, "data": {"max_response_length": 48}})
    setup = SimpleNamespace(name="dapo", options={"dapo": dapo.Config(overlong_buffer=64)})
    with pytest.raises(LaunchError) as verl:
        check_hooks(cfg, setup)
    assert str(verl.value) == str(tiny.value) and "exceeds the response budget" in str(tiny.value)
    check_hooks(cfg, SimpleNamespace(name="dapo", options={"dapo": dapo.Config(overlong_buffer=48)}))
    # HAPO's temperature is verl's rollout temperature (a key verl owns): the two never differ there
    check_hooks(cfg, SimpleNamespace(name="hapo", options={"hapo": hapo.Config()}))
