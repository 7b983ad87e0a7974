"""Nothing a user owns is lost, and every refusal is a message (issue 22): one writer per run directory, resume
exact or refused, directories rlkit did not write left alone, settings checked before any work, splits that never
overlap, dry runs that check what a launch needs, no temporary files left behind."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlkit import cli, files
from rlkit.errors import CannotResume, DiskFull, NotOurDirectory, PermissionDenied, ResumeMismatch, RunLocked
from rlkit.metrics import read_metrics
from rlkit.tiny.config import build_config
from rlkit.tiny.rl import train

STEPS = 3


def timeless(path):
    return [(r["step"], {k: v for k, v in r["data"].items() if not k.startswith(("timing_s/", "perf/"))})
            for r in read_metrics(path)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("sft-cache")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    """An uninterrupted smoke run."""
    return train(build_config("grpo", "smoke", {"steps": STEPS}), tmp_path_factory.mktemp("ref") / "run",
                 progress=False, sft_cache=cache)


def refused(argv, capsys):
    """Run the CLI expecting a refusal: (exit code, the message it printed)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after any progress the command made
    assert "Traceback" not in err and last.startswith("rlkit "), err
    return info.value.code, err


def train_args(out, cache, *extra):
    return ["train", "--method", "grpo", "--scale", "smoke", "--out", str(out), "--sft-cache", str(cache), *extra]


# ------------------------------------------------------------------------------------------------ one writer
HOLD = textwrap.dedent("""
    import sys, time
    from rlkit.files import TRAINING_RUN, claim_dir, lock_dir
    claim_dir(sys.argv[1], TRAINING_RUN)
    with lock_dir(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(60)
""")


def test_a_second_writer_is_refused_naming_the_first_and_a_killed_ones_lock_is_taken_over(tmp_path, cache, capsys,
                                                                                          reaper):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err = refused(train_args(out, cache, "--set", "steps=1"), capsys)
        assert code == 1 and f"pid {holder.pid}" in err and "another --out" in err
        assert not (out / "metrics.jsonl").exists() and not (out / "config.json").exists()  # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with files.lock_dir(out) as stale:  # the kernel released the killed process's lock
        assert stale["pid"] == holder.pid


def test_two_concurrent_trains_on_one_out_one_runs_one_is_refused(tmp_path, cache, reference, reaper):
    cmd = [sys.executable, "-m", "rlkit.cli", *train_args(tmp_path / "run", cache, "--set", f"steps={STEPS}")]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    assert any("being written by another process" in err for _, err in results)
    assert timeless(tmp_path / "run" / "metrics.jsonl") == timeless(reference / "metrics.jsonl")


# ------------------------------------------------------------------------------------------------ resume
def test_a_torn_checkpointed_line_is_relogged_from_the_checkpoint(tmp_path, cache, reference):
    cfg = build_config("grpo", "smoke", {"steps": STEPS})
    part = train(cfg, tmp_path / "run", progress=False, sft_cache=cache, stop_after=2)
    text = (part / "metrics.jsonl").read_text()
    (part / "metrics.jsonl").write_text(text[: text.rindex('{"step": 2') + 15])  # step 2's line torn
    with pytest.warns(UserWarning, match="truncated"):
        train(cfg, part, progress=False, sft_cache=cache, resume=True)
    assert timeless(part / "metrics.jsonl") == timeless(reference / "metrics.jsonl")  # 0, 1, 2, 3 once each


def test_resume_refusals(tmp_path, cache, capsys):
    out = tmp_path / "run"
    assert cli.main(train_args(out, cache, "--set", "steps=2")) == 0
    # any differing setting, nested ones named
    code, err = refused(train_args(out, cache, "--set", "steps=2", "--set", "grpo.clip_high=0.3", "--resume"), capsys)
    assert code == 2 and "grpo.clip_high" in err
    # config.json edited by hand, resumed with matching flags: the checkpoint knows better
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "lr": 5e-4}))
    code, err = refused(train_args(out, cache, "--set", "steps=2", "--set", "lr=5e-4", "--resume"), capsys)
    assert code == 2 and "lr" in err and "edited" in err
    (out / "config.json").write_text(json.dumps(config))
    # a damaged checkpoint
    good = (out / "checkpoint.pt").read_bytes()
    (out / "checkpoint.pt").write_bytes(good[:100])
    code, err = refused(train_args(out, cache, "--set", "steps=2", "--resume"), capsys)
    assert code == 1 and "checkpoint.pt is damaged" in err
    # a damaged env.json: a resumed run keeps it, so it is refused, named, and left as it is
    (out / "checkpoint.pt").write_bytes(good)
    env = (out / "env.json").read_text()
    (out / "env.json").write_text("{not json")
    code, err = refused(train_args(out, cache, "--set", "steps=2", "--resume"), capsys)
    assert code == 1 and "env.json" in err and "delete the run" in err
    assert (out / "env.json").read_text() == "{not json"
    (out / "env.json").write_text(env)
    # no config.json
    (out / "config.json").unlink()
    code, err = refused(train_args(out, cache, "--set", "steps=2", "--resume"), capsys)
    assert code == 1 and "no config.json" in err
    (out / "config.json").write_text(json.dumps(config))
    # metrics but no checkpoint: refused, metrics untouched
    (out / "checkpoint.pt").unlink()
    before = (out / "metrics.jsonl").read_text()
    code, err = refused(train_args(out, cache, "--set", "steps=2", "--resume"), capsys)
    assert code == 1 and "no checkpoint.pt" in err and (out / "metrics.jsonl").read_text() == before
    # without --resume: refused
    code, err = refused(train_args(out, cache, "--set", "steps=2"), capsys)
    assert code == 2 and "already holds a run" in err


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop=st.integers(1, STEPS - 1), tear=st.floats(0, 1), extra_line=st.booleans())
def test_killed_anywhere_resume_gives_every_step_once_with_the_uninterrupted_values(
        tmp_path_factory, cache, reference, stop, tear, extra_line):
    """A kill after step ``stop``'s checkpoint (``stop_after``), the next step's line possibly half-written
    (``extra_line``: killed between that line and its checkpoint), or the checkpointed step's own line torn."""
    cfg = build_config("grpo", "smoke", {"steps": STEPS})
    run = train(cfg, tmp_path_factory.mktemp("kill") / "run", progress=False, sft_cache=cache, stop_after=stop)
    metrics = run / "metrics.jsonl"
    text = metrics.read_text()
    if extra_line:  # the next step's line, torn at a random point
        line = json.dumps({"step": stop + 1, "data": {"critic/score/mean": -1.0}}) + "\n"
        text += line[: int(tear * len(line))]
    else:  # the checkpointed step's own line, torn at a random point
        start = text.rindex('{"step": ')
        text = text[: start + int(tear * (len(text) - start - 1))]
    metrics.write_text(text)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(cfg, run, progress=False, sft_cache=cache, resume=True)
    assert timeless(metrics) == timeless(reference / "metrics.jsonl")
    assert read_metrics(run / "eval.jsonl") == read_metrics(reference / "eval.jsonl")


# ------------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("sets, named", [
    (["steps=abc"], "steps: expected an integer"), (["steps=1.5"], "steps: expected an integer"),
    (["lr=-1"], "lr must be > 0"), (["grpo.agg=foo"], "grpo.agg"), (["temperature=0"], "temperature must be > 0"),
    (["group_size=1"], "group_size must be ≥ 2"), (["grpo.clip_low=-0.1"], "grpo.clip_low=-0.1: must be ≥ 0"),
    (["max_new_tokens=0"], "max_new_tokens must be > 0"), (["nope=1"], "no field 'nope'"),
    (["seed=5", "--seed", "3"], "disagree"), (["method=gspo"], "disagree"),
])
def test_bad_settings_are_refused_before_any_work(sets, named, tmp_path, cache, capsys):
    argv = train_args(tmp_path / "run", cache)
    for item in sets:
        argv += [item] if item.startswith("--") or item.isdigit() else ["--set", item]
    code, err = refused(argv, capsys)
    assert code == 2 and named in err, err
    assert not (tmp_path / "run").exists()


def test_debug_shows_the_traceback(tmp_path, cache):
    from rlkit.errors import InvalidSetting

    with pytest.raises(InvalidSetting):
        cli.main(["--debug", *train_args(tmp_path / "run", cache, "--set", "lr=-1")])


# ------------------------------------------------------------------------------------------------ directories
def test_train_refuses_a_foreign_directory_unless_forced(tmp_path, cache, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code, err = refused(train_args(out, cache, "--set", "steps=1"), capsys)
    assert code == 2 and "rlkit did not write it" in err and "--force" in err
    assert cli.main(train_args(out, cache, "--set", "steps=1", "--force")) == 0
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".rlkit.json", "notes.txt", "checkpoint.pt", "config.json", "env.json", "eval.jsonl", "metrics.jsonl"])


def test_export_keeps_what_it_did_not_write_and_gets_ordinary_modes(tmp_path, cache, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    args = ["export", "--scale", "smoke", "--set", "sft.d_model=64", "--sft-cache", str(cache), "--out", str(out)]
    code, err = refused(args, capsys)
    assert code == 2 and "rlkit did not write it" in err
    assert cli.main([*args, "--force"]) == 0
    assert cli.main(args) == 0  # its own directory now: exported again in place
    assert (out / "notes.txt").read_text() == "keep me" and (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary or ..old.* siblings
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((out / "config.json").stat().st_mode) == 0o666 & ~mask


def test_book_checks_it_is_a_book_before_touching_anything(tmp_path, capsys):
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / "01_grpo.md").write_text("my notebook")
    code, err = refused(["book", "--book-dir", str(root), "--results", str(tmp_path)], capsys)
    assert code == 2 and "not a Jupyter Book" in err and "_config.yml" in err
    assert (root / "notebooks" / "01_grpo.md").read_text() == "my notebook"


def test_book_stage_refuses_a_notebooks_folder_it_did_not_write(tmp_path, monkeypatch):
    from rlkit.lab import book

    results = tmp_path / "results"
    executed = {"a": results / "a.ipynb"}
    results.mkdir()
    empty = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    executed["a"].write_text(empty)
    monkeypatch.setattr(book, "check_results", lambda *a, **k: executed)
    b = tmp_path / "book"
    (b / "notebooks").mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        (b / name).write_text("")
    (b / "notebooks" / "mine.md").write_text("mine")
    with pytest.raises(NotOurDirectory):
        book.stage(b, results)
    book.stage(b, results, force=True)
    assert (b / "notebooks" / "mine.md").read_text() == "mine" and (b / "notebooks" / "a.ipynb").exists()
    executed["b"] = results / "b.ipynb"
    executed["b"].write_text(empty)
    del executed["a"]
    book.stage(b, results)  # its own notebooks replaced, the user's kept
    assert sorted(p.name for p in (b / "notebooks").iterdir()) == [".rlkit.json", "b.ipynb", "mine.md"]


# ------------------------------------------------------------------------------------------------ data
def _gsm8k_file(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"question": f"what is {i} + {i}?", "answer": f"{i} + {i}\n#### {2 * i}"}) + "\n")
    return path


def test_one_source_file_is_split_without_overlap(tmp_path, capsys):
    pytest.importorskip("pyarrow")
    from rlkit.verl.launch.data import prompt_ids

    src = _gsm8k_file(tmp_path / "all.jsonl", 200)
    for out in ("a", "b"):
        assert cli.main(["data", "gsm8k", "--out", str(tmp_path / out), "--source", str(src)]) == 0
    capsys.readouterr()
    train_ids, test_ids = (set(prompt_ids(tmp_path / "a" / f"{s}.parquet")) for s in ("train", "test"))
    assert not train_ids & test_ids and len(train_ids) + len(test_ids) == 200 and 5 < len(test_ids) < 40
    assert prompt_ids(tmp_path / "a" / "test.parquet") == prompt_ids(tmp_path / "b" / "test.parquet")  # deterministic


@pytest.mark.parametrize("name, text, named", [
    ("missing.jsonl", None, "no such file"), ("empty.jsonl", "", "has no train problems"),
    ("bad.jsonl", '{"question": "q"}\n', "question"), ("junk.jsonl", "not json\n", "junk.jsonl"),
])
def test_bad_sources_are_refused_with_a_message(name, text, named, tmp_path, capsys):
    if text is not None:
        (tmp_path / name).write_text(text)
    code, err = refused(["data", "gsm8k", "--out", str(tmp_path / "out"), "--source", str(tmp_path / name)], capsys)
    assert code == 2 and named in err, err
    assert not (tmp_path / "out").exists()


def test_data_refuses_a_foreign_directory(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    code, err = refused(["data", "arithmetic", "--out", str(out), "--train", "4", "--test", "2"], capsys)
    assert code == 2 and "rlkit did not write it" in err


# ------------------------------------------------------------------------------------------------ launch --dry-run
@pytest.mark.parametrize("extra, named", [
    (["--nodes", "4"], "needs --ray-address"),
    (["--model", "{model_no_weights}"], "no weights"),
    (["--model", "{model_bad_config}"], "config.json is not valid JSON"),
    (["--data", "{tmp}/nowhere"], "train.parquet not found"),
])
def test_dry_run_checks_what_a_launch_needs(extra, named, tmp_path, capsys, monkeypatch):
    pytest.importorskip("hydra")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, config in (("model_no_weights", "{}"), ("model_bad_config", "{")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(config)
        (tmp_path / name / "model.safetensors").write_bytes(b"") if name == "model_bad_config" else None
    extra = [e.format(tmp=tmp_path, model_no_weights=tmp_path / "model_no_weights",
                      model_bad_config=tmp_path / "model_bad_config") for e in extra]
    argv = ["launch", "--method", "grpo", "--dataset", "gsm8k", "--gpus", "2", "--dry-run"]
    if "--model" not in extra:
        argv += ["--model", "Qwen/Qwen2.5-0.5B-Instruct"]
    code, err = refused([*argv, *extra], capsys)
    assert code == 2 and named in err, err


# ------------------------------------------------------------------------------------------------ files
def test_atomic_write_leaves_nothing_on_failure_and_names_a_full_disk(tmp_path, monkeypatch):
    target = tmp_path / "config.json"
    with pytest.raises(RuntimeError):
        with files.atomic_write(target) as f:
            f.write("half")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFull, match="no space left"):
        files.write_text(target, "{}")
    assert list(tmp_path.iterdir()) == []


def test_disk_full_and_permission_errors_are_named_at_the_cli(tmp_path, cache, capsys, monkeypatch):
    from rlkit.tiny import rl

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "checkpoint.pt"))

    monkeypatch.setattr(rl, "save_checkpoint", full)
    code, err = refused(train_args(tmp_path / "run", cache, "--set", "steps=1"), capsys)
    assert code == 1 and "no space left" in err and "--resume" in err
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "run").iterdir())
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o500)
        code, err = refused(train_args(locked / "run", cache, "--set", "steps=1"), capsys)
        assert code == 1 and "permission denied" in err
    assert issubclass(PermissionDenied, PermissionError) and issubclass(RunLocked, Exception)
    assert issubclass(CannotResume, Exception) and issubclass(ResumeMismatch, ValueError)


@pytest.mark.parametrize("argv, named", [
    (["plot", "nowhere/run", "--metric", "val/acc", "--out", "x.png"], "nowhere/run"),
    (["reproduced", "--results", "nowhere", "--published", "."], "nowhere is not a results folder"),
    (["reproduce", "--only", "nosuch"], "nosuch"),
])
def test_the_other_commands_refuse_with_a_usage_message(argv, named, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = refused(argv, capsys)
    assert code == 2 and named in err, err
