"""Speed of the tiny engine against this machine's matmul limit, all measured in one run.

Prints one table: matmul GFLOP/s on the model's own GEMM shapes (the FLOP limit), the model's forward FLOPs per
token, sampler new-tokens/s for a batch of sequences and training tokens/s (forward + backward + AdamW step), each
with its ratio to the limit: tokens/s · FLOPs/token ÷ matmul FLOP/s. Medians of ``--repeats`` runs.

Each timed run is paired with a measurement of the limit taken just before it, and a ratio is the median of the
runs' own ratios: other processes share this CPU, and a limit measured once, at a quiet or a busy moment, would
skew every ratio after it.

rlkit is imported before torch, so every measure runs the float kernels rlkit pins for its runs
(:mod:`rlkit.numerics`; ``RLKIT_NUMERICS=native`` measures the libraries' own choice).

Sampling time includes the prompts' prefill (its share is printed too); only new tokens are counted. FLOPs per token: forward 2·N
(N = parameters in matmuls: the blocks' weights and the output projection; the embedding lookup is free) + attention 4·d·n_layers·context (QKᵀ and AV, context = keys attended); training 3× the
forward. Sampling attends to the whole prefix (mean context = prompt + half the new tokens), training to a causal
half (mean context ≈ (L+1)/2).

    python benchmarks/tiny_engine.py              # defaults: 1 thread, 128 sequences × 64 new tokens
    python benchmarks/tiny_engine.py --threads 2 --batch 64

Whole-run mode (``--runs``): trains whole reproduction runs as ``rlkit reproduce``'s workers do (cpu scale, one
thread, the numerics :mod:`rlkit.numerics` pins, the shipped SFT start) into a temporary folder and prints where
each run's time goes — CPU-seconds (``time.process_time``) and wall seconds per phase: the update's forward
(``token_logprobs``), backward and optimizer step, generation, the evaluation every ``eval_every``, the final
evaluation, the stale policy's evaluation, and the rest (warm start, advantages, metrics, checkpoints). Phases are
timed by wrapping the engine's functions, exclusively (a phase's time excludes the phases it calls).

    python benchmarks/tiny_engine.py --runs grpo grpo:stress      # one standard and one stress run
    python benchmarks/tiny_engine.py --runs grpo --set steps=5    # a shorter run

Evaluation-and-sampling mode (``--eval N``): the shipped SFT start of the cpu-scale GRPO run evaluates the first N
held-out problems of the final evaluation's split greedily (:func:`rlkit.tiny.task.evaluate`) and samples a step's
rollout (``prompts_per_step × group_size`` pool problems, seeded), ``--repeats`` times each, one thread, pinned
numerics; prints CPU-seconds (``time.process_time``) and writes the per-problem results and the sampled texts to
``--keep`` (a JSON file), to compare two versions of the engine run side by side (``PYTHONPATH=<other checkout>``).
``--compact EVERY:RUNNING`` sets the sampler's schedule for dropping finished rows (where the sampler has one).

    python benchmarks/tiny_engine.py --eval 1000 --repeats 3 --keep new.json

``--ops`` (with ``--eval``): one more evaluation and one more rollout under ``torch.profiler``, each op's own CPU
time grouped into the weights' GEMMs (``mm``, ``addmm``), attention's products (``bmm``, the prefill's fused
attention) and every other op (copies, concatenations, masks, elementwise and indexing ops: work that a fused
decode step would save), with the ten most costly ops.

    python benchmarks/tiny_engine.py --eval 256 --repeats 1 --ops
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import rlkit  # noqa: F401  (pins the float kernels before torch loads, as the reproduction's workers do)
import torch

from rlkit.tiny.model import ModelConfig, TinyDecoder, token_logprobs
from rlkit.tiny.sampler import sample
from rlkit.tiny.tokenizer import CharTokenizer

try:  # the task's alphabet when the arithmetic module is there; the size is what matters here
    from rlkit.tasks.arithmetic import ALPHABET
except ImportError:
    ALPHABET = "0123456789+-*/=()#$.,:;?!' abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"


def _median_time(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class MatmulLimit:
    """FLOP/s of running the (M, K) @ (K, N) products in ``shapes`` back to back (their FLOP-weighted rate)."""

    def __init__(self, shapes: list[tuple[int, int, int]]):
        self.pairs = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in shapes]
        self.flops = sum(2 * m * k * n for m, k, n in shapes)
        self.inner = max(1, int(2e9 // self.flops))  # ~2 GFLOP per timing so timer noise does not matter
        self.measured: list[float] = []  # every measurement taken, for the table

    def measure(self) -> float:
        t0 = time.perf_counter()
        for _ in range(self.inner):
            for a, b in self.pairs:
                torch.matmul(a, b)
        self.measured.append(self.flops * self.inner / (time.perf_counter() - t0))
        return self.measured[-1]


def paired(fn, limit: MatmulLimit, repeats: int) -> tuple[float, float]:
    """(median seconds of ``fn``, median of limit·seconds): each run of ``fn`` right after a measurement of the
    limit, so a ratio work/(seconds·limit) compares with the machine's speed at that moment."""
    fn()
    limit.measure()
    times, products = [], []
    for _ in range(repeats):
        flops = limit.measure()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        products.append(times[-1] * flops)
    return statistics.median(times), statistics.median(products)


def gemm_shapes(cfg: ModelConfig, rows: int) -> list[tuple[int, int, int]]:
    """The model's weight GEMMs for ``rows`` tokens at once (attention's batched products are left out)."""
    d, f = cfg.d_model, cfg.ffn
    qkv = (cfg.n_heads + 2 * cfg.kv_heads) * cfg.d_head
    per_layer = [(rows, d, qkv), (rows, d, d), (rows, d, 2 * f), (rows, f, d)]  # gate and up fused
    return per_layer * cfg.n_layers + [(rows, d, cfg.vocab_size)]


def matmul_params(cfg: ModelConfig) -> int:
    return sum(k * n for _, k, n in gemm_shapes(cfg, 1))

# ------------------------------------------------------------------------------------------------ whole runs
PHASES = ("update: forward", "update: backward", "update: optimizer", "generation", "evaluation (every eval_every)",
          "evaluation (final)", "stale policy's evaluation", "other")


class PhaseClock:
    """Exclusive CPU and wall seconds per phase: entering a phase charges the time so far to the enclosing one."""

    def __init__(self):
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.stack = ["other"]
        self.mark = (time.process_time(), time.perf_counter())

    def _charge(self) -> None:
        now = (time.process_time(), time.perf_counter())
        self.cpu[self.stack[-1]] += now[0] - self.mark[0]
        self.wall[self.stack[-1]] += now[1] - self.mark[1]
        self.mark = now

    @contextlib.contextmanager
    def phase(self, name: str):
        self._charge()
        self.stack.append(name)
        try:
            yield
        finally:
            self._charge()
            self.stack.pop()

    def wrap(self, owner, attr: str, name) -> None:
        """Time ``owner.attr`` as phase ``name`` (a string, or ``name(*args, **kwargs)`` choosing one: None = the
        enclosing phase's)."""
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            label = name(*args, **kwargs) if callable(name) else name
            if label is None:
                return fn(*args, **kwargs)
            with self.phase(label):
                return fn(*args, **kwargs)

        setattr(owner, attr, timed)


def profile_run(method: str, regime: str, sets: dict, out: Path, scale: str = "cpu") -> tuple[PhaseClock, Any]:
    """Train one run of ``method`` in ``regime`` at ``scale`` into ``out`` with every phase timed; (clock, config)."""
    from rlkit.tiny import rl, sft, step, task
    from rlkit.tiny.config import build_config

    cfg = build_config(method, scale, {"seed": 0, **sets}, regime=regime)
    clock = PhaseClock()
    saved = {(o, a): getattr(o, a) for o, a in ((step, "rollout"), (sft, "rollout"), (rl, "evaluate"),
                                                (step, "policy_eval"), (step, "token_logprobs"),
                                                (task, "token_logprobs"),
                                                (torch.autograd, "backward"), (torch.autograd, "grad"),
                                                (torch.optim.Adam, "step"),
                                                (torch.nn.utils, "clip_grad_norm_"))}
    after_eval = [False]  # the final evaluation is the one that follows the last step's, with no rollout between

    def which_eval(*args, **kw):
        label = "evaluation (final)" if after_eval[0] else "evaluation (every eval_every)"
        after_eval[0] = True
        return label

    def which_rollout(*args, **kw):  # the stale policy's rollout is timed by policy_eval around it
        after_eval[0] = False
        return None if clock.stack[-1] == "stale policy's evaluation" else "generation"

    try:
        for owner in (step, sft):  # the training's rollouts, and SPO's offline pass
            clock.wrap(owner, "rollout", which_rollout)
        clock.wrap(rl, "evaluate", which_eval)
        clock.wrap(step, "policy_eval", "stale policy's evaluation")
        for owner in (step, task):
            clock.wrap(owner, "token_logprobs", "update: forward")
        clock.wrap(torch.autograd, "backward", "update: backward")
        clock.wrap(torch.autograd, "grad", "update: backward")
        clock.wrap(torch.optim.Adam, "step", "update: optimizer")
        clock.wrap(torch.nn.utils, "clip_grad_norm_", "update: optimizer")
        rl.train(cfg, out, progress=False)
        clock._charge()
    finally:
        for (owner, attr), fn in saved.items():
            setattr(owner, attr, fn)
    return clock, cfg


def whole_runs(specs: list[str], sets: dict, threads: int, keep: str | None, scale: str = "cpu") -> None:
    """``--runs``: train each ``method[:regime]`` and print its phases (see the module doc)."""
    from rlkit import numerics

    torch.set_num_threads(threads)
    kernels = numerics.kernels()
    print(f"torch {torch.__version__}, {threads} thread(s), numerics {kernels['mode']} "
          f"(in force: {kernels['in_force']}, {kernels['aten_cpu_capability']}, MKL_CBWR={kernels['mkl_cbwr']})")
    for spec in specs:
        method, _, regime = spec.partition(":")
        regime = regime or "standard"
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / f"{method}-{regime}"
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            clock, cfg = profile_run(method, regime, sets, out, scale)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            if keep:
                dest = Path(keep) / out.name
                dest.mkdir(parents=True, exist_ok=True)
                for name in ("metrics.jsonl", "eval.jsonl"):
                    (dest / name).write_bytes((out / name).read_bytes())
        total_cpu, total_wall = sum(clock.cpu.values()), sum(clock.wall.values())
        rusage = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        print(f"\n{method} ({regime}): {cfg.steps} steps, {cfg.prompts_per_step}×{cfg.group_size} responses, "
              f"{cfg.mini_batches} mini-batches, staleness {cfg.staleness}; {total_cpu:.1f} CPU-s "
              f"(getrusage {rusage:.1f}), {total_wall:.1f} wall-s")
        print(f"| {'phase':<30} | CPU-s  | share | wall-s |")
        print(f"|{'-' * 32}|--------|-------|--------|")
        for name in PHASES:
            print(f"| {name:<30} | {clock.cpu[name]:6.1f} | {100 * clock.cpu[name] / total_cpu:4.1f}% "
                  f"| {clock.wall[name]:6.1f} |")
        print("RESULT " + json.dumps({"run": spec, "cpu_s": total_cpu, "wall_s": total_wall,
                                      "phases_cpu_s": clock.cpu}))


# ------------------------------------------------------------------------------------------------ eval and sampling
OP_GROUPS = {"weights' GEMMs": ("aten::mm", "aten::addmm"),
             "attention's products": ("aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")}
"""``--ops``: the ops whose own time is a matmul; every other op is counted as the rest."""


def op_table(name: str, fn) -> dict[str, float]:
    """Run ``fn`` once plainly (CPU-seconds, ``time.process_time``) and once under ``torch.profiler``, and print
    each op group's share of the ops' own CPU time (:data:`OP_GROUPS`, the rest of the ops) and the ten most costly
    ops; what the ops' own time leaves of the plain run is Python outside them (the sampler's loop, encoding,
    decoding and scoring). Returns the groups' seconds."""
    from torch.profiler import ProfilerActivity, profile

    t0 = time.process_time()
    fn()
    plain = time.process_time() - t0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ops)
    seconds = {g: sum(e.self_cpu_time_total for e in ops if e.key in keys) / 1e6 for g, keys in OP_GROUPS.items()}
    seconds["the rest of the ops"] = total / 1e6 - sum(seconds.values())
    print(f"{name}: {plain:.2f} CPU-s; the ops' own time {total / 1e6:.2f} s in {sum(e.count for e in ops):,} ops "
          "(profiled): " + ", ".join(f"{g} {s / (total / 1e6):.0%}" for g, s in seconds.items()))
    for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:10]:
        print(f"  {e.key:52s} {e.self_cpu_time_total / 1e6:7.3f} s {e.self_cpu_time_total / total:6.1%}  × {e.count}")
    return seconds


def eval_and_sample(n: int, repeats: int, threads: int, keep: str | None, compact: str | None,
                    seeds: int, ops: bool = False) -> None:
    """``--eval N``: greedy evaluation of N held-out problems and a step's sampled rollout (see the module doc)."""
    from rlkit import numerics
    from rlkit.tasks import arithmetic
    from rlkit.tiny import sampler, task
    from rlkit.tiny.config import build_config
    from rlkit.tiny.sft import warm_start

    torch.set_num_threads(threads)
    if compact:
        every, running = compact.split(":")
        sampler.COMPACT_EVERY, sampler.COMPACT_RUNNING = int(every), float(running)
    cfg = build_config("grpo", "cpu", {"seed": 0})
    model, tok, _ = warm_start(cfg.sft, progress=False)
    model.eval()
    knobs, form = dataclasses.asdict(cfg.sft.task), cfg.sft.form
    problems = arithmetic.make_split(n, "test", seed=0, **knobs)
    pool = arithmetic.make_pool(cfg.pool_size, seed=cfg.sft.seed, **knobs)
    max_new = cfg.max_new_tokens or task.max_response_tokens(cfg.sft.task, form)
    step = [p for p in pool[: cfg.prompts_per_step] for _ in range(cfg.group_size)]

    def roll(seed: int):
        gen = torch.Generator().manual_seed(seed)
        return task.rollout(model, tok, step, max_new_tokens=max_new, form=form, temperature=cfg.temperature,
                            generator=gen)

    eval_s, sample_s = [], []
    for _ in range(repeats):
        t0 = time.process_time()
        correct = task.evaluate(model, tok, problems, max_new_tokens=max_new, form=form)
        eval_s.append(time.process_time() - t0)
        t0 = time.process_time()
        roll(0)
        sample_s.append(time.process_time() - t0)
    rollouts = [roll(seed) for seed in range(seeds)]
    result = {"rlkit": str(Path(sampler.__file__).parent), "numerics": numerics.kernels()["mode"],
              "compact": [getattr(sampler, "COMPACT_EVERY", 8), getattr(sampler, "COMPACT_RUNNING", 0.5)],
              "eval_cpu_s": eval_s, "sample_cpu_s": sample_s, "accuracy": task.accuracy(correct),
              "correct": correct.int().tolist(), "texts": [r.texts for r in rollouts],
              "mean_length": statistics.mean(float(r.lengths.float().mean()) for r in rollouts),
              "mean_reward": statistics.mean(float(task.score_rollout(r, step).rewards.mean()) for r in rollouts)}
    print(f"{n} problems: evaluation {statistics.median(eval_s):.2f} CPU-s (median of {repeats}: "
          f"{', '.join(f'{x:.2f}' for x in eval_s)}), accuracy {result['accuracy']:.3f}; a step's rollout "
          f"({len(step)} responses) {statistics.median(sample_s):.2f} CPU-s; {seeds} seeded rollouts: mean length "
          f"{result['mean_length']:.2f}, mean reward {result['mean_reward']:.3f}")
    if hasattr(sampler, "COMPACT_EVERY"):  # the drop schedule changes no sampled token: look for one
        saved = sampler.COMPACT_EVERY, sampler.COMPACT_RUNNING
        texts = []
        for schedule in ((1, 1.0), (10**9, 0.0)):  # finished rows dropped at every step; never
            sampler.COMPACT_EVERY, sampler.COMPACT_RUNNING = schedule
            texts.append([roll(seed).texts for seed in range(seeds)])
        sampler.COMPACT_EVERY, sampler.COMPACT_RUNNING = saved
        same = sum(a == b == c for x, y, z in zip(texts[0], texts[1], result["texts"]) for a, b, c in zip(x, y, z))
        result["schedule_equal"] = same
        print(f"sampled texts equal under drops at every step, never and the default: {same}/{seeds * len(step)}")
    if ops:
        op_table(f"greedy evaluation of {n} problems",
                 lambda: task.evaluate(model, tok, problems, max_new_tokens=max_new, form=form))
        op_table(f"a step's rollout ({len(step)} responses)", lambda: roll(0))
    if keep:
        Path(keep).write_text(json.dumps(result))
    print("RESULT " + json.dumps({k: result[k] for k in ("rlkit", "compact", "eval_cpu_s", "sample_cpu_s",
                                                           "accuracy", "mean_length", "mean_reward")}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: as fast as 2 on a shared 2-core CPU)")
    ap.add_argument("--batch", type=int, default=128, help="sequences sampled at once")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt in the grouped row (GRPO: 16 × 8)")
    ap.add_argument("--prompt-len", type=int, default=96, help="prompt characters (a word problem is ~100)")
    ap.add_argument("--new-tokens", type=int, default=64, help="new tokens per sequence (a solution is ~50)")
    ap.add_argument("--train-batch", type=int, default=32, help="training sequences per step")
    ap.add_argument("--train-len", type=int, default=160, help="training sequence length")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-kv-heads", type=int, default=None, help="grouped-query attention (default: n-heads)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", nargs="+", metavar="METHOD[:REGIME]",
                    help="whole-run mode: train these cpu-scale runs (e.g. grpo grpo:stress) and print their phases")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="whole-run mode: settings (steps=5)")
    ap.add_argument("--scale", default="cpu", help="whole-run mode: the runs' scale (the reproduction's: cpu)")
    ap.add_argument("--keep", help="whole-run mode: copy each run's metrics.jsonl and eval.jsonl under this folder; "
                                   "--eval mode: write the results to this JSON file")
    ap.add_argument("--eval", type=int, metavar="N",
                    help="evaluation-and-sampling mode: evaluate N held-out problems, sample a step's rollout")
    ap.add_argument("--compact", metavar="EVERY:RUNNING", help="--eval mode: the sampler's finished-row schedule")
    ap.add_argument("--seeds", type=int, default=4, help="--eval mode: seeded rollouts whose texts are kept")
    ap.add_argument("--ops", action="store_true", help="--eval mode: where decoding's time goes, op by op")
    args = ap.parse_args()
    if args.eval:
        eval_and_sample(args.eval, args.repeats, args.threads, args.keep, args.compact, args.seeds, args.ops)
        return
    if args.runs:
        from rlkit.tiny.config import parse_sets

        whole_runs(args.runs, parse_sets(args.set), args.threads, args.keep, args.scale)
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    tok = CharTokenizer(ALPHABET)
    cfg = ModelConfig(
        vocab_size=tok.vocab_size, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        max_len=max(args.prompt_len + args.new_tokens + 1, args.train_len),
    )
    model = TinyDecoder(cfg)
    n_params, n_mm = model.num_params(), matmul_params(cfg)
    attn = 4 * cfg.d_model * cfg.n_layers  # per key attended: q·k and p·v over all query heads
    sample_ctx = args.prompt_len + 1 + args.new_tokens / 2
    fwd_flops_sample = 2 * n_mm + attn * sample_ctx
    fwd_flops_train = 2 * n_mm + attn * (args.train_len + 1) / 2

    # ---- the limit: matmul FLOP/s on the model's GEMMs (decode: one token per sequence; training: B·L rows)
    mm_decode = MatmulLimit(gemm_shapes(cfg, args.batch))
    mm_train = MatmulLimit(gemm_shapes(cfg, args.train_batch * args.train_len))
    mm_square = MatmulLimit([(1024, 1024, 1024)])
    for _ in range(args.repeats):
        mm_square.measure()

    # ---- sampling: fixed length (ignore_eos) so every run does the same work; distinct prompts, and the
    # RL shape (batch / group prompts, each sampled group times: their prefill is shared)
    g = torch.Generator().manual_seed(0)
    letters = "abcdefghijklmnopqrstuvwxyz 0123456789"
    prompts = ["".join(letters[int(i)] for i in torch.randint(len(letters), (args.prompt_len,), generator=g))
               for _ in range(args.batch)]
    grouped = [p for p in prompts[: max(1, args.batch // args.group)] for _ in range(args.group)][: args.batch]

    def run_sample(ps=prompts):
        return sample(model, tok, ps, max_new_tokens=args.new_tokens, generator=g, ignore_eos=True)

    t_sample, lt_sample = paired(run_sample, mm_decode, args.repeats)
    sample_tps = args.batch * args.new_tokens / t_sample
    t_grouped, lt_grouped = paired(lambda: run_sample(grouped), mm_decode, args.repeats)
    grouped_tps = len(grouped) * args.new_tokens / t_grouped

    def prefill():  # the sampler's first forward: every prompt, keys/values kept, last position's logits
        ids, mask = tok.encode_batch(prompts)
        with torch.inference_mode():
            model(ids, attention_mask=mask, kv_cache=model.new_cache(len(prompts), ids.shape[1] + 1), last_only=True)

    t_prefill = _median_time(prefill, args.repeats)

    # ---- training: forward + backward + AdamW step on full sequences
    ids = torch.randint(tok.vocab_size, (args.train_batch, args.train_len), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step():
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    t_train, lt_train = paired(train_step, mm_train, args.repeats)
    train_tps = args.train_batch * (args.train_len - 1) / t_train

    # ---- RL recompute: token_logprobs forward + backward on a sampled rollout (the policy-loss pass)
    roll = run_sample()
    seq, mask, start = roll.sequences()

    def logprob_step():
        logp, _ = token_logprobs(model, seq, mask, start)
        opt.zero_grad(set_to_none=True)
        logp.sum().backward()

    t_lp, lt_lp = paired(logprob_step, mm_train, args.repeats)
    lp_tps = seq.shape[0] * (seq.shape[1] - 1) / t_lp
    fwd_flops_lp = 2 * n_mm + attn * seq.shape[1] / 2

    # ---- the same on the GRPO layout (each prompt answered `group` times): its prompts run once per chunk of rows, or
    # each row whole (share_prompts=False), timed alternately
    gseq, gmask, gstart = run_sample(grouped).sequences()

    def grouped_step(share: bool):
        logp, _ = token_logprobs(model, gseq, gmask, gstart, share_prompts=share)
        opt.zero_grad(set_to_none=True)
        logp.sum().backward()

    shared_t, whole_t = [], []
    for _ in range(args.repeats):
        shared_t.append(_median_time(lambda: grouped_step(True), 1, warmup=0))
        whole_t.append(_median_time(lambda: grouped_step(False), 1, warmup=0))
    t_shared, t_whole = statistics.median(shared_t), statistics.median(whole_t)
    speedups = sorted(w / s for w, s in zip(whole_t, shared_t))

    def ratio(n_tokens: float, flops_per_token: float, limit_seconds: float) -> str:
        """Work done ÷ what the limit does in the run's time (the median of the paired runs' products)."""
        return f"{100 * n_tokens * flops_per_token / limit_seconds:5.1f}%"

    print(f"torch {torch.__version__}, {args.threads} thread(s); model d={cfg.d_model} L={cfg.n_layers} "
          f"H={cfg.n_heads} Hkv={cfg.kv_heads} V={cfg.vocab_size}: {n_params / 1e6:.3f}M params "
          f"({n_mm / 1e6:.3f}M in matmuls); "
          f"median of {args.repeats}")
    def gflops(limit: MatmulLimit) -> str:
        return f"{statistics.median(limit.measured) / 1e9:8.1f} GFLOP/s"

    def spread(limit: MatmulLimit) -> str:
        return f"median; {min(limit.measured) / 1e9:.0f}–{max(limit.measured) / 1e9:.0f} over the run"

    n_new = args.batch * args.new_tokens
    rows = [
        (f"matmul, model GEMMs, M = {args.batch} (decode)", gflops(mm_decode), spread(mm_decode)),
        (f"matmul, model GEMMs, M = {args.train_batch * args.train_len} (train)", gflops(mm_train), spread(mm_train)),
        ("matmul, 1024³ (for reference)", gflops(mm_square), spread(mm_square)),
        ("forward FLOPs/token, sampling", f"{fwd_flops_sample / 1e6:8.2f} MFLOP",
         f"(2·{n_mm / 1e6:.2f}M + attention, ctx {sample_ctx:.0f})"),
        ("forward FLOPs/token, training", f"{fwd_flops_train / 1e6:8.2f} MFLOP",
         f"(×3 for fwd+bwd, ctx {(args.train_len + 1) / 2:.0f})"),
        (f"sampling {args.batch} distinct prompts × {args.new_tokens} new tokens", f"{sample_tps:8.0f} tok/s",
         f"{ratio(n_new, fwd_flops_sample, lt_sample)} of decode-GEMM limit ({t_sample:.2f} s, of which "
         f"prefill {t_prefill:.2f} s)"),
        (f"sampling {len(grouped) // args.group} prompts × {args.group} × {args.new_tokens} new tokens",
         f"{grouped_tps:8.0f} tok/s",
         f"{ratio(len(grouped) * args.new_tokens, fwd_flops_sample, lt_grouped)} of decode-GEMM limit "
         f"({t_grouped:.2f} s)"),
        (f"training {args.train_batch} × {args.train_len} (fwd+bwd+AdamW)", f"{train_tps:8.0f} tok/s",
         f"{ratio(args.train_batch * (args.train_len - 1), 3 * fwd_flops_train, lt_train)} of train-GEMM limit "
         f"({t_train * 1e3:.0f} ms/step)"),
        (f"token_logprobs fwd+bwd on the rollout {tuple(seq.shape)}", f"{lp_tps:8.0f} tok/s",
         f"{ratio(seq.shape[0] * (seq.shape[1] - 1), 3 * fwd_flops_lp, lt_lp)} of train-GEMM limit "
         f"({t_lp * 1e3:.0f} ms)"),
        (f"token_logprobs fwd+bwd, {len(grouped) // args.group} prompts × {args.group}, prompts run once",
         f"{gseq.shape[0] * (gseq.shape[1] - 1) / t_shared:8.0f} tok/s",
         f"{statistics.median(speedups):.2f}× each row whole ({t_shared * 1e3:.0f} vs {t_whole * 1e3:.0f} ms; "
         f"{speedups[0]:.2f}–{speedups[-1]:.2f}× over the run)"),
    ]
    w0 = max(len(r[0]) for r in rows)
    print(f"| {'measure':<{w0}} | {'value':>16} | ratio |")
    print(f"|{'-' * (w0 + 2)}|{'-' * 18}|-------|")
    for name, value, note in rows:
        print(f"| {name:<{w0}} | {value:>16} | {note} |")


if __name__ == "__main__":
    main()
