"""DAPO-Math / AIME loading (every source schema, on files the test writes) and math-verify scoring."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest

from rlkit.tasks import dapo_math

# Hand-written problems (not taken from the data sets), laid out in each source's schema.
PROBLEMS = [("What is $2 + 3$?", "5"), ("Compute $\\frac{1}{2} + \\frac{1}{4}$.", "\\frac{3}{4}"),
            ("How many primes are below 10?", "4")]


def original_dapo_rows(repeats: int = 3) -> list[dict]:
    """BytedTsinghua-SIA/DAPO-Math-17k's layout: verl's schema, DAPO's instruction, each problem repeated."""
    return [
        {"data_source": "math_dapo",
         "prompt": [{"content": dapo_math.DAPO_HEAD + p + dapo_math.DAPO_TAIL, "role": "user"}],
         "ability": "MATH", "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"},
         "extra_info": {"index": f"id-{i}-{r}"}}
        for r in range(repeats) for i, (p, a) in enumerate(PROBLEMS)
    ]


def processed_rows() -> list[dict]:
    """open-r1/DAPO-Math-17k-Processed's layout."""
    return [{"prompt": p, "solution": a, "data_source": "math_dapo", "source_prompt": [], "ability": "MATH",
             "reward_model": {"ground_truth": a, "style": "rule"}, "extra_info": {"index": str(i)}}
            for i, (p, a) in enumerate(PROBLEMS)]


def test_every_source_schema_gives_problem_and_answer(tmp_path):
    pd.DataFrame(original_dapo_rows()).to_parquet(tmp_path / "dapo-math-17k.parquet")
    with (tmp_path / "processed.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in processed_rows())
    with (tmp_path / "aime.jsonl").open("w") as f:  # AIME tables hold integer answers
        f.writelines(json.dumps({"ID": "2024-I-1", "Problem": p, "Answer": int(a) if a.isdigit() else a}) + "\n"
                     for p, a in PROBLEMS)
    expected = [{"problem": p, "answer": a} for p, a in PROBLEMS]
    assert dapo_math.load(tmp_path / "dapo-math-17k.parquet") == expected * 3  # repeats kept, instruction gone
    assert dapo_math.load(tmp_path / "processed.jsonl") == expected
    assert dapo_math.load(tmp_path / "aime.jsonl") == expected


def test_unknown_schema_and_empty_rows_are_named(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "1+1?", "label": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"row 0: unrecognised DAPO/AIME row with keys \['label', 'question'\]"):
        dapo_math.load(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": ""}) + "\n")
    with pytest.raises(ValueError, match="row 0: empty problem or answer"):
        dapo_math.load(tmp_path / "empty.jsonl")


def test_prompt_asks_for_a_boxed_answer():
    text = dapo_math.prompt("What is $2 + 3$?")
    assert text.startswith("What is $2 + 3$?") and "\\boxed{}" in text


math_verify = pytest.importorskip("math_verify")


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("2 + 3 = 5, so the answer is \\boxed{5}.", "5", 1.0),
        ("We get $\\boxed{\\frac{3}{4}}$", "\\frac{3}{4}", 1.0),
        ("We get \\boxed{0.75}", "\\frac{3}{4}", 1.0),  # symbolic, not string, equality
        ("So $x = \\boxed{2\\sqrt{2}}$", "\\sqrt{8}", 1.0),
        ("first \\boxed{4}, no wait: \\boxed{5}", "5", 1.0),  # the last boxed answer counts
        ("The answer is \\boxed{6}.", "5", 0.0),
        ("I cannot solve this.", "5", 0.0),
    ],
)
def test_score_checks_equivalence(response, truth, expected):
    assert dapo_math.score(response, truth) == expected


@pytest.mark.parametrize(
    ("response", "error"),
    [
        ("<think>2+3</think>\nThe answer is \\boxed{5}.", None),
        ("<think>```python\nprint(2+3)\n```\n```output\n5\n```</think> \\boxed{5}", None),  # code while thinking
        ("The answer is \\boxed{5}.", "0 '</think>' tags (exactly 1 needed)"),
        ("<think>a</think><think>b</think> \\boxed{5}", "2 '</think>' tags (exactly 1 needed)"),
        ("<think>a</think>\n```python\nprint(5)\n```\n\\boxed{5}", "a code block after '</think>'"),
    ],
)
def test_spo_format_rule(response, error):
    assert dapo_math.format_error(response) == error
    assert dapo_math.score(response, "5", format_rule=True) == float(error is None)
    assert dapo_math.score(response, "5") == 1.0  # without the rule only the answer counts


def test_compute_score_works_in_worker_threads():
    """verl's reward workers call the function from threads, where math-verify's SIGALRM timer cannot run."""
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: dapo_math.compute_score("math_dapo", r, "5", {}, format_rule=True),
                                ["<think>x</think> \\boxed{5}", "\\boxed{5}"]))
    assert results == [{"score": 1.0, "acc": True, "format_ok": True},
                       {"score": 0.0, "acc": False, "format_ok": False}]
