"""Every bad value given to ``rlkit plot``, ``rlkit data`` and ``rlkit launch`` is refused before any work, in one
line naming it, with exit 2, and nothing is written where the command refuses (issue 33, items 4 and 6). The
launch cases run with ``--dry-run`` and are refused before verl's config is composed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit import cli
from rlkit.errors import ConflictingOptions
from rlkit.lab.runs import first_seed
from rlkit.tasks import arithmetic, gsm8k


def refused(argv, capsys, *, quiet=True):
    """Run the CLI expecting a refusal: (exit code, its one-line message); ``quiet``: nothing on stdout (else
    the report a command prints before refusing is let through)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith(f"rlkit {argv[0]}: "), captured.err
    assert not captured.out or not quiet, captured.out
    return info.value.code, err


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def parquet(path: Path, n: int) -> Path:
    """``n`` of the word problems as rows of ``rlkit data`` (written without ``rlkit data``'s directory claim)."""
    from rlkit.verl.launch import data

    return data.write_rows(data.arithmetic_rows(arithmetic.make_split(n, "train"), "train"), path)


# ------------------------------------------------------------------------------------------------ plot
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "data": {"val/acc": i / 4}}) + "\n"
                                               for i in (1, 2, 3)))
    return run


@pytest.mark.parametrize("out, named", [
    ("x.txt", ".txt is not an image format"),
    ("pdir", "pdir is a directory"),
    ("afile/curves.png", "afile is a file"),
])
def test_plot_refuses_an_out_it_cannot_write(out, named, tmp_path, capsys):
    run = run_dir(tmp_path)
    (tmp_path / "pdir").mkdir()
    (tmp_path / "afile").write_text("mine")
    before = tree(tmp_path)
    code, err = refused(["plot", str(run), "--metric", "val/acc", "--out", str(tmp_path / out)], capsys)
    assert code == 2 and named in err, err
    assert tree(tmp_path) == before


def test_plot_out_without_a_suffix_writes_and_prints_the_png(tmp_path, capsys):
    assert cli.main(["plot", str(run_dir(tmp_path)), "--metric", "val/acc", "--out", str(tmp_path / "fig")]) == 0
    assert capsys.readouterr().out.strip() == f"figure: {tmp_path / 'fig.png'}"
    assert (tmp_path / "fig.png").stat().st_size > 1000 and not (tmp_path / "fig").exists()


# ------------------------------------------------------------------------------------------------ data
@pytest.mark.parametrize("argv, named", [
    (["data", "arithmetic", "--test", "-1"], "--test -1"),
    (["data", "arithmetic", "--train", "0"], "--train 0"),
    (["data", "dapo", "--max-train", "0"], "--max-train 0"),
    (["data", "spo-split", "--input", "{rows}", "--subsets", "0"], "--subsets 0"),
    (["data", "spo-estimate", "--input", "{rows}", "--model", "m", "--n", "0"], "--n 0"),
    (["data", "spo-merge", "--inputs", "{lines}", "--max-scores", "0"], "--max-scores 0"),
])
def test_data_counts_below_one_are_refused(argv, named, tmp_path, capsys):
    rows = parquet(tmp_path / "rows.parquet", 4)
    (tmp_path / "lines.jsonl").write_text(json.dumps({"prompt_id": "p", "scores": [1.0]}) + "\n")
    argv = [a.format(rows=rows, lines=tmp_path / "lines.jsonl") for a in argv]
    code, err = refused([*argv, "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and named in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, content, named", [
    ("notes.txt", "not parquet", "not a parquet file"),
    ("absent.parquet", None, "no such file"),
    ("folder", "dir", "a directory"),
])
def test_spo_split_refuses_an_input_that_is_not_parquet(name, content, named, tmp_path, capsys):
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    code, err = refused(["data", "spo-split", "--input", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and f"--input {path}: {named}" in err, err
    assert not (tmp_path / "out").exists()


def test_spo_merge_refuses_a_pool_that_is_not_parquet(tmp_path, capsys):
    (tmp_path / "part.jsonl").write_text(json.dumps({"prompt_id": "p", "scores": [1.0]}) + "\n")
    (tmp_path / "pool.txt").write_text("not parquet")
    code, err = refused(["data", "spo-merge", "--inputs", str(tmp_path / "part.jsonl"), "--pool",
                         str(tmp_path / "pool.txt"), "--out", str(tmp_path / "values.json")], capsys)
    assert code == 2 and f"--pool {tmp_path / 'pool.txt'}: not a parquet file" in err, err
    assert not (tmp_path / "values.json").exists()


def test_spo_split_refuses_more_subsets_than_rows(tmp_path, capsys):
    rows = parquet(tmp_path / "rows.parquet", 7)
    code, err = refused(["data", "spo-split", "--input", str(rows), "--out", str(tmp_path / "out"),
                         "--subsets", "100000"], capsys)
    assert code == 2 and "--subsets 100000" in err and "7 rows" in err, err
    assert not (tmp_path / "out").exists()
    assert cli.main(["data", "spo-split", "--input", str(rows), "--out", str(tmp_path / "out"), "--subsets", "7"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 7 == len(list((tmp_path / "out").glob("subset_*.parquet")))


def test_spo_split_writes_only_a_data_folder_and_leaves_one_split_in_it(tmp_path, capsys):
    """The folder is claimed as a data folder: another kind, or a folder rlkit did not write, is refused untouched;
    a second split into fewer parts removes the first one's extra parts (its own files only)."""
    rows = parquet(tmp_path / "rows.parquet", 7)
    out = tmp_path / "out"
    assert cli.main(["data", "spo-split", "--input", str(rows), "--out", str(out), "--subsets", "5"]) == 0
    (out / "notes.txt").write_text("mine")  # the user's own file beside the parts
    assert cli.main(["data", "spo-split", "--input", str(rows), "--out", str(out), "--subsets", "3"]) == 0
    assert sorted(p.name for p in out.glob("subset_*")) == [f"subset_{i}.parquet" for i in range(3)]
    assert (out / "notes.txt").read_text() == "mine"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "report.pdf").write_text("someone's")
    code, err = refused(["data", "spo-split", "--input", str(rows), "--out", str(foreign)], capsys)
    assert code == 2 and "did not write it" in err, err
    assert tree(foreign) == ["report.pdf"]
    run = tmp_path / "run"
    from rlkit.files import TRAINING_RUN, claim_dir

    claim_dir(run, TRAINING_RUN)
    before = tree(run)
    code, err = refused(["data", "spo-split", "--input", str(rows), "--out", str(run)], capsys)
    assert code == 2 and "training run" in err, err
    assert tree(run) == before


def test_spo_merge_of_only_unusable_lines_is_refused_naming_them(tmp_path, capsys):
    lines = tmp_path / "part.jsonl"
    lines.write_text('["not", "an", "object"]\n{"scores": [1.0]}\n{"prompt_id": "p", "scores": []}\n')
    out = tmp_path / "offline_values.json"
    code, err = refused(["data", "spo-merge", "--inputs", str(lines), str(tmp_path / "gone.jsonl"), "--out",
                         str(out)], capsys)
    assert code == 2 and "no usable line" in err, err
    for reason in ("1 not a JSON object", "1 no prompt_id", "1 scores not a non-empty list", "gone.jsonl"):
        assert reason in err, (reason, err)
    assert tree(tmp_path) == ["part.jsonl"]


def test_gsm8k_refuses_an_answer_that_is_not_a_number(tmp_path, capsys):
    source = tmp_path / "gsm8k.jsonl"
    answers = ["2 + 2\n#### 4", "two\n#### abc", "a lot\n#### 1,000"]
    source.write_text("".join(json.dumps({"question": f"q{i}", "answer": a}) + "\n" for i, a in enumerate(answers)))
    code, err = refused(["data", "gsm8k", "--source", str(source), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "1 of 3 rows" in err and "row 2" in err and "'abc'" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("answer, gold", [("#### 4", "4"), ("x\n#### 1,000", "1000"), ("#### -3.5", "-3.5"),
                                          ("#### abc", None), ("#### ", None), ("#### 1.2.3", None),
                                          ("#### NaN", None), ("no marker", None)])
def test_gold_answer_is_a_number_or_refused(answer, gold):
    if gold is None:
        with pytest.raises(ValueError):
            gsm8k.gold_answer(answer)
    else:
        assert gsm8k.gold_answer(answer) == gold and gsm8k.score(answer, gold) == 1.0


# ------------------------------------------------------------------------------------------------ launch
GPU_LAUNCH = ["launch", "--method", "grpo", "--dataset", "gsm8k", "--gpus", "2", "--model",
              "Qwen/Qwen2.5-0.5B-Instruct", "--dry-run"]


@pytest.mark.parametrize("extra, named", [
    (["--nodes", "0"], "--nodes 0: must be ≥ 1"),
    (["--gpus", "0"], "--gpus 0: must be ≥ 1"),
    (["--steps", "-2"], "--steps -2: must be ≥ 1"),
    (["--timeout", "0"], "--timeout 0.0: give the seconds"),
    (["--experiment", "../../escape"], "--experiment ../../escape: the run directory would not lie inside"),
    (["--experiment", "/tmp/elsewhere"], "--experiment /tmp/elsewhere: the run directory would not lie inside"),
    (["--data", "{file}"], "--data {file} is a file"),
    (["--steps", "3", "--", "trainer.total_training_steps=5"],
     "--steps 3 and trainer.total_training_steps=5 disagree"),
    (["--steps", "3", "--", "~trainer.total_training_steps"], "--steps 3 and ~trainer.total_training_steps disagree"),
    (["--gpus", "4", "--", "trainer.n_gpus_per_node=8"], "--gpus 4 and trainer.n_gpus_per_node=8 disagree"),
    (["--experiment", "a", "--", "trainer.experiment_name=b"], "--experiment a and trainer.experiment_name=b"),
])
def test_launch_refuses_bad_flags_before_any_work(extra, named, tmp_path, capsys):
    (tmp_path / "data.parquet").write_text("a file, not rlkit data's directory")
    extra = [e.format(file=tmp_path / "data.parquet") for e in extra]
    code, err = refused([*GPU_LAUNCH, "--runs-dir", str(tmp_path / "runs"), *extra], capsys)
    assert code == 2 and named.format(file=tmp_path / "data.parquet") in err, err
    assert tree(tmp_path) == ["data.parquet"]


def test_launch_on_cpu_refuses_zero_nodes_and_a_steps_conflict_with_the_tiny_run(tmp_path, capsys):
    cpu = ["launch", "--method", "grpo", "--device", "cpu", "--runs-dir", str(tmp_path / "runs"), "--dry-run"]
    code, err = refused([*cpu, "--nodes", "0"], capsys)
    assert code == 2 and "--nodes 0" in err, err
    code, err = refused([*cpu, "--tiny-scale", "smoke", "--set", "steps=20", "--steps", "3"], capsys)
    assert code == 2 and "--steps 3 and --set steps=20 disagree" in err, err
    assert list(tmp_path.iterdir()) == []


def test_launch_flags_and_overrides_that_agree_are_taken():
    from rlkit.verl.launch import plan, refuse_conflicts

    refuse_conflicts(["trainer.total_training_steps=5", "+trainer.nnodes='2'", "trainer.save_freq=3"], steps=5,
                     nodes=2, gpus=None, experiment="x")
    with pytest.raises(ConflictingOptions, match="--nodes 2 and trainer.nnodes=1 disagree"):
        refuse_conflicts(["trainer.nnodes=1"], nodes=2)
    p = plan("grpo", "gsm8k", "Qwen/Qwen2.5-0.5B-Instruct", gpus=2, experiment="grpo/seed0", runs_dir="runs",
             steps=5, extra=["trainer.total_training_steps=5"])
    assert p.run_dir == "runs/grpo/seed0" and "trainer.total_training_steps=5" in p.overrides


# ------------------------------------------------------------------------------------------------ issue 49
# Every failure one line (no traceback without --debug), no hang, no damaged input passed as good: each case
# asserts the one line, its exit code, and that nothing was changed where the command refused.
PUBLISHED = Path(__file__).parent.parent / "reproductions" / "results-cpu"


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_that_does_not_answer_is_refused_at_once(tmp_path, capsys, monkeypatch):
    import time

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    results = tmp_path / "R"
    t0 = time.monotonic()
    code, err = refused(["reproduce", "--scale", "smoke", "--only", "grpo", "--results", str(results),
                         "--ray-address", f"127.0.0.1:{closed_port()}"], capsys)
    assert code == 1 and "nothing accepts a connection at 127.0.0.1:" in err and "ray status" in err, err
    assert time.monotonic() - t0 < 30 and not results.exists()


def test_a_port_that_answers_but_is_not_ray_is_refused_within_the_probe(tmp_path, monkeypatch):
    import socket

    from rlkit.errors import RunError
    from rlkit.lab.cluster import probe

    with socket.socket() as server:  # accepts, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with pytest.raises(RunError, match="does not answer as Ray does"):
            probe(f"127.0.0.1:{server.getsockname()[1]}", timeout=1)


@pytest.mark.parametrize("address, named", [
    ("localhost:99999", "'99999' is not a port"),
    ("127.0.0.1:0", "'0' is not a port"),
    ("127.0.0.1", "it names no port"),
    ("http://127.0.0.1:6379", "a Ray address is HOST:PORT"),
])
def test_a_ray_address_that_is_none_is_refused_before_anything_runs(address, named, tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code, err = refused(["reproduce", "--only", "grpo", "--results", str(tmp_path / "R"), "--ray-address",
                         address], capsys)
    assert code == 2 and f"--ray-address {address}: {named}" in err, err
    monkeypatch.setenv("RAY_ADDRESS", address)
    code, err = refused(["reproduce", "--only", "grpo", "--results", str(tmp_path / "R")], capsys)
    assert code == 2 and f"RAY_ADDRESS={address}: {named}" in err, err
    assert list(tmp_path.iterdir()) == []


def test_workers_below_one_are_refused_before_the_banner_and_above_the_cpus_cut_to_them(tmp_path, capsys,
                                                                                         monkeypatch):
    import rlkit.lab.reproduce as reproduce

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    results = str(tmp_path / "R")
    code, err = refused(["reproduce", "--only", "grpo", "--results", results, "--workers", "0"], capsys)
    assert code == 2 and "--workers 0: must be" in err, err
    monkeypatch.setattr(reproduce.os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.warns(UserWarning, match="--workers 1000 is more than the 2 CPUs"):
        assert reproduce.usable_workers(1000) == 2
    assert reproduce.usable_workers(2) == 2
    seen = {}
    monkeypatch.setattr(reproduce, "reproduce", lambda **kw: seen.update(kw) or {"notebooks": [],
                                                                                "minutes": {}})
    assert cli.main(["reproduce", "--only", "grpo", "--results", results, "--workers", "1000"]) == 0
    err = capsys.readouterr().err
    assert "warning: --workers 1000 is more than the 2 CPUs" in err, err


@pytest.mark.parametrize("argv", [
    ["train", "--method", "grpo", "--scale", "smoke", "--out", "{file}/sub"],
    ["export", "--out", "{file}/sub"],
    ["data", "arithmetic", "--out", "{file}/sub", "--train", "3", "--test", "2"],
    ["data", "gsm8k", "--out", "{file}/sub", "--source", "{gsm8k}", "--test-source", "{gsm8k_test}"],
    ["plot", "{run}", "--metric", "val/acc", "--out", "{file}/sub/x.png"],
])
def test_a_path_under_a_file_is_one_line(argv, tmp_path, tmp_path_factory, capsys, monkeypatch):
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path_factory.mktemp("cache")))  # made before the run is refused
    (tmp_path / "afile").write_text("mine")
    gsm8k_files(tmp_path)
    run = run_dir(tmp_path)
    before = tree(tmp_path)
    names = {"file": tmp_path / "afile", "run": run, "gsm8k": tmp_path / "g.jsonl",
             "gsm8k_test": tmp_path / "t.jsonl"}
    argv = [a.format(**names) for a in argv]
    code, err = refused(argv, capsys)
    assert code == 2 and f"{tmp_path / 'afile'} is a file" in err, err
    assert tree(tmp_path) == before


def gsm8k_files(folder: Path) -> None:
    (folder / "g.jsonl").write_text("".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) + "\n"
                                            for i in range(3)))
    (folder / "t.jsonl").write_text(json.dumps({"question": "t", "answer": "#### 1"}) + "\n")


@pytest.mark.parametrize("make, named, commands", [
    (lambda tmp: tmp / ("a" * 300) / "out", "a name in the path is too long", ("data", "plot")),
    (lambda tmp: (tmp / "loop").symlink_to(tmp / "loop") or tmp / "loop" / "out",
     "loops through symbolic links", ("data",)),
])
def test_a_path_the_file_system_refuses_is_one_line(make, named, commands, tmp_path, capsys):
    out = make(tmp_path)
    before = tree(tmp_path)
    argvs = {"data": ["data", "arithmetic", "--out", str(out), "--train", "3", "--test", "2"],
             "plot": ["plot", str(out), "--metric", "val/acc", "--out", str(tmp_path / "x.png")]}
    for command in commands:
        code, err = refused(argvs[command], capsys)
        assert code == 2 and named in err and len(err) < 400, err
    assert tree(tmp_path) == before


def test_every_os_error_is_a_refusal_naming_its_path():
    import errno

    from rlkit.errors import BadPath, RunError, from_os_error

    for number in (errno.ENOTDIR, errno.ENOENT, errno.ENAMETOOLONG, errno.ELOOP, errno.EISDIR):
        found = from_os_error(OSError(number, "system's words", "/some/path"))
        assert isinstance(found, BadPath) and found.exit_code == 2 and "/some/path" in str(found)
    other = from_os_error(OSError(errno.EIO, "Input/output error", "/dev/x"))
    assert type(other) is RunError and str(other) == "Input/output error (/dev/x)"
    assert "\n" not in str(from_os_error(OSError(errno.ENOENT, "x", "a\nb")))


def test_data_without_the_network_says_it_needs_it_or_a_local_source(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for argv in (["gsm8k"], ["dapo"]):
        command = [sys.executable, "-m", "rlkit.cli", "data", *argv, "--out", str(tmp_path / "o")]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        err = done.stderr.strip()
        assert done.returncode == 1 and "\n" not in err, err
        assert "needs the network" in err and "--source" in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_missing_test_source_is_named_as_such_and_a_bad_json_line_by_its_number(tmp_path, capsys):
    gsm8k_files(tmp_path)
    code, err = refused(["data", "gsm8k", "--out", str(tmp_path / "o"), "--source", str(tmp_path / "g.jsonl"),
                         "--test-source", str(tmp_path / "absent.jsonl")], capsys)
    assert code == 2 and f"--test-source {tmp_path / 'absent.jsonl'}: no such file" in err, err
    (tmp_path / "bad.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n\n\nnot json\n')
    code, err = refused(["data", "gsm8k", "--out", str(tmp_path / "o"), "--source",
                         str(tmp_path / "bad.jsonl")], capsys)
    assert code == 2 and "bad.jsonl line 4 is not JSON" in err, err
    assert not (tmp_path / "o").exists()


def test_generated_data_has_an_upper_bound(tmp_path, capsys):
    code, err = refused(["data", "arithmetic", "--out", str(tmp_path / "o"), "--train",
                         "99999999999999999999"], capsys)
    assert code == 2 and "--train 99999999999999999999: at most 1,000,000" in err, err
    assert not (tmp_path / "o").exists()


def test_a_garbage_test_hold_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("RLKIT_TEST_HOLD", "soon")
    code, err = refused(["methods"], capsys)
    assert code == 2 and "RLKIT_TEST_HOLD must be <step>:<file>" in err, err


def test_a_full_disk_in_export_or_data_does_not_offer_resume(tmp_path, capsys, monkeypatch):
    import errno

    from rlkit.verl.launch import data

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "o" / "train.parquet"))

    monkeypatch.setattr(data, "prepare_arithmetic", full)
    code, err = refused(["data", "arithmetic", "--out", str(tmp_path / "o")], capsys)
    assert code == 1 and "no space left" in err and "train.parquet" in err and "--resume" not in err, err


# ----------------------------------------------------------------------- damaged runs, wherever they are read
def damage_eval_missing(run: Path) -> str:
    (run / "eval.jsonl").unlink()
    return "eval.jsonl is missing"


def damage_correct(run: Path) -> str:
    record = json.loads((run / "eval.jsonl").read_text())
    record["data"]["correct"] = 5
    (run / "eval.jsonl").write_text(json.dumps(record) + "\n")
    return "eval.jsonl:1: correct is not a list"


def damage_env(run: Path) -> str:
    (run / "env.json").write_text("garbage")
    return "env.json is not JSON"


def damage_final_eval_size(run: Path) -> str:
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "final_eval_size": "many"}))
    return 'final_eval_size is "many"'


def damage_checkpoint(run: Path) -> str:
    (run / "checkpoint.pt").write_bytes(b"garbage")
    return "checkpoint.pt is damaged"


DAMAGES = [damage_eval_missing, damage_correct, damage_env, damage_final_eval_size, damage_checkpoint]


@pytest.fixture
def grpo_copy(tmp_path):
    """This machine's results: a copy of the published GRPO runs."""
    import shutil

    shutil.copytree(PUBLISHED / "grpo", tmp_path / "R" / "grpo")
    return tmp_path / "R"


@pytest.mark.parametrize("damage", DAMAGES)
def test_reproduced_names_a_damaged_run(damage, grpo_copy, tmp_path, capsys):
    third = first_seed(grpo_copy) + 2  # the publication's third seed
    named = damage(grpo_copy / "grpo" / f"seed{third}")
    before = {p: p.read_bytes() for p in grpo_copy.rglob("*") if p.is_file()}
    code, err = refused(["reproduced", "--results", str(grpo_copy), "--out", str(tmp_path / "report")],
                        capsys, quiet=False)
    assert code == 1 and f"grpo seed {third}: damaged" in err and named in err, err
    assert {p: p.read_bytes() for p in grpo_copy.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("damage", DAMAGES)
def test_reuse_and_the_claims_refuse_a_damaged_finished_run(damage, grpo_copy):
    from rlkit.errors import DamagedFile
    from rlkit.lab.reproduce import PlannedRun, train_runs
    from rlkit.lab.runs import available_seeds, final_correct, load_run

    third = first_seed(grpo_copy) + 2
    run = grpo_copy / "grpo" / f"seed{third}"
    intact = load_run(run)
    named = damage(run)
    before = {p: p.read_bytes() for p in grpo_copy.rglob("*") if p.is_file()}
    with pytest.raises(DamagedFile, match=named):  # the reuse: before anything is trained
        train_runs([PlannedRun("grpo", "grpo", "standard", third)], scale="cpu", results=grpo_copy,
                   progress=False)
    with pytest.raises(DamagedFile, match=named):  # the claims' seeds
        available_seeds(grpo_copy, "grpo")
    with pytest.raises(DamagedFile, match=named):  # the claims' per-problem results
        final_correct(intact)
    assert {p: p.read_bytes() for p in grpo_copy.rglob("*") if p.is_file()} == before


def test_reproduce_refuses_to_reuse_a_damaged_run_before_training_anything(grpo_copy, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    second = f"seed{first_seed(grpo_copy) + 1}"
    named = damage_eval_missing(grpo_copy / "grpo" / second)
    before = tree(grpo_copy)
    code, err = refused(["reproduce", "--only", "grpo", "--results", str(grpo_copy), "--workers", "1"], capsys,
                        quiet=False)
    assert code == 1 and f"{grpo_copy / 'grpo' / second / 'eval.jsonl'}" in err and named in err, err
    assert tree(grpo_copy) == before


def test_smoke_results_are_said_not_to_be_expected_to_match():
    from rlkit.lab.reproduced import to_markdown

    out = {"machines": {side: {"processor": "x", "fingerprint": "f", "sft_start": "s"} for side in
                        ("here", "published")}, "counts": {"within the published spread": 1}, "runs": [],
           "claims": [], "claims_differ": 0, "claims_judged": 0, "problems": {},
           "scales": {"here": ["smoke"], "published": ["cpu"]}}
    assert "these runs are at smoke scale, the published ones at cpu scale" in to_markdown(out)
    out["scales"]["here"] = ["cpu"]
    assert "Another scale" not in to_markdown(out)


# ------------------------------------------------------------------------------------------------ book
def pending_last_cell(nb: dict) -> dict:
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    code[-1]["metadata"]["papermill"]["status"] = "pending"
    code[-1]["execution_count"], code[-1]["outputs"] = None, []
    return nb


def never_executed(nb: dict) -> dict:
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["execution_count"], cell["outputs"] = None, []
            cell["metadata"].pop("papermill", None)
    return nb


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("spoil, named", [(pending_last_cell, "papermill left it pending"),
                                          (never_executed, "it has no execution count")])
def test_the_book_refuses_a_notebook_not_executed_to_the_end(spoil, named, strict, tmp_path, capsys):
    import shutil

    from rlkit.lab.book import executed_notebooks

    results, book = tmp_path / "R", tmp_path / "book"
    notebooks = executed_notebooks(PUBLISHED)
    for name, path in notebooks.items():
        (results / path.relative_to(PUBLISHED)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, results / path.relative_to(PUBLISHED))
    target = results / notebooks["grpo"].relative_to(PUBLISHED)
    target.write_text(json.dumps(spoil(json.loads(target.read_text()))))
    book.mkdir()
    for name in ("_config.yml", "_toc.yml"):
        (book / name).write_text("")
    before = tree(tmp_path)
    code, err = refused(["book", "--results", str(results), "--book-dir", str(book),
                         *([] if strict else ["--no-strict"])], capsys)
    assert code == 1 and str(target) in err and named in err, err
    assert tree(tmp_path) == before


# ------------------------------------------------------------------------------------------------ SFT start
def test_a_damaged_cached_sft_start_is_named_and_trained_again(tmp_path, capsys, monkeypatch):
    from rlkit.tiny.config import default_config
    from rlkit.tiny.sft import start_source

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    sft = default_config("smoke").sft
    _, path = start_source(sft)  # trained: its folder made
    path.write_bytes(b"garbage")
    assert cli.main(["start", "--scale", "smoke"]) == 0
    err = capsys.readouterr().err
    assert f"warning: the cached SFT start is damaged ({path} is damaged" in err, err
    assert "training it again" in err, err
    assert start_source(sft)[0] == "cache" and path.stat().st_size > 1000


def test_a_cache_without_room_for_the_sft_start_is_refused_before_training(tmp_path, capsys, monkeypatch):
    import shutil
    from collections import namedtuple

    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 4096, 4096))  # an empty file
    code, err = refused(["train", "--method", "grpo", "--scale", "smoke", "--out", str(tmp_path / "run")],
                        capsys)
    assert code == 1 and f"RLKIT_CACHE={tmp_path / 'cache'}" in err and "MB" in err and "free" in err, err
    assert not (tmp_path / "run").exists() and not list((tmp_path / "cache").rglob("*.pt"))


def test_an_sft_training_stopped_part_way_goes_on_to_the_same_weights(tmp_path, monkeypatch):
    from dataclasses import replace

    from rlkit.numerics import weights_sha256
    from rlkit.tiny import sft
    from rlkit.tiny.config import default_config

    cfg = replace(default_config("smoke").sft, steps=12)
    whole, info = sft.train(cfg, progress=False)
    partial, real, calls = tmp_path / "partial-sft.pt", sft.sft_step, []

    def stopped(*a, **k):  # Ctrl-C during the 8th step: the 7 before are kept
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sft, "PARTIAL_EVERY_S", 0.0)
    monkeypatch.setattr(sft, "sft_step", stopped)
    with pytest.raises(KeyboardInterrupt):
        sft.train(cfg, progress=False, partial=partial)
    monkeypatch.setattr(sft, "sft_step", real)
    resumed, again = sft.train(cfg, progress=False, partial=partial)
    assert weights_sha256(resumed.state_dict()) == weights_sha256(whole.state_dict())
    assert again["loss"] == info["loss"] and again["val/correct"] == info["val/correct"]


# ------------------------------------------------------------------------------------------------ launch
@pytest.mark.parametrize("extra, named", [
    (["--", "actor_rollout_ref.actor.clip_ratio_low=-5"], "actor.clip_ratio_low=-5: must be a number ≥ 0"),
    (["--", "actor_rollout_ref.actor.optim.lr=abc"], "optim.lr=abc: verl's FSDPOptimizerConfig takes lr as"),
    (["--runs-dir", "{file}"], "--runs-dir {file}: {file} is a file"),
])
def test_a_dry_run_refuses_values_verl_would_fail_on(extra, named, tmp_path, capsys):
    data = tmp_path / "data"
    for split in ("train", "test"):
        parquet(data / f"{split}.parquet", 2)
    (tmp_path / "afile").write_text("mine")
    extra = [e.format(file=tmp_path / "afile") for e in extra]
    runs = [] if "--runs-dir" in extra else ["--runs-dir", str(tmp_path / "runs")]
    before = tree(tmp_path)
    code, err = refused([*GPU_LAUNCH, "--data", str(data), *runs, *extra], capsys)
    assert code == 2 and named.format(file=tmp_path / "afile") in err, err
    assert tree(tmp_path) == before
