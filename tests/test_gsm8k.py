"""GSM8K loading and scoring, on the real data set when ../shared/data/gsm8k is present."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rlkit.tasks import gsm8k

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"


def test_extract_strict_and_flexible():
    assert gsm8k.extract_answer("so 3+4 = 7\n#### 7") == "7"
    assert gsm8k.extract_answer("#### 1,234 then #### -5") == "-5"  # the last one counts
    assert gsm8k.extract_answer("the answer is 7") is None  # strict demands the format
    assert gsm8k.extract_answer("the answer is 7.", mode="flexible") == "7."
    assert gsm8k.extract_answer("x" * 400 + "#### 9") == "9"
    assert gsm8k.extract_answer("#### 9" + "x" * 400) is None  # only the last 300 characters are read
    with pytest.raises(ValueError, match="valid: strict, flexible"):
        gsm8k.extract_answer("#### 1", mode="loose")


def test_score_compares_numbers():
    assert gsm8k.score("#### 72", "72") == 1.0
    assert gsm8k.score("#### 72.0", 72) == 1.0
    assert gsm8k.score("#### 1,000", "1000") == 1.0
    assert gsm8k.score("#### 71", "72") == 0.0
    assert gsm8k.score("72", "72") == 0.0
    assert gsm8k.score("it is 72.", "72", mode="flexible") == 1.0


def test_compute_score_gives_the_format_its_score_and_accuracy_the_answer_alone():
    cases = {"so #### 72": (1.0, True), "so #### 71": (0.1, False), "it is 72": (0.0, False)}
    for text, (reward, acc) in cases.items():
        assert gsm8k.compute_score("openai/gsm8k", text, "72", format_score=0.1) == {"score": reward, "acc": acc}
    assert gsm8k.compute_score("openai/gsm8k", "so #### 71", "72")["score"] == 0.0  # verl's default: no format score
    assert gsm8k.compute_score("openai/gsm8k", "it is 71", "72", mode="flexible", format_score=0.1)["score"] == 0.1
    with pytest.raises(ValueError, match=r"format_score must be in \[0, 1\)"):
        gsm8k.compute_score("openai/gsm8k", "#### 1", "1", format_score=1.0)


def test_compute_score_scores_as_verls_own_gsm8k_rule():
    verl_gsm8k = pytest.importorskip("verl.utils.reward_score.gsm8k")
    # (not "72." or "72.0": rlkit compares numbers where verl compares strings, the module doc's one deviation)
    texts = ["#### 72", "#### 71", "no answer", "x #### 1,234", "it is 72", "#### 9" + "x" * 400, "#### $72"]
    for text in texts:
        for mode in gsm8k.MODES:
            ours = gsm8k.compute_score("openai/gsm8k", text, "72", mode=mode, format_score=0.1)["score"]
            assert ours == verl_gsm8k.compute_score(text, "72", method=mode, format_score=0.1), (text, mode)


def test_load_local_jsonl_and_parquet(tmp_path):
    rows = [{"question": "1+1?", "answer": "1+1=2\n#### 2"}, {"question": "2*3?", "answer": "#### 6"}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert gsm8k.load(tmp_path / "train.jsonl") == rows
    assert gsm8k.load(tmp_path) == rows
    pq = tmp_path / "pq"
    pq.mkdir()
    pd.DataFrame(rows).to_parquet(pq / "test-00000-of-00001.parquet")
    assert gsm8k.load(pq, split="test") == rows
    with pytest.raises(FileNotFoundError):
        gsm8k.load(tmp_path / "nope.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"q": 1}) + "\n")
    with pytest.raises(ValueError, match="lack 'question'"):
        gsm8k.load(tmp_path / "bad.jsonl")


@pytest.mark.skipif(not SHARED.is_dir(), reason="real GSM8K not present at ../shared/data/gsm8k")
def test_real_gsm8k_every_gold_answer_extracts_and_scores_one():
    rows = gsm8k.load(SHARED, "train") + gsm8k.load(SHARED, "test")
    assert len(rows) == 8792
    for r in rows:
        truth = gsm8k.gold_answer(r["answer"])
        assert gsm8k.extract_answer(r["answer"]) is not None, r["answer"][-80:]
        assert gsm8k.score(r["answer"], truth) == 1.0, r["answer"][-80:]
