"""The calculator tool: hand cases, refusals as error strings, and agreement with Python arithmetic."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from rlkit.tasks.arithmetic import ALPHABET
from rlkit.tasks.calculator import (
    ALLOWED_CHARS,
    DECIMALS,
    MAX_ABS,
    MAX_CHARS,
    CalculatorError,
    evaluate,
    format_number,
    run_tool,
)


@pytest.mark.parametrize(
    "expr, value",
    [
        ("48-18", 30),
        ("30/2", 15),  # exact division of ints stays an int
        ("7/2", 3.5),
        ("10/4", 2.5),
        ("1/3", 0.333333),  # floats rounded to 6 places
        ("2/3", 0.666667),
        ("0.1+0.2", 0.3),
        ("2+3*4", 14),  # precedence
        ("(2+3)*4", 20),
        ("2*(3+4)-5", 9),
        ("-7//2", -4),  # Python's floor semantics
        ("-7%2", 1),
        ("17%5", 2),
        ("-(3-10)", 7),
        ("+5", 5),
        ("2**10", 1024),
        ("-2**2", -4),  # ** binds tighter than unary minus, as in Python
        ("2**0", 1),
        ("3**2.0", 9),
        (" 12 * 7 ", 84),
        ("07+1", 8),  # leading zeros are accepted
        (".5*4", 2.0),
        ("2.5*2", 5.0),
        ("((((1))))", 1),
        (str(MAX_ABS), MAX_ABS),
        ("1" + "+1" * 31, 32),  # a 63-character flat chain: deep tree, still within the limits
    ],
)
def test_hand_cases(expr, value):
    got = evaluate(expr)
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize(
    "expr, shown",
    [("30/2", "15"), ("2/3", "0.666667"), ("-1/4", "-0.25"), ("2.5*2", "5"), ("1/3000000", "0"),
     ("0-1/3000000", "0"), ("1000000*1000000", "1000000000000"), ("0.125*8", "1"),
     ("100000.5+0", "100000.5")],
)
def test_run_tool_formats_numbers(expr, shown):
    assert run_tool(expr) == shown


def test_format_number():
    assert format_number(15) == "15"
    assert format_number(15.0) == "15"
    assert format_number(-0.0) == "0"
    assert format_number(1e11 + 0.5) == "100000000000.5"  # never exponent notation
    assert format_number(1 / 7) == "0.142857"


@pytest.mark.parametrize(
    "expr, message",
    [
        ("1+", "syntax error"),
        ("1.5.5", "syntax error"),
        ("1 2", "syntax error"),
        ("import os", "invalid character"),
        ("__import__('os')", "invalid character"),
        ("().__class__", "invalid character"),
        ("x+1", "invalid character"),
        ("abs(-3)", "invalid character"),
        ("1e5", "invalid character"),  # exponent literals are refused, not read as 100000
        ("0x10", "invalid character"),
        ("1_000", "invalid character"),
        ("1<2", "invalid character"),
        ("3×4", "invalid character"),
        ("2**99999", "exponent must be a whole number from 0 to 12"),
        ("2**-1", "exponent must be a whole number from 0 to 12"),
        ("2**0.5", "exponent must be a whole number from 0 to 12"),
        ("1/0", "division by zero"),
        ("1//0", "division by zero"),
        ("1%0", "division by zero"),
        ("5/(3-3)", "division by zero"),
        ("1/0.0", "division by zero"),
        ("9" * 200, "expression too long"),
        ("1+" * 100 + "1", "expression too long"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("()", "unsupported operation"),
        ("...", "unsupported operation"),
        (str(MAX_ABS + 1), "number too large"),
        ("999999999999*10", "number too large"),
        ("10**12*10", "number too large"),
        ("1000001**2", "number too large"),
        ("-" * 63 + "1", "too deeply nested"),
    ],
)
def test_refusals_are_error_strings(expr, message):
    assert run_tool(expr) == f"error: {message}"
    with pytest.raises(CalculatorError, match=message.split(" from")[0]):
        evaluate(expr)


def test_calculator_error_is_a_value_error_and_non_text_is_refused():
    assert issubclass(CalculatorError, ValueError)
    for bad in (None, 12, b"1+1", ["1+1"]):
        assert run_tool(bad) == "error: expression must be text"


def test_length_limit_is_exact():
    at_limit = "1" + "+1" * ((MAX_CHARS - 1) // 2)
    assert len(at_limit) <= MAX_CHARS and run_tool(at_limit) == str((MAX_CHARS + 1) // 2)
    assert run_tool(at_limit + "+1").startswith("error: expression too long")


# ------------------------------------------------------------------------------------- never raises


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_run_tool_never_raises_on_any_text(expr):
    out = run_tool(expr)
    assert isinstance(out, str) and out
    assert set(out) <= set(ALPHABET)  # the tokenizer can always encode what the environment writes


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=sorted(ALLOWED_CHARS), max_size=70))
def test_run_tool_never_raises_on_calculator_characters(expr):
    out = run_tool(expr)
    assert set(out) <= set(ALPHABET)
    try:
        value = evaluate(expr)
    except CalculatorError as e:
        assert out == f"error: {e}"
    else:
        assert out == format_number(value) and abs(value) <= MAX_ABS


# ------------------------------------------------------------------------- agreement with Python arithmetic

_INT_OPS = ["+", "-", "*", "//", "%"]


@st.composite
def flat_int_expressions(draw):
    """``3+-4*5//2%7``-style strings of 1–6 ints below 100 (products stay under 1e12): Python's own
    ``eval`` is the reference for precedence and associativity."""
    n = draw(st.integers(1, 6))
    parts = []
    for i in range(n):
        if i:
            parts.append(draw(st.sampled_from(_INT_OPS)))
        parts.append(("-" if draw(st.booleans()) else "") + str(draw(st.integers(0, 99))))
    return "".join(parts)


@settings(max_examples=200, deadline=None)
@given(flat_int_expressions())
def test_agrees_with_python_on_integer_expressions(expr):
    try:
        want = eval(expr)  # noqa: S307 - the test's own generated ints and operators, never model text
    except ZeroDivisionError:
        assert run_tool(expr) == "error: division by zero"
        return
    got = evaluate(expr)
    assert got == want and type(got) is int


_LEAVES = st.one_of(st.integers(0, 999), st.sampled_from([0.5, 1.25, 2.5, 10.75]))
_TREES = st.recursive(
    _LEAVES,
    lambda sub: st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*", "/", "//", "%"]), sub, sub),
        st.tuples(st.just("neg"), sub),
    ),
    max_leaves=6,
)


def _render(tree) -> str:
    if isinstance(tree, tuple):
        if tree[0] == "neg":
            return f"(-{_render(tree[1])})"
        op, left, right = tree
        return f"({_render(left)}{op}{_render(right)})"
    return str(tree)


class _Refused(Exception):
    pass


def _reference(tree):
    """The value of a tree computed directly from it, with the calculator's stated semantics: Python
    arithmetic, exact int/int division kept as an int, magnitudes above MAX_ABS refused."""
    if not isinstance(tree, tuple):
        return tree
    if tree[0] == "neg":
        return -_reference(tree[1])
    op, a, b = tree[0], _reference(tree[1]), _reference(tree[2])
    if op in ("/", "//", "%") and b == 0:
        raise _Refused("division by zero")
    if op == "/":
        value = a // b if isinstance(a, int) and isinstance(b, int) and a % b == 0 else a / b
    elif op == "//":
        value = a // b
    elif op == "%":
        value = a % b
    else:
        value = a + b if op == "+" else a - b if op == "-" else a * b
    if abs(value) > MAX_ABS:
        raise _Refused("number too large")
    return value


@settings(max_examples=200, deadline=None)
@given(_TREES)
def test_agrees_with_tree_reference(tree):
    expr = _render(tree)
    if len(expr) > MAX_CHARS:
        assert run_tool(expr) == "error: expression too long"
        return
    try:
        want = _reference(tree)
    except _Refused as e:
        assert run_tool(expr) == f"error: {e}"
        return
    if isinstance(want, float):
        want = round(want, DECIMALS)
    got = evaluate(expr)
    assert got == want and type(got) is type(want)
