"""DAPO-Math-17k (Yu et al., *DAPO*, arXiv 2503.14476; Apache-2.0) for training, AIME 2024 for validation.

Sources (HF ids or local files): :data:`TRAIN_SOURCE`, the deduplicated English problems SPO trains on;
:data:`ORIGINAL_SOURCE`, the release in verl's schema (DAPO's instruction removed here), and :data:`VAL_SOURCE`, both
with repeats (:func:`rlkit.verl.launch.data.prepare_dapo` removes them).

:func:`score`: math-verify's symbolic equivalence of ``\\boxed{<truth>}`` and the response from its last
``\\boxed`` on, 1.0 or 0.0; with ``format_rule``, SPO's rule first (exactly one ``</think>`` and no code block
after it, else 0). Deviations: SPO's recipe matches verl's ``math_dapo`` normalised strings; its merged code only
counts ``</think>`` (the code-block half is from the PR's description). math-verify's time limits need the main
thread (SIGALRM): elsewhere (verl's reward workers) parsing runs without one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlkit.tasks.gsm8k import read_records
from rlkit.tasks.tools import find_code_calls

TRAIN_SOURCE = "open-r1/DAPO-Math-17k-Processed"
ORIGINAL_SOURCE = "BytedTsinghua-SIA/DAPO-Math-17k"
VAL_SOURCE = "BytedTsinghua-SIA/AIME-2024"
HF_CONFIGS = {TRAIN_SOURCE: "en"}
"""HF config per source id where one must be named (the English subset, as in SPO's split script)."""

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# DAPO's own instruction around each problem in ORIGINAL_SOURCE / VAL_SOURCE
DAPO_HEAD = ("Solve the following math problem step by step. The last line of your response should be of the "
             "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_TAIL = '\n\nRemember to put your answer on its own line after "Answer:".'
THINK_END = "</think>"
TIMEOUT_S = 5


def problem_and_answer(row: Mapping[str, Any]) -> tuple[str, str]:
    """``(problem, answer)`` of a row: ``prompt`` + ``solution`` (open-r1), ``problem``/``answer`` (either case) or
    verl's chat ``prompt`` + ``reward_model.ground_truth``; a ValueError names the keys seen."""
    if isinstance(row.get("prompt"), str) and "solution" in row:
        return row["prompt"].strip(), str(row["solution"]).strip()
    for p, a in (("problem", "answer"), ("Problem", "Answer")):
        if p in row and a in row:
            return str(row[p]).strip(), str(row[a]).strip()
    truth = (row.get("reward_model") or {}).get("ground_truth")
    if "prompt" in row and truth is not None:
        question = (row.get("extra_info") or {}).get("question")
        if not question:
            users = [m["content"] for m in row["prompt"] if m["role"] == "user"]
            if not users:
                raise ValueError("a verl-schema row without a user message in 'prompt'")
            question = users[-1].removeprefix(DAPO_HEAD).removesuffix(DAPO_TAIL)
        return question.strip(), str(truth).strip()
    raise ValueError(f"unrecognised DAPO/AIME row with keys {sorted(row)}; expected prompt+solution, "
                     "problem+answer, Problem+Answer, or verl's prompt+reward_model.ground_truth")


def load(source: str | Path = TRAIN_SOURCE, split: str = "train", *, hf_config: str | None = None) -> list[dict]:
    """Rows ``{"problem", "answer"}`` (:func:`rlkit.tasks.gsm8k.read_records`), repeats kept."""
    hf_config = hf_config or HF_CONFIGS.get(str(source))
    out = []
    for i, row in enumerate(read_records(source, split, hf_config=hf_config)):
        try:
            problem, answer = problem_and_answer(row)
        except ValueError as e:
            raise ValueError(f"{source} row {i}: {e}") from None
        if not problem or not answer:
            raise ValueError(f"{source} row {i}: empty problem or answer")
        out.append({"problem": problem, "answer": answer})
    return out


def prompt(problem: str) -> str:
    """The user message for ``problem``: it asks for the final answer in ``\\boxed{}``."""
    return f"{problem}\n\n{BOXED_INSTRUCTION}"


def format_error(response: str) -> str | None:
    """Why ``response`` breaks SPO's format rule (module doc), or None if it keeps it."""
    n = response.count(THINK_END)
    if n != 1:
        return f"{n} '{THINK_END}' tags (exactly 1 needed)"
    if find_code_calls(response.split(THINK_END, 1)[1]):
        return f"a code block after '{THINK_END}'"
    return None


def _equivalent(response: str, ground_truth: str) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"\\boxed{{{ground_truth}}}", [LatexExtractionConfig()], parsing_timeout=timeout)
    # from the last \boxed on: math-verify would merge several boxed answers into one set
    answer = response[response.rfind("\\boxed"):] if "\\boxed" in response else response
    pred = parse(answer, [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()],
                 parsing_timeout=timeout)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=timeout))


def score(response: str, ground_truth: str | int, *, format_rule: bool = False) -> float:
    """1.0 if ``response``'s answer equals ``ground_truth`` (and, with ``format_rule``, keeps SPO's format)."""
    return compute_score("", response, str(ground_truth), format_rule=format_rule)["score"]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  format_rule: bool = False, **kwargs: Any) -> dict[str, Any]:
    """verl custom reward function: ``{"score", "acc", "format_ok"}``, SPO's rule enforced with ``format_rule``."""
    format_ok = format_error(solution_str) is None
    acc = (format_ok or not format_rule) and _equivalent(solution_str, str(ground_truth))
    return {"score": float(acc), "acc": acc, "format_ok": format_ok}
