"""A method's per-token temperature as a vLLM v1 logits processor — HAPO's adaptive temperature, the one method
with one — on CPU with fake logits (vLLM is not installed). The processor builds HAPO's hooks from its settings and
loads their state from the file the trainer writes.

vLLM divides the processor's output by the request temperature T, so the distribution sampled from is
softmax(apply(z)/T); it must be softmax(z / (T·(1 + τ·h̃))) with h̃ from rlkit's HAPO functions (Eq. 8).
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest
import torch

from rlkit.core.entropy import entropy_from_logits
from rlkit.methods import hapo
from rlkit.verl import sampling

TAU = 0.05


def vllm_config(path, **options):
    config = hapo.Config(**{"temperature_tau": TAU, **options})
    return SimpleNamespace(additional_config={sampling.CONFIG_KEY: sampling.processor_settings(
        "hapo", {"hapo": config}, str(path))})


def save_stats(path, stats):
    """What the trainer writes after an update: HAPO's hooks' state holding ``stats``."""
    sampling.save_state(str(path), {"stats": tuple(stats)})


def logits_with_spread_entropies(rows=6, vocab=40, seed=0):
    """Rows from nearly greedy to nearly flat, so their h̃ span both signs."""
    g = torch.Generator().manual_seed(seed)
    sharpness = torch.linspace(8.0, 0.05, rows).unsqueeze(-1)
    return sharpness * torch.randn(rows, vocab, generator=g)


def stats_of(logits, pivot=0.5):
    h = entropy_from_logits(logits)
    return hapo.entropy_stats(h.unsqueeze(0), torch.ones_like(h).unsqueeze(0), entropy_pivot=pivot)


def test_base_class_is_vllms_when_installed_else_object():
    if importlib.util.find_spec("vllm") is None:  # no vLLM: the module still imports and runs
        assert sampling.AdaptiveTemperatureProcessor.__bases__ == (sampling._AdaptiveTemperature,)
    else:  # vLLM loads it by qualified name and checks the base class
        from vllm.v1.sample.logits_processor import LogitsProcessor

        assert issubclass(sampling.AdaptiveTemperatureProcessor, LogitsProcessor)
    assert sampling.AdaptiveTemperatureProcessor is sampling.AdaptiveTemperatureProcessor  # built once
    assert sampling.AdaptiveTemperatureProcessor.__qualname__ == "AdaptiveTemperatureProcessor"


def test_importing_the_module_does_not_import_vllm():
    """Every verl process imports it through rlkit's plugin; vLLM (3 s) only where the processor is used."""
    import subprocess
    import sys

    code = "import sys, rlkit.verl.sampling; print('vllm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_first_step_without_statistics_changes_nothing(tmp_path):
    proc = sampling.AdaptiveTemperatureProcessor(vllm_config(tmp_path / "absent.json"), "cpu", False)
    logits = logits_with_spread_entropies()
    proc.update_state(None)
    assert torch.equal(proc.apply(logits.clone()), logits)
    assert proc.is_argmax_invariant() is False and proc.validate_params(object()) is None


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("release_compat", [False, True])
def test_sampled_distribution_is_hapos_adaptive_temperature(tmp_path, temperature, release_compat):
    path = tmp_path / "state.pt"
    logits = logits_with_spread_entropies()
    stats = stats_of(logits)
    save_stats(path, stats)
    proc = sampling.AdaptiveTemperatureProcessor(vllm_config(path, release_compat=release_compat), "cpu", False)
    sampled = torch.softmax(proc.apply(logits.clone()) / temperature, dim=-1)  # vLLM divides by T afterwards
    per_row_t = hapo.adaptive_temperature(logits, temperature, stats, temperature_tau=TAU,
                                          release_compat=release_compat)
    torch.testing.assert_close(sampled, torch.softmax(logits / per_row_t.unsqueeze(-1), dim=-1))
    # and in numbers: T(1 + τ·h̃) with h̃ clamped to [−1, 1]
    h = hapo.normalized_entropy(entropy_from_logits(logits), stats, release_compat=release_compat)
    torch.testing.assert_close(per_row_t, temperature * (1 + TAU * h))
    log_h = entropy_from_logits(logits).log()
    above, below = log_h > stats.median, log_h < stats.median
    assert above.any() and below.any()
    assert (per_row_t[above] > temperature).all()  # rows more uncertain than the pivot sample hotter
    if not release_compat:  # the paper's sign: rows more certain than the pivot sample colder
        assert (per_row_t[below] < temperature).all()
    else:  # the released code's h̃ ≥ 0: no row samples colder than T
        assert (per_row_t >= temperature - 1e-7).all()
    assert torch.equal(proc.apply(logits).argmax(-1), logits.argmax(-1))  # greedy rows are unaffected


def test_masked_tokens_stay_masked_and_leave_no_nan(tmp_path):
    path = tmp_path / "state.pt"
    logits = logits_with_spread_entropies()
    save_stats(path, stats_of(logits))
    proc = sampling.AdaptiveTemperatureProcessor(vllm_config(path), "cpu", False)
    masked = logits.clone()
    masked[:, ::3] = float("-inf")  # what an earlier processor (bad words, allowed ids) leaves
    out = proc.apply(masked.clone())
    assert torch.isfinite(out[:, 1::3]).all() and torch.isneginf(out[:, ::3]).all()
    finite = torch.where(torch.isinf(masked), torch.full_like(masked, -1e30), masked)
    expected = masked / hapo.adaptive_temperature(finite, 1.0, stats_of(logits), temperature_tau=TAU).unsqueeze(-1)
    torch.testing.assert_close(out, expected)


def test_new_statistics_are_picked_up_at_the_next_engine_step(tmp_path):
    path = tmp_path / "state.pt"
    logits = logits_with_spread_entropies()
    first, second = stats_of(logits, pivot=0.2), stats_of(logits, pivot=0.9)
    save_stats(path, first)
    proc = sampling.AdaptiveTemperatureProcessor(vllm_config(path), "cpu", False)
    before = proc.apply(logits.clone())
    save_stats(path, second)
    os.utime(path, ns=(os.stat(path).st_mtime_ns + 1_000_000, os.stat(path).st_mtime_ns + 1_000_000))
    assert torch.equal(proc.apply(logits.clone()), before)  # nothing changes inside a step...
    proc.update_state(None)  # ...vLLM calls this before every step
    after = proc.apply(logits.clone())
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, logits / hapo.adaptive_temperature(logits, 1.0, second, temperature_tau=TAU).unsqueeze(-1))


def test_bad_settings_fail_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"additional_config\.rlkit_sampler\.\{method, options, state_path\}"):
        sampling.AdaptiveTemperatureProcessor(SimpleNamespace(additional_config={}), "cpu", False)
    config = vllm_config(tmp_path / "s.pt")
    config.additional_config[sampling.CONFIG_KEY]["tau"] = 0.1
    with pytest.raises(ValueError, match=r"rlkit_sampler\.tau; valid: method, options, state_path"):
        sampling.AdaptiveTemperatureProcessor(config, "cpu", False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tau'"):  # a field hapo.Config lacks
        sampling.AdaptiveTemperatureProcessor(vllm_config(tmp_path / "s.pt", tau=0.1), "cpu", False)
    logits = logits_with_spread_entropies()
    save_stats(tmp_path / "s.pt", stats_of(logits))
    proc = sampling.AdaptiveTemperatureProcessor(vllm_config(tmp_path / "s.pt", temperature_tau=1.5), "cpu", False)
    with pytest.raises(ValueError, match=r"temperature_tau must lie in \[0, 1\)"):
        proc.apply(logits)


def test_applied_temperatures_are_recorded_for_the_trainer(tmp_path):
    """The processor's running totals → the trainer's per-step mean and std of T·(1 + τ·h̃), over processes."""
    path = tmp_path / "state.pt"
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(3)) * 3
    save_stats(path, stats_of(logits))
    proc = sampling.AdaptiveTemperatureProcessor(vllm_config(path), "cpu", False)
    before = sampling.read_applied(str(path))
    assert before == {"tokens": 0.0, "factor_sum": 0.0, "factor_sq_sum": 0.0}
    out = proc.apply(logits.clone())
    factors = logits / out  # each row divided by its 1 + τ·h̃
    proc.update_state(SimpleNamespace(batch_size=0, added=[], removed=[], moved=[]))  # the batch emptied: flush
    after = sampling.read_applied(str(path))
    assert after["tokens"] == 6
    m = sampling.applied_metrics(before, after, temperature=0.8, prefix="hapo")
    assert m["hapo/sampler/temperature_mean"] == pytest.approx(0.8 * factors[:, 0].double().mean().item(), rel=1e-5)
    assert m["hapo/sampler/temperature_std"] == pytest.approx(
        0.8 * factors[:, 0].double().std(unbiased=False).item(), rel=1e-3)
    assert m["hapo/sampler/temperature_std"] > 0
    other = tmp_path / "state.applied.999999.json"  # another vLLM process's totals are added
    other.write_text('{"tokens": 4, "factor_sum": 4.0, "factor_sq_sum": 4.0}')
    assert sampling.read_applied(str(path))["tokens"] == 10
    assert sampling.applied_metrics(after, after, 1.0, prefix="hapo") == {"hapo/sampler/adapted_tokens": 0.0}


def test_recording_never_stops_sampling(tmp_path):
    """Nothing adapted yet (step 1: no statistics): nothing written; an unwritable record: a warning, not an error
    (a processor's exception kills vLLM's engine)."""
    path = tmp_path / "no_dir_yet" / "state.pt"
    proc = sampling.AdaptiveTemperatureProcessor(vllm_config(path), "cpu", False)
    proc.update_state(SimpleNamespace(batch_size=0))
    assert not path.parent.exists()
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = sampling.AdaptiveTemperatureProcessor(vllm_config(blocker / "state.pt"), "cpu", False)
    proc.applied["tokens"] = 1.0
    with pytest.warns(UserWarning, match="cannot record"):
        proc.flush()
    proc.flush()  # said once
