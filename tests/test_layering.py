"""rlkit's layering: its import contracts, one test each.

The contracts are ``[tool.importlinter]`` in pyproject.toml, each checked here by import-linter's ``lint-imports``
(which also runs them all from the command line): rlkit.core imports nothing else of rlkit, the methods only core
and the registry, the library not the reproduction app, rlkit.tasks neither engine, rlkit.tiny not rlkit.verl,
rlkit.verl reaches rlkit.tiny only through rlkit.verl.launch.from_tiny, only rlkit.verl imports verl, and no import
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


ENGINE_FILES = ["rlkit/tiny/rl.py", "rlkit/tiny/step.py", "rlkit/tiny/checkpoint.py", "rlkit/tiny/task.py",
                "rlkit/verl/trainer.py", "rlkit/verl/plugin.py"]
"""The engines' step loops and the verl plugin: never exempt below."""

METHOD_HOMES = ("rlkit/methods/", "rlkit/verl/launch/presets.py", "rlkit/lab/book_pages.py")
"""Where methods are named by design: their modules, the verl presets, the book's generated text."""

MENTIONS_EXEMPT = {
    "rlkit/cli.py": "the help of `rlkit data`'s SPO commands and an example `--set` key; the shipped start's "
                    "manifest key spo_offline",
    "rlkit/lab/claims.py": "the reproduction app: papers' claims, per method",
    "rlkit/lab/notebook.py": "the reproduction app: the settings the method pages quote (DAPO's presets)",
    "rlkit/lab/two_engines.py": "the reproduction app: each method's metrics in both engines",
    "rlkit/tasks/dapo_math.py": "the DAPO-Math dataset is named after DAPO",
    "rlkit/tiny/config.py": "'grpo' the default method",
    "rlkit/verl/launch/data.py": "SPO's data commands (spo-split/-estimate/-merge, the offline values its verl key reads) "
                          "and the DAPO-Math dataset named after DAPO",
    "rlkit/verl/launch/__init__.py": "the DAPO-Math dataset (`--dataset dapo`, its preset keys)",
}
"""Files of rlkit/ outside :data:`METHOD_HOMES` that name methods more than 3 times, in code too, each with
its reason. This list may only shrink: an entry whose file is brought to ≤ 3 mentions fails until it is struck
off."""

PROSE_ONLY = {
    "rlkit/core/ops.py", "rlkit/core/rollout_correction.py", "rlkit/hooks.py",
    "rlkit/registry.py", "rlkit/tasks/arithmetic.py", "rlkit/tasks/tools.py",
    "rlkit/tiny/sampler.py", "rlkit/verl/__init__.py", "rlkit/verl/sampling.py", "rlkit/verl/tools.py",
}
"""Files that name methods more than 3 times, in prose only (docstrings and comments: the methods as examples
of what the code serves), never in code; checked, and the set may only shrink like :data:`MENTIONS_EXEMPT`."""

SPECIAL_CASES_EXEMPT = {
    ("rlkit/verl/launch/__init__.py", "dataset == 'dapo'"): "the DAPO-Math dataset, not the method",
    ("rlkit/verl/launch/__init__.py", "preset.dapo"): "the preset's keys for the DAPO-Math dataset",
    ("rlkit/lab/notebook.py", "build_config('dapo', scale).dapo"): "book glue: DAPO's overlong buffer, quoted",
    ("rlkit/lab/notebook.py", "PRESETS['dapo']"): "book glue: DAPO's full-scale preset, quoted",
    ("rlkit/lab/notebook.py", "PRESETS['dapo'].dapo"): "book glue: DAPO's full-scale preset, quoted",
    ("rlkit/lab/two_engines.py", "{'gspo': Quantity("): "the reproduction app: each method's own metric on the "
                                                          "Two engines page (OWN)",
}
"""Code outside :data:`METHOD_HOMES` that singles out a name of a method (:func:`method_special_cases`) yet is no
special case of the method's inputs: ``(file, the expression's start)`` → reason; may only shrink."""


def checked_files() -> list[str]:
    """Every .py file of rlkit/ outside :data:`METHOD_HOMES`."""
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "rlkit").rglob("*.py"))
    return [f for f in files if not f.startswith(METHOD_HOMES)]


def prose_lines(source: str) -> set[int]:
    """Lines where ``source``'s docstrings start (lone string statements, strings set as ``__doc__``)."""
    import ast

    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and not any(isinstance(t, ast.Attribute) and t.attr == "__doc__"
                                                    for t in node.targets):
            continue
        if isinstance(node, (ast.Expr, ast.Assign)) and isinstance(node.value, ast.Constant) and isinstance(
                node.value.value, str):
            lines.add(node.value.lineno)
    return lines


def method_mentions(path: Path, methods: list[str], *, prose: bool = True) -> list[str]:
    """Words naming a registered method in ``path``'s code, comments and docstrings (``prose=False``: in its
    code only); metric names (strings with a ``/``, e.g. the tool metrics every method logs under ``aspo/*``)
    and verl's own keys (``*_in_grpo``) are not mentions of a method."""
    import io
    import re
    import tokenize

    word = re.compile(r"(?<![A-Za-z0-9/])(" + "|".join(map(re.escape, methods)) + r")(?![A-Za-z0-9/])", re.IGNORECASE)
    source = path.read_text()
    docs = set() if prose else prose_lines(source)
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and "/" in tok.string and len(tok.string) < 60:
            continue
        in_prose = tok.type == tokenize.COMMENT or tok.type == tokenize.STRING and tok.start[0] in docs
        if not prose and in_prose:
            continue
        for m in word.finditer(tok.string.replace("_in_grpo", "")):
            found.append(f"{path.name}:{tok.start[0]}: {m.group(0)}")
    return found


def test_the_engines_name_no_method():
    """Every file of rlkit/ outside the methods' homes names a method at most 3 times (in comments), except the
    files :data:`MENTIONS_EXEMPT` lists with their reasons and those of :data:`PROSE_ONLY`, which name them in
    prose only (issue 35 target)."""
    from rlkit import registry

    methods = registry.list_methods()["method"]
    files = checked_files()
    assert set(ENGINE_FILES) <= set(files) and not set(ENGINE_FILES) & (set(MENTIONS_EXEMPT) | PROSE_ONLY)
    assert not set(MENTIONS_EXEMPT) & PROSE_ONLY
    for name in files:
        found = method_mentions(ROOT / name, methods)
        if name in MENTIONS_EXEMPT or name in PROSE_ONLY:
            assert len(found) > 3, f"{name} names methods {len(found)} times: strike it off the exemptions"
        else:
            assert len(found) <= 3, f"{name} names methods {len(found)} times:\n" + "\n".join(found)
        if name in PROSE_ONLY:
            code = method_mentions(ROOT / name, methods, prose=False)
            assert not code, f"{name} names methods in code, not only in prose:\n" + "\n".join(code)
    listed = set(MENTIONS_EXEMPT) | PROSE_ONLY
    assert listed <= set(files), sorted(listed - set(files))
    probe = ROOT / "tests" / "_probe_engine.py"
    try:  # the check can fail
        probe.write_text('"""GSPO."""\n# SPO\'s tracker\nif cfg.method == "hapo":\n    x = "spo"\n'
                         'hapo_stats = 1\nC.__doc__ = "AEPO"\n')
        assert len(method_mentions(probe, methods)) == 6
        in_code = [m.split(": ")[1] for m in method_mentions(probe, methods, prose=False)]
        assert in_code == ["hapo", "spo", "hapo"]
    finally:
        probe.unlink()


def method_special_cases(path: Path, methods: list[str]) -> list[tuple[str, int]]:
    """``(expression, line)`` of each place ``path``'s code singles a method out by name: a comparison with a
    method's name (``cfg.method == "spo"``, ``p.method in ("spo", "hapo")``), a subscript by one
    (``configs["spo"]``), a dict keyed by one (``{"spo": {"offline_values": None}}``) or an attribute named like one
    (``cfg.spo.offline_N``)."""
    import ast

    names, found = set(methods), []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            values = [e for op in operands for e in (op.elts if isinstance(op, (ast.Tuple, ast.List, ast.Set))
                                                     else [op])]
            hit = any(isinstance(v, ast.Constant) and v.value in names for v in values)
        elif isinstance(node, ast.Subscript):
            hit = isinstance(node.slice, ast.Constant) and node.slice.value in names
        elif isinstance(node, ast.Dict):
            hit = any(isinstance(k, ast.Constant) and k.value in names for k in node.keys)
        else:
            hit = isinstance(node, ast.Attribute) and node.attr in names
        if hit:
            found.append((ast.unparse(node), node.lineno))
    return found


def test_no_method_special_case_outside_the_methods_homes():
    """No code of rlkit/ outside the methods' homes tests a method by name: what a method needs beyond the common
    batch is declared on its record (:class:`rlkit.registry.Method`); exceptions: :data:`SPECIAL_CASES_EXEMPT`."""
    from rlkit import registry

    methods = registry.list_methods()["method"]
    seen = set()
    for name in checked_files():
        for expr, line in method_special_cases(ROOT / name, methods):
            exempt = [key for key in SPECIAL_CASES_EXEMPT if key[0] == name and expr.startswith(key[1])]
            assert exempt, f"{name}:{line} singles a method out: {expr}"
            seen.update(exempt)
    assert set(SPECIAL_CASES_EXEMPT) <= seen, f"strike off: {sorted(set(SPECIAL_CASES_EXEMPT) - seen)}"
    probe = ROOT / "tests" / "_probe_special_case.py"
    try:  # the check can fail
        probe.write_text("if cfg.method == 'spo' and cfg.spo.offline_N:\n    x = c['hapo']\n"
                         "y = m in ('grpo', 'x')\nz = cfg.method == method\nEXTRAS = {'aspo': 1, 'x': 2}\n")
        assert sorted(line for _, line in method_special_cases(probe, methods)) == [1, 1, 2, 3, 5]
    finally:
        probe.unlink()
