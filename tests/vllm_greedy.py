"""vLLM's CPU build serving a model directory: the greedy continuation of one prompt (token ids) given as JSON,
``python tests/vllm_greedy.py DIR '[1, 2, ...]' N``. Prints ``REPORT <json>`` (the new token ids) last; run by
``tests/test_models.py`` in a fresh process (vLLM starts worker processes)."""

from __future__ import annotations

import json
import os
import sys


def main(model_dir: str, prompt_ids: list[int], n_tokens: int) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=512, seed=0)
    out = llm.generate([{"prompt_token_ids": prompt_ids}], SamplingParams(temperature=0.0, max_tokens=n_tokens,
                                                                          ignore_eos=True))
    print("REPORT " + json.dumps({"ids": list(out[0].outputs[0].token_ids)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
