"""The shared registry: every method's names are there, duplicates fail, unknown names list the valid ones."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlkit import registry
from rlkit.methods.grpo import grpo_advantage, ppo_clip_loss
from rlkit.methods.gspo import gspo_loss


def test_builtin_names_resolve_to_the_functions():
    assert registry.get_advantage("grpo") is grpo_advantage
    assert registry.get_policy_loss("ppo") is ppo_clip_loss
    assert registry.get_policy_loss("gspo") is gspo_loss
    names = registry.list_methods()
    assert {"grpo", "aspo", "spo", "hapo_tlga"} <= set(names["advantage"])
    assert {"ppo", "gspo", "aepo", "hapo"} <= set(names["policy_loss"])


def test_duplicate_registration_fails_and_leaves_the_original():
    with pytest.raises(ValueError, match="'gspo' is already registered to rlkit.methods.gspo.gspo_loss"):
        registry.register_policy_loss("gspo")(lambda *a, **k: None)
    assert registry.get_policy_loss("gspo") is gspo_loss


def test_unknown_name_lists_valid_ones():
    with pytest.raises(KeyError, match="unknown policy loss 'gpso'; valid names: .*gspo.*ppo"):
        registry.get_policy_loss("gpso")
    with pytest.raises(KeyError, match="valid names: .*grpo"):
        registry.get_advantage("gae")
    with pytest.raises(ValueError, match="non-empty string"):
        registry.register_advantage("")


def test_cli_lists_methods():
    out = subprocess.run([sys.executable, "-m", "rlkit.cli", "methods", "--json"], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout) == registry.list_methods()
