"""End to end at smoke scale: every notebook executes with papermill, the book builds with warnings as errors, and a
real browser (headless Chromium driven by Playwright) loads every page's figures and follows its internal links."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import pytest

from rlkit.book import BOOK_DIR, build
from rlkit.reproduce import load_specs, reproduce

METHOD_PAGES = ["00_overview", "01_grpo", "02_gspo", "03_aspo", "04_aepo", "05_spo", "06_hapo", "07_comparison"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Every spec executed at smoke scale into a temporary results directory (own SFT cache)."""
    root = tmp_path_factory.mktemp("smoke")
    old = os.environ.get("RLKIT_CACHE")
    os.environ["RLKIT_CACHE"] = str(root / "cache")
    try:
        done = reproduce(scale="smoke", results=root / "results", progress=False)
    finally:
        os.environ.pop("RLKIT_CACHE") if old is None else os.environ.__setitem__("RLKIT_CACHE", old)
    return root, done


@pytest.fixture(scope="module")
def book(smoke):
    root, _ = smoke
    copy = root / "book"
    shutil.copytree(BOOK_DIR, copy, ignore=shutil.ignore_patterns("_build", "notebooks"))
    return build(copy, root / "results")


def test_every_notebook_executes_without_errors(smoke):
    root, done = smoke
    assert [p.stem for p in done["notebooks"]] == METHOD_PAGES
    for path in done["notebooks"]:
        nb = json.loads(path.read_text())
        errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: {errors[0]['ename']}: {errors[0]['evalue']}"
        params = [c for c in nb["cells"] if "injected-parameters" in c.get("metadata", {}).get("tags", [])]
        assert params and "scale = \"smoke\"" in "".join(params[0]["source"]), f"{path.name}: scale not injected"
    for spec in load_specs():
        if spec.method:  # each method's run sits beside its executed notebook
            run = root / "results" / spec.name / "seed0"
            assert {"metrics.jsonl", "config.json", "env.json"} <= {p.name for p in run.iterdir()}, spec.name


def test_a_failing_cell_stops_with_the_cell_and_the_error(tmp_path):
    from rlkit.reproduce import NotebookFailed, Spec, execute

    nb = tmp_path / "bad.md"
    nb.write_text("---\njupytext:\n  text_representation:\n    format_name: myst\nkernelspec:\n  name: python3\n"
                  "  display_name: Python 3\n  language: python\n---\n\n```{code-cell} ipython3\nx = 1\n```\n\n"
                  "```{code-cell} ipython3\nassert x == 2, 'the math is wrong'\n```\n")
    spec = Spec(name="bad", notebook=str(nb))
    with pytest.raises(NotebookFailed) as info:
        execute(spec, tmp_path / "out", {}, progress=False)
    message = str(info.value)
    assert "assert x == 2" in message and "AssertionError: the math is wrong" in message
    assert info.value.output.exists()  # the partial notebook, with the traceback, is kept


def test_book_builds_with_warnings_as_errors(book):
    html = book.parent
    for page in METHOD_PAGES:
        assert (html / "notebooks" / f"{page}.html").exists(), page
    assert (html / "papers.html").exists() and (html / "full_scale_runs.html").exists()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(book):
    handler = functools.partial(_Quiet, directory=str(book.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield browser
        browser.close()


def test_every_page_shows_its_figures_and_its_links_resolve(served, browser):
    page = browser.new_page()
    page.goto(urljoin(served, "index.html"))
    page.wait_for_url("**/intro.html")  # the book's root redirects to its first page
    pages = ["intro.html"] + [f"notebooks/{p}.html" for p in METHOD_PAGES] + ["papers.html", "full_scale_runs.html"]
    anchors_seen: dict[str, set[str]] = {}
    links: set[str] = set()
    for name in pages:
        url = urljoin(served, name)
        response = page.goto(url, wait_until="load")
        assert response is not None and response.ok, f"{name}: HTTP {response and response.status}"
        images = page.eval_on_selector_all("img", "els => els.map(e => [e.getAttribute('src'), e.naturalWidth])")
        broken = [src for src, width in images if width == 0]
        assert not broken, f"{name}: images that did not load: {broken}"
        if name.startswith("notebooks/") and name != "notebooks/00_overview.html":
            assert len(images) >= 2, f"{name}: expected the method's figures, found {len(images)} images"
        if name == "notebooks/01_grpo.html":  # MathJax is served by the book itself: equations render offline
            page.wait_for_selector("mjx-container", timeout=20_000)
        anchors_seen[urldefrag(url)[0]] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
            if urlparse(href).netloc == urlparse(served).netloc:
                links.add(href)
    for link in sorted(links):
        target, fragment = urldefrag(link)
        if target in anchors_seen:
            pass
        elif urlparse(target).path.endswith((".html", "/")):
            response = page.goto(target, wait_until="domcontentloaded")
            assert response is not None and response.ok, f"broken link {link}: HTTP {response and response.status}"
            anchors_seen[target] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        else:  # a download (the page's .ipynb source, an image): it must exist
            response = page.request.get(target)
            assert response.ok, f"broken link {link}: HTTP {response.status}"
            continue
        assert not fragment or fragment in anchors_seen[target], f"broken anchor {link}"
    page.close()
