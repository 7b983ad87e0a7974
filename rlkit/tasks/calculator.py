"""A safe calculator: the tool the tiny engine's policy calls with ``<code>48-18</code>``. The expression is
untrusted: parsed with ``ast.parse(expr, mode="eval")`` and walked node by node, never ``eval``. Accepted: decimal
int and float literals (leading zeros too), ``+ - * / // %``, unary ``-``/``+``, parentheses and ``**`` with a whole
exponent up to :data:`MAX_EXPONENT`; refused: anything else (names, calls, ``1e5``: only :data:`ALLOWED_CHARS`
pass), more than :data:`MAX_CHARS` characters, magnitudes above :data:`MAX_ABS`, trees deeper than
:data:`MAX_DEPTH`. Python's semantics, except that ``/`` of two ints that divide exactly gives an int (``30/2`` is
``15``); a float result is rounded to :data:`DECIMALS` places.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable

from rlkit.tasks.protocol import TOOL_ERROR

MAX_CHARS = 64
"""Longest accepted expression, in characters (surrounding spaces not counted)."""
MAX_ABS = 10**12
"""Largest accepted magnitude of a literal or of any intermediate or final result."""
MAX_DEPTH = 32
"""Deepest accepted operator tree (a flat chain ``1+1+…`` within :data:`MAX_CHARS` always passes)."""
MAX_EXPONENT = 12
"""Largest exponent ``**`` accepts; it must be a whole number (int, or a float such as ``2.0``) from 0 up."""
DECIMALS = 6
"""Decimal places a float result is rounded to."""
ALLOWED_CHARS = frozenset("0123456789.+-*/%() ")
"""Every character an accepted expression may contain."""

Number = int | float

_LEADING_ZEROS = re.compile(r"(?<![\d.])0+(?=\d)")  # "07" -> "7"; Python's parser refuses leading zeros


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot compute; the message is short and model-readable."""


def _true_div(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b  # exact: keep integer word problems in ints
    return a / b


def _power(a: Number, b: Number) -> Number:
    if b != int(b) or not 0 <= b <= MAX_EXPONENT:
        raise CalculatorError(f"exponent must be a whole number from 0 to {MAX_EXPONENT}")
    # |a| <= MAX_ABS and b <= 12, so the power is at most 1e144: computed at once, float-safe, then bounded
    return a ** int(b)


_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: _true_div,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: _power}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _bounded(x: Number) -> Number:
    if abs(x) > MAX_ABS:
        raise CalculatorError("number too large")
    return x


def _walk(node: ast.AST, depth: int) -> Number:
    if depth > MAX_DEPTH:
        raise CalculatorError("too deeply nested")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left, depth + 1), _walk(node.right, depth + 1)
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise CalculatorError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand, depth + 1))
    raise CalculatorError("unsupported operation")


def evaluate(expr: str) -> Number:
    """The value of ``expr`` (module doc); :class:`CalculatorError` (a ``ValueError``) for anything refused."""
    if not isinstance(expr, str):
        raise CalculatorError("expression must be text")
    expr = expr.strip()
    if not expr:
        raise CalculatorError("empty expression")
    if len(expr) > MAX_CHARS:
        raise CalculatorError("expression too long")
    if not ALLOWED_CHARS.issuperset(expr):
        raise CalculatorError("invalid character")
    try:
        tree = ast.parse(_LEADING_ZEROS.sub("", expr), mode="eval")
    except (SyntaxError, ValueError):
        raise CalculatorError("syntax error") from None
    value = _walk(tree.body, 0)
    return round(value, DECIMALS) if isinstance(value, float) else value


def format_number(x: Number) -> str:
    """``x`` as the calculator shows it: no ``.0``, at most :data:`DECIMALS` places, no exponent, no ``-0``."""
    if isinstance(x, float):
        x = round(x, DECIMALS)
        if x.is_integer():
            x = int(x)
        else:
            return f"{x:.{DECIMALS}f}".rstrip("0").rstrip(".")
    return str(x)


def run_tool(expr: str) -> str:
    """What the environment writes in ``<output>``: the value, or ``"error: <reason>"``; never raises."""
    try:
        return format_number(evaluate(expr))
    except CalculatorError as e:
        return f"{TOOL_ERROR}: {e}"
    except (ArithmeticError, RecursionError, MemoryError):  # unreachable within the limits: a backstop
        return f"{TOOL_ERROR}: cannot compute"
