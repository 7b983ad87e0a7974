"""No code line a learner reads is wider than the book's code column (issue 47): a longer line wraps to column 0
in the book (``white-space: pre-wrap`` in ``book/_static/rlkit.css``) and loses its indentation. Static: the
MyST notebooks are parsed with jupytext, only their code cells are read (no output, no Markdown), nothing runs."""

from __future__ import annotations

from pathlib import Path

import jupytext
import pytest

from rlkit.lab import paths

NOTEBOOKS = sorted((paths.project_root() / "notebooks").glob("*.md"))
CODE_COLUMNS = 88
"""The widest code line the book shows whole at 1280 px, derived from the theme's CSS (sphinx-book-theme 1.3.0 on
pydata-sphinx-theme 0.17.1) and ``rlkit.css``: the primary sidebar takes 20% (256 px), the page's table of
contents 17rem (272 px), the article 2rem of padding on each side, the cell its 1rem ``pre`` padding and a 4 px
border — about 650 px of code column, 90 characters of 12 px DejaVu Sans Mono (7.2 px each); 88 leaves room for
a 15 px scrollbar."""


def long_code_lines(text: str, width: int = CODE_COLUMNS) -> list[str]:
    """``cell N, line M (L chars): ...`` for every code-cell line of a MyST notebook wider than ``width``."""
    notebook = jupytext.reads(text, fmt="md:myst")
    found = []
    for n, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        for m, line in enumerate(cell.source.splitlines(), 1):
            if len(line) > width:
                found.append(f"cell {n}, line {m} ({len(line)} chars): {line.strip()[:60]}")
    return found


def test_the_width_rule_reads_code_cells_only():
    wide = "x = " + "1 + " * 30 + "1"
    page = (f"# A page\n\nSome prose {'that runs on ' * 12}\n\n```{{code-cell}} ipython3\n{wide}\nprint(x)\n```\n\n"
            f"```python\n{wide}\n```\n")
    assert long_code_lines(page) == [f"cell 1, line 1 ({len(wide)} chars): {wide[:60]}"]
    assert long_code_lines(page.replace(wide + "\nprint", "x = 1\nprint", 1)) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_code_line_is_wider_than_the_books_code_column(path: Path):
    wide = long_code_lines(path.read_text())
    assert not wide, f"{path.name}: {len(wide)} code lines over {CODE_COLUMNS} columns, first {wide[:3]}"
