"""Reproductions: the specs' runs (:mod:`rlkit.lab.specs`), trained side by side, the notebooks executed with
papermill, and the paper claims they test.

:func:`reproduce` trains the runs, then executes each notebook into ``<results>/<name>/``."""

from __future__ import annotations

import contextlib
import datetime
import heapq
import json
import multiprocessing
import os
import shutil
import signal
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rlkit import numerics, registry
from rlkit.errors import InvalidSetting
from rlkit.files import os_errors
from rlkit.lab import findings, judge, paths, reproduced
from rlkit.lab.claims import run_name
from rlkit.lab.cluster import RayRuns, probe
from rlkit.lab.runs import Run, finished, first_seed, load_run, seed_numbers
from rlkit.lab.specs import PlannedRun, Spec, load_specs
from rlkit.lab.specs import get_spec as get_spec  # the notebooks import it from here
from rlkit.tiny.config import build_config, default_config


def ensure_run(method: str, *, scale: str = "cpu", seed: int = 0, results: str | Path | None = None,
               device: str = "cpu", overrides: dict[str, Any] | None = None, name: str | None = None,
               regime: str = "standard", progress: bool = True) -> Run:
    """The run of ``method`` at ``<results>/<name>/seed<seed>``: reused (same config), resumed, or trained."""
    from rlkit.tiny.rl import differing_settings, train

    cfg = build_config(method, scale, {"seed": seed, **(overrides or {})}, regime=regime)
    run_dir = Path(results or paths.results_dir()) / (name or run_name(method, regime)) / f"seed{seed}"
    if finished(run_dir):
        saved = json.loads((run_dir / "config.json").read_text())
        wanted = json.loads(json.dumps(asdict(cfg), default=list))
        if changed := differing_settings(saved, wanted):
            raise ValueError(f"{run_dir} holds a finished run with another config ({', '.join(changed)} differ); "
                             "delete it or choose another name")
    else:
        train(cfg, run_dir, device=device, resume=True, progress=progress)  # starts afresh when there is nothing
    return load_run(run_dir)


def execute(spec: Spec, out_dir: Path, parameters: dict[str, Any], *, progress: bool = True) -> Path:
    """Execute ``spec``'s notebook into ``out_dir/<stem>.ipynb`` (a failed one: ``<stem>.failed.ipynb``)."""
    import jupytext
    import papermill
    from papermill.exceptions import PapermillExecutionError

    root = paths.project_root()
    if not (root / spec.notebook).exists():
        raise FileNotFoundError(f"spec {spec.name!r}: notebook {spec.notebook} does not exist in {root}")
    stem = Path(spec.notebook).stem
    output, failed = out_dir / f"{stem}.ipynb", out_dir / f"{stem}.failed.ipynb"
    with os_errors():
        out_dir.mkdir(parents=True, exist_ok=True)
        running = out_dir / f".{stem}.running.ipynb"
        try:
            papermill.execute_notebook(  # explicit fmt: a header without format_version still reads as MyST
                jupytext.read(root / spec.notebook, fmt="md:myst"), str(running), parameters=parameters,
                cwd=str(root), kernel_name="python3", progress_bar=progress,
                request_save_on_cell_execute=True)
        except PapermillExecutionError as e:
            running.replace(failed)
            raise NotebookFailed(spec.notebook, failed, e.exec_count, e.source, e.ename, e.evalue) from None
        except BaseException:
            running.unlink(missing_ok=True)
            raise
        without_machine_paths(running, out_dir.parent)
        running.replace(output)
        failed.unlink(missing_ok=True)  # an earlier failure, now superseded
    return output


def without_machine_paths(notebook: Path, results: Path) -> None:
    """Rewrite the executed ``notebook`` so that it names no folder of the machine that ran it."""
    text = notebook.read_text(encoding="utf-8")
    recorded = json.loads(text).get("metadata", {}).get("papermill", {}).get("parameters", {}).get("results")
    for absolute, shown in ((recorded, paths.results_shown(results)), (str(paths.project_root().resolve()), ".")):
        if isinstance(absolute, str) and Path(absolute).is_absolute() and absolute not in ("/", shown):
            text = text.replace(absolute, shown)
    notebook.write_text(text, encoding="utf-8")


class NotebookFailed(RuntimeError):
    """A notebook cell raised: which notebook, cell and error, and where the failed execution is kept."""

    def __init__(self, notebook: str, output: Path, cell: int, source: str, ename: str, evalue: str):
        self.notebook, self.output, self.cell, self.source, self.ename, self.evalue = (
            notebook, output, cell, source, ename, evalue)
        indented = "\n".join("    " + line for line in source.splitlines())
        super().__init__(f"{notebook} failed in cell [{cell}]:\n{indented}\n{ename}: {evalue}\n"
                         f"(executed notebook with the traceback: {output})")


def default_workers() -> int:
    """The CPUs this process may use (its affinity, not the machine's count): runs side by side by default."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS (macOS)
        return os.cpu_count() or 1


def usable_workers(workers: int | None) -> int | None:
    """``workers`` at most the CPUs this process may use (more is cut, with a warning); below 1 is refused."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidSetting(f"--workers {workers}: must be a whole number ≥ 1 (the runs trained side by "
                             "side)")
    cpus = default_workers()
    if workers > cpus:
        warnings.warn(f"--workers {workers} is more than the {cpus} CPUs this process may use: training "
                      f"{cpus} at a time (runs side by side on one CPU only share it)", stacklevel=2)
    return min(workers, cpus)


def train_runs(runs: Sequence[PlannedRun], *, scale: str, results: str | Path | None = None,
               device: str = "cpu", workers: int | None = None, ray_address: str | None = None,
               ray_shared: bool = False, progress: bool = True) -> dict[str, float]:
    """Train the planned runs not finished, one CPU thread each, side by side or on a Ray cluster."""
    from tqdm.auto import tqdm  # looked up at the call: tests replace the bar

    results = Path(results or paths.results_dir())
    todo = [p for p in runs if not finished(results / p.name / f"seed{p.seed}")]
    if not todo:
        return {}
    workers = default_workers() if workers is None else usable_workers(workers)
    cost = {p: _work(build_config(p.method, scale, dict(p.overrides), regime=p.regime)) for p in todo}
    # the longest runs first, so the workers finish together instead of one idling behind a late long run
    todo.sort(key=lambda p: -cost[p])
    label = {p: f"{p.name} seed {p.seed}" for p in todo}
    with contextlib.ExitStack() as stack:
        if ray_address:
            cluster = stack.enter_context(RayRuns(ray_address, results, shared=ray_shared))
            slots = cluster.cpus
            where = f"on the {slots} CPUs of the Ray cluster at {ray_address}"
            ended = cluster.train(todo, _train_one, scale=scale, device=device)
        else:
            from rlkit.tiny.sft import warm_start

            first = todo[0]
            warm_start(build_config(first.method, scale, dict(first.overrides), regime=first.regime).sft,
                       device=device, progress=progress)  # the cache the runs share, before they start side by side
            if workers == 1 or len(todo) == 1 or device != "cpu":
                slots, ended = 1, ((p, _train_one(p, scale, str(results), device)) for p in todo)
            else:
                slots = min(workers, len(todo))
                ended = _in_processes(todo, scale, str(results), device, slots)
            where = f"{slots} at a time"
        left = TimeLeft([cost[p] for p in todo], slots)
        order = {p: i for i, p in enumerate(todo)}
        bar = tqdm(total=len(todo), desc=f"runs ({where})", disable=not progress,
                   bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed} elapsed{postfix}")
        stack.callback(bar.close)
        bar.set_postfix_str(left.text())
        minutes: dict[str, float] = {}
        for done in ended:  # one pass per finished run (None: a tick of the clock), the bar moving as runs end
            if done is not None:
                p, m = done
                minutes[label[p]] = m
                left.ended(order[p], m * 60)
                bar.set_postfix_str(left.text(), refresh=False)
                bar.update()
            else:
                bar.set_postfix_str(left.text())
    return minutes


def _in_processes(todo: Sequence[PlannedRun], scale: str, results: str, device: str, workers: int,
                  tick: float = 5.0):
    """Train ``todo`` in ``workers`` processes; yield ``(run, minutes)`` as each ends, None each ``tick``."""
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet_interrupt)
    try:
        futures = {pool.submit(_train_one, p, scale, results, device): p for p in todo}
        processes = list(getattr(pool, "_processes", {}).values())  # kept: a broken pool forgets them
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=tick, return_when=FIRST_COMPLETED)
            if not finished:
                yield None
            for f in finished:
                p = futures[f]
                try:
                    minutes = f.result()
                except BaseException as e:
                    if isinstance(e, BrokenProcessPool) and _ended_by_ctrl_c(processes):  # Ctrl-C reached a worker
                        raise KeyboardInterrupt from None  # before the launcher
                    raise RuntimeError(f"run {p.name} seed {p.seed} failed: {type(e).__name__}: {e}") from e
                yield p, minutes
    except BaseException:  # a failed run, Ctrl-C: the other runs stop now (each resumes from its last checkpoint)
        workers_left = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in workers_left:
            process.terminate()
        raise
    pool.shutdown()


def _ended_by_ctrl_c(processes, wait: float = 5.0) -> bool:
    """Whether a worker ended with :func:`_quiet_interrupt`'s code 130 (asked for up to ``wait`` s)."""
    deadline = time.monotonic() + wait
    while True:
        codes = [w.exitcode for w in processes]
        if 130 in codes or None not in codes or time.monotonic() > deadline:
            return 130 in codes
        time.sleep(0.01)


def _quiet_interrupt() -> None:
    """A worker's Ctrl-C: end at once, without a traceback (the run resumes from its last checkpoint)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


class TimeLeft:
    """The time left of runs taken in order, ``slots`` at a time, at the rate the ended runs took per cost."""

    def __init__(self, costs: Sequence[float], slots: int, now: float | None = None):
        self.costs = list(costs)
        self.slots = max(1, min(slots, len(self.costs)))
        now = time.monotonic() if now is None else now
        self.started = {i: now for i in range(self.slots)}
        self.done: set[int] = set()
        self.cost_done = self.seconds_done = 0.0

    def ended(self, i: int, seconds: float, now: float | None = None) -> None:
        """Run ``i`` ended after ``seconds`` of training: the next one waiting takes its slot."""
        now = time.monotonic() if now is None else now
        self.done.add(i)
        self.cost_done += self.costs[i]
        self.seconds_done += seconds
        waiting = next((j for j in range(len(self.costs)) if j not in self.started), None)
        if waiting is not None:
            self.started[waiting] = now

    def seconds(self, now: float | None = None) -> float:
        """Seconds until the last run ends: the running ones' rest, then the waiting ones on free slots."""
        now = time.monotonic() if now is None else now
        rate = self.seconds_done / self.cost_done if self.cost_done else 1.0
        free = [max(self.costs[i] * rate - (now - t), 0.0) for i, t in self.started.items() if i not in self.done]
        free += [0.0] * (self.slots - len(free))
        heapq.heapify(free)
        for j in range(len(self.costs)):
            if j not in self.started:
                heapq.heappush(free, heapq.heappop(free) + self.costs[j] * rate)
        return max(free) if len(self.done) < len(self.costs) else 0.0

    def text(self, now: float | None = None) -> str:
        """``~12:34 left``; ``time left: ?`` while no run has ended and one outlasted its estimate."""
        from tqdm import tqdm

        now = time.monotonic() if now is None else now
        if not self.done and any(now - t > self.costs[i] for i, t in self.started.items()):
            return "time left: ? until a run ends"
        return f"~{tqdm.format_interval(self.seconds(now))} left"


def _work(cfg) -> float:
    """A run's relative cost: about its seconds on one core at cpu scale (0.5 s a step's sampling)."""
    return cfg.steps * (0.5 + cfg.ppo_epochs * (1.2 + 0.15 * cfg.mini_batches))


def _train_one(p: PlannedRun, scale: str, results: str, device: str) -> float:
    """One planned run in a worker process, local or a Ray task, on one torch thread."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ensure_run(p.method, scale=scale, seed=p.seed, results=results, device=device, name=p.name, regime=p.regime,
               overrides=dict(p.overrides), progress=False)
    return (time.perf_counter() - t0) / 60


def _where(workers: int | None, ray_address: str | None) -> str:
    """Where :func:`train_runs` trains, in words."""
    if ray_address:
        return f"one CPU each, as tasks of the Ray cluster at {ray_address}"
    if workers is None:
        return (f"{default_workers()} at a time, one CPU thread each, as many as the CPUs this process may use: "
                "--workers N to change")
    return f"{workers} at a time, one CPU thread each"


def reproduce(*, only: Sequence[str] | None = None, scale: str | None = None, seeds: int | None = None,
              results: str | Path | None = None, device: str = "cpu", specs_dir: str | Path | None = None,
              workers: int | None = None, ray_address: str | None = None, ray_shared: bool = False,
              progress: bool = True, rounds: int | None = None) -> dict[str, Any]:
    """Train the specs' runs and seed rounds, judge the claims, execute the notebooks, compare."""
    if seeds is not None and (not isinstance(seeds, int) or seeds < 1):
        raise ValueError(f"seeds must be an integer ≥ 1, got {seeds!r}")
    specs = load_specs(specs_dir)  # no project: ProjectNotFound, before anything is trained
    workers = usable_workers(workers)
    if ray_address:
        probe(ray_address)  # one that does not answer: refused now, not after minutes of Ray's retries
    root, published = paths.project_root(), paths.published_dir()
    if only:
        names = {s.name for s in specs}
        unknown = sorted(set(only) - names)
        if unknown:
            raise KeyError(f"unknown reproductions {unknown}; valid: {', '.join(sorted(names))}")
        specs = [s for s in specs if s.name in only]
    results = Path(results or paths.results_dir()).resolve()
    # notebooks run with the project as working directory: a path inside it is shown relative, as on the CLI
    shown = results.relative_to(root) if results.is_relative_to(root) else results
    minutes: dict[str, float] = {}
    by_scale: dict[str, list[PlannedRun]] = {}
    for spec in specs:
        by_scale.setdefault(scale or spec.scale, []).extend(spec.runs(seeds, results))
    for s, planned in by_scale.items():
        t0 = time.perf_counter()
        planned = list(dict.fromkeys(planned))
        print(f"training {len(planned)} runs at {s} scale ({_where(workers, ray_address)}; finished ones are reused)",
              flush=True)
        train_runs(planned, scale=s, results=results, device=device, workers=workers, ray_address=ray_address,
                   ray_shared=ray_shared, progress=progress)
        minutes[f"runs at {s} scale"] = (time.perf_counter() - t0) / 60
    # the sequential seed rule (issue 32), but with --seeds N or at another scale than the specs' own
    sequential = seeds is None and all((scale or s.scale) == s.scale for s in specs)
    if sequential:
        minutes.update(seed_rounds(specs, results, scale=scale, specs_dir=specs_dir, progress=progress,
                                   device=device, workers=workers, ray_address=ray_address, ray_shared=ray_shared,
                                   max_rounds=rounds))
    judged = judge.judge_all(specs, results, seeds, sequential=sequential,  # before the pages that render them
                             context=load_specs(specs_dir))
    if judged:
        print(f"claims: {len(judged)} judged -> {judge.save(judged, results)}", flush=True)
        if sequential and judge.rule_finished(specs, judged):  # the rule has ended: what it left undecided
            left = findings.at_the_cap(judged)
            print("claims: the seed rule is finished;" + (left or " every judged claim is decided or idle."),
                  flush=True)
    done: list[Path] = []
    for i, spec in enumerate(specs, 1):
        # seeds as judged: None (every seed the rounds left), --seeds N, or each spec's own at another scale
        params = {"scale": scale or spec.scale, "results": str(shown), "device": device, "progress": False,
                  "seeds": None if sequential else seeds or spec.seeds, **spec.parameters}
        print(f"[{i}/{len(specs)}] {spec.name}: {spec.notebook} at {params['scale']} scale", flush=True)
        t0 = time.perf_counter()
        done.append(execute(spec, spec.out_dir(results), params, progress=progress))
        minutes[spec.name] = (time.perf_counter() - t0) / 60
        print(f"[{i}/{len(specs)}] {spec.name}: done in {minutes[spec.name]:.1f} min -> {done[-1]}", flush=True)
    compared = None
    if published.is_dir() and results != published.resolve():  # did I reproduce? (rlkit/lab/reproduced.py)
        compared = reproduced.report(results, published, specs)
    return {"notebooks": done, "minutes": minutes, "reproduced": compared}


def seed_rounds(specs: Sequence[Spec], results: Path, *, scale: str | None = None,
                specs_dir: str | Path | None = None, progress: bool = True, max_rounds: int | None = None,
                **train: Any) -> dict[str, float]:
    """The sequential seed rule's rounds (:func:`rlkit.lab.judge.next_round`); returns minutes per round."""
    every = load_specs(specs_dir)
    templates = {p.name: (p, scale or spec.scale) for spec in every for p in spec.runs(1)}
    minutes: dict[str, float] = {}
    asked: list[dict[str, int]] = []
    while (max_rounds is None or len(asked) < max_rounds) and (needed := judge.next_round(specs, results, context=every)):
        if needed in asked:  # trained, yet still short: a run did not finish; stop rather than loop
            raise RuntimeError(f"the seed rounds asked twice for {needed}: the runs did not finish")
        asked.append(needed)
        t0 = time.perf_counter()
        print(f"seed round {len(asked)}: " + ", ".join(f"{n} to {k} seeds" for n, k in sorted(needed.items())),
              flush=True)
        by_scale: dict[str, list[PlannedRun]] = {}
        for name, n in needed.items():
            p, s = templates[name]
            by_scale.setdefault(s, []).extend(PlannedRun(p.name, p.method, p.regime, k, p.overrides)
                                              for k in seed_numbers(n, first_seed(results)))
        for s, planned in by_scale.items():
            train_runs(planned, scale=s, results=results, progress=progress, **train)
        minutes[f"seed round {len(asked)}"] = (time.perf_counter() - t0) / 60
    return minutes


def ship_start(scale: str = "cpu", *, specs_dir: str | Path | None = None, cache_dir: str | Path | None = None,
               progress: bool = True) -> dict[str, Any]:
    """Maintainers: train and ship the SFT start of ``scale`` with the offline passes of the planned runs;
    returns its manifest entry (``spo_offline``: the passes' files)."""
    from rlkit.tiny.checkpoint import environment
    from rlkit.tiny.machine import fingerprint
    from rlkit.tiny.rl import side_run
    from rlkit.tiny.sft import SHIPPED_DIR, load_checkpoint, offline_scores, shipped_manifest, warm_start
    from rlkit.tiny.task import build_tokenizer

    sft = default_config(scale).sft
    name = f"sft-{sft.key(build_tokenizer())}.pt"
    _, _, info = warm_start(sft, cache_dir=cache_dir, progress=progress, retrain=True)
    SHIPPED_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copy(info["path"], SHIPPED_DIR / name)
    env = environment(default_config(scale), "cpu")
    entry = {"sha256": info["sha256"], "val_acc": info["val/acc"], "loss": info["loss"], "steps": info["steps"],
             "minutes": round(info["minutes"], 2), "scale": scale, "made": datetime.date.today().isoformat(),
             "commit": env["commit"], "dirty": env["dirty"], "torch": env["torch"],
             # the machine that trained the weights (recorded by the training itself), and the one that shipped them
             "processor": info.get("processor"), "fingerprint": info.get("fingerprint"),
             "shipped_on": {"processor": numerics.cpu_model(), "fingerprint": fingerprint(),
                            "kernels": numerics.kernels()},
             "curve": info.get("curve", {}), "spo_offline": []}
    manifest = {**shipped_manifest(), name: entry}
    model, shipped = load_checkpoint(SHIPPED_DIR / name, "cpu", info["sha256"])
    tokenizer, shipped = build_tokenizer(), {**shipped, "source": "shipped"}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the reproduction's workers sample it
    try:
        planned = {p for s in load_specs(specs_dir) for p in s.runs()
                   if registry.get_method(p.method).offline_pass is not None}
        for p in sorted(planned, key=lambda p: (p.name, p.seed)):
            cfg = build_config(p.method, scale, {"seed": p.seed, **dict(p.overrides)}, regime=p.regime)
            n = registry.get_method(p.method).offline_samples(cfg.method_configs[p.method])
            if cfg.sft != sft or not n:
                continue
            run, gen = side_run(cfg, model, tokenizer)  # the run's pool, budget and sampling generator
            before = set(SHIPPED_DIR.glob("offline-*.pt"))
            model.train()  # as rl.train holds it when the pass runs
            offline_scores(run, gen, n, sft=shipped, cache_dir=SHIPPED_DIR)
            entry["spo_offline"] += sorted(f.name for f in set(SHIPPED_DIR.glob("offline-*.pt")) - before)
    finally:
        torch.set_num_threads(threads)
    (SHIPPED_DIR / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return entry
