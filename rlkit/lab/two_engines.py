"""The same run in two engines: a tiny-engine run beside its verl twin (``rlkit launch --tiny-scale``).

Both engines log verl's metric names where verl has one; where they differ (held-out accuracy, HAPO's sampled
temperature, SPO's ρ) :data:`QUANTITIES` and :data:`OWN` name each engine's metric. :func:`figure` draws every
quantity for one method, both engines in one panel; :func:`agreement` tabulates them with the rule the book states:

- held-out accuracy (greedy, the same held-out problems): the two engines *agree* when the difference of their
  last evaluations lies within twice its binomial standard error, ``2·sqrt(p₁(1−p₁)/n + p₂(1−p₂)/n)``;
- every per-step quantity: the means over the last ``window`` steps agree when their difference lies within
  twice its standard error, ``2·sqrt(s₁²/k₁ + s₂²/k₂)`` from the step-to-step spread of each engine (steps treated
  as independent draws, which consecutive steps are not: a lenient rule, stated as such).

One seed per engine: an agreement or a difference here is an anecdote, not an estimate.

Which methods have a twin is read from the folder of twins (:func:`twins`, the published ones in
:func:`published_twins_dir`), never typed: the *Two engines* page glues :func:`twins_words` and the *Full-scale
runs* page's generated block (:mod:`rlkit.lab.book_pages`) renders them, so a method registered later is named
among those without a twin until its twin is made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rlkit.lab.plots import Run, method_color, methods


def published_twins_dir() -> Path:
    """``<project>/reproductions/results-verl-cpu``: the published verl twins, one folder per method."""
    from rlkit.lab.paths import project_root

    return project_root() / "reproductions" / "results-verl-cpu"


def twins(verl_root: Path | str | None = None) -> tuple[list[str], list[str]]:
    """``(with a twin, without one)``: every registered method (:func:`rlkit.lab.plots.methods`, in the figures'
    order) split by whether ``verl_root/<method>/metrics.jsonl`` exists (default: :func:`published_twins_dir`)."""
    root = Path(verl_root) if verl_root is not None else published_twins_dir()
    have = [m for m in methods() if (root / m / "metrics.jsonl").exists()]
    return have, [m for m in methods() if m not in have]


def _series(names: Sequence[str]) -> str:
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def twins_words(verl_root: Path | str | None = None) -> dict[str, str]:
    """The pages' words for :func:`twins`, by glue name: ``twin_methods`` ("grpo, gspo and aspo", or "none")
    and ``no_twin_methods`` ("dapo and cispo have none yet", or "every registered method has one"), the
    methods by their registered names (``--method``)."""
    have, missing = twins(verl_root)
    none = (f"{_series(missing)} {'has' if len(missing) == 1 else 'have'} none yet" if missing
            else "every registered method has one")
    return {"twin_methods": _series(have) or "none", "no_twin_methods": none}


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
    Quantity("calculator calls per response", ("aspo/code_rounds/mean",), ("num_turns/mean",),
             verl_affine=(0.5, -1.0)),
)
"""What every method's page compares."""

OWN: dict[str, Quantity] = {
    "gspo": Quantity("clipped sequences (%)", ("actor/pg_clipfrac_seq",), ("actor/pg_clipfrac_seq",), True),
    "aspo": Quantity("first call at token (mean)", ("aspo/first_code_pos/mean",),
                     ("aspo/first_code_pos/mean", "actor/aspo/first_code_pos/mean")),
    "aepo": Quantity("clipped tokens keeping a gradient (%)", ("aepo/clipfrac_grad_kept",),
                     ("actor/aepo/clipfrac_grad_kept", "aepo/clipfrac_grad_kept"), True),
    "spo": Quantity("forgetting factor ρ (mean)", ("spo/rho/mean",), ("spo/rho_clipped", "spo/rho/mean")),
    "hapo": Quantity("sampling temperature (mean)", ("hapo/temperature/mean",),
                     ("hapo/sampler/temperature_mean", "hapo/temperature/mean")),
}
"""Each method's own metric: what its mechanism does (ASPO's first-call position, SPO's ρ, HAPO's temperature).
A registered method it does not name (GRPO, the baseline; a method added later) is compared on :data:`QUANTITIES`."""

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
    """One panel per quantity (three per row, the book's page width), the tiny engine's curve beside verl's; one
    legend outside the data (in the last row's empty slot, or above the panels)."""
    from rlkit.lab.plots import add_caption, legend_outside, panels

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


def _verdict(diff: float, bound: float) -> str:
    if not math.isfinite(diff) or not math.isfinite(bound):
        return "—"
    return "agree" if abs(diff) <= bound else "differ"


def agreement(tiny: Run, verl: Run, method: str, *, window: int = 5, eval_size: int | None = None) -> pd.DataFrame:
    """Each quantity in both engines with the verdict of the module's rule (``eval_size``: held-out problems,
    default the tiny run's ``eval_size``)."""
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
                     "±2 s.e.": bound, "verdict": _verdict(b - a, bound)})
    return pd.DataFrame(rows).set_index("quantity")


def words(table: pd.DataFrame, method: str) -> str:
    """What one method's figure shows, from its :func:`agreement` table: how many quantities agree under the rule,
    the held-out accuracies at the last evaluation, and each one that differs with both values — the sentence after
    the method's figure on the Two engines page."""
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


def minutes(run: Run) -> float:
    """Wall time of the run's steps (verl: ``timing_s/step`` summed, start-up excluded)."""
    s = run.frame.get("timing_s/step")
    return float(np.nansum(s.to_numpy())) / 60 if s is not None else math.nan


__all__ = ["ENGINES", "OWN", "QUANTITIES", "Quantity", "agreement", "figure", "minutes", "pair",
           "published_twins_dir", "quantities", "series", "twins", "twins_words", "words"]
