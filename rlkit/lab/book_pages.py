"""The book's generated blocks: the presets table, commands and list of verl twins of the *Full-scale runs* page.

The page (``book/full_scale_runs.md``) is hand-written except between markers: ``<!-- rlkit presets -->``
holds :func:`presets_table`; each ``<!-- rlkit launch METHOD DATASET -->`` the ``rlkit launch`` line of that
run (:data:`BOOK_RUNS`) and the ``main_ppo`` command it validates and runs (:func:`book_block`);
``<!-- rlkit cpu command -->`` the CPU launch line with the methods it takes (:func:`cpu_command`); and
``<!-- rlkit twins -->`` the methods that have a verl twin on the *Two engines* page and those that have none
yet (:func:`twins_block`, from :func:`rlkit.lab.two_engines.twins`). Each block ends at ``<!-- end -->``.
:func:`update_book_page` re-renders them all from today's presets (:mod:`rlkit.verl.presets`), plan
(:func:`rlkit.verl.launch.plan`) and twins; a test fails when the page differs from it. The methods are the
registry's that have a verl preset, in the figures' order (:func:`rlkit.lab.plots.methods`).
Nothing here imports verl.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from rlkit.lab import two_engines
from rlkit.lab.plots import methods
from rlkit.verl.launch import plan
from rlkit.verl.presets import CPU_STEPS, PRESETS, dataset_spec, method_preset

BOOK_METHODS = [m for m in methods() if m in PRESETS]
"""The methods the page shows: every registered method verl has a preset for, in the figures' order."""
DAPO_RUNS: dict[str, tuple[str, int, int]] = {
    "grpo": ("Qwen/Qwen3-8B", 8, 1),  # SPO's GRPO baseline (method notes: SPO)
    "gspo": ("Qwen/Qwen3-8B-Base", 8, 1),  # the paper's Qwen3-30B-A3B-Base is MoE: Megatron territory
    "aspo": ("Qwen/Qwen3-8B", 8, 1),  # ASPO §4.1
    "aepo": ("Qwen/Qwen3-4B", 8, 1),  # ARLArena's math trainer, 4B (method notes: AEPO)
    "spo": ("Qwen/Qwen3-8B", 8, 1),  # SPO (method notes: SPO)
    "hapo": ("Qwen/Qwen3-8B-Base", 8, 4),  # v1 Table 1's Qwen3 row, 32×A100 (method notes: HAPO)
}
"""Each method's DAPO-Math run as its paper ran it: (model, GPUs per node, nodes); a method it does not name runs as
GRPO's (Qwen3-8B on one node of 8 GPUs)."""

#: The runs the book's "Full-scale runs" page shows: dataset → method → (model, GPUs per node, nodes).
BOOK_RUNS: dict[str, dict[str, tuple[str, int, int]]] = {
    "gsm8k": {m: ("Qwen/Qwen2.5-0.5B-Instruct", 1, 1) for m in BOOK_METHODS},  # one 80 GB GPU
    "dapo": {m: DAPO_RUNS.get(m, DAPO_RUNS["grpo"]) for m in BOOK_METHODS},
}


NO_DUAL_CLIP = ("cispo",)
"""Loss modes with no dual clip (their loss never reads ``clip_ratio_c``): the presets table shows "—" for their c."""

RAY_HEAD = "HEAD:6379"
"""The Ray address the page's multi-node commands show (the cluster's head node)."""


def render_command(method: str, dataset: str, model: str | None = None, *, gpus: int | None = None,
                   nodes: int | None = None, extra: Sequence[str] = ()) -> str:
    """The ``rlkit launch`` line and the ``main_ppo`` command it runs (defaults: :data:`BOOK_RUNS`)."""
    method_preset(method), dataset_spec(dataset)  # unknown names fail here, listing the valid ones
    default_model, default_gpus, default_nodes = BOOK_RUNS[dataset][method]
    model, gpus, nodes = model or default_model, gpus or default_gpus, nodes or default_nodes
    ray = RAY_HEAD if nodes != 1 else None  # several nodes run on a Ray cluster started beforehand
    p = plan(method, dataset, model, gpus=gpus, nodes=nodes, ray_address=ray, extra=extra)
    launch = ["rlkit", "launch", "--method", method, "--dataset", dataset, "--model", model,
              "--gpus", str(gpus)]
    if nodes != 1:
        launch += ["--nodes", str(nodes), "--ray-address", ray]
    if extra:
        launch += ["--", *extra]
    return " ".join(shlex.quote(w) for w in launch) + "\n" + p.shell(multiline=True)


_BLOCK = re.compile(r"<!-- rlkit (presets|twins|cpu command|launch (\w+) (\w+)) -->\n.*?<!-- end -->", re.S)


def presets_table() -> str:
    """The page's tables of presets, two narrow ones that fit the text column: what each method's loss is, and how
    its batch is drawn on DAPO-Math, as in its paper."""
    loss = ["method", "`adv_estimator`", "`loss_mode`", "clip ε_low / ε_high / c", "loss aggregation"]
    batch = ["method", "responses per prompt", "updates per batch", "prompts per step", "max response",
             "DAPO mechanics", "tools"]
    tables = {"loss": [loss], "batch": [batch]}
    actor = "actor_rollout_ref.actor."
    for method in BOOK_METHODS:
        preset = PRESETS[method]
        keys = {**preset.keys, **preset.dapo}
        mode = keys[actor + "policy_loss.loss_mode"]
        c = "—" if any(m in mode for m in NO_DUAL_CLIP) else f"{keys[actor + 'clip_ratio_c']:g}"
        clip = " / ".join([*(f"{keys[actor + 'clip_ratio_' + k]:g}" for k in ("low", "high")), c])
        mechanics = [name for name, on in (
            ("dynamic sampling", keys.get("algorithm.filter_groups.enable")),
            ("overlong penalty", keys.get("reward.reward_manager.name") == "dapo")) if on]
        tables["loss"].append([method, keys["algorithm.adv_estimator"], mode, clip,
                               keys[actor + "loss_agg_mode"]])
        tables["batch"].append([method, preset.n, preset.updates, preset.dapo_prompts,
                                f"{keys['data.max_response_length']:,}", ", ".join(mechanics) or "—",
                                "Python sandbox" if preset.tools else "—"])

    def markdown(rows: list[list]) -> list[str]:
        return ["| " + " | ".join(map(str, rows[0])) + " |", "|" + "---|" * len(rows[0])] + [
            "| " + " | ".join(map(str, r)) + " |" for r in rows[1:]]

    lines = ["The loss:", "", *markdown(tables["loss"]), "", "The batch, on DAPO-Math as in each paper (prompts and "
             "responses per step, optimizer updates per batch, the response budget in tokens):", "",
             *markdown(tables["batch"])]
    return "<!-- rlkit presets -->\n" + "\n".join(lines) + "\n<!-- end -->"


def cpu_command() -> str:
    """The page's CPU launch line, naming every method it takes (:data:`BOOK_METHODS`) and the default step count."""
    return ("<!-- rlkit cpu command -->\n```bash\nrlkit launch --method grpo --device cpu              # any of "
            f"{', '.join(BOOK_METHODS)}; --steps N (default {CPU_STEPS})\n```\n<!-- end -->")


def twins_block(verl_root: Path | str | None = None) -> str:
    """The page's list of the methods that have a verl twin on the *Two engines* page and those that have none
    (:func:`rlkit.lab.two_engines.twins_words`; default: the published twins)."""
    words = two_engines.twins_words(verl_root)
    return (f"<!-- rlkit twins -->\nThe methods with a twin: {words['twin_methods']}; "
            f"{words['no_twin_methods']}.\n<!-- end -->")


def book_block(method: str, dataset: str) -> str:
    """The page's Markdown for one run: the launch line, and the ``main_ppo`` command in a dropdown."""
    launch_line, _, command = render_command(method, dataset).partition("\n")
    return (f"<!-- rlkit launch {method} {dataset} -->\n```bash\n{launch_line}\n```\n\n"
            f":::{{dropdown}} The verl command it validates and runs\n```bash\n{command}\n```\n:::\n"
            "<!-- end -->")


def update_book_page(text: str) -> str:
    """``text`` with its ``<!-- rlkit presets -->`` table, its CPU command, its list of twins and every
    ``<!-- rlkit launch METHOD DATASET -->`` block re-rendered from today's presets and twins (the tests check
    that the book's page is up to date)::

        python -c "from pathlib import Path; from rlkit.lab.book_pages import update_book_page as u; \\
                   p = Path('book/full_scale_runs.md'); p.write_text(u(p.read_text()))"
    """
    def render(match: re.Match) -> str:
        fixed = {"presets": presets_table, "twins": twins_block, "cpu command": cpu_command}.get(match.group(1))
        return fixed() if fixed else book_block(match.group(2), match.group(3))

    return _BLOCK.sub(render, text)
