"""DAPO-Math-17k (Yu et al., *DAPO*, arXiv 2503.14476; Apache-2.0) for training, AIME 2024 for validation:
load, prompt, score with math-verify.

Sources — HF ids, or local ``.parquet``/``.jsonl`` files in any of their schemas (:func:`problem_and_answer`):

- :data:`TRAIN_SOURCE` ``open-r1/DAPO-Math-17k-Processed``, config ``en``: the deduplicated English
  problems SPO trains on (method notes: SPO); columns ``prompt`` (the problem) and ``solution`` (the answer).
- :data:`ORIGINAL_SOURCE` ``BytedTsinghua-SIA/DAPO-Math-17k``: the release in verl's row schema, each problem
  wrapped in DAPO's "Answer:" instruction (removed here) and repeated about 100 times.
- :data:`VAL_SOURCE` ``BytedTsinghua-SIA/AIME-2024``: the 30 AIME 2024 problems, each repeated 32 times.

:func:`load` returns every row as found; :func:`rlkit.verl.launch.data.prepare_dapo` removes the repeats.

Prompt (:func:`prompt`): the problem, then :data:`BOXED_INSTRUCTION` asking for the answer in ``\\boxed{}``.

Score (:func:`score`): math-verify parses the ground truth as ``\\boxed{<truth>}`` and the response from its
last ``\\boxed`` on (all of it when there is none; ``\\boxed{}`` first, then other LaTeX or plain expressions)
and checks symbolic equivalence: 1.0 or 0.0.
With ``format_rule=True``, SPO's rule (the SPO PR's ``compute_score``, seed 002) comes first: a response
with other than exactly one ``</think>``, or with a code block after it (:func:`rlkit.tasks.tools.find_code_calls`),
scores 0. :func:`compute_score` is the same as a verl custom reward function.

Deviations: SPO's recipe scores with verl's ``math_dapo`` strict-box check (normalised string match); rlkit
uses math-verify's symbolic check. The merged recipe code only counts ``</think>``; the "no code block after
it" half is from the PR's description. math-verify's time limits use SIGALRM, which works only in the main
thread: elsewhere (verl's reward workers score in threads) parsing runs without a time limit.
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
    """``(problem, answer)`` of a row in any supported schema (module doc); ValueError names the keys seen.

    - ``prompt`` (str) + ``solution``: open-r1's processed set;
    - ``problem``/``answer`` or ``Problem``/``Answer``: AIME-style tables;
    - verl's schema — chat ``prompt`` + ``reward_model.ground_truth``: the problem is ``extra_info.question``
      when present (rlkit's rows), else the last user message without DAPO's instruction.
    """
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
    """Rows ``{"problem", "answer"}`` from a HF id (config ``hf_config``, default :data:`HF_CONFIGS`) or a
    local file/directory (:func:`rlkit.tasks.gsm8k.read_records`); repeats are kept."""
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
    """1.0 if ``response``'s final answer is equivalent to ``ground_truth`` (and, with ``format_rule``, the
    response keeps SPO's format), else 0.0."""
    return compute_score("", response, str(ground_truth), format_rule=format_rule)["score"]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  format_rule: bool = False, **kwargs: Any) -> dict[str, Any]:
    """verl custom reward function (``reward.custom_reward_function.path=<this file>``, ``name=compute_score``;
    SPO's rule via ``reward.custom_reward_function.reward_kwargs.format_rule=true``).

    Returns ``{"score": 1.0 | 0.0, "acc": bool, "format_ok": bool}`` (``format_ok`` is reported either way,
    enforced only with ``format_rule``); verl logs the extra keys.
    """
    format_ok = format_error(solution_str) is None
    acc = (format_ok or not format_rule) and _equivalent(solution_str, str(ground_truth))
    return {"score": float(acc), "acc": acc, "format_ok": format_ok}
