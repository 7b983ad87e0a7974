"""vLLM's CPU build serves a model from :func:`rlkit.tiny.hf.export`: greedy continuations of held-out prompts equal
the tiny sampler's token for token (no tool: the same text, plain decoding). Prints ``REPORT <json>`` last; run by
``tests/test_tiny_hf.py`` in a fresh process (vLLM starts worker processes)."""

from __future__ import annotations

import json
import os
import sys
import tempfile


def main(model_dir: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from vllm import LLM, SamplingParams

    from rlkit.tasks import arithmetic
    from rlkit.tiny.model import ModelConfig, TinyDecoder
    from rlkit.tiny.hf import export
    from rlkit.tiny.sampler import sample
    from rlkit.tiny.task import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(3)
    tiny = TinyDecoder(ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=2)).eval()
    with torch.no_grad():
        for p in tiny.parameters():
            p.normal_(0, 0.3)
    export(tiny, tok, model_dir)
    prompts = [arithmetic.prompt(p) for p in arithmetic.make_split(6, "test", seed=2)]
    ours = sample(tiny, tok, prompts, max_new_tokens=24, greedy=True, ignore_eos=True)
    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, max_model_len=512, seed=0)
    outs = llm.generate([{"prompt_token_ids": [tok.bos_id, *tok.encode(p)]} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, skip_special_tokens=False))
    theirs = [list(o.outputs[0].token_ids) for o in outs]
    mine = [ours.tokens[i, :24].tolist() for i in range(len(prompts))]
    print("REPORT " + json.dumps({"tiny": mine, "vllm": theirs}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="rlkit-vllm-") + "/model")
