"""verl data: GSM8K and DAPO parquet in verl's row schema (real GSM8K when ../shared/data/gsm8k is present),
read back by verl's own dataset and reward code, and SPO's offline-value pipeline with a fake sampler."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkit.cli import main
from rlkit.methods.spo import ValueTracker
from rlkit.tasks import dapo_math
from rlkit.verl.launch import data

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"

# verl's GSM8K row schema, as verl's examples/data_preprocess/gsm8k.py writes it (datasets → parquet)
VERL_COLUMNS = {
    "data_source": pa.string(),
    "prompt": pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])),
    "ability": pa.string(),
    "reward_model": pa.struct([("style", pa.string()), ("ground_truth", pa.string())]),
}
VERL_EXTRA_INFO = [("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()), ("question", pa.string())]


def assert_verl_schema(path: Path) -> None:
    schema = pq.read_schema(path)
    assert schema.names == [*VERL_COLUMNS, "extra_info"]
    for name, type_ in VERL_COLUMNS.items():
        assert schema.field(name).type == type_, name
    extra = schema.field("extra_info").type
    assert [(f.name, f.type) for f in extra] == [*VERL_EXTRA_INFO, ("prompt_id", pa.string())]


def gsm8k_dir(tmp_path: Path, n: int = 6) -> Path:
    src = tmp_path / "gsm8k-src"
    src.mkdir()
    for split in ("train", "test"):
        with (src / f"{split}.jsonl").open("w") as f:
            for i in range(n):
                f.write(json.dumps({"question": f"{split}: what is {i} + {i}?",
                                    "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i:,}"}) + "\n")
    return src


def test_prompt_id_is_a_stable_hash_of_the_problem():
    assert data.prompt_id("What is 2 + 3?") == "1ea26256ebae2e04"  # offline_values.json files depend on it
    assert data.prompt_id("  What is 2\n+   3? ") == data.prompt_id("What is 2 + 3?")
    assert data.prompt_id("What is 2 + 4?") != data.prompt_id("What is 2 + 3?")


def test_gsm8k_cli_writes_verl_rows(tmp_path, capsys):
    assert main(["data", "gsm8k", "--out", str(tmp_path / "out"), "--source", str(gsm8k_dir(tmp_path))]) == 0
    assert json.loads(capsys.readouterr().out)["train"]["rows"] == 6
    for split in ("train", "test"):
        assert_verl_schema(tmp_path / "out" / f"{split}.parquet")
    row = data.read_rows(tmp_path / "out" / "train.parquet")[5]
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"train: what is 5 + 5? {data.GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "10"},
        "extra_info": {"split": "train", "index": 5, "answer": "5 + 5 = <<5+5=10>>10\n#### 10",
                       "question": "train: what is 5 + 5?", "prompt_id": data.prompt_id("train: what is 5 + 5?")},
    }


@pytest.mark.skipif(not SHARED.is_dir(), reason="real GSM8K not present at ../shared/data/gsm8k")
def test_real_gsm8k_in_verl_schema(tmp_path):
    summary = data.prepare_gsm8k(tmp_path, SHARED)
    assert {split: s["rows"] for split, s in summary.items()} == {"train": 7473, "test": 1319}
    for split in ("train", "test"):
        path = tmp_path / f"{split}.parquet"
        assert_verl_schema(path)
        rows = data.read_rows(path)
        assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
        assert len({r["extra_info"]["prompt_id"] for r in rows}) == len(rows)  # SPO's pool needs unique ids
        for r in rows:
            info = r["extra_info"]
            # the ground truth is the reference solution's "####" answer, commas dropped
            last_line = info["answer"].strip().splitlines()[-1]
            assert re.fullmatch(r"#### -?[\d.,]+", last_line), last_line
            assert r["reward_model"]["ground_truth"] == last_line[5:].replace(",", "")
            assert r["prompt"] == [{"role": "user", "content": f"{info['question']} {data.GSM8K_INSTRUCTION}"}]
            assert info["split"] == split and info["prompt_id"] == data.prompt_id(info["question"])


@pytest.mark.skipif(not SHARED.is_dir(), reason="real GSM8K not present at ../shared/data/gsm8k")
def test_verl_scores_every_real_reference_solution_correct(tmp_path):
    """verl's own GSM8K reward (chosen by data_source) gives each reference solution 1 against our ground truth."""
    pytest.importorskip("verl")
    from verl.utils.reward_score import default_compute_score

    data.prepare_gsm8k(tmp_path, SHARED)
    for split in ("train", "test"):
        for r in data.read_rows(tmp_path / f"{split}.parquet"):
            assert default_compute_score(r["data_source"], r["extra_info"]["answer"],
                                         r["reward_model"]["ground_truth"]) == 1.0, r["extra_info"]["index"]


def test_verl_dataset_reads_the_rows(tmp_path, monkeypatch):
    """verl's RLHFDataset (what main_ppo builds from data.train_files) loads the parquet and hands rows on."""
    pytest.importorskip("verl")
    import datasets
    from omegaconf import OmegaConf
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from verl.utils.dataset.rl_dataset import RLHFDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    data.prepare_gsm8k(tmp_path / "out", gsm8k_dir(tmp_path))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                        unk_token="<unk>", pad_token="<unk>")
    config = OmegaConf.create({"max_prompt_length": 64, "filter_overlong_prompts": False,
                               "cache_dir": str(tmp_path / "verl-cache")})
    dataset = RLHFDataset([str(tmp_path / "out" / "test.parquet")], tokenizer, config)
    item = dataset[3]
    assert len(dataset) == 6 and item["index"] == 3 and item["data_source"] == "openai/gsm8k"
    assert item["reward_model"]["ground_truth"] == "6" and item["extra_info"]["prompt_id"] == data.prompt_id(
        "test: what is 3 + 3?")
    assert item["raw_prompt"][0]["content"].startswith("test: what is 3 + 3?")


def dapo_sources(tmp_path: Path) -> tuple[Path, Path]:
    """A DAPO-Math-17k parquet in its release layout (repeats, one with another answer) and an AIME jsonl."""
    problems = [("What is $2 + 3$?", "5"), ("Compute $7 \\cdot 6$.", "42"), ("Find $x$ if $2x = 8$.", "4")]
    rows = [{"data_source": "math_dapo", "ability": "MATH", "extra_info": {"index": f"u{i}"},
             "prompt": [{"content": dapo_math.DAPO_HEAD + p + dapo_math.DAPO_TAIL, "role": "user"}],
             "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"}}
            for i, (p, a) in enumerate(problems * 3 + [(problems[0][0], "6")])]
    pd.DataFrame(rows).to_parquet(tmp_path / "dapo-math-17k.parquet")
    with (tmp_path / "aime.jsonl").open("w") as f:
        for i in range(2):
            f.write(json.dumps({"problem": f"AIME problem {i}: find $n$.", "answer": 100 + i}) + "\n")
    return tmp_path / "dapo-math-17k.parquet", tmp_path / "aime.jsonl"


def test_dapo_rows_one_per_problem_with_a_boxed_prompt(tmp_path):
    train_src, val_src = dapo_sources(tmp_path)
    summary = data.prepare_dapo(tmp_path / "out", train_src, val_src)
    assert summary["train"] == {"rows": 3, "repeats_dropped": 7, "conflicting_answers": 1,
                                "path": str(tmp_path / "out" / data.DAPO_TRAIN_FILE)}
    assert summary["val"]["rows"] == 2
    for name in (data.DAPO_TRAIN_FILE, data.DAPO_VAL_FILE):
        assert_verl_schema(tmp_path / "out" / name)
    train = data.read_rows(tmp_path / "out" / data.DAPO_TRAIN_FILE)
    assert [r["reward_model"]["ground_truth"] for r in train] == ["5", "42", "4"]  # the first answer is kept
    assert train[0]["prompt"][0]["content"] == dapo_math.prompt("What is $2 + 3$?")
    assert train[0]["data_source"] == "math_dapo" and train[0]["extra_info"]["question"] == "What is $2 + 3$?"
    val = data.read_rows(tmp_path / "out" / data.DAPO_VAL_FILE)
    assert [(r["data_source"], r["reward_model"]["ground_truth"]) for r in val] == [("aime_2024", "100"),
                                                                                   ("aime_2024", "101")]
    assert dapo_math.load(tmp_path / "out" / data.DAPO_TRAIN_FILE) == [  # rlkit's rows load back as they were
        {"problem": r["extra_info"]["question"], "answer": r["reward_model"]["ground_truth"]} for r in train]


def test_dapo_cli_subset_is_seeded(tmp_path, capsys):
    train_src, _ = dapo_sources(tmp_path)
    runs = []
    for out in ("a", "b"):
        args = ["data", "dapo", "--out", str(tmp_path / out), "--source", str(train_src), "--val-source", "none",
                "--max-train", "2", "--seed", "3"]
        assert main(args) == 0
        summary = json.loads(capsys.readouterr().out)
        assert "val" not in summary and summary["train"]["rows"] == 2 and summary["train"]["sampled_from"] == 3
        runs.append(data.read_rows(tmp_path / out / data.DAPO_TRAIN_FILE))
    assert runs[0] == runs[1] and [r["extra_info"]["index"] for r in runs[0]] == [0, 1]


# --------------------------------------------------------------------------- SPO offline values


def successes(question: str, n: int) -> int:
    """How many of the fake sampler's n answers to ``question`` are right (differs per question)."""
    return int(question.split()[3]) % (n + 1)


def fake_sampler(prompts, n):
    """Answers the GSM8K-style "what is i + i?" prompts: the first successes(...) answers right, then wrong."""
    out = []
    for chat in prompts:
        question = chat[0]["content"]
        right = 2 * int(question.split()[3])
        out.append([f"#### {right if k < successes(question, n) else right + 1}" for k in range(n)])
    return out


def test_spo_pipeline_split_estimate_merge_feeds_the_tracker(tmp_path, capsys):
    data.prepare_gsm8k(tmp_path / "gsm8k", gsm8k_dir(tmp_path, n=10))
    train = tmp_path / "gsm8k" / "train.parquet"
    rows = data.read_rows(train)

    assert main(["data", "spo-split", "--input", str(train), "--out", str(tmp_path / "splits"), "--subsets", "3"]) == 0
    subsets = [Path(p) for p in json.loads(capsys.readouterr().out)]
    parts = [data.read_rows(p) for p in subsets]
    assert [len(p) for p in parts] == [3, 3, 4] and sum(parts, []) == rows

    # subset 0 also holds a malformed row; subset 2 is never estimated (a failed job)
    broken = pq.read_table(subsets[0]).to_pylist() + [{**rows[0], "extra_info": None}]
    pq.write_table(pa.Table.from_pylist(broken, schema=data.row_schema()), subsets[0])
    outs = [tmp_path / "values" / f"subset_{i}.jsonl" for i in range(3)]
    for i in (0, 1):
        summary = data.estimate_offline_values(subsets[i], outs[i], fake_sampler, n_samples=10, batch_size=2)
        assert summary == {"prompts": 3, "responses": 30, "skipped_rows": int(i == 0)}
    with outs[1].open("a") as f:  # lines a crashed or hand-edited job could leave
        f.write('{"prompt_id": "abc", "scores": [1, 0\n')  # cut off
        f.write('["not", "an", "object"]\n{"scores": [1.0]}\n')
        f.write('{"prompt_id": "p1", "scores": []}\n{"prompt_id": "p2", "scores": [1, NaN]}\n')
        f.write('{"prompt_id": "p3", "scores": [true]}\n{"prompt_id": "p4", "scores": "1"}\n\n')

    out = tmp_path / "offline_values.json"
    args = ["data", "spo-merge", "--inputs", str(tmp_path / "values"), str(tmp_path / "nowhere.jsonl"),
            "--out", str(out), "--pool", str(train)]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == {
        "files": 2, "missing_inputs": [str(tmp_path / "nowhere.jsonl")], "prompts": 6, "prompts_capped": 6,
        "skipped_lines": {"not a JSON object": 2, "no prompt_id": 1,
                          "scores not a non-empty list of finite numbers": 4},
        "pool_without_values": 4, "values_outside_pool": 0,
    }
    values = data.load_offline_values(out)
    for r in rows[:6]:
        question = r["extra_info"]["question"]
        expected = [1.0] * successes(question, 10) + [0.0] * (10 - successes(question, 10))
        assert values[r["extra_info"]["prompt_id"]] == expected[:8]  # the first 8 of 10 kept

    pool = data.prompt_ids(train)
    tracker = ValueTracker(pool, offline_scores=values, offline_N=8)
    for r, alpha, beta in zip(rows, tracker.alpha.tolist(), tracker.beta.tolist()):
        scores = values.get(r["extra_info"]["prompt_id"])
        if scores is None:  # the unestimated subset starts uninformed
            assert (alpha, beta) == (0.5, 0.5)
        else:  # α₀ = N₀(Σs + ½)/(N + 1), N₀ = 1/(1 − ρ_min) = 8 (method notes: SPO)
            assert math.isclose(alpha, 8 * (sum(scores) + 0.5) / 9)
            assert math.isclose(beta, 8 * (8 - sum(scores) + 0.5) / 9)


def test_estimate_rejects_a_sampler_that_drops_prompts(tmp_path):
    data.prepare_gsm8k(tmp_path / "gsm8k", gsm8k_dir(tmp_path))
    with pytest.raises(ValueError, match="returned 1 response lists for 6 prompts"):
        data.estimate_offline_values(tmp_path / "gsm8k" / "test.parquet", tmp_path / "v.jsonl",
                                     lambda prompts, n: [["#### 0"] * n])
