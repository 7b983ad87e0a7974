"""Every bad value given to ``rlkit plot``, ``rlkit data`` and ``rlkit launch`` is refused before any work, in one
line naming it, with exit 2, and nothing is written where the command refuses (issue 33, items 4 and 6). The
launch cases run with ``--dry-run`` and are refused before verl's config is composed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit import cli
from rlkit.errors import ConflictingOptions
from rlkit.tasks import arithmetic, gsm8k


def refused(argv, capsys):
    """Run the CLI expecting a refusal: (exit code, its one-line message)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith(f"rlkit {argv[0]}: "), captured.err
    assert not captured.out, captured.out
    return info.value.code, err


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def parquet(path: Path, n: int) -> Path:
    """``n`` of the word problems as rows of ``rlkit data`` (written without ``rlkit data``'s directory claim)."""
    from rlkit.verl import data

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
