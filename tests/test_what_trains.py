"""The code a learner reads is the code that trains: a line trace of a smoke run of every method shows its
registered advantage estimator and policy loss — the functions its book page shows — executing to their return."""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path

import pytest

import rlkit
from rlkit import registry
from rlkit.tiny.config import METHODS, build_config
from rlkit.tiny.rl import train

PACKAGE = Path(rlkit.__file__).parent
TRACED = (str(PACKAGE / "methods"), str(PACKAGE / "core"))
"""Where the trace records lines: the methods' math and the shared tensor math it calls."""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sft-cache")


def return_lines(fn) -> set[int]:
    """The file's line numbers of ``fn``'s own ``return`` statements (not those of functions nested in it)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    found, todo = set(), list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            found.add(fn.__code__.co_firstlineno + node.lineno - 1)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return found


def traced_run(method: str, out: Path, cache: Path) -> set[tuple[str, int]]:
    """(file, line) of every line of rlkit/methods and rlkit/core executed by a one-step smoke run of ``method``."""
    lines: set[tuple[str, int]] = set()

    def local(frame, event, arg):
        if event == "line":
            lines.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(TRACED) else None

    old = sys.gettrace()
    sys.settrace(calls)
    try:
        train(build_config(method, "smoke", {"steps": 1}), out, progress=False, sft_cache=cache)
    finally:
        sys.settrace(old)
    return lines


@pytest.mark.parametrize("method", METHODS)
def test_a_run_executes_the_methods_registered_estimator_and_loss(method, tmp_path, cache):
    record = registry.get_method(method)
    loss = registry.get_policy_loss(record.policy_loss)
    estimator = registry.get_advantage(record.estimator(record.default_config()))
    lines = traced_run(method, tmp_path / method, cache)
    for fn in (estimator, loss):
        path = inspect.getsourcefile(fn)
        assert path.startswith(TRACED), fn
        reached = {(path, n) for n in return_lines(fn)} & lines
        assert reached, f"{method}: {fn.__module__}.{fn.__qualname__} never returned in a training run"


def test_the_trace_sees_a_function_that_did_not_run(tmp_path, cache):
    """The test above can fail: a loss the run never calls has no line in its trace."""
    lines = traced_run("grpo", tmp_path / "grpo", cache)
    unused = registry.get_policy_loss(registry.get_method("gspo").policy_loss)
    assert not {(inspect.getsourcefile(unused), n) for n in return_lines(unused)} & lines

