"""The library works from a wheel: built from this tree, installed (no deps) into a fresh venv that sees this venv's
dependencies (torch, ...) but not its editable rlkit, and run from a folder outside the checkout: ``rlkit train``
trains, the shipped SFT start is read from the installed package, and the reproduction app, which needs a checkout,
says so in one line (exit 2) — unless ``RLKIT_PROJECT`` names one. About a minute on two busy cores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parents[1]
SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RLKIT_PROJECT", "PYTHONSTARTUP")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(venv, wheel, work, env)``: the wheel built from a copy of this tree, installed into a fresh venv; ``work``
    a folder outside the checkout; ``env`` the environment to run it in (its own SFT cache, no project)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # a copy: the build writes build/ and *.egg-info beside the sources, not into the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "rlkit", src / "rlkit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                  "-w", str(tmp / "dist"), str(src)], tmp, env)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp / "dist").glob("rlkit-*.whl")

    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp,
                        env).stdout.strip())
    # this venv's packages, appended to sys.path: a directory a .pth names is not scanned for .pth files, so the
    # checkout's editable finder (__editable__.rlkit-*.pth here) is never installed there
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (purelib / "rlkit_test_deps.pth").write_text("\n".join(ours) + "\n")
    done = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                 str(wheel)], tmp, env)
    assert done.returncode == 0, done.stdout + done.stderr
    work = tmp / "work"
    work.mkdir()
    return venv, wheel, work, {**env, "RLKIT_CACHE": str(tmp / "cache")}


def test_the_wheel_holds_every_module_and_data_file_of_the_package(installed):
    _, wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "rlkit"], cwd=REPO, capture_output=True, text=True).stdout.split()
    assert tracked, "git ls-files found nothing"
    missing = sorted(f for f in tracked if f not in names)
    assert not missing, f"files of the package the wheel lacks (pyproject's package-data): {missing}"
    assert "rlkit/lab/paths.py" in names and "rlkit/tiny/start/MANIFEST.json" in names


def test_the_library_trains_from_the_wheel_outside_a_checkout(installed):
    venv, _, work, env = installed
    where = _run([str(venv / "bin" / "python"), "-c",
                  "import json, sys, rlkit, rlkit.tiny.sft as s; print(json.dumps([rlkit.__file__, str(s.SHIPPED_DIR), "
                  "any('__editable__' in m for m in sys.modules)]))"], work, env)
    assert where.returncode == 0, where.stderr
    module, shipped, editable = json.loads(where.stdout.strip().splitlines()[-1])
    assert Path(module).is_relative_to(venv) and not Path(module).is_relative_to(REPO), module
    assert Path(shipped).is_relative_to(venv) and not editable

    start = _run([str(venv / "bin" / "rlkit"), "start", "--scale", "cpu"], work, env)
    assert start.returncode == 0, start.stdout + start.stderr
    assert f"shipped: {venv}" in start.stdout, start.stdout  # the weights the wheel carries

    out = work / "run"
    train = _run([str(venv / "bin" / "rlkit"), "train", "--method", "grpo", "--scale", "smoke", "--out", str(out)],
                 work, env)
    assert train.returncode == 0, train.stdout + train.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert steps and steps[-1] >= 1, steps


def test_the_lab_from_the_wheel_needs_a_project_and_says_so_in_one_line(installed):
    venv, _, work, env = installed
    rlkit = str(venv / "bin" / "rlkit")
    helped = _run([rlkit, "reproduce", "--help"], work, env)
    assert helped.returncode == 0 and "--results" in helped.stdout, helped.stderr

    refused = _run([rlkit, "reproduce"], work, env)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith("rlkit reproduce: no rlkit project found") and "RLKIT_PROJECT" in lines[0]

    named = _run([rlkit, "reproduce", "--only", "no-such-spec"], work, {**env, "RLKIT_PROJECT": str(REPO)})
    assert named.returncode == 2 and "unknown reproductions ['no-such-spec']" in named.stderr, named.stderr
