"""rlkit's layering: its import contracts, one test each.

The contracts are ``[tool.importlinter]`` in pyproject.toml, each checked here by import-linter's ``lint-imports``
(which also runs them all from the command line): rlkit.core imports nothing else of rlkit, the methods only core
and the registry, the library not the reproduction app, rlkit.tasks neither engine, rlkit.tiny not rlkit.verl,
rlkit.verl reaches rlkit.tiny only through rlkit.verl.from_tiny, only rlkit.verl imports verl, and no import
cycles. The graph counts every import statement of rlkit — at module level, inside functions, under
TYPE_CHECKING — so an import inside a function closes a cycle as much as one at the top; the exceptions are named
in the contracts with their reasons. A broken contract fails its test with import-linter's report, which names
the importing and the imported module (with line numbers for the direct imports).

One contract needs the interpreter rather than the graph: importing rlkit.registry imports no method module (the
registry loads them when first asked, so the graph has that import and the cycle contract ignores it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import grimp
import pytest
from importlinter.api import read_configuration

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
CONTRACTS = [c["id"] for c in read_configuration(str(PYPROJECT))["contracts_options"]]
ENGINES = "engines-name-no-method"


def lint_imports(contract: str) -> tuple[bool, str]:
    """``lint-imports --contract <contract>`` on pyproject.toml: (kept, its report)."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    run = subprocess.run(
        [sys.executable, "-c", code, "--no-logo", "--no-cache", "--contract", contract, str(PYPROJECT)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},  # rich: no wrapping, no colour codes
    )
    if run.returncode not in (0, 1):
        pytest.fail(f"lint-imports could not check {contract!r} (exit {run.returncode}):\n{run.stdout}{run.stderr}")
    return run.returncode == 0, run.stdout


def cycle_imports(report: str) -> str:
    """The direct imports behind each dependency that import-linter's cycle report proposes to remove (it names
    sibling modules or packages relative to their parent, ``- .tiny -> .numerics (2 imports)``)."""
    graph = grimp.build_graph("rlkit", cache_dir=None)

    def package(name: str) -> set[str]:
        return {name} | graph.find_descendants(name)

    found, parent = [], "rlkit"
    for line in report.splitlines():
        line = line.strip()
        if m := re.fullmatch(r"No cycles are allowed in ([\w.]+)\.", line):
            parent = m[1]
        elif m := re.match(r"- \.([\w.]+) -> \.([\w.]+) \(", line):
            a, b = (f"{parent}.{name}" for name in m.groups())
            for importer in sorted(package(a)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer) & package(b)):
                    lines = [f"l.{d['line_number']}" for d in graph.get_import_details(importer=importer,
                                                                                        imported=imported)]
                    found.append(f"- {importer} -> {imported} ({', '.join(lines)})")
    return "\n".join(found)


def check(contract: str) -> None:
    kept, report = lint_imports(contract)
    if not kept:
        broken = report[report.find("Broken contracts"):]
        if "No cycles are allowed" in broken:
            broken += f"\nThe imports behind those dependencies:\n{cycle_imports(broken)}"
        pytest.fail(f"import contract {contract!r} is broken:\n{broken}", pytrace=False)
    if "No matches for ignored import" in report:  # an exception no longer needed: say so, but pass
        warnings.warn(f"import contract {contract!r}: {report[report.find('Warnings'):].strip()}", stacklevel=2)


def test_every_contract_has_an_id():
    assert CONTRACTS and all(CONTRACTS) and len(set(CONTRACTS)) == len(CONTRACTS)
    assert ENGINES in CONTRACTS


@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract(contract):
    check(contract)




# the importer of a method module, found on the stack when the import system looks for it
SPY = """
import sys, traceback

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "rlkit.methods" or name.startswith("rlkit.methods."):
            frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith("<")]
            print(f"{name} (imported at {frames[-1].filename}:{frames[-1].lineno})" if frames else name)
        return None

sys.meta_path.insert(0, Spy())
import rlkit.registry
"""


def test_registry_imports_no_method_at_import_time():
    """rlkit.registry loads the methods when first asked (``_load_methods``), never while it is imported."""
    run = subprocess.run([sys.executable, "-c", SPY], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "", f"importing rlkit.registry imports method modules:\n{run.stdout}"


ENGINE_FILES = ["rlkit/tiny/rl.py", "rlkit/tiny/checkpoint.py", "rlkit/tiny/task.py", "rlkit/verl/trainer.py",
                "rlkit/verl/plugin.py"]


def method_mentions(path: Path, methods: list[str]) -> list[str]:
    """Words naming a registered method in ``path``'s code, comments and docstrings; metric names (strings with a
    ``/``, e.g. the tool metrics every method logs under ``aspo/*``) and verl's own keys (``*_in_grpo``) are not
    mentions of a method."""
    import io
    import re
    import tokenize

    word = re.compile(r"(?<![A-Za-z0-9/])(" + "|".join(map(re.escape, methods)) + r")(?![A-Za-z0-9/])", re.IGNORECASE)
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.STRING and "/" in tok.string and len(tok.string) < 60:
            continue
        for m in word.finditer(tok.string.replace("_in_grpo", "")):
            found.append(f"{path.name}:{tok.start[0]}: {m.group(0)}")
    return found


def test_the_engines_name_no_method():
    """The engines call hooks and the registry; at most 3 mentions of a method in comments (issue target)."""
    from rlkit import registry

    methods = registry.list_methods()["method"]
    for name in ENGINE_FILES:
        found = method_mentions(ROOT / name, methods)
        assert len(found) <= 3, f"{name} names methods {len(found)} times:\n" + "\n".join(found)
    probe = ROOT / "tests" / "_probe_engine.py"
    try:  # the check can fail
        probe.write_text("# SPO's tracker\nif cfg.method == 'hapo':\n    x = 'spo'\nhapo_stats = 1\n")
        assert len(method_mentions(probe, methods)) == 4
    finally:
        probe.unlink()
