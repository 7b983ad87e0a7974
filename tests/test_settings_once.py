"""Each setting written once, read from one place (issue 45, item 2): a run's estimator, loss and hooks read its own
method's ``Config`` and no other method's section; the knobs several methods share are declared once in
:mod:`rlkit.registry` and keep their ranges where a method overrides a default; a function's signature default
equals its ``Config``'s (the book's pages show the functions with their paper's numbers, so the signatures keep them
written out, held to the ``Config`` here); ``--set <another method>.<knob>`` is refused in one line."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest
import torch

import rlkit.methods
from conftest import make_batch, make_groups
from rlkit import cli, registry, settings
from rlkit.errors import InvalidSetting
from rlkit.methods import gspo
from rlkit.tiny.config import build_config

METHODS = sorted(p.stem for p in Path(rlkit.methods.__file__).parent.glob("*.py") if p.stem != "__init__")


class Unread:
    """Another method's section, which must not be read: any attribute of it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"another method's Config was read ({name})")


def inputs_for(seed: int):
    """A batch with every per-response input an estimator may read (ASPO's, SPO's baselines)."""
    b = make_batch(seed, noise=0.4)
    n = len(b["mask"])
    ids, rewards = make_groups(seed, n)
    g = torch.Generator().manual_seed(seed)
    lengths = b["mask"].sum(-1)
    first = torch.where(torch.rand(n, generator=g) < 0.6, torch.floor(torch.rand(n, generator=g) * lengths), -1.0)
    inputs = registry.AdvantageInputs(rewards, ids, b["mask"], correct=rewards > 0, lengths=lengths,
                                      first_code_pos=first, code_pass=torch.rand(n, generator=g) < 0.7,
                                      baselines=torch.rand(n, generator=g, dtype=torch.float64))
    return b, inputs, torch.rand(b["mask"].shape, generator=g, dtype=torch.float64) * 2


@pytest.mark.parametrize("method", METHODS)
def test_a_run_reads_its_own_methods_config_and_no_other(method):
    """Every other method's section is one whose reading fails; estimator, loss and the hooks' advantage metrics
    give what they give with the run's own section alone."""
    b, inputs, entropy = inputs_for(3)
    own = {method: registry.get_method(method).default_config()}
    others = {**{m: Unread() for m in METHODS}, **own}
    adv = registry.advantage(method, inputs, own)
    assert torch.equal(registry.advantage(method, inputs, others), adv)
    args = (b["logp"], b["old_logp"], b["adv"], b["mask"])
    assert registry.loss_kwargs(method, others) == registry.loss_kwargs(method, own)
    loss, _ = registry.policy_loss(method, *args, own, entropy=entropy)
    assert torch.equal(registry.policy_loss(method, *args, others, entropy=entropy)[0], loss)
    hooks = registry.make_hooks(method, others)
    assert hooks.config is own[method] and hooks.configs == own
    if registry.get_method(method).offline_pass is None:  # SPO's metrics read its tracker, filled by a run's start
        hooks.advantage_metrics(adv, inputs, None)


def test_gspo_trains_with_its_own_group_advantage_knobs():
    """The issue's case: GRPO's section does not change GSPO's advantages; GSPO's own norm_by_std does."""
    _, inputs, _ = inputs_for(5)
    plain = registry.advantage("gspo", inputs)
    assert torch.equal(registry.advantage("gspo", inputs, {"grpo": registry.get_method("grpo").config(
        norm_by_std=False)}), plain)
    mean_only = registry.advantage("gspo", inputs, {"gspo": gspo.Config(norm_by_std=False)})
    assert not torch.equal(mean_only, plain)


OWN_DEFAULTS = {("ValueTracker.__init__", "offline_N"): "None: every score given, for a tracker built outside a run"}
"""Parameters named like a Config knob whose default means something else, each with its meaning."""


@pytest.mark.parametrize("method", METHODS)
def test_every_signature_default_is_the_configs(method):
    """A function of a method's module that takes one of its Config's knobs defaults to the Config's value (the
    registry always passes the Config's; a direct call, as the book's pages make, gets the same)."""
    module = importlib.import_module(f"rlkit.methods.{method}")
    config = module.Config()
    functions = [fn for _, cls in inspect.getmembers(module, inspect.isclass) if cls.__module__ == module.__name__
                 for fn in vars(cls).values() if inspect.isfunction(fn)]
    functions += [fn for _, fn in inspect.getmembers(module, inspect.isfunction) if fn.__module__ == module.__name__]
    checked = 0
    for fn in functions:
        for name, p in inspect.signature(fn).parameters.items():
            if hasattr(config, name) and p.default is not inspect.Parameter.empty \
                    and (fn.__qualname__, name) not in OWN_DEFAULTS:
                assert p.default == getattr(config, name), (fn.__qualname__, name)
                checked += 1
    assert checked, method


def test_shared_knobs_keep_their_ranges_where_a_method_overrides_the_default():
    """GSPO's clip bounds are plain defaults over the registry's ClipKnobs: their range and the aggregation's
    choices are still checked; AEPO's own narrower range wins over the shared one."""
    rules = settings.declared_rules(gspo.Config)
    assert rules["clip_low"] == settings.declared_rules(settings.ClipKnobs)["clip_low"]
    assert rules["agg"] == settings.declared_rules(settings.LossKnobs)["agg"]
    with pytest.raises(InvalidSetting, match="gspo.clip_low=-1: must be ≥ 0"):
        registry.check_settings("gspo", {"clip_low": -1})
    with pytest.raises(InvalidSetting, match="gspo.agg=sum: must be one of token-mean"):
        registry.check_settings("gspo", {"agg": "sum"})
    with pytest.raises(InvalidSetting, match=r"aepo.clip_low=1: must be in \[0, 1\)"):
        registry.check_settings("aepo", {"clip_low": 1})
    shared = {f.name for f in dataclasses.fields(settings.DualClipKnobs)} | {"norm_by_std"}
    for method in METHODS:  # no Config declares a shared knob's range again
        config = registry.get_method(method).config
        declared_here = vars(config).get("__annotations__", {})
        for f in dataclasses.fields(config):
            if f.name in shared and f.name in declared_here and "range" in f.metadata:
                assert (method, f.name) == ("aepo", "clip_low"), (method, f.name)


@pytest.mark.parametrize("key", ["grpo.norm_by_std=false", "grpo.clip_c=2", "hapo.adv_beta=0.5"])
def test_setting_another_methods_section_is_refused_in_one_line(key, tmp_path, capsys):
    """``rlkit train --method gspo --set grpo.norm_by_std=false`` would change nothing in a GSPO run: refused, exit
    2, naming the run's method (and its own knob, where it has one)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--method", "gspo", "--scale", "smoke", "--out", str(tmp_path / "run"), "--set", key])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"rlkit train: {key.split('=')[0]}: a gspo run reads only its own method's settings")
    assert ("set gspo.norm_by_std" in err[0]) == key.startswith("grpo.norm_by_std")
    assert not (tmp_path / "run").exists()
    assert build_config("gspo", "smoke", {"gspo.norm_by_std": False}).gspo.norm_by_std is False  # its own: taken
