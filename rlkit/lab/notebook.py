"""What the method notebooks share: rlkit's own source on the page (:func:`show_source`: the math first,
argument checks and registration folded, every line a click away), the run-and-compare section, helpers."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from rlkit import registry
from rlkit.files import read_torch
from rlkit.lab import claims, findings, judge, paths, plots, report
from rlkit.lab.book_pages import verdict_legend_html
from rlkit.lab.claims import run_name
from rlkit.lab.runs import Run, available_seeds, first_seed, seed_numbers
from rlkit.lab.reproduce import ensure_run
from rlkit.lab.specs import ANATOMY, get_spec, load_specs
from rlkit.lab.stability import gradient_weight
from rlkit.tiny.config import build_config
from rlkit.verl.launch.presets import PRESETS


pd.set_option("display.max_colwidth", None)  # a page's tables print every value whole: no "0.26..." in a cell

REGISTRATION = "register"
"""A decorator whose name starts with this registers the function: plumbing, moved above the code."""


@dataclass(frozen=True)
class SourceView:
    """One object's source as a page shows it: ``shown`` (folded), ``full``, ``notes`` on what was folded."""

    name: str
    where: str
    shown: str
    full: str
    notes: tuple[str, ...]


def source_view(obj: Any, *, checks: bool = False) -> SourceView:
    """:class:`SourceView` of a function, class or module: ``checks=True`` folds nothing."""
    name = f"{obj.__module__}.{obj.__qualname__}" if hasattr(obj, "__qualname__") else obj.__name__
    path = Path(inspect.getsourcefile(obj)).resolve()
    lines, line = inspect.getsourcelines(obj)
    full = textwrap.dedent("".join(lines))
    shown, notes = full, [f"line {line}"]
    if not checks:
        shown, decorators = fold_registration(shown)
        notes += [f"registered by `{d}`" for d in decorators]
        offset = len(full.splitlines()) - len(shown.splitlines())
        shown, folded = fold_checks(shown, first_line=line + offset, filename=path.name)
        if folded:
            notes.append(f"{folded} line{'s' if folded > 1 else ''} of argument checks folded")
    return SourceView(name, f"{path.parent.name}/{path.name}", shown, full, tuple(notes))


def fold_registration(source: str) -> tuple[str, list[str]]:
    """``source`` without its registering decorators (:data:`REGISTRATION`), and those decorators."""
    tree = ast.parse(source)
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return source, []
    lines = source.splitlines(keepends=True)
    plumbing = [d for d in node.decorator_list if _call_name(d).startswith(REGISTRATION)]
    for d in sorted(plumbing, key=lambda d: d.lineno, reverse=True):
        del lines[d.lineno - 1:d.end_lineno]
    return "".join(lines), [f"@{ast.get_source_segment(source, d)}" for d in plumbing]


FOLD_LINES = 24
"""A listing longer than this many lines is shown in a dropdown (:func:`show_source`)."""


def show_source(*objects: Any, checks: bool = False, fold: bool | None = None) -> None:
    """Display the source of objects (:func:`source_view`), folded past :data:`FOLD_LINES` (``fold`` None)."""
    from IPython.display import HTML, Code, Markdown, display

    for obj in objects:
        view = source_view(obj, checks=checks)
        header = f"`{view.name}` — `{view.where}`, {'; '.join(view.notes)}"
        if fold or fold is None and len(view.shown.splitlines()) > FOLD_LINES:
            display(HTML(f'<details class="rlkit-source"><summary>Source of <code>{escape(view.name)}</code> '
                         f"({len(view.shown.splitlines())} lines; {escape(view.where)}, {escape('; '.join(view.notes))})"
                         f"</summary>{Code(view.shown, language='python')._repr_html_()}</details>"))
        else:
            display(Markdown(header))
            display(Code(view.shown, language="python"))
        if view.shown != view.full:
            display(HTML(f'<details class="rlkit-source"><summary>Full source of <code>{escape(view.name)}</code>, '
                         f"every line</summary>{Code(view.full, language='python')._repr_html_()}</details>"))


def source_lines(obj: Any, *needles: str) -> str:
    """The lines of ``obj``'s source with any of ``needles``, numbered, ``…`` where lines are skipped."""
    view = source_view(obj)
    first = inspect.getsourcelines(obj)[1]
    full = view.full.splitlines()
    out, last = [], None
    for i, line in enumerate(full):
        if any(n in line for n in needles):
            if last is not None and i > last + 1:
                out.append("    …")
            out.append(f"{first + i:4d}  {line}")
            last = i
    missing = [n for n in needles if not any(n in line for line in full)]
    if missing:
        raise ValueError(f"{view.name}: no line contains {missing}")
    return "\n".join(out)


def show_lines(obj: Any, *needles: str) -> None:
    """Display :func:`source_lines` under the function's name and file."""
    from IPython.display import Code, Markdown, display

    view = source_view(obj)
    display(Markdown(f"`{view.name}` — `{view.where}`"))
    display(Code(source_lines(obj, *needles), language="python"))


def _call_name(node: ast.AST) -> str:
    """The name a call or decorator calls: ``f`` for ``f(…)``, ``m.f(…)`` or a bare ``f``."""
    func = node.func if isinstance(node, ast.Call) else node
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_check(stmt: ast.stmt) -> bool:
    """An argument check: ``if …: raise …`` / ``warnings.warn(…)``, or a call to ``check_*`` / ``_check_*``."""
    def raises_or_warns(s: ast.stmt) -> bool:
        return isinstance(s, ast.Raise) or (isinstance(s, ast.Expr) and _call_name(s.value) == "warn")

    if isinstance(stmt, ast.If):
        return not stmt.orelse and all(raises_or_warns(s) for s in stmt.body)
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and _call_name(stmt.value).lstrip("_").startswith("check"))


def _check_runs(body: list[ast.stmt], lines: list[str]) -> list[tuple[int, int, int]]:
    """Spans ``(first, last, indent)`` of ``body``'s runs of argument checks, recursively."""
    runs: list[tuple[int, int, int]] = []
    if not all(_is_check(s) for s in body):
        previous = None
        for stmt in body:
            if _is_check(stmt):
                if previous is not None and _is_check(previous):
                    runs[-1] = (runs[-1][0], stmt.end_lineno, runs[-1][2])
                else:
                    runs.append((stmt.lineno, stmt.end_lineno, stmt.col_offset))
            previous = stmt
    for stmt in body:
        if _is_check(stmt):
            continue
        for block in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, block, None)
            if not (isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt)):
                continue
            runs += _check_runs(inner, lines)
            head = lines[inner[0].lineno - 2] if inner[0].lineno > 1 else ""
            if block == "orelse" and isinstance(stmt, ast.If) and head.strip() == "else:" and all(
                    isinstance(s, ast.Raise) for s in inner):
                runs.append((inner[0].lineno - 1, inner[-1].end_lineno, len(head) - len(head.lstrip())))
    return runs


def fold_checks(source: str, *, first_line: int = 1, filename: str = "") -> tuple[str, int]:
    """``(source, lines folded)``: each run of argument checks replaced by a comment naming its lines."""
    code = textwrap.dedent(source)
    tree = ast.parse(code)
    func = tree.body[0] if tree.body else None
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return source, 0
    lines = code.splitlines()
    folded = 0
    for start, end, indent in sorted(_check_runs(func.body, lines), reverse=True):
        a, b = first_line + start - 1, first_line + end - 1
        where = f"{filename} line {a}" if a == b else f"{filename} lines {a}–{b}"
        lines[start - 1:end] = [" " * indent + f"# … argument checks ({where}) …"]
        folded += end - start + 1
    return "\n".join(lines) + "\n", folded


TAIL_WINDOW = 10
"""The steps at the end of a run that a page averages a logged metric over (:func:`tail`)."""


def tail(runs, metric: str, window: int = TAIL_WINDOW) -> float:
    """Mean of the last ``window`` values of ``metric`` in a run, or the mean of that over a list of runs."""
    if hasattr(runs, "frame"):  # one run
        return float(runs.frame[metric].dropna().iloc[-window:].mean())
    return sum(tail(r, metric, window) for r in runs) / len(runs)


def final_state(run: Run) -> dict[str, Any]:
    """A tiny run's final checkpoint, on the CPU; a clear error where absent (published runs have none)."""
    path = run.path / "checkpoint.pt"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: this run's final checkpoint is not in {run.path.parent.parent} (published results "
            "keep metrics only, checkpoints are not committed). Execute this notebook on runs trained here: "
            "`rlkit reproduce --only <spec>` (results in reproductions/results), or `--results DIR`.")
    return read_torch(path)  # load_state_dict copies onto the model's own device


def results_dir(results: str | Path | None) -> Path:
    """The notebooks' ``results`` parameter: None means the project's ``reproductions/results``."""
    return Path(results) if results else paths.results_dir()


def seeds_of(name: str, seeds: int | None, results: str | Path | None, start: int) -> list[int]:
    """The seeds a page takes of group ``name``: its first ``seeds``, or (None) all present, ≥ ``start``."""
    root = results_dir(results)
    first = first_seed(root)
    if seeds is not None:
        return seed_numbers(seeds, first)
    present = available_seeds(root, name)
    return present if len(present) >= start else seed_numbers(start, first)


def seeds_text(counts: Sequence[int]) -> str:
    """How many seeds run groups have, in words: ``"3"`` when they all have 3, ``"3–12"`` when they differ."""
    lo, hi = min(counts), max(counts)
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def spec_runs(name: str, *, scale: str, seeds: int | None, results: str | Path | None, device: str = "cpu",
              progress: bool = True, regime: str = "standard", variant: str | None = None) -> list[Run]:
    """The seeds (:func:`seeds_of`) of a spec's method in ``regime`` or ``variant``, trained or reused."""
    spec = get_spec(name)
    if spec.method is None:
        raise ValueError(f"spec {name!r} trains no method")
    if variant is not None and variant not in spec.variants:
        raise KeyError(f"spec {name!r} has no variant {variant!r}; valid: {', '.join(spec.variants) or 'none'}")
    overrides = spec.variants[variant] if variant else {}
    group = variant or run_name(spec.method, regime)
    return [ensure_run(spec.method, scale=scale, seed=k, results=results_dir(results), device=device,
                       name=variant, regime=regime if variant is None else "standard", overrides=overrides,
                       progress=progress) for k in seeds_of(group, seeds, results, spec.seeds)]


def compare_runs(method: str, metrics: Sequence[str], *, scale: str, seeds: int | None,
                 results: str | Path | None, device: str = "cpu", progress: bool = True,
                 baseline: str | None = "grpo", regime: str = "standard", variants: Sequence[str] = (),
                 titles: Sequence[str] | None = None, x: str = "step", figure: str = "curves.png"):
    """Train or reuse ``method``, ``baseline``, ``variants``; draw, save ``metrics``; ``(runs, fig)``."""
    kw = dict(scale=scale, seeds=seeds, results=results, device=device, progress=progress)
    runs = spec_runs(baseline, regime=regime, **kw) if baseline and baseline != method else []
    runs += spec_runs(method, regime=regime, **kw)
    for v in variants:
        runs += spec_runs(method, variant=v, **kw)
    fig = plots.curves(runs, metrics, titles=titles, x=x)
    plots.save(fig, results_dir(results) / method / "figures" / figure)
    return runs, fig


def run_settings(name: str, scale: str, seeds: int | None, results: str | Path | None = None) -> dict[str, Any]:
    """The settings a page quotes about spec ``name``'s runs, by glue name, from their configs."""
    spec = get_spec(name)
    method = spec.method or name
    std, stress = build_config(method, scale), build_config(method, scale, regime="stress")
    spo = build_config("spo", scale)
    counts = [seeds] if seeds is not None else [len(seeds_of(p.name, None, results, spec.seeds))
                                                 for p in spec.runs(1)]
    return {"steps": std.steps, "prompts": std.prompts_per_step, "group": std.group_size,
            "samples": std.prompts_per_step * std.group_size, "eval_every": std.eval_every,
            "eval_size": std.eval_size, "final_eval_size": f"{std.final_eval_size:,}",
            "seeds": seeds if seeds is not None else seeds_text(counts),
            "seeds_dof": seeds - 1 if seeds is not None else seeds_text([n - 1 for n in counts]),
            "tail_window": TAIL_WINDOW, "stress_staleness": stress.staleness, "budget": std.max_new,
            "spo_prompts": spo.prompts_per_step, "spo_group": spo.group_size, "scale": scale,
            "dapo_buffer": build_config("dapo", scale).dapo.overlong_buffer, **preset_settings()}


def preset_settings() -> dict[str, str]:
    """The full-scale presets' settings (:data:`rlkit.verl.launch.presets.PRESETS`) a page quotes."""
    out = {f"preset_{m}_{k}": f"{v:,}" for m, p in PRESETS.items()
           for k, v in (("prompts", p.dapo_prompts), ("n", p.n), ("updates", p.updates))}
    dapo = {**PRESETS["dapo"].keys, **PRESETS["dapo"].dapo}
    buffer = dapo["+reward.reward_kwargs.overlong_buffer_cfg.len"]
    return out | {"preset_dapo_overlong_buffer": f"{buffer:,}",
                  "preset_dapo_max_length": f"{dapo['data.max_response_length'] - buffer:,}"}


def glue_settings(name: str, scale: str, seeds: int | None, results: str | Path | None = None) -> None:
    """Glue :func:`run_settings` under their names for the page's ``{glue:text}`` roles; shows nothing."""
    from myst_nb import glue

    for key, value in run_settings(name, scale, seeds, results).items():
        glue(key, value, display=False)


def regime_settings(method: str, scale: str, regime: str = "stress") -> str:
    """Sentences explaining ``regime``'s settings beside the standard run's, from the configs."""
    std, cfg = build_config(method, scale), build_config(method, scale, regime=regime)
    said = []
    if cfg.staleness:
        said.append(f"`staleness`: the rollouts of each step are sampled by the policy of {cfg.staleness} steps "
                    "earlier, as in an asynchronous trainer; the loss's ratio is taken against that policy, so it "
                    "leaves 1 from the first mini-batch on.")
    else:
        said.append("`staleness`: 0, the rollouts of each step are sampled by the policy being trained, and the "
                    "ratio is taken against the batch's own sampler, as in the papers: it is 1 at the first "
                    "mini-batch.")
    if cfg.mini_batches != std.mini_batches:
        said.append(f"`mini_batches`: {cfg.mini_batches} optimizer steps per rollout batch (standard: "
                    f"{std.mini_batches}), each further from the sampling policy than the last.")
    if (cfg.lr, cfg.warmup_steps) != (std.lr, std.warmup_steps):
        said.append(f"`lr`, `warmup_steps`: {cfg.lr:g} (standard: {std.lr:g}), reached after {cfg.warmup_steps} "
                    "steps.")
    if cfg.steps != std.steps:
        said.append(f"`steps`: {cfg.steps} RL steps (standard: {std.steps}).")
    if cfg.staleness and cfg.policy_eval_tail:
        said.append(f"`policy_eval_tail`: the policy being trained also samples the step's problems itself "
                    f"(`policy/*`, what the entropy and reward claims read) at each of the last "
                    f"{cfg.policy_eval_tail} steps, and every {cfg.eval_every} before them.")
    return " ".join(said + ["Everything else is the standard run's."])


RULES_LINK = ("every rule — intervals, margins, the seed rule — in one paragraph, on "
              "<a href='07_comparison.html#verdict-rules'>the comparison page</a>")
"""The last line of the legend under every claims table: the rules are stated once, on the comparison page."""


def claim_records(name: str, *, seed: int | None = None, seeds: int | None = None,
                  results: str | Path | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The records of spec ``name``'s claims a page shows (``claims.json``'s, or judged now), and a note."""
    spec = get_spec(name)
    root = results_dir(results)
    chosen = [seed] if seed is not None else None if seeds is None else seed_numbers(seeds, first_seed(root))
    saved = judge.load(root, spec.notebook) or []
    if saved and (chosen is None or judge.load(root, spec.notebook, chosen)):
        return saved, None
    records = judge.judge_spec(spec, root, chosen, judged=_required_records(spec, root, chosen))
    if not saved:
        return records, None
    judged_on = sorted({len(r["seeds"]) for r in saved if r["interval"] is not None})
    on = f"seed {seed}" if seed is not None else f"seeds {chosen[0]}–{chosen[-1]}"
    return records, (f"Judged here on {on} (a fixed design, 95% intervals): the reproduction's verdicts in "
                     f"{judge.CLAIMS_FILE}, judged on {seeds_text(judged_on or [0])} seeds, differ in their seeds; "
                     "execute the page with seeds = None to show them.")


def _required_records(spec, root: Path, chosen: Sequence[int] | None) -> list[dict[str, Any]]:
    """The records of the other specs' claims that ``spec``'s claims require, judged on the same seeds."""
    others = {c.requires["claim"].rpartition("-")[0] for c in spec.claims
              if c.requires and isinstance(c.requires["claim"], str)}
    return [r for name in sorted(others) for r in judge.judge_spec(get_spec(name), root, chosen)]


def note_html(note: str | None) -> str:
    """A :func:`claim_records` note as a paragraph above the claims (nothing without one)."""
    return f"<p class='rlkit-note'>{escape(note)}</p>" if note else ""


def claims_table(name: str, *, seed: int | None = None, seeds: int | None = None,
                 results: str | Path | None = None):
    """The spec's claims as HTML: the "What we found" box, the table and the verdict legend."""
    records, note = claim_records(name, seed=seed, seeds=seeds, results=results)
    from IPython.display import HTML

    collapses = records_sentences(records)[1:]  # its first sentence, the counts, opens the "What we found" box
    return HTML(note_html(note) + (say_html(collapses) if collapses else "")
                + report.found_box(records, limit=0) + report.html(records) + verdict_legend_html(records, RULES_LINK))


@dataclass(frozen=True)
class Ending:
    """How one run group ended on held-out accuracy over its seeds (:func:`endings`)."""

    label: str
    seeds: int
    start: float
    end: float
    below: int
    collapsed: int
    low: float = 0.0
    high: float = 0.0
    """The lowest and the highest seed's end: the band of the figures."""

    @property
    def fell(self) -> bool:
        """Ended below its start in most seeds."""
        return self.below * 2 > self.seeds


def endings(runs: Sequence[Run]) -> list[Ending]:
    """Each run group's :class:`Ending`, in the order the runs come, but groups that logged no ``val/acc``."""
    out = []
    for label, group in plots.by_method(runs).items():
        ends = []
        for run in group:
            if (acc := claims.accuracy_ends(run.frame)) is None:
                continue
            facts = claims.collapse_facts(run)
            ends.append((*acc, bool(facts and facts["collapsed"])))
        if ends:
            n = len(ends)
            finals = [e for _, e, _ in ends]
            out.append(Ending(label, n, sum(s for s, _, _ in ends) / n, sum(finals) / n,
                              sum(e < s for s, e, _ in ends), sum(c for _, _, c in ends), min(finals), max(finals)))
    return out


def _acc(x: float) -> str:
    return f"{x:.3f}"


def endings_sentences(runs: Sequence[Run]) -> list[str]:
    """Up to four sentences on how ``runs`` ended, computed from them (never typed)."""
    ends = endings(runs)
    if not ends:
        return []
    counts = [e.seeds for e in ends]
    over = f"{seeds_text(counts)} seed{'s' * (max(counts) > 1)}"
    moves = "; ".join(f"`{e.label}` {_acc(e.start)} → {_acc(e.end)}" for e in ends)
    out = [f"Held-out accuracy, start → end, mean of {over}: {moves}."]
    if len(ends) > 1:
        best = max(ends, key=lambda e: e.end)
        rest = [e for e in ends if e is not best]
        if all(best.low <= e.end <= best.high and e.low <= best.end <= e.high for e in rest):
            gap = best.end - min(e.end for e in rest)
            out.append(f"They end level: each mean lies within the seeds' band of the highest, `{best.label}`, and "
                       f"its mean within theirs; it is {_acc(gap) if gap >= 0.0005 else 'less than 0.001'} above the "
                       "lowest.")
        else:
            gaps = ", ".join(f"`{e.label}` by {_acc(best.end - e.end)}" for e in rest)
            out.append(f"`{best.label}` ends highest, ahead of {gaps}.")
    fell = [e for e in ends if e.fell]
    if fell:
        out.append("Not every run survives: " + "; ".join(
            f"`{e.label}` {'collapses' if e.collapsed * 2 > e.seeds else 'ends below its start'} "
            f"({e.below} of {e.seeds} seeds end below their start)" for e in fell) + ".")
    some = [e for e in ends if e.below and not e.fell]
    if some:
        out.append("In some seeds held-out accuracy ends below the start: " + "; ".join(
            f"`{e.label}` in {e.below} of {e.seeds}" for e in some) + ".")
    elif len(ends) > 1 and not fell:
        out.append("Every run ends at or above its start.")
    return out


def survivors_sentence(runs: Sequence[Run]) -> str:
    """Which run groups survive (end at or above their start in most seeds) and which do not: one sentence."""
    ends = endings(runs)
    alive = [f"`{e.label}` ({_acc(e.start)} → {_acc(e.end)}" + (f", {e.below} of {e.seeds} seeds below" if e.below
                                                                   else "") + ")" for e in ends if not e.fell]
    gone = [f"`{e.label}` ({_acc(e.start)} → {_acc(e.end)}, {e.below} of {e.seeds} seeds below their start"
            f"{', collapsed' if e.collapsed * 2 > e.seeds else ''})" for e in ends if e.fell]
    if not gone:
        return f"Every method survives: {', '.join(alive)} end at or above their start in most seeds."
    one = len(alive) == 1
    head = (f"{', '.join(alive)} survive{'s' * one} (end{'s' * one} at or above {'its' if one else 'their'} start "
            "in most seeds); "
            if alive else "No method survives; ")
    return head + f"{', '.join(gone)} end{'s' * (len(gone) == 1)} below {'its' if len(gone) == 1 else 'their'} start."


def records_sentences(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Sentences from verdict records: how many claims have each verdict, and each run they call collapsed."""
    if not records:
        return []
    counts = Counter(r["verdict"] for r in records)
    told: dict[str, Mapping[str, Any]] = {}
    for r in records:
        if r.get("collapsed"):
            told.setdefault(r["collapsed"]["run"], r["collapsed"])
    return [f"Of {len(records)} claim{'s' * (len(records) > 1)}: "
            + ", ".join(f"{n} “{v}”" for v, n in counts.items()) + "."] + [
        findings.collapse_sentence(c) for c in told.values()]


def say_html(sentences: Sequence[str]) -> str:
    """``sentences`` as the book's result words: a paragraph of class ``rlkit-say`` (inline `code` kept)."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(" ".join(sentences)))
    return f"<p class='rlkit-say'>{text}</p>"


def words(runs: Sequence[Run] = (), records: Sequence[Mapping[str, Any]] | None = None, *,
          survivors: bool = False, extra: Sequence[str] = ()) -> list[str]:
    """The sentences :func:`say` shows: from ``runs``, from verdict ``records``, then ``extra``."""
    sentences = [survivors_sentence(runs)] if survivors and runs else endings_sentences(runs) if runs else []
    return sentences + records_sentences(records or []) + list(extra)


def say(runs: Sequence[Run] = (), records: Sequence[Mapping[str, Any]] | None = None, *, survivors: bool = False,
        extra: Sequence[str] = ()) -> None:
    """Display the words that follow a result (:func:`words`), generated from the runs and records."""
    from IPython.display import HTML, display

    display(HTML(say_html(words(runs, records, survivors=survivors, extra=extra))))


def anatomy_table() -> str:
    """The overview's Markdown table of the four parts every method shares, one row per method page's spec."""
    rows = ["| method | " + " | ".join(ANATOMY.values()) + " |", "|---" * (len(ANATOMY) + 1) + "|"]
    for spec in load_specs():
        if spec.method_page:
            if not spec.anatomy:
                raise ValueError(f"spec {spec.name!r} gives no anatomy: its row of this table "
                                 f"({', '.join(ANATOMY)}; reproductions/specs/{spec.name}.yaml)")
            label = spec.anatomy.get("label") or f"**{spec.title.split(':')[0].strip() or spec.method}**"
            rows.append(f"| {label} | " + " | ".join(spec.anatomy[k] for k in ANATOMY) + " |")
    return "\n".join(rows)


EXAMPLE_REWARDS = (1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0)
"""The overview's worked example: one group of eight answers to one prompt, three of them right."""
EXAMPLE_RATIOS = (1.5, 0.7, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
"""Each answer's one token's ratio π_θ/π_old after some updates."""
EXAMPLE_FIRST_CALLS = (2.0, -1.0, 6.0, 3.0, -1.0, 10.0, 4.0, -1.0)
"""Where each answer first calls the calculator (−1: never), out of 12 tokens: what ASPO's bias reads."""


def worked_example(methods: Sequence[str] | None = None) -> pd.DataFrame:
    """:data:`EXAMPLE_REWARDS` through every method: advantages, gradient weights (at 1.5, 0.7), the loss."""
    rewards = torch.tensor(EXAMPLE_REWARDS, dtype=torch.float64)
    n = len(rewards)
    mask = torch.ones(n, 1, dtype=torch.float64)
    inputs = registry.AdvantageInputs(
        rewards, ["prompt"] * n, mask, correct=rewards.bool(), first_code_pos=torch.tensor(EXAMPLE_FIRST_CALLS),
        lengths=torch.full((n,), 12.0), code_pass=torch.ones(n, dtype=torch.bool),
        baselines=torch.full((n,), 0.5))
    right = rewards.bool()
    rows = {}
    for method in methods or plots.methods():
        configs = build_config(method, "cpu").method_configs
        adv = registry.advantage(method, inputs, configs).to(torch.float64)
        logp = torch.tensor(EXAMPLE_RATIOS, dtype=torch.float64).log().unsqueeze(1)
        entropy = torch.ones_like(logp) if registry.get_method(method).needs_entropy(configs[method]) else None
        loss, _ = registry.policy_loss(method, logp, torch.zeros_like(logp), adv, mask, configs, entropy=entropy)
        rows[method] = {
            "Â of the right answers": ", ".join(dict.fromkeys(f"{a:+.3f}" for a in adv[right, 0].tolist())),
            "Â of the wrong answers": ", ".join(dict.fromkeys(f"{a:+.3f}" for a in adv[~right, 0].tolist())),
            "weight at r = 1.5 (right)": f"{gradient_weight(method, EXAMPLE_RATIOS[0], 1.0):.3f}",
            "weight at r = 0.7 (wrong)": f"{gradient_weight(method, EXAMPLE_RATIOS[1], -1.0):.3f}",
            "loss": f"{loss.item():+.4f}",
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("method")


def judged(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records with an interval: the claims the runs decided or left inconclusive."""
    return [r for r in records if r.get("interval") is not None and None not in r["interval"]]


def verdict_counts(records: Sequence[Mapping[str, Any]]) -> str:
    """One sentence counting ``records`` by verdict, in the order of :data:`rlkit.lab.claims.VERDICTS`."""
    words = list(claims.VERDICTS) + sorted({r["verdict"] for r in records} - set(claims.VERDICTS))
    counts = {v: sum(r["verdict"] == v for r in records) for v in words}
    words = "; ".join(f"{n} {v}" for v, n in counts.items() if n)
    return f"Of the {len(records)} claims, {len(judged(records))} were judged on intervals" + (f": {words}." if words else ".")


def claims_summary_html(records: Sequence[Mapping[str, Any]]) -> str:
    """Every claim in one line each (method, statement, coloured verdict) under :func:`verdict_counts`."""
    rows = "".join(
        f"<tr><td>{escape(str(r['id']).rsplit('-', 1)[0])}</td><td>{escape(r['statement'])}</td>"
        f"<td style='background-color:{report.COLOURS.get(r['verdict'], 'white')}'>{escape(r['verdict'])}</td></tr>"
        for r in records)
    return (f"<p>{escape(verdict_counts(records))}</p><table class='rlkit-claims rlkit-summary'><thead><tr>"
            f"<th>method</th><th>claim</th><th>verdict</th></tr></thead><tbody>{rows}</tbody></table>")


NON_INFERIORITY = ("not lower", "within ±margin")
"""Words of a record's rule that make it a claim of no loss (non-inferiority, equality), not of a gain."""


def forest_panels(records: Sequence[Mapping[str, Any]], width: int = 44):
    """The forest plot, claims of a gain and of no loss apart, in units of each claim's margin."""
    import matplotlib.pyplot as plt

    shown = [r for r in judged(records) if r["margin"]]
    kinds = {"claims of a gain (superiority): hold right of +1":
             [r for r in shown if not any(w in (r.get("rule") or "") for w in NON_INFERIORITY)],
             "claims of no loss (non-inferiority, equality): hold right of −1":
             [r for r in shown if any(w in (r.get("rule") or "") for w in NON_INFERIORITY)]}
    kinds = {k: v for k, v in kinds.items() if v} or {"no claim was judged on an interval with a margin": []}
    labels = {id(r): textwrap.fill(f"{str(r['id']).rsplit('-', 1)[0]}: {r['statement']}", width)
              for r in shown}
    heights = [sum(labels[id(r)].count("\n") + 1 for r in rs) * 0.16 + 0.16 * len(rs) + 0.8 + 0.8 * (not rs)
               for rs in kinds.values()]
    fig, axes = plt.subplots(len(kinds), 1, figsize=(plots.PAGE_WIDTH, sum(heights) + 1.0), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, rs) in zip(axes[:, 0], kinds.items()):
        ax.axvspan(-1, 1, color="#dddddd", alpha=0.6, lw=0)
        ax.axvline(0, color="#777777", lw=0.8)
        for y, r in enumerate(reversed(rs)):
            sign = -1.0 if r["direction"] == "lower" else 1.0
            lo, hi = sorted(sign * v / r["margin"] for v in r["interval"])
            colour = report.MARKERS.get(r["verdict"], "#999999")
            ax.plot([lo, hi], [y, y], color=colour, lw=2)
            ax.plot(sign * r["estimate"] / r["margin"], y, report.SHAPES.get(r["verdict"], "o"), color=colour, ms=6)
        ax.set_yticks(range(len(rs)), [labels[id(r)] for r in reversed(rs)], fontsize=8.5)
        ax.set_ylim(-0.7, max(len(rs), 1) - 0.3)
        ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("difference in the claimed direction, in units of the claim's margin (its CI)")
    handles = [plt.Line2D([], [], color=c, marker=report.SHAPES.get(v, "o"), lw=2, label=v)
               for v, c in report.MARKERS.items() if any(r["verdict"] == v for r in shown)]
    fig.tight_layout()
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, frameon=False, fontsize=9)
    return fig


def accuracy_multiples(runs: Sequence[Run], metric: str = "val/acc", baseline: str = "grpo", ncols: int = 4):
    """Held-out accuracy, one panel per method, the ``baseline``'s mean in grey behind the others."""
    groups = plots.by_method(runs)
    names = [m for m in plots.methods() if m in groups] + [m for m in groups if m not in plots.methods()]
    fig, axes, _ = plots.panels(len(names), ncols=ncols, height=2.1, sharex=True, sharey=True)
    base = plots.seed_band(groups[baseline], metric) if baseline in groups else None
    for ax, name in zip(axes, names):
        band = plots.seed_band(groups[name], metric)
        if base is not None and name != baseline:
            ax.plot(base.index, base["mean"], color="#bbbbbb", lw=1.5, label=baseline)
        colour = plots.method_color(groups[name][0].method)
        ax.plot(band.index, band["mean"], color=colour, lw=1.8)
        ax.fill_between(band.index, band["low"], band["high"], color=colour, alpha=0.2, lw=0)
        ax.set_title(f"{name} ({len(groups[name])} seeds)", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[-ncols:]:
        ax.set_xlabel("RL step")
    fig.tight_layout()
    return fig
