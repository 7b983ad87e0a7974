"""The same run in two engines: a tiny-engine run beside its verl twin (``rlkit launch --tiny-scale``).

:data:`QUANTITIES` and :data:`OWN` name each engine's metric for what both measure. :func:`agreement`: the
engines agree when the last held-out accuracies differ by at most ``2·sqrt(p₁(1−p₁)/n+p₂(1−p₂)/n)``, and a
per-step quantity's means over the last ``window`` steps within ``2·sqrt(s₁²/k₁+s₂²/k₂)`` (steps as
independent draws: lenient). One seed per engine: an anecdote, not an estimate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rlkit.lab.paths import project_root
from rlkit.lab.plots import add_caption, legend_outside, method_color, methods, panels
from rlkit.lab.runs import Run


def published_twins_dir() -> Path:
    """``<project>/reproductions/results-verl-cpu``: the published verl twins, one folder per method."""
    return project_root() / "reproductions" / "results-verl-cpu"


def twins(verl_root: Path | str | None = None) -> tuple[list[str], list[str]]:
    """``(with a twin, without one)``: methods with ``verl_root/<method>/metrics.jsonl``, and the rest."""
    root = Path(verl_root) if verl_root is not None else published_twins_dir()
    have = [m for m in methods() if (root / m / "metrics.jsonl").exists()]
    return have, [m for m in methods() if m not in have]


def word_list(names: Sequence[str]) -> str:
    """``["a", "b", "c"]`` as "a, b and c"."""
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def twins_words(verl_root: Path | str | None = None) -> dict[str, str]:
    """The pages' words for :func:`twins`, by glue name: ``twin_methods`` and ``no_twin_methods``."""
    have, missing = twins(verl_root)
    none = (f"{word_list(missing)} {'has' if len(missing) == 1 else 'have'} none yet" if missing
            else "every registered method has one")
    return {"twin_methods": word_list(have) or "none", "no_twin_methods": none}


@dataclass(frozen=True)
class Quantity:
    """One thing both engines measure, under each engine's metric names (the first one logged is used)."""

    label: str
    tiny: tuple[str, ...]
    verl: tuple[str, ...]
    percent: bool = False
    """Shown ×100 (accuracies, fractions)."""
    verl_affine: tuple[float, float] = (1.0, 0.0)
    """``(a, b)``: verl's value is ``a·x + b`` of its metric ``x`` (calls per response from verl's turn count)."""


QUANTITIES: tuple[Quantity, ...] = (
    Quantity("held-out accuracy (greedy, %)", ("val/acc",), ("val-core/rlkit/arithmetic/acc/mean@1",), True),
    Quantity("training reward", ("critic/score/mean",), ("critic/score/mean",)),
    Quantity("entropy (nats/token)", ("actor/entropy",), ("actor/entropy",)),
    Quantity("clipped tokens (%)", ("actor/pg_clipfrac",), ("actor/pg_clipfrac",), True),
    Quantity("response length (tokens)", ("response_length/mean",), ("response_length/mean",)),
    # verl counts messages: the prompt, then a model turn and a tool answer per call, then the final model turn
    Quantity("calculator calls per response", ("tool/code_rounds/mean",), ("num_turns/mean",),
             verl_affine=(0.5, -1.0)),
)
"""What every method's page compares."""

OWN: dict[str, Quantity] = {
    "gspo": Quantity("clipped sequences (%)", ("actor/pg_clipfrac_seq",), ("actor/pg_clipfrac_seq",), True),
    "aspo": Quantity("first call at token (mean)", ("tool/first_code_pos/mean",),
                     ("tool/first_code_pos/mean", "actor/tool/first_code_pos/mean")),
    "aepo": Quantity("clipped tokens keeping a gradient (%)", ("aepo/clipfrac_grad_kept",),
                     ("actor/aepo/clipfrac_grad_kept", "aepo/clipfrac_grad_kept"), True),
    "spo": Quantity("forgetting factor ρ (mean)", ("spo/rho/mean",), ("spo/rho_clipped", "spo/rho/mean")),
    "hapo": Quantity("sampling temperature (mean)", ("hapo/temperature/mean",),
                     ("hapo/sampler/temperature_mean", "hapo/temperature/mean")),
}
"""Each method's own metric: what its mechanism does; another method is compared on :data:`QUANTITIES`."""

ENGINES = ("tiny engine", "verl")


def quantities(method: str) -> tuple[Quantity, ...]:
    """The quantities of ``method``'s comparison (a registered method): :data:`QUANTITIES` and its own metric."""
    valid = methods()
    if method not in valid:
        raise KeyError(f"unknown method {method!r}; valid: {', '.join(valid)}")
    return (*QUANTITIES, OWN[method]) if method in OWN else QUANTITIES


def series(run: Run, names: Sequence[str], *, percent: bool = False, last_step: int | None = None) -> pd.Series:
    """The first of ``names`` that ``run`` logged, by step (up to ``last_step``); empty when none was logged."""
    for name in names:
        if name in run.frame:
            s = run.frame[name].dropna()
            if last_step is not None:
                s = s[s.index <= last_step]
            return (s * 100 if percent else s).astype(float)
    return pd.Series(dtype=float)


def pair(tiny: Run, verl: Run, quantity: Quantity) -> tuple[pd.Series, pd.Series]:
    """``quantity`` in both runs, over the steps both ran (the verl twin may be shorter)."""
    a, b = quantity.verl_affine
    v = series(verl, quantity.verl, percent=quantity.percent) * a + b
    last = int(v.index.max()) if len(v) else None
    return series(tiny, quantity.tiny, percent=quantity.percent, last_step=last), v


def figure(tiny: Run, verl: Run, method: str, *, caption: str | None = None):
    """One panel per quantity, three a row, the tiny engine's curve beside verl's; one legend outside."""
    qs = quantities(method)
    fig, axes, spare = panels(len(qs), ncols=3, height=2.7)
    color = method_color(method)
    for ax, q in zip(axes, qs):
        t, v = pair(tiny, verl, q)
        ax.plot(t.index, t.values, color=color, lw=1.8, marker="o" if len(t) <= 12 else None, ms=4,
                label=f"{method.upper()} · {ENGINES[0]}")
        ax.plot(v.index, v.values, color=color, lw=1.8, ls="--", marker="s" if len(v) <= 12 else None, ms=4,
                mfc="white", label=f"{method.upper()} · {ENGINES[1]}")
        if not len(v):
            ax.text(0.5, 0.5, "not logged by verl", transform=ax.transAxes, ha="center", color="#888888")
        ax.set_title(q.label, fontsize=10)
        ax.set_xlabel("RL step", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    legend_outside(fig, axes, spare)
    if caption:
        add_caption(fig, caption, fontsize=8)
    return fig


def agreement(tiny: Run, verl: Run, method: str, *, window: int = 5, eval_size: int | None = None) -> pd.DataFrame:
    """Each quantity in both engines with the module rule's verdict (``eval_size``: held-out problems)."""
    n = eval_size or int(tiny.config.get("eval_size", 0)) or None
    rows = []
    for q in quantities(method):
        t, v = pair(tiny, verl, q)
        if not len(t) or not len(v):
            rows.append({"quantity": q.label, "tiny engine": math.nan, "verl": math.nan, "difference": math.nan,
                         "±2 s.e.": math.nan, "verdict": "not logged by verl" if len(t) else
                         "not logged by the tiny run" if len(v) else "not logged"})
            continue
        if q is QUANTITIES[0]:  # accuracies: the last evaluation of each, binomial standard error
            a, b = t.iloc[-1], v.iloc[-1]
            bound = 2 * math.sqrt((a * (100 - a) + b * (100 - b)) / n) if n else math.nan
            what = f"step {int(t.index[-1])} / {int(v.index[-1])}"
        else:  # per-step quantities: the mean of the last `window` steps
            tw, vw = t.iloc[-window:], v.iloc[-window:]
            a, b = float(tw.mean()), float(vw.mean())
            bound = 2 * math.sqrt(float(tw.var(ddof=1)) / len(tw) + float(vw.var(ddof=1)) / len(vw)) \
                if len(tw) > 1 and len(vw) > 1 else math.nan
            what = f"mean of steps {int(tw.index[0])}–{int(tw.index[-1])}"
        rows.append({"quantity": q.label, "compared": what, "tiny engine": a, "verl": b, "difference": b - a,
                     "±2 s.e.": bound, "verdict": "—" if not (math.isfinite(b - a) and math.isfinite(bound))
                     else "agree" if abs(b - a) <= bound else "differ"})
    return pd.DataFrame(rows).set_index("quantity")


def words(table: pd.DataFrame, method: str) -> str:
    """What one method's figure shows, from its :func:`agreement` table, in one or two sentences."""
    judged = table[table["verdict"].isin(["agree", "differ"])]
    agree = int((judged["verdict"] == "agree").sum())
    acc = table.loc[QUANTITIES[0].label]
    out = [f"{method.upper()}: {agree} of {len(judged)} quantities agree by the rule below"]
    if not math.isnan(acc["tiny engine"]):
        out.append(f"held-out accuracy at the last evaluation {acc['tiny engine']:.1f}% in the tiny engine, "
                   f"{acc['verl']:.1f}% in verl")
    differ = judged[judged["verdict"] == "differ"]
    text = "; ".join(out) + "."
    if len(differ):
        text += " Differs: " + "; ".join(f"{q}, {row['tiny engine']:.3g} against verl's {row['verl']:.3g}"
                                         for q, row in differ.iterrows()) + "."
    return text


def _value(run: Run, quantity: Quantity, last_step: int | None, window: int) -> float:
    """``quantity`` in a tiny run as :func:`agreement` reads it (last evaluation or ``window`` steps)."""
    s = series(run, quantity.tiny, percent=quantity.percent, last_step=last_step)
    if not len(s):
        return math.nan
    return float(s.iloc[-1]) if quantity is QUANTITIES[0] else float(s.iloc[-window:].mean())


def _verl_setting(verl: Run, path: str):
    """A setting of the verl twin's config by its dotted path (``${other.path}`` followed); None if absent."""
    node = verl.config.get("verl", {})
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, str) and node.startswith("${") and node.endswith("}") and ":" not in node:
        return _verl_setting(verl, node[2:-1])
    return node


def _tokens_per_step(run: Run, verl: bool, last_step: int | None, window: int) -> float:
    """Response tokens a step over the last ``window`` steps: mean response length × responses per step."""
    length = series(run, ("response_length/mean",), last_step=last_step).iloc[-window:].mean()
    if verl:
        n = (_verl_setting(run, "data.train_batch_size") or math.nan) * (
            _verl_setting(run, "actor_rollout_ref.rollout.n") or math.nan)
    else:
        n = run.config.get("prompts_per_step", math.nan) * run.config.get("group_size", math.nan)
    return float(length * n)


def differences(table: pd.DataFrame, method: str, tiny: Run, verl: Run, tiny_seeds: Sequence[Run], *,
                window: int = 5) -> list[str]:
    """One sentence per quantity that differs, saying what the difference is made of."""
    differ = table[table["verdict"] == "differ"]
    by_label = {q.label: q for q in quantities(method)}
    last = int(verl.frame.index.max()) if len(verl.frame) else None
    out = []
    for label, row in differ.iterrows():
        q, value = by_label[label], float(row["verl"])
        text = f"{label[0].upper()}{label[1:]}"  # the values themselves: words() says them first
        if q.tiny == ("actor/pg_clipfrac",):
            t_tokens, v_tokens = _tokens_per_step(tiny, False, last, window), _tokens_per_step(verl, True, last, window)
            text += (f": about {row['tiny engine'] / 100 * t_tokens:.1f} clipped tokens a step of "
                     f"{t_tokens:,.0f} in the tiny engine, {value / 100 * v_tokens:.1f} of {v_tokens:,.0f} in verl")
        bound = False  # verl's value stands for a lower bound of the tiny engine's quantity
        mode = _verl_setting(verl, "actor_rollout_ref.actor.loss_agg_mode")
        if q.tiny == ("actor/entropy",) and mode not in (None, "token-mean"):
            text += (f": not the same quantity — verl logs `actor/entropy` aggregated by the loss's own mode "
                     f"(`{mode}`), the tiny engine the per-token mean")
            scale = _verl_setting(verl, "actor_rollout_ref.actor.loss_scale_factor")
            if mode == "seq-mean-token-sum-norm" and isinstance(scale, (int, float)) and scale > 0:
                lengths = series(verl, ("response_length/mean",), last_step=last).iloc[-window:]
                logged = series(verl, q.verl, last_step=last).reindex(lengths.index)
                value, bound = float((logged * scale / lengths).mean()), True  # step by step, then the mean
                text += (f"; verl's is each response's summed entropy divided by {scale:g}, averaged over responses "
                         f"(the per-token entropy × the trained tokens per response / {scale:g}); with verl's mean "
                         f"response length of each step ({lengths.mean():.1f} tokens, calculator results included, "
                         f"so at least the trained tokens) the per-token entropy is at least {value:.3g} nats")
            else:
                value = math.nan  # no per-token value to place among the seeds
        seeds = [v for v in (_value(r, q, last, window) for r in tiny_seeds) if not math.isnan(v)]
        if seeds and not math.isnan(value):
            lo, hi = min(seeds), max(seeds)
            text += (f"{';' if ':' in text else ':'} the tiny engine's {len(seeds)} seed{'s' * (len(seeds) > 1)} "
                     f"of {method.upper()} give {lo:.3g}–{hi:.3g}: ")
            if bound:
                text += ("above that bound, so consistent with it (verl's per-token value itself is not logged)"
                         if hi >= value else "all below that bound, a difference between the engines")
            elif lo <= value <= hi:
                text += "verl's value lies among them, what another seed gives, not a difference between the engines"
            else:
                text += "verl's value lies outside them" + _outside(len(seeds))
        out.append(text + ".")
    return out


def _outside(n: int) -> str:
    """What a value outside ``n`` seeds' range says: one more seed lands there with probability 2/(n + 1)."""
    if n < 2:
        return (": one seed has no range, and one run per engine cannot tell an engine difference from another "
                "seed")
    chance = f"one more seed of the tiny engine would land outside {n} seeds 2 times in {n + 1}"
    if 2 / (n + 1) <= 0.05:
        return f"; {chance}, so this is a difference between the engines the page does not explain"
    return f", as {chance}: one run per engine does not show a difference between the engines"


def minutes(run: Run) -> float:
    """Wall time of the run's steps (verl: ``timing_s/step`` summed, start-up excluded)."""
    s = run.frame.get("timing_s/step")
    return float(np.nansum(s.to_numpy())) / 60 if s is not None else math.nan


__all__ = ["ENGINES", "OWN", "QUANTITIES", "Quantity", "agreement", "differences", "figure", "minutes", "pair",
           "published_twins_dir", "quantities", "series", "twins", "twins_words", "words"]
