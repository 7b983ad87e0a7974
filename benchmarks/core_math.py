"""rlkit's advantage estimators and policy losses against their peers, all measured in one run on this CPU.

Every row is a ratio measured in the same process, rlkit and its peer timed alternately in each repeat, so a
busy machine slows both: the ratio is the median of the per-repeat ratios, the ms columns are medians too.

- ``verl``: verl 0.9.1's fastest equivalent (``grpo_vectorized`` advantage, ``vanilla`` and ``gspo`` losses),
  called as verl's trainer calls it (token-level rewards in, ``(loss, metrics)`` out). Target: ratio ≤ 1.
- ``copy``: the copy floor, ``.clone()`` of the input tensors the function reads. Losses run forward +
  backward. Target for losses: ratio ≤ 3.
- ``loop``: a per-group Python loop written here (TLGA, ASPO), checked equal to rlkit's result first: one Python
  iteration per group, vectorised within the group (torch ops over the group's rows). Target for TLGA: rlkit
  ≥ 100× faster (ratio ≤ 0.01).

    python benchmarks/core_math.py              # B=8192, T=2048 (loops: B=1024, T=512), 5 repeats
    python benchmarks/core_math.py --small      # B=1024, T=512: a quick run
    python benchmarks/core_math.py --B 4096 --T 1024 --repeats 7
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

from rlkit.methods.aepo import aepo_advantage
from rlkit.methods.aspo import aspo_shape
from rlkit.methods.grpo import grpo_advantage
from rlkit.methods.hapo import adaptive_clip, entropy_stats, normalized_entropy, redistribute_advantage, tlga_advantage
from rlkit.methods.spo import spo_advantage
from rlkit.registry import get_policy_loss

ROWS: list[dict] = []


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def compare(method: str, ours: Callable[[], object], peer: Callable[[], object], peer_name: str, target: str,
            repeats: int) -> None:
    """Time ``ours`` and ``peer`` alternately ``repeats`` times after one warm-up each; record the medians."""
    log(f"  {method} vs {peer_name} ...")
    ours(), peer()
    a, b, ratios = [], [], []
    for i in range(repeats):
        if i % 2:
            tb, ta = _time(peer), _time(ours)
        else:
            ta, tb = _time(ours), _time(peer)
        a.append(ta), b.append(tb), ratios.append(ta / tb)
    ratio = statistics.median(ratios)
    bound = float(target.split()[-1].rstrip("x×")) if target != "-" else math.nan
    met = "-" if target == "-" else ("yes" if ratio <= bound else "NO")
    ROWS.append({"method": method, "peer": peer_name, "ours": statistics.median(a), "theirs": statistics.median(b),
                 "ratio": ratio, "target": target, "met": met})


def clones(*tensors: torch.Tensor) -> Callable[[], object]:
    return lambda: [t.clone() for t in tensors]


def fwd_bwd(loss_fn: Callable[[torch.Tensor], tuple], logp: torch.Tensor) -> Callable[[], object]:
    def run() -> None:
        lp = logp.detach().requires_grad_()
        out = loss_fn(lp)
        loss = out[0] if isinstance(out, tuple) else out.loss
        loss.backward()
    return run


# ------------------------------------------------------------------------------------------------ reference loops


def tlga_loop(rewards: torch.Tensor, ids: np.ndarray, mask: torch.Tensor, *, eps: float = 1e-6,
              threshold: float = 5.0) -> torch.Tensor:
    """HAPO's token-level group average, one Python iteration per group (as the released code does it)."""
    adv = torch.zeros_like(mask, dtype=rewards.dtype)
    for g in dict.fromkeys(ids.tolist()):
        rows = torch.as_tensor(np.flatnonzero(ids == g))
        r, m = rewards[rows], mask[rows]
        tokens = r.repeat_interleave(m.sum(-1).long())  # every valid token observes its sample's reward
        mean, std = tokens.mean(), tokens.std(unbiased=False) if tokens.numel() else torch.zeros(())
        a = ((r - mean) / (std + eps)).unsqueeze(-1) * m
        if (a.abs() >= threshold).any():  # fall back to GRPO's group advantage
            if len(rows) == 1:
                a = (r / (1.0 + eps)).unsqueeze(-1) * m
            else:
                a = ((r - r.mean()) / (r.std() + eps)).unsqueeze(-1) * m
        adv[rows] = a
    return adv


def aspo_loop(adv: torch.Tensor, ids: np.ndarray, correct: torch.Tensor, pos: torch.Tensor, lengths: torch.Tensor,
              *, delta: float = -2.0, k: float = 0.7) -> torch.Tensor:
    """ASPO Eq. 2, one Python iteration per group."""
    out = adv.clone()
    for g in dict.fromkeys(ids.tolist()):
        rows = torch.as_tensor(np.flatnonzero(ids == g))
        elig = correct[rows] & torch.isfinite(pos[rows]) & (pos[rows] >= 0)
        if not elig.any():
            continue
        p_bar, l_bar = pos[rows][elig].mean(), lengths[rows][elig].float().mean()
        if not (torch.isfinite(l_bar) and l_bar > 0):
            continue
        e = rows[elig]
        bound = k * adv[e].abs()
        raw = delta * (pos[e] - p_bar) / l_bar
        out[e] = adv[e] + torch.minimum(torch.maximum(raw, -bound), bound)
    return out


# ------------------------------------------------------------------------------------------------------- batches


def batch(B: int, T: int, seed: int = 0, group: int = 8) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    logp = -3.0 * torch.rand(B, T, generator=g)
    old = logp + 0.3 * torch.randn(B, T, generator=g)
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    ids = np.repeat(np.arange(B // group), group)[:B]
    token_rewards = torch.zeros(B, T)
    token_rewards[torch.arange(B), lengths - 1] = rewards
    entropy = 2.0 * torch.rand(B, T, generator=g)
    return {"mask": mask, "logp": logp, "old": old, "rewards": rewards, "ids": ids, "lengths": lengths,
            "token_rewards": token_rewards, "entropy": entropy, "gen": g}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=8192)
    p.add_argument("--T", type=int, default=2048)
    p.add_argument("--loop-B", type=int, default=1024)
    p.add_argument("--loop-T", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--small", action="store_true", help="B=1024, T=512 (a quick run)")
    args = p.parse_args()
    if args.small:
        args.B, args.T = 1024, 512
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    from verl.trainer.ppo import core_algos
    from verl.workers.config.actor import ActorConfig

    R = args.repeats
    log(f"batch B={args.B} T={args.T} float32, {torch.get_num_threads()} threads, {R} repeats")
    b = batch(args.B, args.T)
    mask, logp, old, ent = b["mask"], b["logp"], b["old"], b["entropy"]
    adv = grpo_advantage(b["rewards"], b["ids"], mask)
    cfg = lambda lo, hi, c=3.0: ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,  # noqa: E731
                                            clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c)

    log("advantage estimators")
    verl_grpo = core_algos.get_adv_estimator_fn("grpo_vectorized")
    ours_grpo = lambda: grpo_advantage(b["token_rewards"].sum(-1), b["ids"], mask)  # noqa: E731
    torch.testing.assert_close(ours_grpo(), verl_grpo(b["token_rewards"], mask, b["ids"])[0])
    compare("grpo_advantage", ours_grpo, lambda: verl_grpo(b["token_rewards"], mask, b["ids"]), "verl", "≤ 1x", R)
    compare("grpo_advantage", ours_grpo, clones(b["token_rewards"], mask), "copy", "-", R)
    base = torch.rand(args.B, generator=b["gen"], dtype=torch.float64)
    compare("spo_advantage", lambda: spo_advantage(b["rewards"], base, mask=mask), clones(b["rewards"], base, mask),
            "copy", "-", R)
    compare("tlga_advantage", lambda: tlga_advantage(b["rewards"], b["ids"], mask),
            clones(b["rewards"], mask), "copy", "-", R)
    compare("aepo_advantage", lambda: aepo_advantage(adv, ent, mask), clones(adv, ent, mask), "copy", "-", R)
    stats = entropy_stats(ent, mask)
    compare("hapo entropy_stats", lambda: entropy_stats(ent, mask), clones(ent, mask), "copy", "-", R)
    h = normalized_entropy(ent, stats)
    compare("hapo normalized_entropy", lambda: normalized_entropy(ent, stats), clones(ent), "copy", "-", R)
    compare("adaptive_clip", lambda: adaptive_clip(h, 0.2, 0.28), clones(h), "copy", "-", R)
    ratio = (logp - old).exp()
    eps_lo, eps_hi = adaptive_clip(h, 0.2, 0.28)
    compare("redistribute_advantage", lambda: redistribute_advantage(adv, h, ratio, eps_lo, eps_hi),
            clones(adv, h, ratio, eps_lo, eps_hi), "copy", "-", R)
    adv_seq = adv[:, 0].contiguous()
    correct = b["rewards"] > 0
    pos = torch.where(torch.rand(args.B, generator=b["gen"]) < 0.7, torch.randint(0, args.T, (args.B,)).float(),
                      torch.tensor(math.nan))
    compare("aspo_shape", lambda: aspo_shape(adv_seq, b["ids"], correct, pos, b["lengths"]),
            clones(adv_seq, correct, pos, b["lengths"]), "copy", "-", R)

    log("policy losses, forward + backward")
    vanilla, verl_gspo = core_algos.get_policy_loss_fn("vanilla"), core_algos.get_policy_loss_fn("gspo")
    floor4 = clones(logp, old, adv, mask)
    floor5 = clones(logp, old, adv, mask, ent)
    ppo = lambda lp: get_policy_loss("ppo")(lp, old, adv, mask, clip_c=3.0)  # noqa: E731
    compare("ppo_clip_loss", fwd_bwd(ppo, logp),
            fwd_bwd(lambda lp: vanilla(old, lp, adv, mask, "token-mean", cfg(0.2, 0.2)), logp), "verl", "≤ 1x", R)
    compare("ppo_clip_loss", fwd_bwd(ppo, logp), floor4, "copy", "≤ 3x", R)
    for variant in ("token", "sequence"):
        gs = lambda lp, v=variant: get_policy_loss("gspo")(lp, old, adv, mask, variant=v)  # noqa: E731
        name = f"gspo_loss ({variant})"
        if variant == "token":
            compare(name, fwd_bwd(gs, logp), fwd_bwd(
                lambda lp: verl_gspo(old, lp, adv, mask, "seq-mean-token-mean", cfg(3e-4, 4e-4)), logp), "verl",
                "≤ 1x", R)
        compare(name, fwd_bwd(gs, logp), floor4, "copy", "≤ 3x", R)
    aepo = lambda lp: get_policy_loss("aepo")(lp, old, adv, mask, entropy=ent)  # noqa: E731
    compare("aepo_loss", fwd_bwd(aepo, logp), floor5, "copy", "≤ 3x", R)
    hapo = lambda lp: get_policy_loss("hapo")(lp, old, adv, mask, entropy=ent)  # noqa: E731
    compare("hapo_loss", fwd_bwd(hapo, logp), floor5, "copy", "≤ 3x", R)

    log(f"loops, B={args.loop_B} T={args.loop_T}")
    s = batch(args.loop_B, args.loop_T, seed=1)
    torch.testing.assert_close(tlga_advantage(s["rewards"], s["ids"], s["mask"]), tlga_loop(s["rewards"], s["ids"], s["mask"]))
    compare("tlga_advantage", lambda: tlga_advantage(s["rewards"], s["ids"], s["mask"]),
            lambda: tlga_loop(s["rewards"], s["ids"], s["mask"]), "loop", "≤ 0.01x", R)
    a_seq = grpo_advantage(s["rewards"], s["ids"], s["mask"])[:, 0].contiguous()
    ok = s["rewards"] > 0
    p_s = torch.where(torch.rand(args.loop_B, generator=s["gen"]) < 0.7,
                      torch.randint(0, args.loop_T, (args.loop_B,)).float(), torch.tensor(math.nan))
    torch.testing.assert_close(aspo_shape(a_seq, s["ids"], ok, p_s, s["lengths"]),
                               aspo_loop(a_seq, s["ids"], ok, p_s, s["lengths"]))
    compare("aspo_shape", lambda: aspo_shape(a_seq, s["ids"], ok, p_s, s["lengths"]),
            lambda: aspo_loop(a_seq, s["ids"], ok, p_s, s["lengths"]), "loop", "-", R)

    print(f"\nB={args.B} T={args.T} (loops B={args.loop_B} T={args.loop_T}), float32, "
          f"{torch.get_num_threads()} threads, median of {R}; torch {torch.__version__}")
    head = f"{'method':<28} {'peer':<13} {'rlkit ms':>10} {'peer ms':>10} {'ratio':>8}  {'target':<9} met?"
    print(head)
    print("-" * len(head))
    for r in ROWS:
        print(f"{r['method']:<28} {r['peer']:<13} {r['ours']:>10.1f} {r['theirs']:>10.1f} {r['ratio']:>8.3f}  "
              f"{r['target']:<9} {r['met']}")
    print()
    for r in ROWS:
        if r["target"] == "-":
            continue
        verdict = "met" if r["met"] == "yes" else "NOT met"
        if r["peer"] == "loop":
            print(f"{verdict}: {r['method']} is {1 / r['ratio']:.0f}x faster than the per-group loop (target ≥ 100x)")
        else:
            print(f"{verdict}: {r['method']} takes {r['ratio']:.2f}x {r['peer']} (target {r['target']})")


if __name__ == "__main__":
    main()
