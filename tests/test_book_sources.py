"""The book stands on its own: no page cites a developer file, every method page has the same anatomy and links to
the method notes, and `rlkit book` on results without runs says what is missing. Static checks: no notebook runs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from rlkit.cli import main
from rlkit.lab import paths
from rlkit.lab.book import executed_notebooks, one_parameters_cell
from rlkit.lab.notebook import fold_checks, tail

REPO, BOOK_DIR = paths.project_root(), paths.book_dir()

# Files that exist only in the developers' workspace: a published page must not send a reader to them.
DEVELOPER_FILES = ("METHODS.md", "METHODS §", "NOTES-", "DESIGN.md", "STYLE.md", "../shared")
METHOD_NOTEBOOKS = ["01_grpo", "02_gspo", "03_aspo", "04_aepo", "05_spo", "06_hapo"]
SECTIONS = ["Background", "Key equations", "Implementation", "Checks on toy tensors", "Run it",
            "Results beside the paper's claim", "Logged metrics explained", "Pitfalls and deviations", "Exercises",
            "References"]
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


@pytest.mark.parametrize("name", METHOD_NOTEBOOKS)
def test_method_page_anatomy(name):
    """Quick facts and pseudocode first, the ten sections in order, visible imports, helpers from rlkit."""
    text = (REPO / "notebooks" / f"{name}.md").read_text()
    first_section = text.index("\n## ")
    assert "{admonition} Quick facts" in text[:first_section], f"{name}: no Quick facts box before the sections"
    assert "{admonition} Pseudocode: one training step" in text[:first_section], f"{name}: no pseudocode"
    assert re.findall(r"^## (.+)$", text, re.M) == SECTIONS
    assert "remove-cell" not in text, f"{name}: a hidden cell (imports must stay visible: hide-input)"
    assert "def tail(" not in text, f"{name}: a copy of rlkit.lab.notebook.tail"
    implementation = text[text.index("## Implementation"):text.index("## Checks on toy tensors")]
    assert "show_source(" in implementation, f"{name}: Implementation does not show rlkit's source"
    if name != "01_grpo":
        assert "<notes-" in text, f"{name}: no link to its method notes"


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


TYPED_SETTINGS = re.compile(r"every \d+ steps|\b\d+ RL steps|policy of step \$n ?- ?\d+|\b\d+ optimizer steps per")
"""Run settings typed into a page's text (the evaluation interval, the number of steps, the staleness, the updates
per batch): a page quotes them from the config it runs (glue, or a generated paragraph) instead."""


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.md")), ids=lambda p: p.stem)
def test_pages_quote_run_settings_from_the_config(path):
    text = re.sub(r"```\{code-cell\}.*?```", "", path.read_text(), flags=re.S)  # the prose, not the code
    typed = [m.group(0) for m in TYPED_SETTINGS.finditer(text)]
    assert not typed, f"{path.name} types run settings the config sets: {typed}"

