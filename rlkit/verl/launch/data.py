"""Data for full-scale verl runs: GSM8K and DAPO-Math parquet in verl's row schema, and SPO's offline values.

Rows follow verl's GSM8K schema (``examples/data_preprocess/gsm8k.py``) plus ``extra_info.prompt_id``. SPO's
offline values follow the SPO recipe's ``estimate_offline_values/`` but key prompts by a hash of the problem,
keep each prompt's first ``max_scores`` scores (not a random subset) and sample one turn without tools.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlkit.errors import BadSource, InvalidSetting
from rlkit.files import DATA, atomic_write, claim_dir, record_files
from rlkit.tasks import arithmetic, dapo_math, gsm8k

GSM8K_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
"""verl's GSM8K instruction, appended after a space (examples/data_preprocess/gsm8k.py)."""
DAPO_TRAIN_FILE, DAPO_VAL_FILE = "train.parquet", "aime2024.parquet"

Sampler = Callable[[list[list[dict[str, str]]], int], list[list[str]]]
"""``sampler(chat_prompts, n) -> n response texts per prompt``, in order."""
Scorer = Callable[[str, str, str], float]
"""``scorer(data_source, response, ground_truth) -> reward``."""


def prompt_id(question: str) -> str:
    """SPO's stable prompt id: the first 16 hex digits of sha256 of ``question`` with whitespace runs collapsed."""
    return hashlib.sha256(" ".join(question.split()).encode("utf-8")).hexdigest()[:16]


def row_schema():
    """The rows' arrow schema: verl's GSM8K schema plus ``extra_info.prompt_id``."""
    import pyarrow as pa

    return pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()),
                                  ("question", pa.string()), ("prompt_id", pa.string())])),
    ])


def make_row(data_source: str, content: str, ground_truth: str, split: str, index: int, answer: str,
             question: str) -> dict[str, Any]:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question,
                       "prompt_id": prompt_id(question)},
    }


def gsm8k_rows(examples: Sequence[Mapping[str, str]], split: str) -> list[dict[str, Any]]:
    """verl's GSM8K rows of ``{"question", "answer"}`` examples (:func:`rlkit.tasks.gsm8k.load`)."""
    return [make_row(GSM8K_SOURCE, f"{ex['question']} {GSM8K_INSTRUCTION}", gsm8k.gold_answer(ex["answer"]), split,
                     i, ex["answer"], ex["question"]) for i, ex in enumerate(examples)]


def dapo_rows(problems: Iterable[Mapping[str, str]], split: str, data_source: str) -> tuple[list[dict], dict]:
    """Rows of ``{"problem", "answer"}``, one per prompt id (first kept), and counts of what was dropped."""
    answers: dict[str, str] = {}
    rows, repeats, conflicts = [], 0, 0
    for p in problems:
        pid = prompt_id(p["problem"])
        if pid in answers:
            repeats += 1
            conflicts += answers[pid] != p["answer"]
            continue
        answers[pid] = p["answer"]
        rows.append(make_row(data_source, dapo_math.prompt(p["problem"]), p["answer"], split, len(rows),
                             p["answer"], p["problem"]))
    return rows, {"rows": len(rows), "repeats_dropped": repeats, "conflicting_answers": conflicts}


def write_rows(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Write rows as parquet with :func:`row_schema` (pyarrow checks every field's type)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(list(rows), schema=row_schema())
    with atomic_write(path, "wb") as f:
        pq.write_table(table, f)
    return path


def read_table(path: str | os.PathLike, flag: str = "--input", columns: list[str] | None = None):
    """The parquet file ``path`` as an arrow table; anything else is a :class:`~rlkit.errors.BadSource`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        what = "a directory" if Path(path).is_dir() else "no such file"
        raise BadSource(f"{flag} {path}: {what}; give a parquet file (rlkit data gsm8k|dapo|arithmetic)")
    try:
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadSource(f"{flag} {path}: not a parquet file of rlkit's rows ({first})") from None


def read_rows(path: str | os.PathLike, flag: str = "--input") -> list[dict[str, Any]]:
    """Rows of a parquet file as plain Python (lists and dicts, no numpy); see :func:`read_table`."""
    return read_table(path, flag).to_pylist()


def prompt_ids(path: str | os.PathLike, flag: str = "--pool") -> list[str]:
    """``extra_info.prompt_id`` of every row of a parquet file, in order; see :func:`read_table`."""
    table = read_table(path, flag, columns=["extra_info"])
    try:
        return [info["prompt_id"] for info in table.column(0).to_pylist()]
    except (KeyError, TypeError):
        raise BadSource(f"{flag} {path}: rows without extra_info.prompt_id (rlkit data writes it)") from None


DATA_FILES = ("train.parquet", "test.parquet", DAPO_TRAIN_FILE, DAPO_VAL_FILE)
"""What ``rlkit data gsm8k|arithmetic|dapo`` write into ``--out``."""
TEST_FRACTION = 0.1
"""Share of a single ``--source`` file's problems that :func:`prepare_gsm8k` holds out for testing."""


def at_least_one(**counts: int) -> None:
    """Refuse a count below 1 naming its flag: ``max_train=0`` → ``--max-train 0``."""
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidSetting(f"--{name.replace('_', '-')} {n}: must be a whole number ≥ 1")


def claim_data_dir(out: str | os.PathLike, *, force: bool = False) -> None:
    """``out`` made a data folder rlkit may write (:func:`rlkit.files.claim_dir`)."""
    claim_dir(out, DATA, force=force, writes=DATA_FILES)


def split_by_hash(examples: Sequence[Mapping[str, str]], test_fraction: float = TEST_FRACTION,
                  ) -> tuple[list, list]:
    """``examples`` split into (train, test) by a hash of each question (:func:`prompt_id`), in any order."""
    if not 0 < test_fraction < 1:
        raise BadSource(f"--test-fraction must be between 0 and 1, got {test_fraction}")
    train, test = [], []
    for ex in examples:
        h = int(prompt_id(ex["question"]), 16) / 16 ** 16
        (test if h < test_fraction else train).append(ex)
    return train, test


def load_gsm8k(source: str | os.PathLike, split: str, flag: str = "--source") -> list[dict[str, str]]:
    """:func:`rlkit.tasks.gsm8k.load`, a missing, empty or malformed source refused naming it and ``flag``."""
    local = Path(source).exists() or str(source).startswith((".", "/", "~")) or str(source).endswith(
        (".jsonl", ".parquet")) or str(source).count("/") != 1
    if local and not Path(source).expanduser().exists():
        raise BadSource(f"{flag} {source}: no such file or directory (give a local .jsonl/.parquet file or "
                        "folder, or a Hugging Face dataset id such as openai/gsm8k)")
    try:
        examples = gsm8k.load(Path(source).expanduser() if local else source, split)
    except FileNotFoundError as e:
        raise BadSource(f"{flag} {source}: {e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise BadSource(f"{flag} {source} ({split}): {e}; each row needs 'question' and 'answer' "
                        "(ending '#### <number>')") from None
    if not examples:
        raise BadSource(f"{flag} {source} has no {split} problems: give a file with GSM8K rows")
    bad = []
    for i, ex in enumerate(examples):
        if not isinstance(ex["question"], str) or not isinstance(ex["answer"], str):
            raise BadSource(f"{flag} {source} ({split}) row {i + 1}: 'question' and 'answer' must be strings")
        try:
            gsm8k.gold_answer(ex["answer"])
        except ValueError as e:
            bad.append(f"row {i + 1}: {e}")
    if bad:
        raise BadSource(f"{flag} {source} ({split}): {len(bad)} of {len(examples)} rows lack an answer "
                        f"ending '#### <number>' ({bad[0]}); fix or remove them")
    return examples


def prepare_gsm8k(out: str | os.PathLike, source: str | os.PathLike = GSM8K_SOURCE,
                  test_source: str | os.PathLike | None = None, *, test_fraction: float = TEST_FRACTION,
                  force: bool = False) -> dict[str, Any]:
    """``out/train.parquet`` and ``out/test.parquet`` from a HF id or GSM8K files (one file: hash-split)."""
    single = Path(source).expanduser().is_file()
    if test_source is not None:
        splits = {"train": load_gsm8k(source, "train"),
                  "test": load_gsm8k(test_source, "test", "--test-source")}
    elif single:
        splits = dict(zip(("train", "test"), split_by_hash(load_gsm8k(source, "train"), test_fraction)))
        for split, rows in splits.items():
            if not rows:
                raise BadSource(f"--source {source}: too few problems to hold some out for {split}; pass the test "
                                f"set with --test-source FILE (or a folder holding train.jsonl and test.jsonl)")
    else:
        splits = {split: load_gsm8k(source, split) for split in ("train", "test")}
    ids = {split: {prompt_id(ex["question"]) for ex in examples} for split, examples in splits.items()}
    overlap = ids["train"] & ids["test"]
    if overlap:
        raise BadSource(f"train and test share {len(overlap)} problem(s): pass disjoint sources (--source for train, "
                        "--test-source for test)")
    claim_data_dir(out, force=force)
    summary: dict[str, Any] = {}
    for split, examples in splits.items():
        rows = gsm8k_rows(examples, split)
        summary[split] = {"rows": len(rows), "path": str(write_rows(rows, Path(out) / f"{split}.parquet"))}
    if single and test_source is None:
        summary["test"]["held_out_of"] = str(source)
    return summary


ARITHMETIC_SOURCE = "rlkit/arithmetic"
"""``data_source`` of the word problems (scored by :func:`rlkit.tasks.arithmetic.compute_score`)."""
ARITHMETIC_FORM = "mixed"
"""The solution form kept as each row's reference ``answer`` (the tiny engine's default form)."""


def arithmetic_rows(problems: Sequence[arithmetic.Problem], split: str) -> list[dict[str, Any]]:
    """Rows of the tiny engine's word problems: its prompt, the integer answer as ground truth."""
    return [make_row(ARITHMETIC_SOURCE, arithmetic.prompt(p), str(p.answer), split, i,
                     p.solution(ARITHMETIC_FORM), p.question) for i, p in enumerate(problems)]


def prepare_arithmetic(out: str | os.PathLike, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
                       force: bool = False, **knobs: Any) -> dict[str, Any]:
    """``out/train.parquet`` and ``out/test.parquet`` of the tiny engine's word problems (``make_split``)."""
    at_least_one(train=n_train, test=n_test)
    splits = {}
    for split, n in (("train", n_train), ("test", n_test)):
        try:
            splits[split] = arithmetic_rows(arithmetic.make_split(n, split, seed, **knobs), split)
        except ValueError as e:  # e.g. fewer distinct problems than asked
            raise InvalidSetting(f"--{split} {n}: {e}") from None
    claim_data_dir(out, force=force)
    return {split: {"rows": len(rows), "path": str(write_rows(rows, Path(out) / f"{split}.parquet"))}
            for split, rows in splits.items()}


def prepare_dapo(out: str | os.PathLike, source: str | os.PathLike = dapo_math.TRAIN_SOURCE,
                 val_source: str | os.PathLike | None = dapo_math.VAL_SOURCE, *, max_train: int | None = None,
                 seed: int = 0, force: bool = False) -> dict[str, Any]:
    """``out/train.parquet`` (DAPO-Math; ``max_train``: a seeded subset) and ``out/aime2024.parquet``."""
    if max_train is not None:
        at_least_one(max_train=max_train)
    train, info = dapo_rows(dapo_math.load(source), "train", "math_dapo")
    if not train:
        raise BadSource(f"--source {source} has no problems")
    claim_data_dir(out, force=force)
    if max_train is not None and max_train < len(train):
        keep = sorted(random.Random(seed).sample(range(len(train)), max_train))
        train = [{**train[i], "extra_info": {**train[i]["extra_info"], "index": j}} for j, i in enumerate(keep)]
        info = {**info, "rows": len(train), "sampled_from": info["rows"]}
    summary = {"train": {**info, "path": str(write_rows(train, Path(out) / DAPO_TRAIN_FILE))}}
    if val_source is not None:
        val, val_info = dapo_rows(dapo_math.load(val_source), "test", "aime_2024")
        summary["val"] = {**val_info, "path": str(write_rows(val, Path(out) / DAPO_VAL_FILE))}
    return summary


def split_subsets(path: str | os.PathLike, out_dir: str | os.PathLike, n_subsets: int = 5) -> list[Path]:
    """``out_dir/subset_{i}.parquet``: ``path``'s rows in ``n_subsets`` contiguous parts (old parts gone)."""
    import pyarrow.parquet as pq

    at_least_one(subsets=n_subsets)
    table = read_table(path)
    if n_subsets > len(table):
        raise InvalidSetting(f"--subsets {n_subsets}: more parts than the {len(table)} rows of {path}; give at most "
                             f"{len(table)}")
    out_dir = Path(out_dir)
    names = [f"subset_{i}.parquet" for i in range(n_subsets)]
    earlier = sorted(p.name for p in out_dir.glob("subset_*.parquet")) if out_dir.is_dir() else []
    marker = claim_dir(out_dir, DATA, writes=[*DATA_FILES, *names, *earlier])
    for name in set(earlier) - set(names) & set(marker.get("files", [])):
        (out_dir / name).unlink()
    bounds = [len(table) * i // n_subsets for i in range(n_subsets + 1)]
    paths = []
    for name, lo, hi in zip(names, bounds, bounds[1:]):
        paths.append(out_dir / name)
        pq.write_table(table.slice(lo, hi - lo), paths[-1])
    record_files(out_dir, DATA, names)
    return paths


def default_scorer(data_source: str, response: str, ground_truth: str, *, format_rule: bool = False) -> float:
    """The training reward: verl's GSM8K rule for ``openai/gsm8k``, else DAPO's math-verify check."""
    if data_source == GSM8K_SOURCE:
        return gsm8k.score(response, ground_truth)
    return dapo_math.score(response, ground_truth, format_rule=format_rule)


def _usable(row: Any) -> tuple[str, str, list, str] | None:
    """``(prompt_id, data_source, chat prompt, ground_truth)`` of a well-formed row, else None."""
    try:
        pid, chat = row["extra_info"]["prompt_id"], list(row["prompt"])
        truth, source = row["reward_model"]["ground_truth"], row["data_source"]
    except (KeyError, TypeError):
        return None
    ok = isinstance(pid, str) and pid and chat and all(isinstance(m, Mapping) and "content" in m for m in chat)
    return (pid, source, chat, str(truth)) if ok and truth is not None else None


def estimate_offline_values(path: str | os.PathLike, out: str | os.PathLike, sampler: Sampler, *,
                            n_samples: int = 8, batch_size: int = 1024,
                            scorer: Scorer = default_scorer) -> dict[str, Any]:
    """Score ``n_samples`` responses per prompt of ``path`` into ``out`` (JSON lines; bad rows skipped)."""
    at_least_one(n=n_samples, batch_size=batch_size)
    rows = read_rows(path)
    usable = [u for u in map(_usable, rows) if u is not None]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for start in range(0, len(usable), batch_size):
            batch = usable[start:start + batch_size]
            responses = sampler([chat for _, _, chat, _ in batch], n_samples)
            if len(responses) != len(batch):
                raise ValueError(f"the sampler returned {len(responses)} response lists for {len(batch)} prompts")
            for (pid, source, _, truth), texts in zip(batch, responses):
                scores = [float(scorer(source, text, truth)) for text in texts]
                f.write(json.dumps({"prompt_id": pid, "data_source": source, "scores": scores}) + "\n")
            f.flush()
    return {"prompts": len(usable), "responses": len(usable) * n_samples, "skipped_rows": len(rows) - len(usable)}


def vllm_sampler(model: str, *, temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 8192,
                 tensor_parallel_size: int = 1, seed: int = 0, **llm_kwargs: Any) -> Sampler:
    """A :data:`Sampler` on vLLM's ``LLM.chat`` (one turn, GPUs; ``llm_kwargs`` go to ``vllm.LLM``)."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, tensor_parallel_size=tensor_parallel_size, seed=seed, **llm_kwargs)

    def sample(prompts: list[list[dict[str, str]]], n: int) -> list[list[str]]:
        params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
        return [[c.text for c in out.outputs] for out in llm.chat(prompts, params, use_tqdm=False)]

    return sample


def _score_list(value: Any) -> list[float] | None:
    ok = isinstance(value, list) and value and all(
        isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in value)
    return [float(s) for s in value] if ok else None


def merge_offline_values(inputs: Iterable[str | os.PathLike], out: str | os.PathLike, *, max_scores: int = 8,
                         pool: Iterable[str] | None = None) -> dict[str, Any]:
    """Merge :func:`estimate_offline_values` files (or folders of ``*.jsonl``) atomically into ``out``,
    ``{prompt_id: [scores]}`` (the first ``max_scores``), counting skipped lines and pool prompts without
    values."""
    at_least_one(max_scores=max_scores)
    files, missing = [], []
    for item in map(Path, inputs):
        if item.is_dir():
            files += sorted(item.glob("*.jsonl"))
        elif item.is_file():
            files.append(item)
        else:
            missing.append(str(item))
    merged: dict[str, list[float]] = {}
    skipped: Counter[str] = Counter()
    for file in files:
        with open(file, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = None
                if not isinstance(record, dict):
                    skipped["not a JSON object"] += 1
                elif not isinstance(record.get("prompt_id"), str) or not record["prompt_id"]:
                    skipped["no prompt_id"] += 1
                elif (scores := _score_list(record.get("scores"))) is None:
                    skipped["scores not a non-empty list of finite numbers"] += 1
                else:
                    merged.setdefault(record["prompt_id"], []).extend(scores)
    if not merged:  # an empty offline_values.json would start every prompt uninformed, silently
        why = [f"{n} {reason}" for reason, n in skipped.items()] + [f"missing: {', '.join(missing)}"] * bool(missing)
        found = f"{len(files)} file(s)" + (f" ({'; '.join(why)})" if why else "")
        raise BadSource(f"--inputs: no usable line of prompt scores in {found}; expected JSON lines "
                        '{"prompt_id": ..., "scores": [...]} from rlkit data spo-estimate')
    summary: dict[str, Any] = {
        "files": len(files), "missing_inputs": missing, "prompts": len(merged),
        "prompts_capped": sum(len(s) > max_scores for s in merged.values()), "skipped_lines": dict(skipped),
    }
    merged = {pid: scores[:max_scores] for pid, scores in merged.items()}
    if pool is not None:
        pool = set(pool)
        summary["pool_without_values"] = len(pool - merged.keys())
        summary["values_outside_pool"] = len(merged.keys() - pool)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out) as f:
        json.dump(merged, f)
    return summary


def load_offline_values(path: str | os.PathLike) -> dict[str, list[float]]:
    """``offline_values.json`` as the ``offline_scores`` of :class:`rlkit.methods.spo.ValueTracker`."""
    with open(path, encoding="utf-8") as f:
        values = json.load(f)
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a JSON object prompt_id → [scores], got {type(values).__name__}")
    return values


def _print(summary: Any) -> int:
    print(json.dumps(summary, indent=2))
    return 0


def _estimate(args: argparse.Namespace) -> int:
    at_least_one(n=args.n, max_tokens=args.max_tokens, tensor_parallel_size=args.tensor_parallel_size)
    read_table(args.input, columns=[])  # a bad --input is named before vLLM loads the model
    sampler = vllm_sampler(args.model, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                           tensor_parallel_size=args.tensor_parallel_size, seed=args.seed)
    scorer = functools.partial(default_scorer, format_rule=args.format_rule)
    return _print(estimate_offline_values(args.input, args.out, sampler, n_samples=args.n, scorer=scorer))


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="verl parquet data (GSM8K, DAPO-Math) and SPO's offline values")
    data = p.add_subparsers(dest="data_command", required=True)
    source_help = "HF dataset id, or a local .jsonl/.parquet file or directory"

    force_help = "write into a non-empty directory rlkit did not write (only its own files are replaced)"
    p = data.add_parser("gsm8k", help="train.parquet + test.parquet in verl's GSM8K schema")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--source", default=GSM8K_SOURCE,
                   help=f"{source_help} (default %(default)s); a single file is split into train and test unless "
                        "--test-source is given")
    p.add_argument("--test-source", default=None, help="a local file of test problems (with a single --source file)")
    p.add_argument("--test-fraction", type=float, default=TEST_FRACTION,
                   help="share of a single --source file held out for test (default %(default)s)")
    p.add_argument("--force", action="store_true", help=force_help)
    p.set_defaults(func=lambda a: _print(prepare_gsm8k(a.out, a.source, a.test_source, test_fraction=a.test_fraction,
                                                       force=a.force)))

    p = data.add_parser("arithmetic", help="train.parquet + test.parquet of the tiny engine's word problems")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--train", type=int, default=2000, help="training problems (default %(default)s)")
    p.add_argument("--test", type=int, default=200, help="held-out problems (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help=force_help)
    p.set_defaults(func=lambda a: _print(prepare_arithmetic(a.out, n_train=a.train, n_test=a.test, seed=a.seed,
                                                            force=a.force)))
    p = data.add_parser("dapo", help=f"{DAPO_TRAIN_FILE} (DAPO-Math-17k) + {DAPO_VAL_FILE} (AIME 2024)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--source", default=dapo_math.TRAIN_SOURCE, help=f"{source_help} (default %(default)s)")
    p.add_argument("--val-source", default=dapo_math.VAL_SOURCE, help=f"{source_help}, or 'none' (default %(default)s)")
    p.add_argument("--max-train", type=int, default=None, help="a seeded random subset of this many problems")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help=force_help)
    p.set_defaults(func=lambda a: _print(prepare_dapo(a.out, a.source, None if a.val_source == "none" else a.val_source,
                                                      max_train=a.max_train, seed=a.seed, force=a.force)))

    p = data.add_parser("spo-split", help="SPO offline values, 1/3: the training parquet in parts")
    p.add_argument("--input", required=True, help="training parquet (rlkit data gsm8k|dapo)")
    p.add_argument("--out", required=True, help="directory for subset_<i>.parquet")
    p.add_argument("--subsets", type=int, default=5, help="number of parts (default %(default)s, SPO's)")
    p.set_defaults(func=lambda a: _print([str(x) for x in split_subsets(a.input, a.out, a.subsets)]))

    p = data.add_parser("spo-estimate", help="SPO offline values, 2/3: sample and score one part (vLLM, GPUs)")
    p.add_argument("--input", required=True, help="a subset_<i>.parquet")
    p.add_argument("--out", required=True, help="JSON-lines output")
    p.add_argument("--model", required=True, help="HF model id or local path")
    p.add_argument("--n", type=int, default=8, help="responses per prompt (default %(default)s, SPO's offline_N)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format-rule", action="store_true", help="score with SPO's format rule (DAPO rows)")
    p.set_defaults(func=_estimate)

    p = data.add_parser("spo-merge", help="SPO offline values, 3/3: merge the parts into offline_values.json")
    p.add_argument("--inputs", nargs="+", required=True, help="spo-estimate outputs, or directories of *.jsonl")
    p.add_argument("--out", required=True, help="offline_values.json path")
    p.add_argument("--max-scores", type=int, default=8, help="scores kept per prompt (default %(default)s)")
    p.add_argument("--pool", default=None, help="training parquet: also count its prompts without values")
    p.set_defaults(func=lambda a: _print(merge_offline_values(
        a.inputs, a.out, max_scores=a.max_scores, pool=None if a.pool is None else prompt_ids(a.pool))))
