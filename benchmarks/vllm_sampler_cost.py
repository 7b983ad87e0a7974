"""What registering HAPO's sampler (rlkit's vLLM logits processor) costs vLLM's CPU build, offline.

One process per call: SmolLM2-135M-Instruct (``rlkit model smollm2 --out DIR``) in vLLM with the CPU preset's
engine settings, 16 copies of a GSM8K-like prompt, 64 sampled tokens each (EOS ignored), timed; ``--processor``
registers ``rlkit.verl.sampling:AdaptiveTemperatureProcessor`` with no statistics yet (it returns the logits as
they are, as in a HAPO run's first step).

    python benchmarks/vllm_sampler_cost.py --model DIR
    python benchmarks/vllm_sampler_cost.py --model DIR --processor
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import rlkit  # noqa: F401  (before torch: rlkit's numerics settings)
from rlkit.verl import cpu
from rlkit.verl.sampling import CONFIG_KEY
from rlkit.verl.trainer import SAMPLER_PROCESSOR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model directory vLLM's CPU build serves")
    parser.add_argument("--processor", action="store_true", help="register HAPO's sampler")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    os.environ.update(cpu.ENV)
    from vllm import LLM, SamplingParams

    engine = dict(model=args.model, dtype="float32", enforce_eager=True, max_model_len=768, enable_prefix_caching=False,
                  max_num_batched_tokens=2048, gpu_memory_utilization=0.1, distributed_executor_backend="uni")
    if args.processor:
        state = os.path.join(tempfile.mkdtemp(), "none_yet.pt")  # no statistics yet: the first step's sampler
        engine["logits_processors"] = [SAMPLER_PROCESSOR]
        engine["additional_config"] = {CONFIG_KEY: {"method": "hapo", "options": {"hapo": {}}, "state_path": state}}
    llm = LLM(**engine)
    prompts = ["Janet has 3 apples and buys 5 more. How many apples does she have? Let's think step by step."] * 16
    t0 = time.perf_counter()
    out = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True))
    tokens = sum(len(o.outputs[0].token_ids) for o in out)
    print(f"{'with' if args.processor else 'without'} the sampler: {time.perf_counter() - t0:.1f} s for {tokens} tokens")


if __name__ == "__main__":
    main()
