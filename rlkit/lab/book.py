"""Build the Jupyter Book (1.x, offline) from the executed notebooks of the reproductions.

:func:`build` copies each spec's executed notebook from the results into ``<book>/notebooks/`` and runs
``jupyter-book build`` with warnings as errors; nothing is executed during the build, so the pages show
exactly what ``rlkit reproduce`` computed (generated text of the pages: :mod:`rlkit.lab.book_pages`).

    rlkit book                                  # reproductions/results -> book/_build/html
    rlkit book --results /tmp/smoke --book /tmp/book-copy
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlkit.errors import DamagedFile, ExecutionFailed, NotABook
from rlkit.files import BOOK, claim_dir, lock_dir, os_errors, record_files, remove_owned
from rlkit.lab import paths
from rlkit.lab.specs import load_specs


def executed_notebooks(results: Path | None = None, specs_dir: Path | None = None) -> dict[str, Path]:
    """Where each spec's executed notebook lies under ``results`` (default: the project's), by spec name."""
    results = Path(results or paths.results_dir())
    return {spec.name: spec.out_dir(results) / f"{Path(spec.notebook).stem}.ipynb" for spec in load_specs(specs_dir)}


def check_results(results: Path | None = None, specs_dir: Path | None = None) -> dict[str, Path]:
    """:func:`executed_notebooks`, or FileNotFoundError naming every missing one and the command that makes them."""
    results = Path(results or paths.results_dir())
    notebooks = executed_notebooks(results, specs_dir)
    missing = {name: path for name, path in notebooks.items() if not path.exists()}
    if not missing:
        return notebooks
    if not results.is_dir():
        raise FileNotFoundError(f"results directory {results} does not exist: the book is built from the executed "
                                f"notebooks that `rlkit reproduce --results {results}` writes there (the published "
                                "ones: reproductions/results-cpu)")
    listed = "\n".join(f"  {name}: {path.relative_to(results)}" for name, path in missing.items())
    kind = "holds no executed notebooks" if len(missing) == len(notebooks) else "lacks executed notebooks"
    raise FileNotFoundError(f"{results} {kind} for {len(missing)} of {len(notebooks)} reproductions:\n{listed}\n"
                            f"make them with `rlkit reproduce --only {' '.join(missing)} --results {results}`")


def check_book(book: Path) -> None:
    """Refuse (:class:`~rlkit.errors.NotABook`) a ``book`` directory without ``_config.yml`` and ``_toc.yml``."""
    missing = [name for name in ("_config.yml", "_toc.yml") if not (Path(book) / name).is_file()]
    if missing:
        raise NotABook(f"{book} is not a Jupyter Book (no {' or '.join(missing)}): pass --book-dir the folder that "
                       "holds the book's _config.yml and _toc.yml (default: the project's book/)")


def stage(book: Path | None = None, results: Path | None = None, specs_dir: Path | None = None, *,
          force: bool = False) -> list[Path]:
    """Copy every spec's executed notebook into ``<book>/notebooks/`` (missing ones named first)."""
    book = Path(book or paths.book_dir())
    check_book(book)
    notebooks = check_results(results, specs_dir)
    again = f"execute it again: rlkit reproduce --only {{}} --results {Path(results or paths.results_dir())}"
    pages = {name: read_executed(path, again.format(name)) for name, path in notebooks.items()}
    target = book / "notebooks"
    names = [path.name for path in notebooks.values()]
    claim_dir(target, BOOK, force=force, writes=names)
    with lock_dir(target, BOOK), os_errors():
        remove_owned(target, keep=names)
        record_files(target, BOOK, names)
        staged = []
        shown = paths.results_shown(results)
        for name, path in notebooks.items():  # each page with one parameters cell, folded, written once
            page = fold_parameters(one_parameters_cell(pages[name]), shown)
            staged.append(target / path.name)
            staged[-1].write_text(json.dumps(page, indent=1, ensure_ascii=False) + "\n")
        return staged


def read_executed(path: Path, remedy: str = "execute it again (rlkit reproduce)") -> dict[str, Any]:
    """The executed notebook at ``path``, refused with ``remedy`` when damaged, failed or unfinished."""
    with os_errors():
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        nb = json.loads(text)
    except ValueError as e:
        raise DamagedFile(f"{path} is cut off or not a notebook (not JSON: {e.msg} at line {e.lineno}): "
                          f"{remedy}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise DamagedFile(f"{path} is not a notebook (no list of cells): {remedy}")
    for cell in nb["cells"]:
        for output in cell.get("outputs", []) if isinstance(cell, dict) else []:
            if isinstance(output, dict) and output.get("output_type") == "error":
                error = f"{output.get('ename', '?')}: {str(output.get('evalue', '')).strip()}".splitlines()[0]
                raise ExecutionFailed(f"{path}: its execution failed in cell [{cell.get('execution_count')}] "
                                      f"({error}), and the book does not publish a traceback: {remedy}")
    for number, cell in enumerate(nb["cells"], 1):
        if not_run := not_executed(cell):
            raise ExecutionFailed(f"{path}: code cell {number} was not executed ({not_run}): the "
                                  "execution stopped before the end, and the book publishes only notebooks "
                                  f"executed to the end: {remedy}")
    return nb


def not_executed(cell: Any) -> str | None:
    """Why a code ``cell`` was not executed (papermill left it ``pending``, no execution count), or None."""
    source = "".join(cell.get("source", "")) if isinstance(cell, dict) else ""
    if not isinstance(cell, dict) or cell.get("cell_type") != "code" or not source.strip():
        return None
    status = (cell.get("metadata", {}).get("papermill") or {}).get("status")
    if status not in (None, "completed"):
        return f"papermill left it {status}"
    return "it has no execution count" if cell.get("execution_count") is None else None


_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<value>[^#]*?)\s*(?P<comment>#.*)?$")


def one_parameters_cell(nb: dict[str, Any]) -> dict[str, Any]:
    """A page's two parameter cells made one: papermill's injected values in the notebook's own."""
    cells = nb.get("cells", [])

    def tagged(tag: str) -> int | None:
        return next((i for i, c in enumerate(cells) if tag in c.get("metadata", {}).get("tags", [])), None)

    own, injected = tagged("parameters"), tagged("injected-parameters")
    if own is None or injected is None:
        return nb
    values = {m["name"]: m["value"] for line in "".join(cells[injected]["source"]).splitlines()
              if (m := _ASSIGNMENT.match(line))}
    lines = []
    for line in "".join(cells[own]["source"]).splitlines():
        m = _ASSIGNMENT.match(line)
        if m is None or m["name"] not in values:
            lines.append(line)
            continue
        code = f"{m['name']} = {values.pop(m['name'])}"
        comment = m["comment"] or ""
        column = line.index(comment) if comment else 0
        lines.append(f"{code.ljust(column - 1)} {comment}".rstrip() if comment else code)
    lines += [f"{name} = {value}" for name, value in values.items()]
    merged = {**cells[own], "source": "\n".join(lines)}
    return {**nb, "cells": [merged if i == own else c for i, c in enumerate(cells) if i != injected]}


PARAMETERS_LINE = "This page was executed with {values} (the parameters cell, folded here: `rlkit reproduce` sets them)."
"""The line above a page's folded parameters cell: the values it ran with, in one line."""


def fold_parameters(nb: dict[str, Any], shown: str) -> dict[str, Any]:
    """A page's parameters cell folded under one line (:data:`PARAMETERS_LINE`), ``results`` as ``shown``."""
    cells = nb.get("cells", [])
    own = next((i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if own is None:
        return nb
    values, lines = {}, []
    for line in "".join(cells[own]["source"]).splitlines():
        m = _ASSIGNMENT.match(line)
        if m and m["name"] == "results" and m["value"] not in ("None", ""):
            line = line.replace(m["value"], json.dumps(shown), 1)
            m = _ASSIGNMENT.match(line)
        if m:
            values[m["name"]] = m["value"]
        lines.append(line)
    tags = list(cells[own].get("metadata", {}).get("tags", []))
    cell = {**cells[own], "source": "\n".join(lines),
            "metadata": {**cells[own].get("metadata", {}), "tags": tags + ["hide-cell"] * ("hide-cell" not in tags)}}
    said = ", ".join(f"`{k} = {v}`" for k, v in values.items() if k != "progress")
    line = {"cell_type": "markdown", "metadata": {}, "source": PARAMETERS_LINE.format(values=said)}
    meta = dict(nb.get("metadata", {}))
    if isinstance(meta.get("papermill"), dict):  # where papermill read and wrote it: this machine's paths
        record = {k: v for k, v in meta["papermill"].items() if k not in ("input_path", "output_path")}
        if isinstance(record.get("parameters"), dict) and "results" in record["parameters"]:
            record["parameters"] = {**record["parameters"], "results": shown}
        meta["papermill"] = record
    return {**nb, "metadata": meta, "cells": cells[:own] + [line, cell] + cells[own + 1:]}


def build(book: Path | None = None, results: Path | None = None, *, strict: bool = True,
          specs_dir: Path | None = None, force: bool = False) -> Path:
    """Stage the notebooks and build the HTML book afresh (``strict``: warnings are errors); its index."""
    book = Path(book or paths.book_dir())
    stage(book, results, specs_dir, force=force)
    cmd = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()", "build", str(book), "--all"]
    if strict:
        cmd += ["-W", "--keep-going"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"jupyter-book build failed ({' '.join(cmd[3:])}):\n{tail}")
    index = book / "_build" / "html" / "index.html"
    if not index.exists():
        raise RuntimeError(f"jupyter-book reported success but {index} is missing")
    return index
