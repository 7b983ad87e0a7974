"""The reproduction app finds its project in one place (rlkit/lab/paths.py) and says so in one line when there is
none; its figures and pages take the methods from the registry, so a method registered later is drawn too."""

from __future__ import annotations

import pytest

from rlkit.cli import main
from rlkit.errors import UsageError
from rlkit.lab import paths, plots, two_engines

CHECKOUT = paths.project_root()  # the tests run in a checkout


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """A directory holding no project, as the working directory, with no RLKIT_PROJECT and no checkout above the
    installed package (a wheel's site-packages)."""
    monkeypatch.delenv(paths.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "_checkout", lambda: tmp_path / "site-packages")
    return tmp_path


def make_project(root):
    for marker in paths.MARKERS:
        (root / marker).mkdir(parents=True)
    return root


def test_no_project_is_a_usage_error_saying_what_where_and_what_to_do(nowhere):
    assert paths.find_project() is None
    with pytest.raises(paths.ProjectNotFound) as info:
        paths.specs_dir()
    message = str(info.value)
    assert isinstance(info.value, UsageError) and info.value.exit_code == 2
    assert "\n" not in message
    for part in ("reproductions/specs/", "notebooks/", str(nowhere), "site-packages", "checkout", paths.ENV):
        assert part in message, (part, message)


def test_rlkit_project_names_the_checkout_from_anywhere(nowhere, monkeypatch):
    monkeypatch.setenv(paths.ENV, str(CHECKOUT))
    assert paths.project_root() == CHECKOUT
    assert paths.specs_dir() == CHECKOUT / "reproductions" / "specs" and paths.specs_dir().is_dir()
    assert paths.results_dir() == CHECKOUT / "reproductions" / "results"
    assert paths.published_dir() == CHECKOUT / "reproductions" / "results-cpu"
    assert paths.book_dir() == CHECKOUT / "book"


def test_rlkit_project_naming_no_project_is_refused_not_ignored(nowhere, monkeypatch):
    make_project(nowhere / "elsewhere")
    monkeypatch.chdir(nowhere / "elsewhere")  # a project here does not stand in for a wrong RLKIT_PROJECT
    monkeypatch.setenv(paths.ENV, str(nowhere))
    with pytest.raises(paths.ProjectNotFound, match=f"{paths.ENV}=.* is not an rlkit project"):
        paths.project_root()


def test_the_project_is_found_from_a_folder_below_it(nowhere, monkeypatch):
    root = make_project(nowhere / "proj")
    (root / "notebooks" / "deep").mkdir()
    monkeypatch.chdir(root / "notebooks" / "deep")
    assert paths.project_root() == root.resolve()


def test_cli_reproduce_without_a_project_exits_2_with_one_line(nowhere, capsys):
    with pytest.raises(SystemExit) as info:
        main(["reproduce", "--help"])
    assert info.value.code == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["reproduce", "--only", "grpo"])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("rlkit reproduce: no rlkit project found") and "\n" not in err
    assert main(["env", "--json"]) == 0  # the library's commands need no project


def test_a_method_registered_later_is_shown_last_in_a_colour_of_its_own(monkeypatch):
    from rlkit import registry
    from rlkit.lab.book_pages import method_specs

    real = registry.list_methods()
    later = sorted([*real["method"], "zeta"])
    monkeypatch.setattr(registry, "list_methods", lambda: {**real, "method": later})
    shown = plots.methods()
    assert shown == [*(s.method for s in method_specs()), "zeta"]  # the book's order, GRPO's page first
    colors = [plots.method_color(m) for m in shown]
    assert len(set(colors)) == len(colors), "two methods share a colour"
    # a run folder's name: a palette colour no method has, not an error
    assert plots.method_color("not-a-method") in set(plots.PALETTE) - set(colors)
    assert two_engines.quantities("cispo") == two_engines.QUANTITIES  # no own metric: the shared ones
    with pytest.raises(KeyError, match="valid: grpo, gspo"):
        two_engines.quantities("nope")

    def no_project():
        raise paths.ProjectNotFound("no project")

    monkeypatch.setattr(paths, "specs_dir", no_project)
    assert plots.methods() == sorted(shown)  # outside a checkout: by name
