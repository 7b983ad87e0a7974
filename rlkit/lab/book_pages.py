"""The book's generated text: every list of the methods on its hand-written pages, and the *Full-scale runs*
page's presets table, commands and list of verl twins.

A page is hand-written except between markers (``<!-- rlkit KIND … -->`` to ``<!-- end -->``), each block
rendered here from today's specs and presets (:func:`update_book_page`); ``python -m rlkit.lab.book_pages``
rewrites them, and tests fail when a committed page differs. Nothing here imports verl."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from rlkit.lab import paths, two_engines
from rlkit.lab.claims import VERDICTS
from rlkit.lab.plots import methods
from rlkit.lab.report import GLOSSARY
from rlkit.lab.specs import Spec, load_specs
from rlkit.lab.stats import SeedRule
from rlkit.registry import get_method
from rlkit.verl.launch import plan
from rlkit.verl.launch.presets import CPU_STEPS, PRESETS, dataset_spec, method_preset

BOOK_METHODS = [m for m in methods() if m in PRESETS]
"""The methods the page shows: every registered method verl has a preset for, in the figures' order."""
DAPO_RUNS: dict[str, tuple[str, int, int]] = {
    "grpo": ("Qwen/Qwen3-8B", 8, 1),  # SPO's GRPO baseline (method notes: SPO)
    "gspo": ("Qwen/Qwen3-8B-Base", 8, 1),  # the paper's Qwen3-30B-A3B-Base is MoE: Megatron territory
    "aspo": ("Qwen/Qwen3-8B", 8, 1),  # ASPO §4.1
    "aepo": ("Qwen/Qwen3-4B", 8, 1),  # ARLArena's math trainer, 4B (method notes: AEPO)
    "spo": ("Qwen/Qwen3-8B", 8, 1),  # SPO (method notes: SPO)
    "hapo": ("Qwen/Qwen3-8B-Base", 8, 4),  # v1 Table 1's Qwen3 row, 32×A100 (method notes: HAPO)
}
"""Each method's DAPO-Math run as its paper ran it: (model, GPUs per node, nodes); others run as GRPO's."""

#: The runs the book's "Full-scale runs" page shows: dataset → method → (model, GPUs per node, nodes).
BOOK_RUNS: dict[str, dict[str, tuple[str, int, int]]] = {
    "gsm8k": {m: ("Qwen/Qwen2.5-0.5B-Instruct", 1, 1) for m in BOOK_METHODS},  # one 80 GB GPU
    "dapo": {m: DAPO_RUNS.get(m, DAPO_RUNS["grpo"]) for m in BOOK_METHODS},
}


NO_DUAL_CLIP = ("cispo",)
"""Loss modes with no dual clip (their loss never reads ``clip_ratio_c``): the presets table shows "—"."""

RAY_HEAD = "HEAD:6379"
"""The Ray address the page's multi-node commands show (the cluster's head node)."""


def render_command(method: str, dataset: str, model: str | None = None, *, gpus: int | None = None,
                   nodes: int | None = None, extra: Sequence[str] = ()) -> str:
    """The ``rlkit launch`` line and the ``main_ppo`` command it runs (defaults: :data:`BOOK_RUNS`)."""
    method_preset(method), dataset_spec(dataset)  # unknown names fail here, listing the valid ones
    default_model, default_gpus, default_nodes = BOOK_RUNS[dataset][method]
    model, gpus, nodes = model or default_model, gpus or default_gpus, nodes or default_nodes
    ray = RAY_HEAD if nodes != 1 else None  # several nodes run on a Ray cluster started beforehand
    p = plan(method, dataset, model, gpus=gpus, nodes=nodes, ray_address=ray, extra=extra)
    launch = ["rlkit", "launch", "--method", method, "--dataset", dataset, "--model", model,
              "--gpus", str(gpus)]
    if nodes != 1:
        launch += ["--nodes", str(nodes), "--ray-address", ray]
    if extra:
        launch += ["--", *extra]
    return " ".join(shlex.quote(w) for w in launch) + "\n" + p.shell(multiline=True)


def verdict_legend(records: Sequence[Mapping[str, Any]] | None = None) -> list[tuple[str, Any]]:
    """The verdict legend, five ``(term, meaning)`` lines read from the verdicts and :data:`GLOSSARY`."""
    present = {r["verdict"] for r in records} if records is not None else set(VERDICTS)
    words = [(v, GLOSSARY[v]) for v in VERDICTS if v in present and v in GLOSSARY]
    rule = SeedRule()
    counts = sorted({len(r["seeds"]) for r in records or () if r.get("interval") is not None and r.get("seeds")})
    judged = (f"these claims were judged on {counts[0]}" + (f"–{counts[-1]}" if counts[-1] != counts[0] else "")
              + " seeds; ") if counts else ""
    seeds = (f"{judged}each claim starts with {rule.start} seeds, paired by seed with its baseline, and one still "
             f"inconclusive gets {rule.batch} more at a time, up to {rule.cap}")
    return [("verdicts", words), ("interval (CI)", GLOSSARY["CI"]), ("margin", GLOSSARY["margin"]),
            ("seeds", seeds), ("rules", "every rule, in one paragraph, on the comparison page")]


def verdict_legend_markdown(records: Sequence[Mapping[str, Any]] | None = None) -> str:
    """:func:`verdict_legend` as a Markdown list, a verdict word a line (``<!-- rlkit verdicts -->``)."""
    lines = []
    for term, meaning in verdict_legend(records):
        if term == "verdicts":
            lines += ["- **the verdict words**:"] + [f"  - *{word}*: {gloss}" for word, gloss in meaning]
        else:
            rules = ": {ref}`verdict rules <verdict-rules>`" if term == "rules" else ""
            lines.append(f"- **{term}**: {meaning}{rules}")
    return "<!-- rlkit verdicts -->\n" + "\n".join(lines) + "\n<!-- end -->"


def verdict_legend_html(records: Sequence[Mapping[str, Any]] | None = None, rules_html: str = "") -> str:
    """:func:`verdict_legend` as the HTML box beside a claims table; ``rules_html``: the rules line's text."""
    items = []
    for term, meaning in verdict_legend(records):
        if term == "verdicts":
            body = "; ".join(f"<i>{escape(word)}</i>: {escape(gloss)}" for word, gloss in meaning)
        else:
            body = rules_html if term == "rules" and rules_html else escape(meaning)
        items.append(f"<li><b>{escape(term)}</b>: {body}</li>")
    return f"<div class='rlkit-legend'><p class='rlkit-legend-title'>Reading the verdicts</p><ul>{''.join(items)}</ul></div>"


def references_line(specs_dir: Path | None = None) -> str:
    """The overview's references: every method page's method by name, cited (its spec's paper), in notebook order."""
    cited = ", ".join(f"{display_name(s)} {{cite:p}}`{s.paper}`" for s in method_specs(specs_dir))
    return f"<!-- rlkit references -->\nThe methods: {cited}; the full list is on {{doc}}`../papers`.\n<!-- end -->"


_BLOCK = re.compile(r"<!-- rlkit (presets|twins|cpu command|cpu launches|pretrained|method pages|methods|papers|verdicts|references|"
                    r"launch (\w+) (\w+)) -->\n.*?<!-- end -->", re.S)
_RUNS = re.compile(r"<!-- rlkit runs (\w+) -->\n.*?<!-- end runs -->", re.S)
_TOC = re.compile(r"^( *)# rlkit (method|topic) pages\n.*?^ *# end\n", re.S | re.M)
GENERATED = (_RUNS, _BLOCK, _TOC)
"""Every kind of generated block, outermost first (a ``runs`` block holds ``launch`` blocks)."""


def method_specs(specs_dir: Path | None = None) -> list[Spec]:
    """The specs of the method pages (those that train a method, topic pages aside), in notebook order."""
    return [s for s in load_specs(specs_dir) if s.method_page]


def topic_specs(specs_dir: Path | None = None) -> list[Spec]:
    """The specs of the topic pages (:attr:`rlkit.lab.specs.Spec.topic`), in notebook order."""
    return [s for s in load_specs(specs_dir) if s.topic]


def display_name(spec: Spec) -> str:
    """The method's name in prose: its spec's title up to the colon (``Dr. GRPO``)."""
    return spec.title.partition(":")[0].strip() or spec.method.upper()


def page_summary(spec: Spec) -> str:
    """What the method's page shows: its spec's title after the colon."""
    return spec.title.partition(":")[2].strip()


def _page(spec: Spec) -> str:
    """The book's name of a spec's page (``notebooks/01_grpo``: :mod:`rlkit.lab.book` stages it there)."""
    return "notebooks/" + Path(spec.notebook).stem


def _markdown(rows: list[list]) -> list[str]:
    """A Markdown table: a header row, then the rows."""
    return ["| " + " | ".join(map(str, rows[0])) + " |", "|" + "---|" * len(rows[0])] + [
        "| " + " | ".join(map(str, r)) + " |" for r in rows[1:]]


def method_pages_table(specs_dir: Path | None = None) -> str:
    """The intro's table of the method pages: each linked by its method's name, with the rest of its title."""
    rows = [["method", "what its page shows"]] + [
        [f"{{doc}}`{display_name(s)} <{_page(s)}>`", page_summary(s)]
        for s in method_specs(specs_dir)]
    return "<!-- rlkit method pages -->\n" + "\n".join(_markdown(rows)) + "\n<!-- end -->"


def methods_table(specs_dir: Path | None = None) -> str:
    """The README's table of the methods: each by its name, its module and what its page shows."""
    rows = [["method", "module", "what its page shows"]] + [
        [f"**{display_name(s)}**", f"`rlkit/methods/{s.method}.py`", page_summary(s)]
        for s in method_specs(specs_dir)]
    return "<!-- rlkit methods -->\n" + "\n".join(_markdown(rows)) + "\n<!-- end -->"


def papers_table(specs_dir: Path | None = None) -> str:
    """The papers page's table: each method's page, the paper its spec cites, and its rlkit module."""
    rows = [["method", "paper", "rlkit's module"]] + [
        [f"{{doc}}`{display_name(s)} <{_page(s)}>`", f"{{cite:t}}`{s.paper}`",
         f"`{get_method(s.method).config.__module__}`"] for s in method_specs(specs_dir)]
    return "<!-- rlkit papers -->\n" + "\n".join(_markdown(rows)) + "\n<!-- end -->"


def toc_block(indent: str = "      ", specs_dir: Path | None = None, kind: str = "method") -> str:
    """``_toc.yml``'s chapters of the method pages (or with ``kind`` ``topic``, the topic pages)."""
    specs = {"method": method_specs, "topic": topic_specs}[kind](specs_dir)
    lines = [f"{indent}# rlkit {kind} pages"] + [f"{indent}- file: {_page(s)}" for s in specs]
    return "\n".join([*lines, f"{indent}# end"]) + "\n"


def runs_block(dataset: str) -> str:
    """The page's commands on ``dataset``: for each method of :data:`BOOK_RUNS`, a heading and its launch block."""
    names = {s.method: display_name(s) for s in method_specs()}
    parts = [f"#### {names.get(m, m.upper())}\n{book_block(m, dataset)}" for m in BOOK_RUNS[dataset]]
    return f"<!-- rlkit runs {dataset} -->\n" + "\n\n".join(parts) + "\n<!-- end runs -->"


def presets_table() -> str:
    """The page's two tables of presets: each method's loss, and its batch on DAPO-Math as in its paper."""
    loss = ["method", "`adv_estimator`", "`loss_mode`", "clip ε_low / ε_high / c", "loss aggregation"]
    batch = ["method", "responses per prompt", "updates per batch", "prompts per step", "max response",
             "DAPO mechanics", "tools"]
    tables = {"loss": [loss], "batch": [batch]}
    actor = "actor_rollout_ref.actor."
    for method in BOOK_METHODS:
        preset = PRESETS[method]
        keys = {**preset.keys, **preset.dapo}
        mode = keys[actor + "policy_loss.loss_mode"]
        shown = [f"{keys[actor + key]:g}" if actor + key in keys else "—"  # unset: a key the loss never reads
                 for key in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")]
        clip = " / ".join(shown[:2] + ["—" if any(m in mode for m in NO_DUAL_CLIP) else shown[2]])
        mechanics = [name for name, on in (
            ("dynamic sampling", keys.get("algorithm.filter_groups.enable")),
            ("overlong penalty", keys.get("reward.reward_manager.name") == "dapo")) if on]
        tables["loss"].append([method, keys["algorithm.adv_estimator"], mode, clip,
                               keys[actor + "loss_agg_mode"]])
        tables["batch"].append([method, preset.n, preset.updates, preset.dapo_prompts,
                                f"{keys['data.max_response_length']:,}", ", ".join(mechanics) or "—",
                                "Python sandbox" if preset.tools else "—"])

    lines = ["The loss:", "", *_markdown(tables["loss"]), "", "The batch, on DAPO-Math as in each paper (prompts "
             "and responses per step, optimizer updates per batch, the response budget in tokens):", "",
             *_markdown(tables["batch"])]
    return "<!-- rlkit presets -->\n" + "\n".join(lines) + "\n<!-- end -->"


def cpu_command() -> str:
    """The page's CPU launch line, naming every method it takes (:data:`BOOK_METHODS`) and the default step count."""
    return ("<!-- rlkit cpu command -->\n```bash\nrlkit launch --method grpo --device cpu              # any of "
            f"{', '.join(BOOK_METHODS)}; --steps N (default {CPU_STEPS})\n```\n<!-- end -->")


def twins_block(verl_root: Path | str | None = None) -> str:
    """The methods with a verl twin and those without (:func:`rlkit.lab.two_engines.twins_words`)."""
    words = two_engines.twins_words(verl_root)
    return (f"<!-- rlkit twins -->\nThe methods with a twin: {words['twin_methods']}; "
            f"{words['no_twin_methods']}.\n<!-- end -->")


LAUNCH_FALLBACK_METRIC = "critic/advantages/max"
"""The own-metric column of a method that logs no metric named after it (GRPO's group advantages)."""


def launches_table(path: Path | str | None = None) -> str:
    """The page's table of CPU launches, one row per method, under its machine: ``path`` (default: the
    published ``toy-launches.json``), each method's 5-step launch, timed by benchmarks/verl_cpu_methods.py."""
    path = Path(path) if path is not None else two_engines.published_twins_dir() / "toy-launches.json"
    if not path.exists():
        return ("<!-- rlkit cpu launches -->\nNo CPU launches measured yet (`python benchmarks/verl_cpu_methods.py`)."
                "\n<!-- end -->")
    data = json.loads(path.read_text())
    runs = {r["method"]: r for r in data["runs"]}
    loads = [r[k] for r in data["runs"] for k in ("load_before", "load_after") if r.get(k) is not None]
    head = (f"Measured on {data['cpu']}, {data['cores']} cores, no GPU, {data['date']}, commit {data['commit']}: "
            f"`{data['command']}` for each method, one after another (`python benchmarks/verl_cpu_methods.py`), "
            f"the 1-minute load average {min(loads):g}–{max(loads):g} around them. One run each: the probe reward "
            "moves by chance at this length. " + _moved(data["runs"]))
    rows = [["method", "launch, all in (s)", "median step (s)", "steps", "probe reward, first → last step",
             "the method's own metric over the steps"]]
    for m in BOOK_METHODS:
        r = runs.get(m)
        if r is None:
            rows.append([m, "not measured", "", "", "", ""])
        elif "error" in r:
            rows.append([m, f"failed ({r.get('launch_s') or r['wall_s']:g} s)", "", "", "", ""])
        else:
            rows.append([m, f"{r['launch_s']:.0f}", f"{r['median_step_s']:.2f}", str(r["steps"]),
                         f"{r['reward'][0]:.2f} → {r['reward'][1]:.2f}",
                         f"`{r['own_metric']}` " + _span(r["own_range"])])
    return "<!-- rlkit cpu launches -->\n" + head + "\n\n" + "\n".join(_markdown(rows)) + "\n<!-- end -->"


PRETRAINED_FIGURE = "_static/smollm2_gsm8k.png"
"""The figure of :func:`pretrained_table`'s runs (``benchmarks/verl_cpu_pretrained.py`` draws it)."""


def pretrained_table(path: Path | str | None = None) -> str:
    """The page's table and figure of a pretrained model's GSM8K runs through ``main_ppo`` on a CPU
    (``path``, default: the published ``smollm2-gsm8k/runs.json``)."""
    path = Path(path) if path is not None else two_engines.published_twins_dir() / "smollm2-gsm8k/runs.json"
    if not path.exists():
        return ("<!-- rlkit pretrained -->\nNo pretrained run measured yet (`python benchmarks/verl_cpu_pretrained.py`)."
                "\n<!-- end -->")
    data = json.loads(path.read_text())
    model = data["model"]
    dirty = " with uncommitted changes to rlkit" if data.get("rlkit_changes_uncommitted") else ""
    head = (f"Measured on {data['cpu']}, {data['cores']} cores, no GPU, {data['date']}, commit {data['commit']}{dirty}: "
            f"{model['name']} ({model.get('package', '?')} {model.get('version', '?')}, {model.get('dtype', '?')}, "
            f"weights SHA-256 `{model['weights_sha256'][:12]}…`), `{data['command']}` for each method, one after "
            "another (`python benchmarks/verl_cpu_pretrained.py`). One run each.")
    rows = [["method", "outcome", "steps", "start-up (s)", "step (s, median)", "reward, first → last (highest)",
             "answer length, first → last (tokens; cut at the cap)", "held-out accuracy, before → after"]]
    for method, r in data["runs"].items():
        steps, acc = r.get("steps") or [], r.get("held_out_accuracy") or {}
        reward, length, cut = r.get("reward") or [], r.get("response_length") or [], r.get("clipped") or []
        before_after = " → ".join(f"{acc[k]:.3f}" for k in sorted(acc, key=int)) if acc else "not logged"
        lengths = f"{length[0]:.0f} → {length[-1]:.0f}" if length else "not logged"
        rows.append([method, str(r.get("outcome")), str(len(steps)),
                     f"{r['startup_s']:.0f}" if r.get("startup_s") is not None else "—",
                     f"{r['median_s']['step']:.0f}" if "step" in r.get("median_s", {}) else "—",
                     f"{reward[0]:.3f} → {reward[-1]:.3f} ({max(reward):.3f})" if reward else "not logged",
                     lengths + (f" ({sum(cut) / len(cut):.0%} cut)" if cut else ""), before_after])
    methods = two_engines.word_list([m for m, r in data["runs"].items() if r.get("steps")])
    figure = (f"```{{figure}} {PRETRAINED_FIGURE}\n:name: fig-pretrained-gsm8k\n:alt: Three line charts against the "
              f"verl step, one line per method ({methods}): the training reward, the mean response length in tokens, "
              "and the held-out GSM8K accuracy before the first step and after the last.\n\n"
              f"{model['name']} on GSM8K through verl's `main_ppo` on a CPU, one run per method: the training "
              "reward, the response length, and the held-out accuracy (greedy) before the first step and after "
              "the last.\n```")
    return ("<!-- rlkit pretrained -->\n" + head + "\n\n" + "\n".join(_markdown(rows)) + "\n\n" + figure
            + "\n<!-- end -->")


def _span(bounds: list[float] | None) -> str:
    """A metric's range over the steps, with as many digits as tell its ends apart (up to 6); float noise as 0."""
    if not bounds:
        return "not logged"
    lo, hi = (0.0 if abs(x) < 1e-9 else x for x in bounds)
    if lo == hi:
        return f"{lo:.3g} throughout"
    digits = next((d for d in range(3, 7) if f"{lo:.{d}g}" != f"{hi:.{d}g}"), 6)
    fmt = lambda x: f"{x:.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"  # noqa: E731
    return f"{fmt(lo)}–{fmt(hi)}"


def _moved(runs: list[dict]) -> str:
    """Which launches' own metric moved, which stayed put, and which methods log no metric of their own."""
    done = [r for r in runs if "error" not in r and r.get("own_range")]
    none = [r["method"] for r in done if r["own_metric"] == LAUNCH_FALLBACK_METRIC]
    own = [r for r in done if r["own_metric"] != LAUNCH_FALLBACK_METRIC]
    still = [r["method"] for r in own if r["own_range"][0] == r["own_range"][1]]
    out = f"Each method's own metric is logged; it moves in {len(own) - len(still)} of {len(own)} launches"
    if still:
        out += (f" and stays put in {two_engines.word_list(still)} (the mechanism did not act over these few steps "
                "of a toy model)")
    if none:
        one = len(none) == 1
        out += (f"; {two_engines.word_list(none)} log{'s' * one} no metric named after {'it' if one else 'them'}, "
                f"so the column shows `{LAUNCH_FALLBACK_METRIC}`")
    return out + "."


def book_block(method: str, dataset: str) -> str:
    """The page's Markdown for one run: the launch line, and the ``main_ppo`` command in a dropdown."""
    launch_line, _, command = render_command(method, dataset).partition("\n")
    return (f"<!-- rlkit launch {method} {dataset} -->\n```bash\n{launch_line}\n```\n\n"
            f":::{{dropdown}} The verl command it validates and runs\n```bash\n{command}\n```\n:::\n"
            "<!-- end -->")


def update_book_page(text: str) -> str:
    """``text`` with every generated block re-rendered (module doc)."""
    def render(match: re.Match) -> str:
        fixed = {"presets": presets_table, "twins": twins_block, "cpu command": cpu_command,
                 "cpu launches": launches_table, "pretrained": pretrained_table,
                 "method pages": method_pages_table, "methods": methods_table,
                 "papers": papers_table, "verdicts": verdict_legend_markdown,
                 "references": references_line}.get(match.group(1))
        return fixed() if fixed else book_block(match.group(2), match.group(3))

    text = _TOC.sub(lambda m: toc_block(m.group(1), kind=m.group(2)), text)
    return _BLOCK.sub(render, _RUNS.sub(lambda m: runs_block(m.group(1)), text))


BOOK_PAGES = ("_toc.yml", "intro.md", "papers.md", "full_scale_runs.md", "method_notes.md")
"""The book's hand-written files that hold generated blocks."""
PROJECT_PAGES = ("README.md", "notebooks/00_overview.md")
"""The project's other files that hold them: the README's table of the methods, the overview's references."""


def generated_pages(book: Path | None = None) -> list[Path]:
    """Every hand-written file that holds generated blocks: :data:`BOOK_PAGES` and :data:`PROJECT_PAGES`."""
    pages = [Path(book or paths.book_dir()) / name for name in BOOK_PAGES]
    return [*pages, *(paths.project_root() / name for name in PROJECT_PAGES)]


def update_book(book: Path | None = None) -> list[Path]:
    """Re-render the generated blocks of every file of :func:`generated_pages`; returns those that changed."""
    changed = []
    for path in generated_pages(book):
        text = path.read_text()
        if (new := update_book_page(text)) != text:
            path.write_text(new)
            changed.append(path)
    return changed


if __name__ == "__main__":  # python -m rlkit.lab.book_pages
    for path in update_book():
        print(f"updated {path}")
