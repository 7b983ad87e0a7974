"""Pinned float kernels and the weights hash (rlkit/numerics.py), the tiny engine's fingerprint (rlkit/tiny/sft.py),
and ``rlkit env``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkit import numerics
from rlkit.tiny import sft
from rlkit.tiny.model import ModelConfig, TinyDecoder


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter (torch not yet loaded) with ``env`` added; its stdout."""
    clean = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "RLKIT_NUMERICS")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


HAS_AVX2 = "avx2" in numerics.cpu_flags()


@pytest.mark.skipif(not HAS_AVX2, reason="the pinned kernels are AVX2 ones")
def test_import_rlkit_pins_the_kernels_before_torch_loads():
    code = "import rlkit, torch, os; print(torch.backends.cpu.get_cpu_capability(), os.environ.get('MKL_CBWR'))"
    assert _python(code) == "AVX2 AVX2"
    assert _python(code, RLKIT_NUMERICS="compatible") == "AVX2 COMPATIBLE"
    native = _python(code, RLKIT_NUMERICS="native").split()
    assert native[1] == "None" and native[0] == _python("import torch; print(torch.backends.cpu.get_cpu_capability())")
    # a variable the user set wins
    assert _python(code, MKL_CBWR="COMPATIBLE") == "AVX2 COMPATIBLE"


def test_torch_loaded_first_cannot_be_pinned_and_the_run_records_it():
    code = ("import torch, rlkit, json; from rlkit import numerics; "
            "print(json.dumps([rlkit._numerics.pin(), numerics.kernels()['in_force']]))")
    pinned, in_force = json.loads(_python(code))
    assert pinned is False and in_force is False


def test_an_unknown_mode_is_refused_with_the_valid_ones(monkeypatch):
    monkeypatch.setenv("RLKIT_NUMERICS", "fast")
    with pytest.raises(ValueError, match="pinned, compatible, native"):
        numerics.mode()


def test_the_fingerprint_is_the_same_in_two_processes_and_moves_with_the_kernels():
    code = "import rlkit; from rlkit.tiny import sft; print(sft.fingerprint())"
    first, second = _python(code), _python(code)
    assert first == second and len(first) == 12
    assert _python(code, RLKIT_NUMERICS="compatible") != first  # MKL's SSE2 branch rounds differently


def test_the_fingerprint_leaves_the_callers_threads_and_random_state_alone():
    torch.set_num_threads(1)
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    sft.fingerprint.cache_clear()
    sft.fingerprint(steps=1)
    assert torch.get_num_threads() == 1
    assert torch.equal(torch.rand(3), expected)


def _model(seed: int) -> TinyDecoder:
    torch.manual_seed(seed)
    return TinyDecoder(ModelConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, max_len=16))


def test_weights_hash_hand_case():
    # one 2-element tensor: sha256(name, shape, little-endian float32 bytes)
    import hashlib

    state = {"w": torch.tensor([1.0, -2.0])}
    expected = hashlib.sha256(b"w" + b"(2,)" + bytes.fromhex("0000803f000000c0")).hexdigest()
    assert numerics.weights_sha256(state) == expected


def test_weights_hash_ignores_the_file_and_the_key_order(tmp_path):
    model = _model(0)
    torch.save(model.state_dict(), tmp_path / "a.pt")
    reloaded = torch.load(tmp_path / "a.pt", weights_only=True)
    reordered = dict(reversed(list(reloaded.items())))
    assert numerics.weights_sha256(reordered) == numerics.weights_sha256(model.state_dict())


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1, -1]))
def test_weights_hash_sees_a_one_ulp_change_anywhere(index, direction):
    state = _model(1).state_dict()
    flat = [(name, t) for name, t in state.items()]
    sizes = [t.numel() for _, t in flat]
    index %= sum(sizes)
    before = numerics.weights_sha256(state)
    for name, t in flat:
        if index < t.numel():
            view = t.view(-1)
            view[index] = torch.nextafter(view[index], torch.tensor(direction * float("inf")))
            break
        index -= t.numel()
    assert numerics.weights_sha256(state) != before


def test_cpu_model_names_the_processor():
    name = numerics.cpu_model()
    assert name and name != "?"
    if os.path.exists("/proc/cpuinfo"):
        assert "family" in name  # virtual machines show generic names: the numbers are kept


def test_rlkit_env_prints_the_fingerprint():
    out = subprocess.run([sys.executable, "-m", "rlkit.cli", "env", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["here"]["fingerprint"]) == 12 and report["here"]["cpu_model"]


def test_programs_rlkit_launches_get_their_own_kernels_back(monkeypatch):
    monkeypatch.setattr(numerics, "SET_HERE", {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    env = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx512", "PATH": "/bin"}  # the user chose avx512 later
    assert numerics.unpinned_env(env) == {"ATEN_CPU_CAPABILITY": "avx512", "PATH": "/bin"}
