"""`make lab` end to end: JupyterLab started by the Makefile's own target on a busy port moves to a free one and says
so; a method notebook (MyST Markdown) opens as a notebook in headless Chromium, runs every cell at smoke scale, and
shows no error. The server, its kernels and the browser are stopped whatever happens."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rlkit.lab.paths import project_root
from test_book import VIEWPORT, launch_chromium

REPO = project_root()

NOTEBOOK = "01_grpo.md"
START_TIMEOUT = 180  # s: JupyterLab's start on a busy 2-core machine
RUN_TIMEOUT = 240  # s: the notebook at smoke scale (about 15 s alone) while other jobs share the CPU


def smoke_copy(source: Path, target: Path, results: Path) -> Path:
    """``source`` with its parameters cell set to smoke scale and results under ``results`` (papermill's values)."""
    text = source.read_text()
    for name, value in (("scale", '"smoke"'), ("results", repr(str(results))), ("progress", "False")):
        text, n = re.subn(rf"^{name} = .*?(?=\s+#|$)", f"{name} = {value}", text, count=1, flags=re.M)
        assert n == 1, f"{source.name}: no `{name} = ...` line in its parameters cell"
    target.write_text(text)
    return target


@pytest.fixture
def lab(tmp_path):
    """`make lab` on a copy of the notebook, its LAB_PORT held by another socket; yields (base URL, token, log).

    Everything JupyterLab writes (settings, workspaces, runtime files, the SFT cache) goes to ``tmp_path``, except
    the venv's default-viewer setting that `make lab` itself writes."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    smoke_copy(REPO / "notebooks" / NOTEBOOK, folder / NOTEBOOK, tmp_path / "results")
    token = secrets.token_hex(16)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    env = {**os.environ, "RLKIT_CACHE": str(tmp_path / "cache"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    args = (f"--no-browser --IdentityProvider.token={token} --LabApp.expose_app_in_browser=True "
            f"--LabApp.user_settings_dir={tmp_path / 'user-settings'} --LabApp.workspaces_dir={tmp_path / 'ws'}")
    log = tmp_path / "lab.log"
    with log.open("w") as out:  # -o: the venv is there already; do not reinstall it from the test
        proc = subprocess.Popen(["make", "-s", "-o", ".venv/.installed", "lab", f"LAB_PORT={port}",
                                 f"LAB_DIR={folder}", f"LAB_ARGS={args}"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        url = None
        while url is None:
            assert proc.poll() is None, f"make lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"JupyterLab did not start:\n{log.read_text()[-3000:]}"
            time.sleep(1)
            found = re.search(r"http://127\.0\.0\.1:(\d+)/lab\?token=", log.read_text())
            url = found and f"http://127.0.0.1:{found.group(1)}/"
        with urllib.request.urlopen(f"{url}api/status?token={token}", timeout=30) as response:
            assert response.status == 200
        yield url, token, log
    finally:
        busy.close()
        try:  # the server, make and the kernels share one process group: ours
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_smoke_copy_sets_the_parameters(tmp_path):
    copy = smoke_copy(REPO / "notebooks" / NOTEBOOK, tmp_path / NOTEBOOK, tmp_path / "r")
    text = copy.read_text()
    assert 'scale = "smoke"' in text and f"results = {str(tmp_path / 'r')!r}" in text and "progress = False" in text
    assert text.count("\n") == (REPO / "notebooks" / NOTEBOOK).read_text().count("\n")


CELLS = """() => {
  const model = window.jupyterapp.shell.currentWidget.content.model;
  const cells = [];
  for (let i = 0; i < model.cells.length; i++) {
    const cell = model.cells.get(i);
    if (cell.type === 'code') cells.push({count: cell.executionCount, outputs: cell.outputs.toJSON()});
  }
  return cells;
}"""


@pytest.mark.timeout(START_TIMEOUT + RUN_TIMEOUT + 120)
def test_make_lab_opens_a_method_notebook_as_a_notebook_and_runs_it(lab):
    url, token, log = lab
    assert re.search(r"is already in use", log.read_text()), "the busy LAB_PORT was not reported"
    viewers = (REPO / ".venv" / "share" / "jupyter" / "lab" / "settings" / "overrides.json").read_text()
    assert '"markdown": "Jupytext Notebook"' in viewers and '"myst": "Jupytext Notebook"' in viewers

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{url}lab/tree/{NOTEBOOK}?token={token}", timeout=120_000)
            # the default viewer (what a double-click uses) is the notebook: cells, not a text editor
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=120_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session", timeout=120_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            deadline = time.monotonic() + RUN_TIMEOUT
            while True:
                cells = page.evaluate(CELLS)
                errors = [o for c in cells for o in c["outputs"] if o.get("output_type") == "error"]
                assert not errors, f"{errors[0]['ename']}: {errors[0]['evalue']}"
                if all(c["count"] for c in cells):
                    break
                assert time.monotonic() < deadline, f"{sum(not c['count'] for c in cells)} cells never ran"
                time.sleep(2)
            outputs = [o for c in cells for o in c["outputs"]]
            assert any("image/png" in o.get("data", {}) for o in outputs), "no figure came out"
            assert page.locator(".jp-OutputArea-output").count() > 0
        finally:
            browser.close()
