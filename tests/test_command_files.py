"""Every command keeps to its own files, and every damaged input is named (issue 33, items 1-3).

- A directory belongs to the command that made it: its marker records the kind (training run, model export, launch
  run, ...), and a command refuses another kind's directory, ``--force`` or not, with one line naming both kinds.
- A refusal changes nothing: a reproduction whose notebook fails leaves the published notebook as it was (the
  failure goes to ``<stem>.failed.ipynb``), and ``rlkit book`` refuses a failed or cut-off notebook instead of
  publishing it.
- ``rlkit reproduced`` names a damaged run (which file, what is wrong) and exits 1; "not run here" is only for runs
  that are absent; its report goes where ``--out`` says, and an unwritable place is refused in one line.

The run directories here are written by hand (no training): each refusal comes before any work.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit import cli, files
from rlkit.errors import DamagedFile, NotOurDirectory
from rlkit.lab import reproduced
from rlkit.lab.reproduce import PlannedRun


def refused(argv, capsys):
    """Run the CLI expecting a refusal: (exit code, its one-line message)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.startswith("rlkit ") and len(err.splitlines()) == 1, err
    return info.value.code, err


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------ kinds
def killed_training_run(path: Path) -> Path:
    """A training run killed after step 1: its marker still names the dead writer."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"method": "grpo", "steps": 5, "seed": 0}))
    (path / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n{"step": 1, "data": {}}\n')
    (path / "checkpoint.pt").write_bytes(b"weights")
    marker = {"kind": files.TRAINING_RUN, "files": ["checkpoint.pt", "config.json", "metrics.jsonl"],
              "writer": {"pid": 999999, "host": "here", "started": "2026-01-01 00:00:00 +0000"}}
    (path / files.MARKER).write_text(json.dumps(marker))
    return path


def export_dir(path: Path) -> Path:
    """What ``rlkit export`` leaves: a Hugging Face model directory."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (path / "rlkit_model.json").write_text(json.dumps({"kind": "sft"}))
    (path / files.MARKER).write_text(json.dumps({"kind": files.EXPORT, "files": ["config.json", "rlkit_model.json"]}))
    return path


def launch_run(path: Path) -> Path:
    """A launch's run directory, marked by an older rlkit (a command, no kind)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"method": "grpo", "dataset": "arithmetic"}))
    (path / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n')
    (path / files.MARKER).write_text(json.dumps({"command": "rlkit launch", "files": ["config.json"]}))
    return path


EXPORT_ARGS = ["export", "--scale", "smoke", "--set", "sft.d_model=64", "--out"]
TRAIN_ARGS = ["train", "--method", "grpo", "--scale", "smoke", "--set", "steps=1", "--out"]


@pytest.mark.parametrize("make, argv, found, wanted", [
    (killed_training_run, EXPORT_ARGS, "training run", "model export"),
    (export_dir, TRAIN_ARGS, "model export", "training run"),
    (launch_run, EXPORT_ARGS, "launch run", "model export"),
    (launch_run, TRAIN_ARGS, "launch run", "training run"),
    (killed_training_run, ["data", "arithmetic", "--out"], "training run", "data folder"),
], ids=["export-into-killed-run", "train-into-export", "export-into-launch-run", "train-into-launch-run",
        "data-into-run"])
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_command_refuses_another_commands_directory_naming_both_kinds(make, argv, found, wanted, force, tmp_path,
                                                                         capsys):
    out = make(tmp_path / "dir")
    before = snapshot(out)
    code, err = refused([*argv, str(out), *(["--force"] if force else [])], capsys)
    assert code == 2 and f"holds a {found}" in err and f"not a {wanted}" in err, err
    assert "--force never turns" in err
    assert snapshot(out) == before  # the run can still resume: nothing of it was touched


def test_a_marker_records_its_kind_and_an_older_ones_command_still_says_it(tmp_path):
    new = tmp_path / "new"
    marker = files.claim_dir(new, files.EXPORT)
    assert marker["kind"] == files.EXPORT and files.read_marker(new)["kind"] == files.EXPORT
    files.claim_dir(new, files.EXPORT)  # its own kind: written again
    with pytest.raises(NotOurDirectory, match="holds a model export .* not a training run"):
        files.claim_dir(new, files.TRAINING_RUN, force=True)
    old = {"rlkit train": files.TRAINING_RUN, "rlkit export": files.EXPORT, "rlkit launch": files.LAUNCH_RUN,
           "rlkit book": files.BOOK, "rlkit data gsm8k": files.DATA, "rlkit data arithmetic": files.DATA,
           "run": files.TRAINING_RUN, "export": files.EXPORT, "book": files.BOOK}
    for command, kind in old.items():
        assert files.kind_of({"command": command, "files": []}) == kind, command
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / files.MARKER).write_text(json.dumps({"command": "rlkit frobnicate", "files": []}))
    with pytest.raises(NotOurDirectory, match="unknown kind"):
        files.claim_dir(unknown, files.TRAINING_RUN, force=True)
    with pytest.raises(ValueError, match="unknown kind of directory"):
        files.claim_dir(tmp_path / "x", "rlkit train")  # a command name is not a kind


def test_an_older_training_runs_marker_is_still_its_own(tmp_path):
    """A run an older rlkit started (marker with "command": "rlkit train") is resumed in place by train."""
    run = tmp_path / "run"
    run.mkdir()
    (run / files.MARKER).write_text(json.dumps({"command": "rlkit train", "files": ["config.json"]}))
    (run / "config.json").write_text("{}")
    assert files.claim_dir(run, files.TRAINING_RUN)["kind"] == files.TRAINING_RUN
    with files.lock_dir(run, files.TRAINING_RUN):
        assert json.loads((run / files.MARKER).read_text())["kind"] == files.TRAINING_RUN
    with pytest.raises(NotOurDirectory, match="holds a training run"):
        files.claim_dir(run, files.EXPORT)


def test_reproduce_refuses_a_file_as_results(tmp_path, capsys):
    target = tmp_path / "results.txt"
    target.write_text("my notes")
    code, err = refused(["reproduce", "--only", "grpo", "--results", str(target)], capsys)
    assert code == 2 and "is a file, not a directory" in err and str(target) in err
    assert target.read_text() == "my notes"


# ------------------------------------------------------------------------------------------------ notebooks
NOTEBOOK = ("---\njupytext:\n  text_representation:\n    format_name: myst\nkernelspec:\n  name: python3\n"
            "  display_name: Python 3\n  language: python\n---\n\n```{{code-cell}} ipython3\n{code}\n```\n")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project with one reproduction, ``toy`` (no runs of its own), whose notebook is ``notebooks/toy.md``."""
    root = tmp_path / "project"
    (root / "reproductions" / "specs").mkdir(parents=True)
    (root / "notebooks").mkdir()
    (root / "reproductions" / "specs" / "toy.yaml").write_text("name: toy\ntitle: Toy\nnotebook: notebooks/toy.md\n")
    monkeypatch.setenv("RLKIT_PROJECT", str(root))
    return root


def write_notebook(project: Path, code: str) -> None:
    (project / "notebooks" / "toy.md").write_text(NOTEBOOK.format(code=code))


def test_a_refused_reproduction_keeps_the_published_notebook_and_the_book_refuses_a_failed_one(project, tmp_path,
                                                                                             capsys):
    results = tmp_path / "results"
    (results / "toy").mkdir(parents=True)
    published = results / "toy" / "toy.ipynb"
    published.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    before = published.read_bytes()
    write_notebook(project, "raise ValueError('results/toy/seed0 holds a finished run with another config')")
    capsys.readouterr()
    assert cli.main(["reproduce", "--only", "toy", "--results", str(results)]) == 1
    err = capsys.readouterr().err
    failed = results / "toy" / "toy.failed.ipynb"
    assert "holds a finished run with another config" in err and str(failed) in err
    assert published.read_bytes() == before  # the refusal changed nothing
    assert "holds a finished run" in failed.read_text()
    assert sorted(p.name for p in (results / "toy").iterdir()) == ["toy.failed.ipynb", "toy.ipynb"]

    book = tmp_path / "book"
    book.mkdir()
    for name in ("_config.yml", "_toc.yml"):
        (book / name).write_text("")
    shutil.copyfile(failed, published)  # as an older rlkit published it
    code, err = refused(["book", "--results", str(results), "--book-dir", str(book)], capsys)
    assert code == 1 and str(published) in err and "execution failed" in err and "ValueError" in err
    assert "rlkit reproduce --only toy" in err
    published.write_text(failed.read_text()[:200])  # cut off
    code, err = refused(["book", "--results", str(results), "--book-dir", str(book)], capsys)
    assert code == 1 and str(published) in err and "cut off" in err
    assert sorted(p.name for p in book.iterdir()) == ["_config.yml", "_toc.yml"]  # nothing staged

    write_notebook(project, "x = 1")  # a success replaces the published notebook and clears the failure
    capsys.readouterr()
    assert cli.main(["reproduce", "--only", "toy", "--results", str(results)]) == 0
    assert json.loads(published.read_text())["cells"] and not failed.exists()
    assert not list((results / "toy").glob(".*"))  # no temporary execution left


# ------------------------------------------------------------------------------------------------ reproduced
def fake_run(run_dir: Path, final: float, steps: int = 2) -> Path:
    """A finished run written by hand: config, environment, per-problem results and metrics."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"method": "toy", "steps": steps, "final_eval_size": 200}))
    (run_dir / "env.json").write_text(json.dumps({"processor": "cpu", "fingerprint": "f", "sft_start": {}}))
    (run_dir / "eval.jsonl").write_text(json.dumps({"step": steps, "data": {"correct": [1, 0]}}) + "\n")
    lines = [{"step": k, "data": {"val/acc": 0.1 * k}} for k in range(steps)]
    lines.append({"step": steps, "data": {"val/acc": 0.3, "val/acc_final": final}})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_dir


@pytest.fixture
def folders(tmp_path):
    """A "published" folder of three seeds of the run ``toy`` and this machine's identical copy."""
    published = tmp_path / "published"
    for seed, final in enumerate([0.50, 0.52, 0.51]):
        fake_run(published / "toy" / f"seed{seed}", final)
    mine = tmp_path / "mine"
    shutil.copytree(published, mine)
    return mine, published


def damage_config_missing(run: Path) -> None:
    (run / "config.json").unlink()


def damage_metrics_line(run: Path) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "garbage", *lines[2:]]) + "\n")


def damage_metrics_cut(run: Path) -> None:
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[:len(text) - 10])


def damage_metrics_short(run: Path) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")


def damage_env(run: Path) -> None:
    (run / "env.json").write_text("garbage")


def damage_eval_line(run: Path) -> None:
    (run / "eval.jsonl").write_text("{not json\n{}\n")


@pytest.mark.parametrize("damage, status, named", [
    (damage_config_missing, reproduced.DAMAGED, "config.json is missing"),
    (damage_metrics_line, reproduced.DAMAGED, "metrics.jsonl:2: not a JSON line"),
    (damage_metrics_cut, reproduced.DAMAGED, "metrics.jsonl:3: the last line is cut off"),
    (damage_metrics_short, reproduced.UNFINISHED, "metrics.jsonl ends at step 1 of 2"),
    (damage_env, reproduced.DAMAGED, "env.json is not JSON"),
    (damage_eval_line, reproduced.DAMAGED, "eval.jsonl:1: not a JSON line"),
], ids=["config-missing", "metrics-garbage-line", "metrics-cut-off", "metrics-short", "env-garbage", "eval-garbage"])
@pytest.mark.parametrize("side", ["here", "published"])
def test_reproduced_names_a_damaged_run_and_exits_1(damage, status, named, side, folders, tmp_path, capsys):
    mine, published = folders
    broken = (mine if side == "here" else published) / "toy" / "seed1"
    damage(broken)
    out = tmp_path / "report"
    argv = ["reproduced", "--results", str(mine), "--published", str(published), "--out", str(out)]
    code, err = refused(argv, capsys)
    assert code == 1 and str(broken) in err and named in err, err
    report = json.loads((out / "reproduced.json").read_text())
    rows = {r["seed"]: r for r in report["runs"]}
    assert rows[1]["status"] == status and named in rows[1]["problem"]
    assert rows[0]["status"] == rows[2]["status"] == reproduced.IDENTICAL
    assert reproduced.MISSING not in report["counts"]  # "not run here" only for absent runs
    assert named in (out / "reproduced.md").read_text()
    assert not (mine / "reproduced.json").exists()  # --out, not beside the results


def test_an_absent_run_is_not_run_here_and_the_report_goes_beside_the_results(folders, capsys):
    mine, published = folders
    shutil.rmtree(mine / "toy" / "seed2")
    capsys.readouterr()
    assert cli.main(["reproduced", "--results", str(mine), "--published", str(published)]) == 0
    rows = {r["seed"]: r["status"] for r in json.loads((mine / "reproduced.json").read_text())["runs"]}
    assert rows == {0: reproduced.IDENTICAL, 1: reproduced.IDENTICAL, 2: reproduced.MISSING}
    assert "1 not run here" in (mine / "reproduced.md").read_text()


def test_reproduced_refuses_an_unwritable_place_before_comparing(folders, tmp_path, capsys, monkeypatch):
    mine, published = folders
    before = snapshot(mine)
    mine.chmod(0o555)
    if os.geteuid() == 0:  # root writes into a read-only folder: the kernel's refusal, as a user would get it
        real = tempfile.mkstemp

        def read_only(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == mine:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(reproduced, "compare_runs", lambda *a: pytest.fail("compared before refusing"))
    try:
        code, err = refused(["reproduced", "--results", str(mine), "--published", str(published)], capsys)
    finally:
        mine.chmod(0o755)
    assert code == 1 and f"{mine} cannot be written" in err and "--out" in err
    assert snapshot(mine) == before
    not_a_folder = tmp_path / "report.txt"
    not_a_folder.write_text("mine")
    code, err = refused(["reproduced", "--results", str(mine), "--published", str(published), "--out",
                         str(not_a_folder)], capsys)
    assert code == 2 and "is a file, not a directory" in err and not_a_folder.read_text() == "mine"


def test_claims_over_a_damaged_run_are_not_judged_nor_counted_as_agreement(folders, monkeypatch):
    """The probe's garbage env.json: its reproduction's claims are listed as not judged, naming the file."""
    mine, published = folders
    damage_env(mine / "toy" / "seed0")
    spec = SimpleNamespace(name="toy", method="toy", claims=["a claim"],
                           runs=lambda seeds=None: [PlannedRun("toy", "toy", "standard", 0)])
    monkeypatch.setattr("rlkit.lab.judge.judge_spec", lambda *a, **k: pytest.fail("judged over a damaged run"))
    not_judged = []
    claims = reproduced.compare_claims(mine, published, [spec], not_judged)
    assert len(claims) == 0
    assert [entry["spec"] for entry in not_judged] == ["toy"]
    assert str(mine / "toy" / "seed0" / "env.json") in not_judged[0]["problem"]
    report = reproduced.report(mine, published, [spec])
    text = reproduced.to_markdown(report)
    assert "1 reproduction(s) not judged" in text and "toy: claims not judged" in text
    assert reproduced.problems(report)


def test_readers_of_run_files_name_the_damaged_file(tmp_path):
    from rlkit.lab.runs import load_run
    from rlkit.metrics import read_metrics

    run = fake_run(tmp_path / "run", 0.5)
    damage_env(run)
    with pytest.raises(DamagedFile, match=r"env\.json is not JSON"):
        load_run(run)
    (run / "config.json").write_text("[]")
    with pytest.raises(DamagedFile, match=r"config\.json holds a JSON array, not an object"):
        load_run(run)
    (run / "metrics.jsonl").write_text('{"step": "one", "data": {}}\n')
    with pytest.raises(DamagedFile, match=r"metrics\.jsonl:1: expected"):
        read_metrics(run / "metrics.jsonl")
    (run / "metrics.jsonl").write_bytes(b'{"step": 0, "data": {}}\n\xff\xfe\n')
    with pytest.raises(DamagedFile, match=r"metrics\.jsonl:2: not a JSON line"):
        read_metrics(run / "metrics.jsonl")
