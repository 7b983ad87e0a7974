"""One batch, two engines: the tiny engine's update code and verl's (its estimator registry and FSDP2 actor engine
with rlkit's trainer loss) on the same model, prompts, responses, rewards and behaviour log-probs
(``tests/two_engines_one_batch.py``, in a fresh process: verl fixes its platform at import).

Both run in float32. With the whole batch in one verl micro-batch the advantages are equal bit for bit and the
losses and gradients agree to float32 round-off. With micro-batches of 4 rows, GRPO's and GSPO's still agree
(verl normalises each micro-batch's loss by the global token count), while AEPO's and HAPO's differ: their entropy
statistics (AEPO's batch-normalised entropy, HAPO's pivot quantile) are taken over the micro-batch verl's loss
function sees, not over the batch — a difference of the engines' update code that the *Two engines* page lists.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytestmark = [pytest.mark.verl, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).with_name("two_engines_one_batch.py")


def report(micro: int) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(micro)], capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


@pytest.fixture(scope="module")
def whole_batch():
    return report(8)


def test_advantages_are_equal(whole_batch):
    assert whole_batch["advantage_nonzero"] > 100  # rewards vary within each group
    assert whole_batch["advantage_max_abs_diff"] == 0.0


@pytest.mark.parametrize("method", ["grpo", "gspo", "aepo", "hapo"])
def test_loss_and_gradient_agree_with_the_batch_in_one_micro_batch(whole_batch, method):
    r = whole_batch["methods"][method]
    assert r["grad_names"] == r["verl_param_names"] == 20  # every Llama weight compared (tied head included)
    assert r["tiny_loss"] == pytest.approx(r["verl_loss"], rel=2e-5, abs=1e-7)
    assert r["grad_max_abs"] > 1e-3  # a real gradient
    assert r["grad_max_abs_diff"] <= 2e-5 * r["grad_max_abs"] + 1e-7


def test_micro_batches_change_only_the_entropy_methods():
    r = report(4)["methods"]
    for method in ("grpo", "gspo"):
        assert r[method]["tiny_loss"] == pytest.approx(r[method]["verl_loss"], rel=2e-5)
        assert r[method]["grad_max_abs_diff"] <= 2e-5 * r[method]["grad_max_abs"] + 1e-7
    for method in ("aepo", "hapo"):  # per-micro-batch entropy statistics: a real, documented difference
        assert abs(r[method]["tiny_loss"] - r[method]["verl_loss"]) > 1e-4
