"""SmolLM2-135M-Instruct on this CPU in plain transformers: what one RL step of it costs before verl is involved.

Three timings on the directory ``rlkit model smollm2`` writes (converted first into a temporary directory when
``--model`` is not given, and that conversion timed too):

- load: ``AutoModelForCausalLM.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)``;
- sample: 8 answers of 32 new tokens to one GSM8K problem (its chat template, verl's instruction), temperature 1,
  one ``generate`` call of 8 sequences, as a GRPO group of 8 is;
- step: one forward + backward + AdamW step on those 8 prompt+answer sequences (the answers' token-mean
  log-likelihood, float32, lr 1e-6), once: it is the slow part, and one is what the issue needs.

    python benchmarks/smollm2_step.py                       # convert, then time (about 3 minutes on 2 cores)
    python benchmarks/smollm2_step.py --model /tmp/smollm2  # a directory rlkit model smollm2 wrote
    python benchmarks/smollm2_step.py --model DIR --no-step # load and sampling only

Prints one line per timing and a JSON line of them all (``--json FILE`` writes it too), with the threads torch
used and the load average while it ran: on a shared machine the numbers are the machine's, not the model's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
            "clips did Natalia sell altogether in April and May?")


def timed(label: str, results: dict, fn, *args, **kwargs):
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    results[label] = round(time.perf_counter() - start, 2)
    print(f"{label:<8} {results[label]:8.2f} s", flush=True)
    return value


def load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True), \
        AutoTokenizer.from_pretrained(path, local_files_only=True)


def sample(model, tokenizer, n: int, new_tokens: int, seed: int) -> tuple[torch.Tensor, int]:
    """``n`` answers of ``new_tokens`` tokens (sampled, no early stop) to :data:`QUESTION`: (sequences, prompt
    length)."""
    from rlkit.verl.launch.data import GSM8K_INSTRUCTION

    chat = [{"role": "user", "content": f"{QUESTION} {GSM8K_INSTRUCTION}"}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**prompt, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, num_return_sequences=n, pad_token_id=tokenizer.pad_token_id)
    return out, prompt["input_ids"].shape[1]


def step(model, sequences: torch.Tensor, prompt_len: int) -> float:
    """One forward + backward + AdamW step on the answers' token-mean negative log-likelihood; the loss."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    labels = sequences.clone()
    labels[:, :prompt_len] = -100  # the answers only, as a policy loss counts them
    loss = model(input_ids=sequences, labels=labels).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a directory `rlkit model smollm2` wrote")
    parser.add_argument("--answers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per answer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-step", action="store_true", help="skip the forward + backward + AdamW step")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    results: dict = {"threads": torch.get_num_threads(), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        path = args.model
        if path is None:
            from rlkit.models import convert

            path = Path(tmp) / "smollm2"
            timed("convert", results, convert, "smollm2", path, progress=None)
        model, tokenizer = timed("load", results, load, path)
        results["parameters"] = sum(p.numel() for p in model.parameters())
        sequences, prompt_len = timed("sample", results, sample, model, tokenizer, args.answers, args.tokens,
                                      args.seed)
        results.update(answers=args.answers, new_tokens=args.tokens, prompt_tokens=prompt_len)
        print("first answer:", repr(tokenizer.decode(sequences[0, prompt_len:], skip_special_tokens=True)))
        if not args.no_step:
            results["loss"] = round(timed("step", results, step, model, sequences, prompt_len), 4)
    results["load_average"] = round(os.getloadavg()[0], 2)
    line = json.dumps(results)
    print(line)
    if args.json:
        args.json.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
