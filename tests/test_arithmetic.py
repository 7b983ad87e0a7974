"""Procedural word problems: determinism, disjoint splits, gold solutions, alphabet, coverage, sizes."""

from __future__ import annotations

import random
import re
from itertools import chain

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from rlkit.tasks import arithmetic as A
from rlkit.tasks.arithmetic import (
    ALPHABET,
    MAX_QUESTION_CHARS,
    TEMPLATES,
    Problem,
    TaskConfig,
    generate,
    iter_split,
    make_pool,
    make_split,
    normalize_question,
    prompt,
    reward,
    split_of,
)
from rlkit.tasks.calculator import evaluate, run_tool

_CALL = re.compile(r"<code>(.*?)</code><output>(.*?)</output>")
_TOOL_FORM = re.compile(r"^(<code>[0-9+\-*/]+</code><output>[0-9]+</output>)+ #### [0-9]+$")
_PLAIN_FORM = re.compile(r"^([0-9]+[+\-*/][0-9]+=[0-9]+\. )+#### [0-9]+$")


@pytest.fixture(scope="module")
def train():
    return make_split(4000, "train", seed=0, max_ops=4)


@pytest.fixture(scope="module")
def test_set():
    return make_split(1000, "test", seed=0, max_ops=4)


def test_hand_checked_problem():
    question = "Sam has 48 cards. He loses 18. He shares them equally among 2 friends. How many does each get?"
    p = Problem(question, 15, (("48-18", 30), ("30/2", 15)), "sharing")
    assert p.plain == "48-18=30. 30/2=15. #### 15"
    assert p.tool == "<code>48-18</code><output>30</output><code>30/2</code><output>15</output> #### 15"
    assert p.solution() == p.tool and p.solution("plain") == p.plain and p.n_ops == 2
    assert prompt(p) == p.question + "\n" == prompt(p.question)
    assert reward(p, p.tool) == reward(p, p.plain) == 1.0
    assert reward(p, "48-18=30. 30/2=15. #### 16") == 0.0
    assert reward(p, "the answer is 15") == 0.0  # strict: the "#### n" format is part of the reward
    assert reward(p, "the answer is 15", mode="flexible") == 1.0
    assert reward(p, "#### 15.0") == 1.0  # compared as numbers (rlkit.tasks.gsm8k)


# --------------------------------------------------------------------------------------------- determinism


def test_same_seed_same_problems_and_prefix_property():
    a = make_split(300, "train", seed=7, max_ops=4)
    assert a == make_split(300, "train", seed=7, max_ops=4)
    assert make_split(100, "train", seed=7, max_ops=4) == a[:100]
    assert make_split(300, "train", seed=8, max_ops=4) != a
    assert make_pool(64, seed=3) == make_pool(64, seed=3) != make_pool(64, seed=4)
    assert list(zip(range(50), iter_split("test", 5))) == list(zip(range(50), iter_split("test", 5)))


def test_same_seed_in_a_fresh_process():
    import subprocess
    import sys

    code = "from rlkit.tasks.arithmetic import make_split as m; print([p.question for p in m(5, 'test', 11)])"
    here = str([p.question for p in make_split(5, "test", 11)])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123"}).stdout.strip()
    assert out == here  # no dependence on Python's per-process string hashing


# ------------------------------------------------------------------------------------------------ splits


def test_splits_never_share_a_question(train, test_set):
    more_train = make_split(4000, "train", seed=1)  # other seed, other knobs: still disjoint
    more_test = make_split(1000, "test", seed=2, max_number=30)
    train_q = {normalize_question(p.question) for p in chain(train, more_train, make_pool(500, seed=0))}
    test_q = {normalize_question(p.question) for p in chain(test_set, more_test)}
    assert not train_q & test_q
    assert all(split_of(q) == "train" for q in train_q) and all(split_of(q) == "test" for q in test_q)


def test_splits_are_distinct_within():
    for split in ("train", "test"):
        qs = [normalize_question(p.question) for p in make_split(2000, split, seed=4, max_ops=2)]
        assert len(set(qs)) == len(qs)


def test_split_bucket_depends_only_on_the_normalised_question():
    q = "Ava has $7. She earns $52. How much does Ava have now?"
    assert normalize_question("  " + q.upper().replace(" ", "   ") + " ") == normalize_question(q)
    assert split_of(q.upper()) == split_of(q) == split_of(q.replace(" ", "  "))


def test_test_fraction_of_question_space():
    rng = random.Random(0)
    n = 20_000
    share = sum(split_of(generate(rng).question) == "test" for _ in range(n)) / n
    assert abs(share - A.TEST_FRACTION) < 0.01  # 5 standard errors


def test_tiny_question_space_runs_out_with_a_clear_error():
    # rates, one step, numbers <= 2: "A {car,bus,train,boat,bike} goes 2 km an hour for 2 hours." (5 questions)
    knobs = dict(templates=("rates",), min_ops=1, max_ops=1, max_number=2, max_value=10)
    with pytest.raises(ValueError, match="distinct"):
        make_split(10, "train", seed=0, **knobs)


# ------------------------------------------------------------------------------------------ gold solutions


def _check_problem(p: Problem, cfg: TaskConfig) -> None:
    """Every invariant of a generated problem."""
    # the chain of steps: each value is the calculator's, and in [1, max_value]; the answer is the last one
    assert p.n_ops >= 1 and p.answer == p.steps[-1][1]
    for expr, value in p.steps:
        assert evaluate(expr) == value and type(evaluate(expr)) is int
        assert 1 <= value <= cfg.max_value
    assert cfg.min_ops <= p.n_ops <= cfg.max_ops and p.template in (cfg.templates or TEMPLATES)
    # numbers written in the question respect max_number
    assert all(int(n) <= cfg.max_number for n in re.findall(r"[0-9]+", p.question))
    # the two solution forms, and what the environment would write: run_tool of each call
    assert _TOOL_FORM.match(p.tool) and _PLAIN_FORM.match(p.plain)
    calls = _CALL.findall(p.tool)
    assert [c for c, _ in calls] == [e for e, _ in p.steps]
    assert all(out == run_tool(call) == str(value) for (call, out), (_, value) in zip(calls, p.steps))
    # the mixed form: an optional plan naming the operators in order, then each step as a call or plain text
    words = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
    planned = [words[w] for w in p.plan.removeprefix("Plan: ").removesuffix(".").split(", ")]
    assert planned == [re.sub(r"[0-9]", "", e) for e, _ in p.steps]
    assert p.mixed.startswith(p.plan + " ") or not p.mixed.startswith("Plan")
    for form in A.FORMS:
        text = p.solution(form)
        assert reward(p, text) == 1.0 and reward(p, text, mode="flexible") == 1.0
        assert set(prompt(p) + text) <= set(ALPHABET)
        assert len(text) <= cfg.max_solution_chars(form)
    assert len(p.question) <= MAX_QUESTION_CHARS


def test_every_gold_solution_scores_and_checks(train, test_set):
    cfg = TaskConfig(max_ops=4)
    for p in chain(train, test_set):
        _check_problem(p, cfg)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    ops=st.tuples(st.integers(1, 4), st.integers(1, 4)).map(sorted),
    max_number=st.integers(2, 150),
    extra_value=st.integers(0, 2000),
    templates=st.one_of(st.none(), st.lists(st.sampled_from(TEMPLATES), min_size=1, unique=True).map(tuple)),
)
def test_generated_problems_hold_their_invariants(seed, ops, max_number, extra_value, templates):
    cfg = TaskConfig(min_ops=ops[0], max_ops=ops[1], max_number=max_number,
                     max_value=max(10, max_number) + extra_value, templates=templates)
    rng = random.Random(seed)
    for _ in range(5):
        _check_problem(generate(rng, cfg), cfg)


def test_alphabet_is_fixed_and_covers_calculator_errors():
    assert len(set(ALPHABET)) == len(ALPHABET) == 82
    texts = [run_tool(e) for e in ("1/0", "x", "1+", "2**99", "9" * 99, "", "()", "1e99", "-" * 60 + "1")]
    assert all(t.startswith("error: ") and set(t) <= set(ALPHABET) for t in texts)


# ------------------------------------------------------------------------------------------------ coverage


def test_every_template_builds_every_operation_count():
    for name in TEMPLATES:
        for n in range(1, A.MAX_OPS + 1):
            cfg = TaskConfig(min_ops=n, max_ops=n, templates=(name,))
            problems = make_split(20, "train", seed=n, min_ops=n, max_ops=n, templates=(name,))
            for p in problems:
                assert p.template == name and p.n_ops == n
                _check_problem(p, cfg)


def test_a_default_sample_covers_templates_op_counts_and_operators(train):
    assert len(TEMPLATES) >= 8
    assert {p.template for p in train} == set(TEMPLATES)
    assert {p.n_ops for p in train} == {1, 2, 3, 4}
    assert {p.n_ops for p in make_split(500, "train", seed=0)} == {1, 2, 3}  # default: 1-3 operations
    operators = {re.sub(r"[0-9]", "", e) for p in train for e, _ in p.steps}
    assert operators == {"+", "-", "*", "/"}
    # names and items vary
    assert len({p.question.split()[0] for p in train}) > 20
    assert len({p.answer for p in train}) > 300


# --------------------------------------------------------------------------------------------- size, knobs


def test_mixed_form_shares_of_plans_and_calls(train):
    mixed = [p.mixed for p in train]
    n = len(mixed)
    assert abs(sum(m.startswith("Plan: ") for m in mixed) / n - A.PLAN_SHARE) < 4 * (0.25 / n) ** 0.5
    steps = sum(p.n_ops for p in train)
    calls = sum(m.count("<code>") for m in mixed)
    assert abs(calls / steps - A.MIXED_TOOL_SHARE) < 4 * (0.25 / steps) ** 0.5


def test_lengths_within_the_stated_bounds(train):
    default = make_split(3000, "train", seed=2)
    cfg = TaskConfig()
    assert all(len(p.question) <= MAX_QUESTION_CHARS for p in chain(train, default))
    assert max(len(prompt(p) + p.tool) for p in default) <= MAX_QUESTION_CHARS + 1 + cfg.max_solution_chars()
    mean = sum(len(prompt(p) + p.tool) for p in default) / len(default)
    assert 120 < mean < 200  # the documented ~172 characters: a size that trains in minutes on the CPU
    assert cfg.max_solution_chars("tool") == 3 * (30 + 3 + 1 + 2 + 3) + 6 + 3


def test_knobs_bound_numbers_and_values():
    small = make_split(500, "train", seed=0, max_number=9, max_value=40, max_ops=4)
    assert all(int(n) <= 9 for p in small for n in re.findall(r"[0-9]+", p.question))
    assert all(1 <= v <= 40 for p in small for _, v in p.steps)
    ages = make_split(300, "train", seed=0, templates=("ages",), max_ops=4)
    assert all(v <= 99 for p in ages for _, v in p.steps)


@pytest.mark.parametrize(
    "knobs",
    [dict(min_ops=0), dict(min_ops=3, max_ops=2), dict(max_ops=5), dict(max_number=1), dict(max_value=5),
     dict(max_number=50, max_value=40), dict(templates=("cooking",)), dict(templates=()), dict(difficulty=3)],
)
def test_bad_knobs_raise(knobs):
    with pytest.raises(ValueError):
        make_split(1, "train", 0, **knobs)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="split"):
        make_split(1, "dev")
    with pytest.raises(ValueError, match="non-negative"):
        make_split(-1)
    with pytest.raises(ValueError, match="form"):
        make_split(1)[0].solution("latex")
    with pytest.raises(ValueError, match="prompt"):
        prompt(3)
    assert make_split(0) == []
