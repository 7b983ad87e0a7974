"""The RL stage of the tiny engine: rollout → reward → advantage → loss → step, for every method.

:func:`train` reads top to bottom. Each step samples responses to prompts from a fixed training pool (groups of
``group_size`` answers per prompt; SPO: one answer per prompt drawn by its weighted sampler), scores them with
rlkit's one answer rule, turns rewards into advantages with the method's estimator, and takes ``mini_batches``
optimizer steps on the method's policy loss — the *same* functions from :mod:`rlkit.methods` that the verl plugin
registers. Metric names are verl's, written to ``metrics.jsonl`` in verl's ``file`` logger format.

Nothing is lost when a run is killed: after every step the model, the optimizer, every random generator and the
method's state (SPO's tracker, sampler and stored responses, HAPO's entropy statistics) are written atomically,
and the metrics line of a step is written before its checkpoint, so ``resume=True`` truncates the metrics to the
checkpoint's step and redoes the rest bit for bit.

Options every method can use: dynamic sampling (DAPO; AReaL's GSPO example) — sample ``dynamic_oversample``
times the groups, keep the first ``prompts_per_step`` whose rewards are not all equal — and DAPO's overlong
penalty, a linear reward penalty over the last ``overlong_buffer`` tokens of the response budget.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

import rlkit
from rlkit.core.masked import masked_mean
from rlkit.methods import aepo, aspo, grpo, gspo, hapo, spo
from rlkit.metrics import MetricsWriter
from rlkit.tasks import arithmetic
from rlkit.tiny.model import token_logprobs
from rlkit.tiny.sft import SFTConfig, warm_start
from rlkit.tiny.task import (
    evaluate, max_response_tokens, response_logprobs, rollout, score_rollout, select_rows,
)

Tensor = torch.Tensor
METHODS = ("grpo", "gspo", "aspo", "aepo", "spo", "hapo")


@dataclass
class RLConfig:
    """One tiny-engine run. Field names are the CLI's ``--set`` keys and the notebooks' parameters."""

    method: str = "grpo"
    """Which method: grpo, gspo, aspo, aepo, spo or hapo."""
    scale: str = "cpu"
    """The preset these settings started from (smoke, cpu, gpu; see ``SCALES``), recorded for figure captions."""
    seed: int = 0
    """Seeds prompt choice, sampling and mini-batch order (the SFT checkpoint has its own seed)."""
    steps: int = 40
    """RL steps (one rollout batch each). 40 at cpu scale: held-out accuracy plateaus by step 20–30 and the methods'
    mechanisms (first-call position, zero-advantage share, clipping) have separated by then, while the six methods,
    their notebooks and the book fit in 20 minutes on a 2-core CPU (reproductions/LOG.md)."""
    prompts_per_step: int = 16
    """Prompts per rollout batch."""
    group_size: int = 8
    """Responses per prompt (GRPO's G). SPO uses 1 and draws ``group_size`` times the prompts instead."""
    pool_size: int = 512
    """Fixed pool of training prompts every method draws from (SPO's tracker needs prompts that come back)."""
    temperature: float = 1.0
    """Sampling temperature (HAPO adapts it per token around this value)."""
    max_new_tokens: int | None = None
    """Response budget in tokens; None fits every gold solution of the task."""
    lr: float = 1e-4
    """Adam learning rate of the RL stage. Measured here (GRPO, SFT start 51%): 3e-4 and above drift the tiny
    model off its SFT optimum (held-out accuracy falls 5–25 points); 1e-4 holds it (reproductions/LOG.md)."""
    warmup_steps: int = 10
    """Linear learning-rate warm-up over the first RL steps (as the HAPO/DAPO recipes): Adam's first,
    sign-like updates at full rate knock a freshly fine-tuned model off its SFT optimum."""
    mini_batches: int = 2
    """Optimizer steps per rollout batch; ≥ 2 takes the later ones off-policy, so ratios leave 1 and clips act."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    eval_every: int = 10
    """Greedy held-out accuracy (``val/acc``) every this many steps, at step 0 and at the last step."""
    eval_size: int = 200
    """Held-out problems for ``val/acc``."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (DAPO), refilled from ``dynamic_oversample``× as many groups."""
    dynamic_oversample: int = 2
    """How many times ``prompts_per_step`` groups are sampled when ``dynamic_sampling`` is on."""
    overlong_buffer: int = 0
    """DAPO's soft overlong penalty: the last this-many tokens of the budget cost reward linearly (0: off)."""
    overlong_penalty: float = 1.0
    """Reward lost at the very end of the budget."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The warm start (cached by its hash; the task knobs live here)."""
    grpo: grpo.Config = field(default_factory=lambda: grpo.Config(clip_high=0.28, clip_c=3.0))
    """GRPO's advantage and PPO-clip loss (also ASPO's base). Clip-higher 0.28 and dual clip 3 as in DAPO/verl."""
    gspo: gspo.Config = field(default_factory=gspo.Config)
    """GSPO's sequence-ratio loss."""
    aspo: aspo.Config = field(default_factory=aspo.Config)
    """ASPO's shaping of GRPO's advantage."""
    aepo: aepo.Config = field(default_factory=aepo.Config)
    """AEPO's entropy-aware advantage and stop-gradient clip."""
    spo: spo.Config = field(default_factory=spo.Config)
    """SPO's value tracker, forgetting factor, prompt sampler and PPO clip."""
    hapo: hapo.Config = field(default_factory=hapo.Config)
    """HAPO's adaptive temperature, TLGA, redistribution and adaptive clip."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; valid: {', '.join(METHODS)}")
        if self.method == "spo" and self.dynamic_sampling:
            raise ValueError("dynamic sampling filters groups; SPO has one response per prompt and no groups")
        if self.method == "aspo" and self.aspo.base_advantage != "grpo":
            raise ValueError(f"aspo.base_advantage: the tiny engine shapes GRPO's advantage ('grpo'), "
                             f"got {self.aspo.base_advantage!r}")
        if self.method == "hapo":  # fields of hapo.Config that the tiny engine takes from elsewhere must agree
            if self.hapo.adv_estimator not in ("hapo_tlga", "grpo"):
                raise ValueError(f"hapo.adv_estimator must be 'hapo_tlga' (component B) or 'grpo' (B off), "
                                 f"got {self.hapo.adv_estimator!r}")
            if self.hapo.temperature != self.temperature:
                raise ValueError(f"hapo.temperature ({self.hapo.temperature}) differs from temperature "
                                 f"({self.temperature}): the tiny engine samples at `temperature`; set that one")
        for name in ("steps", "prompts_per_step", "group_size", "pool_size", "mini_batches", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size


# ------------------------------------------------------------------------------------------------ scales
# Each scale is a set of overrides of RLConfig; SPO then trades groups for prompts, and user overrides win.
SCALES: dict[str, dict[str, Any]] = {
    "smoke": {  # plumbing only, seconds on a CPU: every method end to end in the test suite
        "steps": 2, "prompts_per_step": 4, "group_size": 4, "pool_size": 16, "eval_every": 2, "eval_size": 8,
        "max_new_tokens": 48,
        "sft": {"d_model": 32, "n_layers": 1, "n_heads": 2, "steps": 4, "schedule_steps": None, "batch_size": 8,
                "warmup": 2, "eval_size": 8, "task": {"max_ops": 1}},
    },
    "cpu": {},  # the defaults: the reproductions' scale on a 2-core CPU
    "gpu": {
        "steps": 200, "prompts_per_step": 64, "pool_size": 4096, "eval_size": 1000,
        "sft": {"d_model": 256, "n_layers": 6, "n_heads": 8, "steps": 1500, "schedule_steps": 2000, "batch_size": 64,
                "eval_size": 1000},
    },
}


def build_config(method: str, scale: str = "cpu", overrides: dict[str, Any] | None = None) -> RLConfig:
    """RLConfig for ``method`` at ``scale`` with dotted-key ``overrides`` (e.g. ``{"gspo.clip_low": 3e-3}``)."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    cfg = RLConfig(method=method, scale=scale)
    _apply(cfg, SCALES[scale])
    if method == "spo":  # one response per prompt, and as many prompts as GRPO has samples per step
        _apply(cfg, {"group_size": 1, "prompts_per_step": cfg.samples_per_step})
    for key, value in (overrides or {}).items():
        set_field(cfg, key, value)
    cfg.__post_init__()
    return cfg


def _apply(obj: Any, values: dict[str, Any], prefix: str = "") -> None:
    for key, value in values.items():
        if isinstance(value, dict):
            _apply(obj, value, f"{prefix}{key}.")
        else:
            set_field(obj, prefix + key, value)


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``["steps=100", "gspo.clip_low=3e-3"]`` (the CLI's ``--set``) → ``{"steps": "100", ...}``."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def set_field(obj: Any, dotted: str, value: Any) -> None:
    """Set a (nested, frozen or not) dataclass field by dotted name; strings are parsed as YAML scalars."""
    head, _, rest = dotted.partition(".")
    names = {f.name for f in fields(obj)}
    if head not in names:
        raise KeyError(f"{type(obj).__name__} has no field {head!r}; valid: {', '.join(sorted(names))}")
    if rest:
        child = getattr(obj, head)
        if not is_dataclass(child):
            raise KeyError(f"{head!r} is not a group of settings, so {dotted!r} cannot be set")
        set_field(child, rest, value)
        if getattr(type(child), "__dataclass_params__").frozen:  # frozen configs (TaskConfig) are rebuilt
            object.__setattr__(obj, head, type(child)(**asdict(child)))
        return
    if isinstance(value, str):
        value = _parse_scalar(value)
    current = getattr(obj, head)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(current, tuple) and isinstance(value, list):
        value = tuple(value)
    object.__setattr__(obj, head, value)


def _parse_scalar(text: str) -> Any:
    """A command-line value: JSON first (``3e-3``, ``true``, ``null``, ``[1, 2]``), then YAML, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        import yaml

        return yaml.safe_load(text)


# ------------------------------------------------------------------------------------------------ run state
@dataclass
class RunState:
    """Everything a resumed run needs besides the model and optimizer."""

    step: int = 0
    prompt_gen: torch.Generator = field(default_factory=torch.Generator)
    sample_gen: torch.Generator | None = None
    tracker: spo.ValueTracker | None = None
    prompt_sampler: spo.PromptSampler | None = None
    spo_memory: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    """SPO: per pool prompt, its last response (tokens, temperatures, log-probs at sampling time) for D."""
    hapo_stats: hapo.EntropyStats | None = None
    """HAPO: the previous step's entropy statistics, which set this step's sampling temperatures."""


def _checkpoint(path: Path, model, opt, state: RunState) -> None:
    blob = {
        "model": model.state_dict(), "optimizer": opt.state_dict(), "step": state.step,
        "prompt_gen": state.prompt_gen.get_state(), "sample_gen": state.sample_gen.get_state(),
        "tracker": state.tracker.state_dict() if state.tracker else None,
        "prompt_sampler": state.prompt_sampler.state_dict() if state.prompt_sampler else None,
        "spo_memory": state.spo_memory,
        "hapo_stats": tuple(state.hapo_stats) if state.hapo_stats is not None else None,
    }
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)  # atomic: a kill leaves the previous checkpoint or this one, never half of one


def _restore(path: Path, model, opt, state: RunState) -> None:
    blob = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(blob["model"])
    opt.load_state_dict(blob["optimizer"])
    state.step = blob["step"]
    state.prompt_gen.set_state(blob["prompt_gen"])
    state.sample_gen.set_state(blob["sample_gen"])
    if state.tracker is not None:
        state.tracker.load_state_dict(blob["tracker"])
        state.prompt_sampler.load_state_dict(blob["prompt_sampler"])
    state.spo_memory = blob["spo_memory"]
    state.hapo_stats = hapo.EntropyStats(*blob["hapo_stats"]) if blob["hapo_stats"] is not None else None


def environment(cfg: RLConfig, device: str) -> dict[str, Any]:
    """``env.json``: versions, seed and hardware, so a result can be traced to what produced it."""
    here = Path(rlkit.__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=here).stdout.strip() or None
        # the library differs from the commit (uncommitted edits under rlkit/): the commit alone does not reproduce it
        dirty = commit is not None and subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=here,
                                                      timeout=5).returncode == 1
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "rlkit": rlkit.__version__, "commit": commit, "dirty": dirty, "python": platform.python_version(),
        "torch": torch.__version__, "platform": platform.platform(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device,
        "cuda": torch.cuda.get_device_name(0) if device.startswith("cuda") else None, "seed": cfg.seed,
    }


# ------------------------------------------------------------------------------------------------ the loop
def train(cfg: RLConfig, out_dir: str | Path, *, device: str = "cpu", resume: bool = False,
          progress: bool = True, sft_cache: str | Path | None = None, stop_after: int | None = None) -> Path:
    """Run ``cfg`` into ``out_dir`` (``metrics.jsonl``, ``config.json``, ``env.json``, ``checkpoint.pt``).

    ``resume`` continues the run in ``out_dir`` from its checkpoint; ``stop_after`` returns after that step
    (a run in stages: resume it later), as if the run had been killed there.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path, metrics_path = out / "checkpoint.pt", out / "metrics.jsonl"
    if not resume and ckpt_path.exists():
        raise FileExistsError(f"{out} already holds a run; pass resume=True (--resume) or choose another --out")
    resumed = resume and ckpt_path.exists()
    config = json.loads(json.dumps(asdict(cfg), default=list))
    if resumed:  # a resumed run must be the same run
        saved = json.loads((out / "config.json").read_text())
        changed = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
        if changed:
            raise ValueError(f"{out} was started with a different config ({', '.join(changed)} differ); "
                             "resume it with the same settings")
    else:
        (out / "config.json").write_text(json.dumps(config, indent=2))
        (out / "env.json").write_text(json.dumps(environment(cfg, device), indent=2))

    # --- the SFT warm start (shared by every method), the prompt pool and the held-out problems
    model, tokenizer, sft_info = warm_start(cfg.sft, device=device, cache_dir=sft_cache, progress=progress)
    model.train()
    knobs, form = asdict(cfg.sft.task), cfg.sft.form
    pool = arithmetic.make_pool(cfg.pool_size, seed=cfg.sft.seed, **knobs)
    held_out = arithmetic.make_split(cfg.eval_size, "test", seed=0, **knobs)
    max_new = cfg.max_new_tokens or max_response_tokens(cfg.sft.task, form)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))

    t_init = time.perf_counter()
    state = RunState(sample_gen=torch.Generator(device=device))
    state.prompt_gen.manual_seed(cfg.seed)
    state.sample_gen.manual_seed(cfg.seed + 1)
    if cfg.method == "spo":  # a resumed run restores the tracker instead of re-estimating the offline values
        offline = None if resumed else _offline_scores(model, tokenizer, pool, cfg, max_new, form, state.sample_gen)
        state.tracker = spo.ValueTracker(range(len(pool)), offline_scores=offline, offline_N=cfg.spo.offline_N,
                                         rho_min=cfg.spo.rho_min, rho_max=cfg.spo.rho_max, d_half=cfg.spo.d_half,
                                         rho_type=cfg.spo.rho_type, rho_value=cfg.spo.rho_value)
        state.prompt_sampler = spo.PromptSampler(range(len(pool)), seed=cfg.seed)

    if resumed:
        _restore(ckpt_path, model, opt, state)
    writer = MetricsWriter.open(metrics_path, resume_after=state.step if resumed else None)
    if not resumed:  # step 0: the SFT start
        acc = evaluate(model, tokenizer, held_out, max_new_tokens=max_new, form=form)
        writer.log({"val/acc": acc, "sft/val_acc": sft_info["val/acc"],
                    "timing_s/init": time.perf_counter() - t_init}, step=0)  # SPO's offline pass, step-0 eval

    last = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    bar = tqdm(range(state.step + 1, last + 1), desc=f"{cfg.method} seed {cfg.seed}", disable=not progress)
    for step in bar:
        t0 = time.perf_counter()
        metrics = _rl_step(cfg, model, tokenizer, opt, state, pool, max_new, form)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            metrics["val/acc"] = evaluate(model, tokenizer, held_out, max_new_tokens=max_new, form=form)
        metrics["timing_s/step"] = time.perf_counter() - t0
        metrics["perf/throughput"] = metrics.pop("_tokens") / metrics["timing_s/step"]
        state.step = step
        writer.log(metrics, step)  # the line first, then the checkpoint: a kill in between redoes the step
        _checkpoint(ckpt_path, model, opt, state)
        bar.set_postfix(score=f"{metrics['critic/score/mean']:.2f}",
                        acc=f"{metrics['val/acc']:.2f}" if "val/acc" in metrics else "")
    writer.close()
    return out


def _rl_step(cfg: RLConfig, model, tokenizer, opt, state: RunState, pool, max_new: int, form: str) -> dict:
    m = cfg.method
    metrics: dict[str, float] = {}

    # ---- 1. choose prompts: groups of G answers per prompt; SPO: one answer per prompt, weighted by p̂(1−p̂)
    if m == "spo":
        weights = state.tracker.weights(eps=cfg.spo.eps, gamma=cfg.spo.gamma)
        prompt_idx = torch.tensor(state.prompt_sampler.sample(weights, cfg.prompts_per_step))
    else:
        n_groups = cfg.prompts_per_step * (cfg.dynamic_oversample if cfg.dynamic_sampling else 1)
        prompt_idx = _draw(len(pool), n_groups, state.prompt_gen)
    group_ids = prompt_idx.repeat_interleave(cfg.group_size)  # (B,) the prompt each response answers (CPU)
    problems = [pool[i] for i in group_ids.tolist()]

    # ---- 2. rollout: sample, with HAPO's per-token temperature from the previous step's entropy statistics
    t0 = time.perf_counter()
    temperature_fn = None
    if m == "hapo" and cfg.hapo.adaptive_temperature and state.hapo_stats is not None:
        stats, T, tau, compat = state.hapo_stats, cfg.temperature, cfg.hapo.temperature_tau, cfg.hapo.release_compat
        temperature_fn = lambda logits: hapo.adaptive_temperature(logits, T, stats, tau=tau, release_compat=compat)  # noqa: E731
    ro = rollout(model, tokenizer, problems, max_new_tokens=max_new, form=form, temperature=cfg.temperature,
                 temperature_fn=temperature_fn, generator=state.sample_gen)
    scored = score_rollout(ro, problems)
    metrics["timing_s/gen"] = time.perf_counter() - t0
    metrics["rollout/response_tokens"] = ro.lengths.sum().item()  # all sampled, before any filtering

    # ---- 3. reward: correctness (+ DAPO's overlong penalty); dynamic sampling keeps groups with signal
    if cfg.dynamic_sampling:
        rows, kept = _groups_with_signal(scored.rewards.cpu(), cfg.group_size, cfg.prompts_per_step)
        ro, scored = select_rows(ro, rows.to(ro.tokens.device)), _select_scored(scored, rows.to(ro.tokens.device))
        group_ids, problems = group_ids[rows], [problems[i] for i in rows.tolist()]
        metrics["train/kept_groups"] = kept
    rewards = scored.rewards
    if cfg.overlong_buffer > 0:
        over = ro.lengths.float() - (max_new - cfg.overlong_buffer)
        rewards = rewards - cfg.overlong_penalty * (over / cfg.overlong_buffer).clamp(0.0, 1.0)
    correct = scored.rewards > 0
    mask = ro.mask
    ids, attn, start = ro.sequences()

    # ---- 4. old log-probs: the sampler's. verl recomputes them because vLLM's numerics differ from the trainer's;
    # here sampler and trainer are one float32 model, so they agree to ~1e-6 (tests/test_sampler.py) and a
    # forward pass is saved.
    old_logp, old_entropy = ro.logp, ro.entropy

    # ---- 5. advantage
    if m == "spo":  # the divergence of each prompt's last response sets its forgetting factor ρ
        divergence = _spo_divergence(model, tokenizer, state, pool, prompt_idx)
        baseline = state.tracker.baseline(prompt_idx.tolist()).to(rewards)  # the pre-update p̂ (tracker: CPU)
        if cfg.spo.no_baseline:  # the paper's App. F ablation: v̂ = 0
            baseline = torch.zeros_like(baseline)
        adv = spo.spo_advantage(rewards, baseline, eps=cfg.spo.adv_eps, mask=mask)
    elif m == "hapo" and cfg.hapo.adv_estimator == "hapo_tlga":
        adv = hapo.tlga_advantage(rewards, group_ids, mask, norm_by_std=cfg.hapo.norm_by_std,
                                  fallback_threshold=cfg.hapo.fallback_threshold, eps=cfg.hapo.eps)
    else:  # GRPO's group advantage: GRPO, GSPO, AEPO (and HAPO without TLGA) use it as is, ASPO shapes it
        adv = grpo.grpo_advantage(rewards, group_ids, mask, norm_by_std=cfg.grpo.norm_by_std, eps=cfg.grpo.eps)
        if m == "aspo" and cfg.aspo.enabled:
            first_pos = ro.first_tool_pos.float()  # −1 = no call
            code_pass = scored.code_pass if cfg.aspo.require_code_pass else None
            adv = aspo.aspo_shape(adv, group_ids, correct, first_pos, ro.lengths, delta=cfg.aspo.delta,
                                  k=cfg.aspo.k, code_pass=code_pass, mask=mask)

    # ---- 6. policy update: mini_batches optimizer steps over a shuffled split of the batch
    t0 = time.perf_counter()
    loss_metrics: dict[str, list[float]] = defaultdict(list)
    for group in opt.param_groups:
        group["lr"] = cfg.lr * min(1.0, (state.step + 1) / max(1, cfg.warmup_steps))
    order = torch.randperm(len(problems), generator=state.prompt_gen)
    device = mask.device
    for rows in order.chunk(cfg.mini_batches):
        rows = rows.to(device)
        logp, entropy = token_logprobs(model, ids[rows], attn[rows], start, temperature=ro.temperature[rows])
        loss, lm = _policy_loss(cfg, logp, old_logp[rows], adv[rows], mask[rows], entropy.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lm["actor/grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
        opt.step()
        for k, v in lm.items():
            loss_metrics[k].append(v)
    metrics.update({k: max(v) if k.endswith("/max") else min(v) if k.endswith("/min") else sum(v) / len(v)
                    for k, v in loss_metrics.items()})  # extremes over the mini-batches, means otherwise
    metrics["timing_s/update"] = time.perf_counter() - t0

    # ---- 7. method state after the step: SPO's tracker and stored responses, HAPO's next temperature statistics
    if m == "spo":
        tracked = state.tracker.update(prompt_idx.tolist(), scored.rewards.double(), divergence)
        _remember(state, prompt_idx, ro, old_logp)
        metrics.update({"spo/rho/mean": tracked["spo/rho_clipped"], "spo/D/mean": tracked["spo/D"],
                        "spo/rho_clip_ratio": tracked["spo/rho_clip_ratio"]})
    if m == "hapo":
        state.hapo_stats = hapo.entropy_stats(old_entropy, mask, pivot=cfg.hapo.entropy_pivot)
        temps = ro.temperature[mask.bool()]
        metrics["hapo/temperature/mean"] = temps.mean().item()
        metrics["hapo/temperature/std"] = temps.std().item() if temps.numel() > 1 else 0.0

    # ---- 8. metrics every method logs (verl's names; ASPO's tool metrics on the tool task)
    sample_adv = (adv.abs() * mask).sum(-1)
    metrics.update({
        "critic/score/mean": scored.rewards.mean().item(),
        "critic/rewards/mean": rewards.mean().item(),
        "response_length/mean": ro.lengths.float().mean().item(),
        "actor/entropy": masked_mean(old_entropy, mask).item(),
        "adv/zero_frac": (sample_adv == 0).float().mean().item(),
        "_tokens": ro.lengths.sum().item(),
    })
    if form != "plain":  # the tool metrics of every method, so curves compare
        metrics.update(aspo.aspo_metrics(ro.first_tool_pos.float().masked_fill(ro.first_tool_pos < 0, float("nan")),
                                         correct, ro.tool_calls, scored.code_pass))
    return metrics


# ------------------------------------------------------------------------------------------------ helpers
def _draw(pool_size: int, n: int, gen: torch.Generator) -> Tensor:
    """``n`` pool indices, without replacement while the pool lasts."""
    reps = -(-n // pool_size)
    return torch.cat([torch.randperm(pool_size, generator=gen) for _ in range(reps)])[:n]


def _groups_with_signal(rewards: Tensor, group_size: int, wanted: int) -> tuple[Tensor, int]:
    """Rows of the first ``wanted`` groups whose rewards are not all equal (DAPO's dynamic sampling)."""
    grouped = rewards.view(-1, group_size)
    mixed = (grouped.max(-1).values > grouped.min(-1).values).nonzero().squeeze(-1)[:wanted]
    if mixed.numel() == 0:  # nothing to learn from: keep the first groups (their advantage is 0)
        mixed = torch.arange(min(wanted, grouped.shape[0]))
    rows = (mixed.unsqueeze(-1) * group_size + torch.arange(group_size)).flatten()
    return rows, int(mixed.numel())


def _select_scored(scored, rows: Tensor):
    return type(scored)(rewards=scored.rewards[rows], code_pass=scored.code_pass[rows])


def _policy_loss(cfg: RLConfig, logp, old_logp, adv, mask, entropy) -> tuple[Tensor, dict[str, float]]:
    m = cfg.method
    if m == "gspo":
        c = cfg.gspo
        return gspo.gspo_loss(logp, old_logp, adv, mask, clip_low=c.clip_low, clip_high=c.clip_high, agg=c.agg,
                              variant=c.variant)
    if m == "aepo":
        c = cfg.aepo
        return aepo.aepo_loss(logp, old_logp, adv, mask, entropy=entropy if c.use_entropy_advantage else None,
                              coef=c.coef, clip_low=c.clip_low, clip_high=c.clip_high, clip_c=c.clip_c, agg=c.agg,
                              variant=c.variant)
    if m == "hapo":
        c = cfg.hapo
        return hapo.hapo_loss(logp, old_logp, adv, mask, entropy=entropy, clip_low=c.clip_low,
                              clip_high=c.clip_high, clip_c=c.clip_c, beta=c.adv_beta, alpha=c.clip_alpha,
                              pivot=c.entropy_pivot, agg=c.agg, release_compat=c.release_compat,
                              use_redistribution=c.adaptive_advantage, use_adaptive_clip=c.adaptive_clip)
    c = cfg.spo if m == "spo" else cfg.grpo  # GRPO, ASPO (GRPO's loss) and SPO (PPO clip 0.2/0.28, c = 10)
    return grpo.ppo_clip_loss(logp, old_logp, adv, mask, clip_low=c.clip_low, clip_high=c.clip_high,
                              clip_c=c.clip_c, agg=c.agg)


def _offline_scores(model, tokenizer, pool, cfg: RLConfig, max_new: int, form: str, gen) -> dict[int, list[float]]:
    """SPO's offline value estimate: ``offline_N`` samples per pool prompt from the SFT model."""
    n = cfg.spo.offline_N
    if n == 0:
        return {}
    problems = [p for p in pool for _ in range(n)]
    rewards = []
    for i in range(0, len(problems), 512):
        chunk = problems[i : i + 512]
        ro = rollout(model, tokenizer, chunk, max_new_tokens=max_new, form=form, temperature=cfg.temperature,
                     generator=gen)
        rewards.append(score_rollout(ro, chunk).rewards)
    per_prompt = torch.cat(rewards).view(len(pool), n)
    return {i: per_prompt[i].tolist() for i in range(len(pool))}


def _spo_divergence(model, tokenizer, state: RunState, pool, prompt_idx: Tensor) -> Tensor:
    """D = mean |Δ log π| on each prompt's last response between the policy that sampled it and the current one;
    0 for a prompt seen for the first time (verl: its stored log-probs equal the current ones)."""
    divergence = torch.zeros(len(prompt_idx), dtype=torch.float64)
    seen = [j for j, i in enumerate(prompt_idx.tolist()) if i in state.spo_memory]
    if not seen:
        return divergence
    mem = [state.spo_memory[int(prompt_idx[j])] for j in seen]
    with torch.no_grad():
        cur = response_logprobs(model, tokenizer, [arithmetic.prompt(pool[int(prompt_idx[j])]) for j in seen],
                                [e["tokens"] for e in mem], [e["temperature"] for e in mem]).cpu()
    for row, (j, e) in enumerate(zip(seen, mem)):
        n = len(e["tokens"])
        divergence[j] = masked_mean((cur[row, :n] - e["logp"]).abs(), e["mask"]).item()
    return divergence


def _remember(state: RunState, prompt_idx: Tensor, ro, old_logp: Tensor) -> None:
    """Store each prompt's response (what SPO's next divergence is measured on)."""
    for j, i in enumerate(prompt_idx.tolist()):
        n = int(ro.lengths[j])
        state.spo_memory[i] = {"tokens": ro.tokens[j, :n].cpu(), "mask": ro.mask[j, :n].cpu(),
                               "temperature": ro.temperature[j, :n].cpu(), "logp": old_logp[j, :n].cpu()}
