"""Adding a method means six hand-edited files (README: "Adding a method"): its module, its test, its spec, its
notebook, its verl preset and its bibliography entry. Every other list of the methods is generated from the
registry and the specs (:mod:`rlkit.lab.book_pages`) or read from them at run time; a list typed by hand anywhere
else fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from rlkit import registry
from rlkit.lab import book_pages, paths
from rlkit.lab.reproduce import Spec
from rlkit.verl.launch.presets import PRESETS

REPO = paths.project_root()
SPECS = {s.method: s for s in book_pages.method_specs()}


def six_files(method: str) -> list[str]:
    """The files a new method's author edits by hand, relative to the project root."""
    return [f"rlkit/methods/{method}.py", f"tests/test_{method}.py", f"reproductions/specs/{SPECS[method].name}.yaml",
            SPECS[method].notebook, "rlkit/verl/launch/presets.py", "book/references.bib"]


PUBLISHED = ("reproductions/results", "reproductions/LOG.md")
"""Published runs and the log of how they were made: records, not lists to keep."""
KNOWN = {
    "rlkit/methods/__init__.py": "imports the methods that came first; the registry imports any method module it "
                                 "does not name (tests/test_registry.py)",
    "book/method_notes.md": "one hand-written section per method (its equations, defaults, the paper-versus-code "
                            "differences): the notes of a new method are written with it, as its page is",
    "tests/test_verl_cpu_runs.py": "left: OWN_METRICS, what each method's verl CPU run must log (a method without an "
                                   "entry is not run there)",
    "book/full_scale_runs.md": "left: the presets' notes ('Where a value is not in the paper'), one per method; "
                               "generating them needs a note on each Preset in rlkit/verl/launch/presets.py",
}
"""Files that still name every method by hand, each with why; a stale entry fails too (the list only shrinks)."""


def _tracked() -> list[str]:
    """The project's files, as git sees them (tracked and new, not ignored)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.splitlines() if (REPO / f).is_file()]


def names_every_method(place: str, methods: list[str]) -> bool:
    """Whether ``place`` names each of ``methods``: by name (``dr_grpo``, also inside ``10_dr_grpo`` or
    ``rlkit_dr_grpo``) or by its spec's name (``Dr. GRPO``); ``GRPO`` inside ``Dr. GRPO`` is not GRPO."""
    titles = {m: book_pages.display_name(SPECS[m]) for m in methods if m in SPECS}

    def named(m: str) -> bool:
        text = place
        for other, title in titles.items():
            if other != m and m in SPECS and titles[m] in title and titles[m] != title:
                text = text.replace(title, "")
        return any(re.search(rf"(?<![A-Za-z0-9]){re.escape(w)}(?![A-Za-z0-9])", text)
                   for w in [m, *([titles[m]] if m in titles else [])])

    return all(named(m) for m in methods)


def lists_of_every_method(text: str, methods: list[str]) -> list[str]:
    """The places in ``text``, outside its generated blocks, that name every one of ``methods``: a paragraph (lines
    with no blank line between them), or the page's headings together."""
    for block in book_pages.GENERATED:
        text = block.sub("", text)
    places = [*re.split(r"\n\s*\n", text), "\n".join(re.findall(r"^#{2,6} .*$", text, re.M))]
    return [place.strip().splitlines()[0][:80] for place in places
            if place.strip() and names_every_method(place, methods)]


def hand_kept_lists(methods: list[str]) -> dict[str, list[str]]:
    """Every file but a method's own six and the published records that lists every method by hand."""
    own = {f for m in methods for f in six_files(m)}
    found = {}
    for f in _tracked():
        if f in own or f.startswith(PUBLISHED) or Path(f).suffix not in {".py", ".md", ".yml", ".yaml", ".toml", ""}:
            continue
        if places := lists_of_every_method((REPO / f).read_text(errors="replace"), methods):
            found[f] = places
    return found


def test_every_method_has_its_six_files():
    bib = (REPO / "book" / "references.bib").read_text()
    for method in registry.list_methods()["method"]:
        assert method in SPECS, f"{method}: no spec in reproductions/specs trains it"
        assert all((REPO / f).is_file() for f in six_files(method)), f"{method}: {six_files(method)}"
        assert method in PRESETS, f"{method}: no verl preset"
        assert re.search(rf"^@\w+\{{{re.escape(SPECS[method].paper)},", bib, re.M), f"{method}: paper not in the bib"
    assert set(SPECS) == set(registry.list_methods()["method"])


def test_no_other_file_lists_the_methods_by_hand():
    found = hand_kept_lists(registry.list_methods()["method"])
    typed = {f: places for f, places in found.items() if f not in KNOWN}
    assert not typed, f"lists of the methods typed by hand (generate them from the registry or the specs): {typed}"
    # a KNOWN list names the methods of its day, not those added since; it is stale once it no longer lists even
    # three methods every such list had
    still = hand_kept_lists(["grpo", "gspo", "cispo"])
    assert sorted(set(KNOWN) - set(still)) == [], "no longer a hand-kept list: remove it from KNOWN"


def test_the_rule_finds_a_typed_list_and_skips_generated_ones():
    methods = ["grpo", "dr_grpo", "cispo"]
    assert lists_of_every_method("Intro.\n\n- GRPO\n- Dr. GRPO\n- CISPO\n", methods) == ["- GRPO"]
    assert lists_of_every_method("#### GRPO\nx\n\n#### Dr. GRPO\n\n#### CISPO\n", methods) == ["#### GRPO"]
    assert lists_of_every_method('ALL = ["grpo", "dr_grpo", "cispo"]\n', methods) != []
    assert lists_of_every_method("GRPO and Dr. GRPO.\n\nCISPO.\n", methods) == []  # not one paragraph
    assert lists_of_every_method("Dr. GRPO and CISPO\n", methods) == []  # GRPO only inside Dr. GRPO
    generated = book_pages.method_pages_table()
    assert lists_of_every_method(generated, list(SPECS)) == []
    assert lists_of_every_method(generated.replace("<!-- rlkit method pages -->\n", ""), list(SPECS)) != []


def test_a_new_method_joins_every_generated_list(monkeypatch):
    """A method registered with a spec (ZETA here) appears in the table of contents, the intro's and the papers
    page's tables and the README's without an edit to them."""
    specs = list(book_pages.method_specs())
    last = Path(specs[-1].notebook).stem  # the last method page today
    zeta = Spec(name="zeta", notebook="notebooks/99_zeta.md", title="ZETA: a method added later", method="zeta",
                paper="zeta2026")
    monkeypatch.setattr(book_pages, "method_specs", lambda specs_dir=None: [*specs, zeta])
    registry.register_method(registry.Method("zeta", registry.get_method("grpo").config, advantage="grpo",
                                             policy_loss="ppo"))
    try:
        pages = {path.name: book_pages.update_book_page(path.read_text())
                 for path in book_pages.generated_pages()}
    finally:
        registry.unregister("zeta")
    assert f"      - file: notebooks/{last}\n      - file: notebooks/99_zeta\n      # end\n" in pages["_toc.yml"]
    assert "| {doc}`ZETA <notebooks/99_zeta>` | a method added later |\n<!-- end -->" in pages["intro.md"]
    assert "{cite:t}`zeta2026`" in pages["papers.md"]
    assert "| **ZETA** | `rlkit/methods/zeta.py` | a method added later |\n<!-- end -->" in pages["README.md"]


def test_the_readme_names_the_six_files_and_the_command():
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Adding a method"):]
    section = section[:section.find("\n## ", 3)] if "\n## " in section[3:] else section
    for f in ["rlkit/methods/<name>.py", "tests/test_<name>.py", "reproductions/specs/<name>.yaml",
              "notebooks/NN_<name>.md", "rlkit/verl/launch/presets.py", "book/references.bib",
              "python -m rlkit.lab.book_pages"]:
        assert f in section, f"README's Adding a method does not name {f}"
