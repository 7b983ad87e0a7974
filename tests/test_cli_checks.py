"""Every value checked before any work, and long work announced (issue 33, items 4 and 5): settings that depend on
each other, the environment variables rlkit reads, a run's damaged files on --resume and Ctrl-C each end in one
line (exit 2 usage, 1 run time, 130 interrupted), before any SFT or RL step; a command about to train for minutes
says what and roughly how long, with a progress bar."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import default_sigint
from rlkit import cli
from rlkit.tiny import rl, sft
from rlkit.tiny.config import build_config


class WorkStarted(AssertionError):
    """Raised by the patched SFT and RL trainers: a check came after the work it guards."""


@pytest.fixture
def no_work(monkeypatch):
    """The SFT trainer and the SFT start's loading (which every RL step comes after) fail the test if reached."""
    def refuse(*args, **kwargs):
        raise WorkStarted("work started before the refusal")

    monkeypatch.setattr(sft, "train", refuse)
    monkeypatch.setattr(rl, "warm_start", refuse)


def refused(argv, capsys) -> tuple[int, str]:
    """The CLI's exit code and its stderr's one line (asserted to be one, no traceback)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlkit ") and "Traceback" not in err, err
    return info.value.code, lines[0]


def train_args(out: Path, *extra: str) -> list[str]:
    return ["train", "--method", "grpo", "--scale", "smoke", "--out", str(out), *extra]


# ------------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("setting, named", [
    ("sft.d_model=33", "sft.d_model=33"),  # 33 does not split into heads of even width
    ("sft.n_heads=3", "sft.n_heads=3"),  # 3 does not divide the smoke width 32
    ("sft.n_kv_heads=3", "sft.n_kv_heads=3"),
    ("sft.max_len=4", "sft.max_len=4"),  # not even the longest prompt fits
    ("max_new_tokens=100000", "max_new_tokens=100000"),  # the budget against the model's context
    ("steps=99999999999999999999", "steps=99999999999999999999"),  # past 64 bits
    ("seed=-99999999999999999999", "seed=-99999999999999999999"),
    ("sft.task.templates=bogus", "sft.task.templates"),
])
def test_settings_that_depend_on_others_are_refused_before_any_work(setting, named, tmp_path, capsys, no_work):
    code, line = refused(train_args(tmp_path / "run", "--sft-cache", str(tmp_path / "cache"), "--set", setting),
                         capsys)
    assert code == 2 and named in line, line
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_export_checks_the_model_shape_before_any_work(tmp_path, capsys, no_work):
    code, line = refused(["export", "--scale", "smoke", "--out", str(tmp_path / "model"), "--sft-cache",
                          str(tmp_path / "cache"), "--set", "sft.n_heads=3"], capsys)
    assert code == 2 and "sft.n_heads=3" in line and not (tmp_path / "model").exists()


def test_a_context_that_just_fits_is_accepted():
    from rlkit.tiny.config import longest_prompt_tokens

    cfg = build_config("grpo", "smoke")
    room = cfg.sft.max_len - longest_prompt_tokens()
    assert build_config("grpo", "smoke", {"max_new_tokens": room}).max_new_tokens == room
    with pytest.raises(ValueError, match="max_new_tokens"):
        build_config("grpo", "smoke", {"max_new_tokens": room + 1})


@pytest.mark.parametrize("value, templates", [
    ("shopping", ("shopping",)), ("shopping,ages", ("shopping", "ages")), ('["ages"]', ("ages",)),
])
def test_templates_are_read_as_names_not_letters(value, templates):
    assert build_config("grpo", "smoke", {"sft.task.templates": value}).sft.task.templates == templates


# ------------------------------------------------------------------------------------------------ environment
@pytest.mark.parametrize("name, value", [
    ("RLKIT_NUMERICS", "bogus"), ("RLKIT_RETRAIN_SFT", "maybe"),
    ("RLKIT_VLLM_KEEP_WEIGHTS", "2"), ("RLKIT_CACHE", "{file}"), ("RLKIT_CACHE", "{file}/sub"),
])
def test_environment_variables_are_checked_before_any_work(name, value, tmp_path, capsys, monkeypatch, no_work):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv(name, value.format(file=tmp_path / "file"))
    code, line = refused(train_args(tmp_path / "run"), capsys)
    assert code == 2 and f"{name}=" in line, line
    assert not (tmp_path / "run").exists()


def test_an_unknown_numerics_mode_is_one_line_not_an_import_traceback():
    env = {**os.environ, "RLKIT_NUMERICS": "bogus"}  # read when rlkit is imported: a process of its own
    done = subprocess.run([sys.executable, "-m", "rlkit.cli", "methods"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "rlkit methods: RLKIT_NUMERICS=bogus: valid values are pinned, compatible, native (or unset it)"], done.stderr


def test_help_needs_no_valid_environment(capsys, monkeypatch):
    monkeypatch.setenv("RLKIT_NUMERICS", "bogus")
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0 and "usage: rlkit" in capsys.readouterr().out


def test_an_empty_cache_variable_is_the_default_cache_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RLKIT_CACHE", raising=False)
    default = sft.default_cache_dir()
    monkeypatch.setenv("RLKIT_CACHE", "")
    assert sft.default_cache_dir() == default == tmp_path / ".cache" / "rlkit" / "sft"


def test_an_unwritable_cache_is_refused_before_the_sft_trains(tmp_path, capsys, monkeypatch, no_work):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    if os.access(cache, os.W_OK):  # root writes anyway: refuse the write probe as the file system would
        import rlkit.files

        def read_only(*args, **kwargs):
            raise PermissionError(errno.EROFS, "Read-only file system")

        monkeypatch.setattr(rlkit.files.tempfile, "mkstemp", read_only)  # the probe of rlkit.files.try_write
    monkeypatch.setenv("RLKIT_CACHE", str(cache))
    try:
        code, line = refused(train_args(tmp_path / "run"), capsys)  # smoke: no shipped start, trained into the cache
    finally:
        cache.chmod(0o755)
    assert code == 2 and f"RLKIT_CACHE={cache}: cannot write" in line, line
    assert not (tmp_path / "run").exists() and not list(cache.rglob("*.pt"))


def test_a_wrong_project_variable_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RLKIT_PROJECT", str(tmp_path / "nowhere"))
    code, line = refused(["reproduced"], capsys)
    assert code == 2 and "RLKIT_PROJECT=" in line, line


# ------------------------------------------------------------------------------------------------ --resume
SMALL = {"steps": "1", "prompts_per_step": "2", "final_eval_size": "8"}
"""A finished run as small as the smoke scale allows."""


def resume_args(run: Path, cache: Path) -> list[str]:
    return train_args(run, "--sft-cache", str(cache), "--resume", *(a for k, v in SMALL.items()
                                                                    for a in ("--set", f"{k}={v}")))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-step smoke run and its SFT cache."""
    cache = tmp_path_factory.mktemp("sft-cache")
    cfg = build_config("grpo", "smoke", SMALL)
    return rl.train(cfg, tmp_path_factory.mktemp("run") / "run", progress=False, sft_cache=cache), cache


def _damage(run: Path, how: str) -> None:
    if how == "garbage eval line":
        with (run / "eval.jsonl").open("a") as f:
            f.write("garbage\n")
    elif how == "duplicated metrics line":
        lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
        (run / "metrics.jsonl").write_text("".join(lines + lines[-1:]))
    elif how == "config.json holding []":
        (run / "config.json").write_text("[]")


@pytest.mark.parametrize("how, named", [
    ("garbage eval line", "eval.jsonl:2: not a JSON line"),
    ("duplicated metrics line", "metrics.jsonl holds step 1 twice"),
    ("config.json holding []", "config.json holds a JSON array, not an object: the run's settings are unreadable"),
])
def test_damaged_run_files_are_named_on_resume_before_any_work(how, named, finished, tmp_path, capsys, no_work):
    src, cache = finished
    run = tmp_path / "run"
    shutil.copytree(src, run)
    _damage(run, how)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    code, line = refused(resume_args(run, cache), capsys)
    assert code == 1 and named in line, line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_torn_line_is_one_readable_warning(finished, tmp_path, capsys):
    src, cache = finished
    run = tmp_path / "run"
    shutil.copytree(src, run)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "da')  # a torn line past the run's end: read twice on resume (checked, then truncated)
    capsys.readouterr()
    assert cli.main(resume_args(run, cache)) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "truncated" in line]
    assert warned == [f"rlkit train: warning: {run / 'metrics.jsonl'}: ignoring a truncated last line"], err
    assert "UserWarning" not in err


# ------------------------------------------------------------------------------------------------ long work
@pytest.mark.parametrize("argv, announced", [
    (["start", "--scale", "gpu"], "training 1,500 steps on this machine (rlkit ships no start for this SFT config), "
                                  "about 85 min"),
    (["start", "--retrain-sft"], "training 1,000 steps on this machine (--retrain-sft), about 16 min"),
])
def test_long_training_is_announced_with_its_length_and_a_progress_bar(argv, announced, tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path))
    monkeypatch.setenv("RLKIT_RETRAIN_SFT", "0")  # --retrain-sft sets it for the process: restored afterwards
    calls = []

    def record(cfg, **kwargs):
        calls.append((cfg.steps, kwargs))
        raise KeyboardInterrupt  # as a Ctrl-C during the training

    monkeypatch.setattr(sft, "train", record)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 130 and len(err) == 2, err
    assert announced in err[0] and err[1] == "rlkit start: interrupted (Ctrl-C)"
    assert calls == [(int(announced.split()[1].replace(",", "")), {"device": "cpu", "progress": True})]


def test_a_minutes_long_rl_stage_is_announced_above_its_progress_bar(tmp_path, capsys, monkeypatch):
    """``rlkit train`` at cpu scale (the shipped SFT start: nothing else to announce), stopped at its first step."""
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))

    def interrupted(run, state):
        raise KeyboardInterrupt

    monkeypatch.setattr(rl, "rl_step", interrupted)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "--method", "grpo", "--out", str(tmp_path / "run")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 130, err
    assert err[0] == ("RL: 20 steps of 128 responses, about 1 min on one CPU thread (progress below; Ctrl-C stops it, "
                      "--resume continues it)"), err
    assert any(line.startswith("grpo seed 0:") for line in err[1:-1]), err  # the bar
    assert err[-1].startswith("rlkit train: interrupted (Ctrl-C)"), err


def test_a_short_run_is_not_announced(tmp_path, capsys):
    from rlkit.tiny.config import estimated_minutes

    cfg = build_config("grpo", "smoke", {"sft.steps": 1})
    assert estimated_minutes(cfg) < 1
    rl.train(cfg, tmp_path / "run", sft_cache=tmp_path / "cache")
    assert "RL:" not in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ Ctrl-C
def test_ctrl_c_inside_training_is_one_line_and_exit_130(tmp_path):
    """SIGINT to a real ``rlkit train`` once its SFT has taken a step (its progress bar shows a loss)."""
    argv = [sys.executable, "-m", "rlkit.cli", *train_args(tmp_path / "run", "--sft-cache", str(tmp_path / "cache"),
                                                           "--set", "sft.steps=100000")]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    try:
        err, deadline = b"", time.monotonic() + 120
        os.set_blocking(proc.stderr.fileno(), False)
        while b"loss=" not in err:  # tqdm's postfix after the first SFT step: provably inside the training
            assert proc.poll() is None and time.monotonic() < deadline, err.decode()
            err += proc.stderr.read() or b""
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        os.set_blocking(proc.stderr.fileno(), True)
        err += proc.communicate(timeout=60)[1]  # a process that goes on fails the test, never hangs it
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode()
    lines = [part.split("\r")[-1].strip() for part in text.split("\n")]  # a progress bar redraws with \r
    lines = [line for line in lines if line]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert lines[0].startswith("SFT start: training 100,000 steps") and "h on one CPU thread" in lines[0], lines
    assert lines[-1] == ("rlkit train: interrupted (Ctrl-C): rlkit train --resume continues the run from its last "
                         "finished step"), lines
    assert sum("interrupted" in line for line in lines) == 1, lines
    assert not list((tmp_path / "cache").glob("sft-*.pt"))  # no start cached from an interrupted training
