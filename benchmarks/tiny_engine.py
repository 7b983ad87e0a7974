"""Speed of the tiny engine against this machine's matmul limit, all measured in one run.

Prints one table: matmul GFLOP/s on the model's own GEMM shapes (the FLOP limit), the model's forward FLOPs per
token, sampler new-tokens/s for a batch of sequences and training tokens/s (forward + backward + AdamW step), each
with its ratio to the limit: tokens/s · FLOPs/token ÷ matmul FLOP/s. Medians of ``--repeats`` runs.

Sampling time includes the prompts' prefill; only new tokens are counted. FLOPs per token: forward 2·N
(N = parameters in matmuls: the blocks' weights and the output projection; the embedding lookup is free) + attention 4·d·n_layers·context (QKᵀ and AV, context = keys attended); training 3× the
forward. Sampling attends to the whole prefix (mean context = prompt + half the new tokens), training to a causal
half (mean context ≈ (L+1)/2).

    python benchmarks/tiny_engine.py              # defaults: 1 thread, 128 sequences × 64 new tokens
    python benchmarks/tiny_engine.py --threads 2 --batch 64
"""

from __future__ import annotations

import argparse
import statistics
import time

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


def matmul_flops(shapes: list[tuple[int, int, int]], repeats: int) -> float:
    """FLOP/s of running the (M, K) @ (K, N) products in ``shapes`` back to back (their FLOP-weighted rate)."""
    pairs = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in shapes]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    inner = max(1, int(2e9 // flops))  # ~2 GFLOP per timing so timer noise does not matter

    def run():
        for _ in range(inner):
            for a, b in pairs:
                torch.matmul(a, b)

    return flops * inner / _median_time(run, repeats)


def gemm_shapes(cfg: ModelConfig, rows: int) -> list[tuple[int, int, int]]:
    """The model's weight GEMMs for ``rows`` tokens at once (attention's batched products are left out)."""
    d, f = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    qkv = (cfg.n_heads + 2 * cfg.kv_heads) * cfg.d_head
    per_layer = [(rows, d, qkv), (rows, d, d), (rows, d, f), (rows, f, d)]
    return per_layer * cfg.n_layers + [(rows, d, cfg.vocab_size)]


def matmul_params(cfg: ModelConfig) -> int:
    return sum(k * n for _, k, n in gemm_shapes(cfg, 1))


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
    args = ap.parse_args()
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
    mm_decode = matmul_flops(gemm_shapes(cfg, args.batch), args.repeats)
    mm_train = matmul_flops(gemm_shapes(cfg, args.train_batch * args.train_len), args.repeats)
    mm_square = matmul_flops([(1024, 1024, 1024)], args.repeats)

    # ---- sampling: fixed length (ignore_eos) so every run does the same work; distinct prompts, and the
    # RL shape (batch / group prompts, each sampled group times: their prefill is shared)
    g = torch.Generator().manual_seed(0)
    letters = "abcdefghijklmnopqrstuvwxyz 0123456789"
    prompts = ["".join(letters[int(i)] for i in torch.randint(len(letters), (args.prompt_len,), generator=g))
               for _ in range(args.batch)]
    grouped = [p for p in prompts[: max(1, args.batch // args.group)] for _ in range(args.group)][: args.batch]

    def run_sample(ps=prompts):
        return sample(model, tok, ps, max_new_tokens=args.new_tokens, generator=g, ignore_eos=True)

    t_sample = _median_time(run_sample, args.repeats)
    sample_tps = args.batch * args.new_tokens / t_sample
    t_grouped = _median_time(lambda: run_sample(grouped), args.repeats)
    grouped_tps = len(grouped) * args.new_tokens / t_grouped

    # ---- training: forward + backward + AdamW step on full sequences
    ids = torch.randint(tok.vocab_size, (args.train_batch, args.train_len), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step():
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    t_train = _median_time(train_step, args.repeats)
    train_tps = args.train_batch * (args.train_len - 1) / t_train

    # ---- RL recompute: token_logprobs forward + backward on a sampled rollout (the policy-loss pass)
    roll = run_sample()
    seq, mask, start = roll.sequences()

    def logprob_step():
        logp, _ = token_logprobs(model, seq, mask, start)
        opt.zero_grad(set_to_none=True)
        logp.sum().backward()

    t_lp = _median_time(logprob_step, args.repeats)
    lp_tps = seq.shape[0] * (seq.shape[1] - 1) / t_lp
    fwd_flops_lp = 2 * n_mm + attn * seq.shape[1] / 2

    def ratio(tps: float, flops_per_token: float, limit: float) -> str:
        return f"{100 * tps * flops_per_token / limit:5.1f}%"

    print(f"torch {torch.__version__}, {args.threads} thread(s); model d={cfg.d_model} L={cfg.n_layers} "
          f"H={cfg.n_heads} Hkv={cfg.kv_heads} V={cfg.vocab_size}: {n_params / 1e6:.3f}M params "
          f"({n_mm / 1e6:.3f}M in matmuls); "
          f"median of {args.repeats}")
    rows = [
        ("matmul, model GEMMs, M = {} (decode)".format(args.batch), f"{mm_decode / 1e9:8.1f} GFLOP/s", ""),
        (f"matmul, model GEMMs, M = {args.train_batch * args.train_len} (train)", f"{mm_train / 1e9:8.1f} GFLOP/s", ""),
        ("matmul, 1024³ (for reference)", f"{mm_square / 1e9:8.1f} GFLOP/s", ""),
        ("forward FLOPs/token, sampling", f"{fwd_flops_sample / 1e6:8.2f} MFLOP",
         f"(2·{n_mm / 1e6:.2f}M + attention, ctx {sample_ctx:.0f})"),
        ("forward FLOPs/token, training", f"{fwd_flops_train / 1e6:8.2f} MFLOP",
         f"(×3 for fwd+bwd, ctx {(args.train_len + 1) / 2:.0f})"),
        (f"sampling {args.batch} distinct prompts × {args.new_tokens} new tokens", f"{sample_tps:8.0f} tok/s",
         f"{ratio(sample_tps, fwd_flops_sample, mm_decode)} of decode-GEMM limit, "
         f"{ratio(sample_tps, fwd_flops_sample, mm_train)} of train-GEMM limit ({t_sample:.2f} s)"),
        (f"sampling {len(grouped) // args.group} prompts × {args.group} × {args.new_tokens} new tokens",
         f"{grouped_tps:8.0f} tok/s",
         f"{ratio(grouped_tps, fwd_flops_sample, mm_decode)} of decode-GEMM limit ({t_grouped:.2f} s)"),
        (f"training {args.train_batch} × {args.train_len} (fwd+bwd+AdamW)", f"{train_tps:8.0f} tok/s",
         f"{ratio(train_tps, 3 * fwd_flops_train, mm_train)} of train-GEMM limit ({t_train * 1e3:.0f} ms/step)"),
        (f"token_logprobs fwd+bwd on the rollout {tuple(seq.shape)}", f"{lp_tps:8.0f} tok/s",
         f"{ratio(lp_tps, 3 * fwd_flops_lp, mm_train)} of train-GEMM limit ({t_lp * 1e3:.0f} ms)"),
    ]
    w0 = max(len(r[0]) for r in rows)
    print(f"| {'measure':<{w0}} | {'value':>16} | ratio |")
    print(f"|{'-' * (w0 + 2)}|{'-' * 18}|-------|")
    for name, value, note in rows:
        print(f"| {name:<{w0}} | {value:>16} | {note} |")


if __name__ == "__main__":
    main()
