"""GSM8K (Cobbe et al. 2021, arXiv 2110.14168; MIT): load, extract the final answer, score. The answer rule of
every grade-school task in rlkit (the tiny engine's too): ``strict`` (default), verl's GSM8K rule, the last ``####
<number>`` in the final 300 characters (commas and ``$`` dropped; without ``####`` it scores 0); ``flexible``, the
last number there. Unlike verl, answers are compared as numbers (``72.0`` equals ``72``).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

CLIP_CHARS = 300  # verl only looks at the tail: the answer is at the end and regexes on long strings are slow
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
MODES = ("strict", "flexible")


def extract_answer(text: str, mode: str = "strict") -> str | None:
    """The final answer in ``text`` as a string without commas or ``$``, or None (see module doc for the modes)."""
    if mode not in MODES:
        raise ValueError(f"unknown answer mode {mode!r}; valid: {', '.join(MODES)}")
    tail = text[-CLIP_CHARS:]
    if mode == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    numbers = [n for n in _FLEXIBLE.findall(tail) if n not in ("", ".")]
    return numbers[-1].replace(",", "") if numbers else None


def _number(s: str) -> Decimal | None:
    try:
        return Decimal(s.replace(",", "").replace("$", "").strip().rstrip("."))
    except InvalidOperation:
        return None


def score(text: str, ground_truth: str | int | float, mode: str = "strict") -> float:
    """1.0 if the extracted answer equals ``ground_truth`` numerically, else 0.0."""
    answer = extract_answer(text, mode)
    if answer is None:
        return 0.0
    got, want = _number(answer), _number(str(ground_truth))
    return float(got is not None and want is not None and got == want)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  mode: str = "strict", format_score: float = 0.0, **kwargs) -> dict:
    """verl custom reward function for GSM8K (``reward_kwargs.mode``, ``.format_score``), scored as verl's: 1.0 for
    the right answer, ``format_score`` (default 0) for a wrong one with the format, else 0.0; ``acc``: right alone."""
    if not 0.0 <= format_score < 1.0:
        raise ValueError(f"format_score must be in [0, 1) (a right answer scores 1), got {format_score}")
    right = score(solution_str, ground_truth, mode) == 1.0
    formatted = extract_answer(solution_str, mode) is not None
    return {"score": 1.0 if right else (format_score if formatted else 0.0), "acc": right}


_GOLD = re.compile(r"-?(\d+(\.\d*)?|\.\d+)")


def gold_answer(solution: str) -> str:
    """The number after a GSM8K reference solution's ``####``, commas removed (``ValueError`` without one)."""
    if "####" not in solution:
        raise ValueError("a GSM8K reference solution ends with '#### <answer>'; this one has no '####'")
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not _GOLD.fullmatch(answer):
        raise ValueError(f"the final answer after '####' is {answer[:40]!r}, not a number")
    return answer


def read_records(source: str | Path, split: str = "train", *, hf_config: str | None = None) -> list[dict[str, Any]]:
    """Raw rows: a ``.jsonl``/``.parquet`` file, a folder of ``<split>`` files, or a HF ``datasets`` id."""
    path = Path(source)
    if path.is_dir():
        candidates = [path / f"{split}.jsonl", path / f"{split}.parquet", *sorted(path.glob(f"**/{split}-*.parquet"))]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise FileNotFoundError(f"no {split}.jsonl or {split}.parquet under {path}")
        path = found[0]
    if path.is_file():
        if path.suffix == ".jsonl":
            return _json_lines(path)
        if path.suffix == ".parquet":
            import pandas as pd

            return pd.read_parquet(path).to_dict("records")
        raise ValueError(f"{path}: expected a .jsonl or .parquet file")
    if isinstance(source, str) and "/" in source and not path.exists() and not source.startswith((".", "/")):
        return _from_hub(source, split, hf_config)
    raise FileNotFoundError(f"{source}: no such file or directory (and not a HF dataset id)")


def _json_lines(path: Path) -> list[Any]:
    """The JSON values of a ``.jsonl`` file's non-blank lines (a bad line: ``ValueError`` naming it)."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{path} line {number} is not JSON ({getattr(e, 'msg', e)})") from None
    return rows


HUB_LOGGERS = ("huggingface_hub", "datasets", "fsspec")
"""Libraries that log each failed request to the hub: quiet while a load tries it (its error says it once)."""


def _from_hub(source: str, split: str, hf_config: str | None) -> list[dict[str, Any]]:
    """The rows of a HF ``datasets`` id; a hub that cannot be reached is :class:`~rlkit.errors.NoNetwork`."""
    import logging

    import datasets  # the hub id path: only imported when used

    from rlkit.errors import NoNetwork

    loggers = [logging.getLogger(name) for name in HUB_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        return list(datasets.load_dataset(source, hf_config, split=split))
    except ConnectionError as e:
        raise NoNetwork(f"{source} is a Hugging Face dataset id and the hub cannot be reached ({e}): "
                        "this needs the network, or give --source a local .jsonl/.parquet file or "
                        "folder") from None
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def load(source: str | Path = "openai/gsm8k", split: str = "train") -> list[dict[str, Any]]:
    """GSM8K rows ``{"question", "answer"}`` (:func:`read_records`, config ``main``)."""
    rows = read_records(source, split, hf_config="main")
    missing = [i for i, r in enumerate(rows) if "question" not in r or "answer" not in r]
    if missing:
        raise ValueError(f"{source}: rows {missing[:5]} lack 'question'/'answer' fields")
    return [{"question": r["question"], "answer": r["answer"]} for r in rows]
