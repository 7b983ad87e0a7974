"""What a learner reads to follow a method from its equation to the optimizer step, measured on a real run.

A one-step smoke run of the method is traced (``sys.settrace``) from the trainer's step (``rlkit.tiny.step.rl_step``)
down; every rlkit function called inside the step's advantage and policy-loss dispatch
(:func:`rlkit.registry.advantage`, :func:`rlkit.registry.policy_loss`) is one a learner reads, and so is the step
itself, from the rollout's rewards to ``optimizer.step()``. The sampler, the model and the evaluation are not on the
path (they are the same for every method). Comprehensions count as part of their function. Prints each file with
the functions read there and their source lines, then the totals: the functions' lines, and the whole files'.

    python benchmarks/read_path.py              # GSPO
    python benchmarks/read_path.py --method hapo
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from pathlib import Path

import rlkit
from rlkit import registry
from rlkit.tiny import rl, step
from rlkit.tiny.config import build_config

PACKAGE = Path(rlkit.__file__).parent
DISPATCH = {registry.advantage.__code__, registry.policy_loss.__code__}


def read_path(method: str) -> dict[str, dict[str, int]]:
    """File (relative to the package) → {function name: source lines} of the functions on ``method``'s path."""
    codes = {step.rl_step.__code__}
    depth = {"dispatch": 0}

    def tracer(frame, event, arg):
        code = frame.f_code
        if event == "call":
            if code in DISPATCH:
                depth["dispatch"] += 1
            if depth["dispatch"] and code.co_filename.startswith(str(PACKAGE)) and not code.co_name.startswith("<"):
                codes.add(code)
            return tracer
        if event == "return" and code in DISPATCH:
            depth["dispatch"] -= 1
        return tracer

    with tempfile.TemporaryDirectory() as tmp:
        sys.settrace(tracer)
        try:
            rl.train(build_config(method, "smoke", {"steps": 1}), Path(tmp) / "run", progress=False,
                     sft_cache=Path(tmp) / "sft")
        finally:
            sys.settrace(None)
    out: dict[str, dict[str, int]] = {}
    for code in codes:
        lines, _ = inspect.getsourcelines(code)
        out.setdefault(str(Path(code.co_filename).relative_to(PACKAGE)), {})[code.co_qualname] = len(lines)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="gspo", choices=registry.list_methods()["method"])
    args = p.parse_args()
    path = read_path(args.method)
    for name, functions in sorted(path.items()):
        print(f"rlkit/{name}: {sum(functions.values())} lines — " + ", ".join(
            f"{f} ({n})" for f, n in sorted(functions.items(), key=lambda kv: -kv[1])))
    total = sum(sum(f.values()) for f in path.values())
    whole = sum(len((PACKAGE / name).read_text().splitlines()) for name in path)
    print(f"\n{args.method}: {len(path)} files; {total} lines of the functions on the path from the equation to the "
          f"optimizer step, {whole} lines in those files")


if __name__ == "__main__":
    main()
