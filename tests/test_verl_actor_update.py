"""One update of verl 0.9.1's own actor (its FSDP2 engine, ``train_batch``, ``ppo_loss``) per rlkit loss, on CPU.

The run happens in a fresh process (``tests/verl_cpu_actor_step.py``): verl has no CPU platform, so one is
registered through verl's ``PlatformRegistry`` before verl resolves its platform (see that script's docstring
for exactly what CPU needs). A tiny randomly initialised Qwen2 model is built there; nothing is downloaded.

Each step starts from verl's old-log-prob pass, so every ratio is 1 and each micro-batch's loss must equal the
rlkit function called directly on it, scaled by verl's global token-mean normalisation.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")

SCRIPT = os.path.join(os.path.dirname(__file__), "verl_cpu_actor_step.py")
METRICS = {"rlkit_ppo": "actor/pg_clipfrac", "rlkit_gspo": "gspo/seq_ratio/mean",
           "rlkit_aepo": "aepo/adv_reshape/mean", "rlkit_hapo": "hapo/redistributed_frac",
           "rlkit_cispo": "cispo/clipped_frac"}


@pytest.fixture(scope="module")
def report():
    out = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(METRICS))
def test_one_actor_update_per_rlkit_loss(report, name):
    step = report[name]
    assert len(step["loss"]) == 2  # two micro-batches of two responses
    for got, want in zip(step["loss"], step["expected"]):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert math.isfinite(step["grad_norm"]) and step["grad_norm"] > 0
    assert step["moved"] > 0  # the optimizer stepped
    assert METRICS[name] in step["metrics"]  # rlkit's own metrics came back through verl
