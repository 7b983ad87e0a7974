"""rlkit/verl in two parts (issue 45, item 4): the plugin — what runs inside verl's processes (rlkit.verl itself,
plugin, inputs, trainer, sampling, tools, cpu) — imports nothing of the launcher (rlkit.verl.launch); the
launcher imports the plugin. Read from the source, so every import counts: at
module level, inside functions and under TYPE_CHECKING (the import contract ``verl-plugin-below-launcher`` in
pyproject.toml says the same of the submodules; it cannot name the package's own ``__init__``)."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VERL = ROOT / "rlkit" / "verl"
LAUNCHER = "rlkit.verl.launch"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def plugin_files() -> list[Path]:
    """Every module of rlkit/verl outside the launcher's package."""
    return sorted(VERL.glob("*.py"))


def imported(path: Path, package: str | None = None) -> set[str]:
    """Every module ``path`` (of ``package``: its own by default) imports (``from rlkit.verl import x`` counted as
    ``rlkit.verl.x`` too)."""
    if package is None:
        package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def launcher_imports(path: Path, package: str | None = None) -> list[str]:
    return sorted(n for n in imported(path, package) if n == LAUNCHER or n.startswith(LAUNCHER + "."))


def test_the_plugin_imports_nothing_of_the_launcher():
    files = plugin_files()
    assert {p.stem for p in files} >= {"__init__", "plugin", "inputs", "trainer", "sampling", "tools", "cpu"}
    found = {module_name(p): launcher_imports(p) for p in files}
    assert not any(found.values()), {m: n for m, n in found.items() if n}


def test_the_check_sees_every_kind_of_import(tmp_path):
    """The check can fail: a plugin module importing the launcher in any spelling is caught."""
    probe = tmp_path / "probe.py"
    probe.write_text("from rlkit.verl import launch\nimport rlkit.verl.launch.config\nimport rlkit.verl.cpu\n"
                     "def f():\n    from rlkit.verl.launch.presets import PRESETS\n    from .launch import data\n")
    assert launcher_imports(probe, "rlkit.verl") == [
        "rlkit.verl.launch", "rlkit.verl.launch.config", "rlkit.verl.launch.data", "rlkit.verl.launch.presets",
        "rlkit.verl.launch.presets.PRESETS"]


def test_the_launcher_is_above_the_plugin():
    """The launcher's modules import the plugin's (what a launch validates is what the plugin runs)."""
    config = imported(VERL / "launch" / "config.py")
    assert {"rlkit.verl.plugin", "rlkit.verl.trainer", "rlkit.verl.inputs"} <= config


def test_the_old_paths_are_gone():
    """rlkit/verl/{presets,data,compose,runner}.py named the launcher's modules while callers moved; none is left."""
    for name in ("presets", "data", "compose", "runner"):
        assert not (VERL / f"{name}.py").exists(), name
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"rlkit.verl.{name}")


def test_importing_the_plugin_loads_no_launcher_module():
    """At run time too: a process that loads the plugin (as every verl and vLLM process does) and what the trainer
    hands the losses loads none of the launcher."""
    code = ("import sys, rlkit.verl, rlkit.verl.plugin, rlkit.verl.inputs, rlkit.verl.sampling, rlkit.verl.cpu\n"
            "print(sorted(m for m in sys.modules if m.startswith('rlkit.verl.launch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
