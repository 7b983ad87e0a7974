"""Where the reproduction app finds its project (``reproductions/specs/`` and ``notebooks/``):
``$RLKIT_PROJECT``, else the nearest folder at or above the current one, else the checkout rlkit was imported
from; resolved when asked, never at import (:class:`ProjectNotFound` without one)."""

from __future__ import annotations

import os
from pathlib import Path

from rlkit.errors import UsageError

ENV = "RLKIT_PROJECT"
"""The environment variable that names the project folder."""
MARKERS = ("reproductions/specs", "notebooks")
"""The folders a project holds (relative to its root)."""


class ProjectNotFound(UsageError):
    """No rlkit project (``reproductions/specs/`` and ``notebooks/``) where the app looked (exit 2)."""


def is_project(folder: str | Path) -> bool:
    """Whether ``folder`` holds every one of :data:`MARKERS`."""
    return all((Path(folder) / marker).is_dir() for marker in MARKERS)


def _checkout() -> Path:
    """The folder above the ``rlkit`` package this module was imported from (a checkout when installed editable)."""
    return Path(__file__).resolve().parents[2]


def find_project() -> Path | None:
    """The project root (the module's order), or None; ``$RLKIT_PROJECT`` naming no project is an error."""
    named = os.environ.get(ENV)
    if named:
        root = Path(named).expanduser().resolve()
        if not is_project(root):
            missing = [m + "/" for m in MARKERS if not (root / m).is_dir()]
            raise ProjectNotFound(f"{ENV}={named} is not an rlkit project (no {' or '.join(missing)} in {root}): "
                                  f"point {ENV} at a checkout of rlkit, or unset it")
        return root
    here = Path.cwd().resolve()
    return next((c for c in (here, *here.parents, _checkout()) if is_project(c)), None)


def project_root() -> Path:
    """The project root, or :class:`ProjectNotFound` naming what is missing, where it looked and what to do."""
    root = find_project()
    if root is None:
        here, checkout = Path.cwd().resolve(), _checkout()
        raise ProjectNotFound(
            f"no rlkit project found: {' and '.join(m + '/' for m in MARKERS)} are not in {here} or any folder above "
            f"it, nor in {checkout} (where rlkit is installed): run from a checkout of rlkit, or set {ENV} to one")
    return root


def specs_dir() -> Path:
    """``<project>/reproductions/specs``: one YAML spec per reproduction."""
    return project_root() / "reproductions" / "specs"


def results_dir() -> Path:
    """``<project>/reproductions/results``: this machine's runs and executed notebooks (``rlkit reproduce``)."""
    return project_root() / "reproductions" / "results"


def published_dir() -> Path:
    """``<project>/reproductions/results-cpu``: the published cpu-scale results (:mod:`rlkit.lab.reproduced`)."""
    return project_root() / "reproductions" / "results-cpu"


def book_dir() -> Path:
    """``<project>/book``: the Jupyter Book's hand-written pages and configuration (:mod:`rlkit.lab.book`)."""
    return project_root() / "book"


def results_shown(results: Path | str | None = None) -> str:
    """The results folder as a page names it: relative to the project when inside it, else by its own name."""
    folder = Path(results or results_dir()).resolve()
    root = project_root().resolve()
    return str(folder.relative_to(root)) if folder.is_relative_to(root) else folder.name
