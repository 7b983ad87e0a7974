"""The reproductions' specs: ``reproductions/specs/<name>.yaml`` names a notebook, its method, seeds, scale
and claims, checked when it loads; :meth:`Spec.runs` plans the tiny-engine runs it needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkit.lab import paths
from rlkit.lab.claims import Claim, run_name
from rlkit.lab.runs import FIRST_SEED, first_seed, seed_numbers
from rlkit.lab.stats import SeedRule
from rlkit.tiny.config import REGIMES, build_config


ANATOMY = {"samples": "samples", "advantage": "advantage", "ratio": "ratio and clip", "aggregation": "aggregation"}
"""The four parts every method shares (a spec's ``anatomy`` keys → the overview table's column headings)."""


@dataclass
class Spec:
    """One reproduction: ``reproductions/specs/<name>.yaml``."""

    name: str
    notebook: str
    """Path of the MyST notebook, relative to the project root."""
    title: str = ""
    method: str | None = None
    """The method the notebook trains (None: overview / comparison, which read the others' runs)."""
    topic: bool = False
    """The page is about a topic: it trains and judges runs of ``method``, which has its own page."""
    paper: str = ""
    """Citation key in book/references.bib."""
    scale: str = "cpu"
    seeds: int = 3
    """Seeds of every run to start with, from :data:`rlkit.lab.runs.FIRST_SEED`."""
    regimes: list[str] = field(default_factory=lambda: ["standard"])
    """The regimes the method is run in (:data:`rlkit.tiny.config.REGIMES`)."""
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Further runs of the method: directory name → config overrides (in each of :attr:`variant_regimes`)."""
    variant_regimes: list[str] = field(default_factory=lambda: ["standard"])
    """The regimes every variant runs in (``<variant>-<regime>`` outside the standard one)."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Extra papermill parameters."""
    claims: list[Claim] = field(default_factory=list)
    seed_rule: dict[str, int] = field(default_factory=dict)
    """The sequential seed rule's ``batch`` and ``cap`` (:class:`rlkit.lab.stats.SeedRule`)."""
    anatomy: dict[str, str] = field(default_factory=dict)
    """A method's row of the overview's table (:data:`ANATOMY`, Markdown; "as GRPO" where alike)."""

    def __post_init__(self) -> None:
        if not isinstance(self.seeds, int) or self.seeds < 1:
            raise ValueError(f"spec {self.name!r}: seeds must be an integer ≥ 1, got {self.seeds!r}")
        unknown = sorted((set(self.regimes) | set(self.variant_regimes)) - set(REGIMES))
        if unknown:
            raise ValueError(f"spec {self.name!r}: unknown regimes {unknown}; valid: {', '.join(REGIMES)}")
        if (self.variants or self.regimes != ["standard"]) and not self.method:
            raise ValueError(f"spec {self.name!r}: regimes and variants need a method")
        if self.method and self.claims:
            SeedRule(start=self.seeds, **self.seed_rule)  # a bad rule fails when the spec loads
        if self.anatomy and set(self.anatomy) - {"label"} != set(ANATOMY):
            raise ValueError(f"spec {self.name!r}: anatomy must give {', '.join(ANATOMY)} (and may give a label) — "
                             f"its row of the overview's table; got {', '.join(sorted(self.anatomy))}")
        if self.anatomy and not self.method:
            raise ValueError(f"spec {self.name!r}: anatomy is a method's row; this spec trains no method")
        if self.topic and not self.method:
            raise ValueError(f"spec {self.name!r}: a topic page trains runs of a method: give its method")
        if self.topic and (self.anatomy or self.paper):
            raise ValueError(f"spec {self.name!r}: a topic page is not its method's page: anatomy and paper are the "
                             f"method page's (reproductions/specs/{self.method}.yaml)")

    @property
    def method_page(self) -> bool:
        """Whether the page is its method's own (a method, no :attr:`topic`): the book lists these."""
        return bool(self.method) and not self.topic

    @classmethod
    def load(cls, path: str | Path) -> Spec:
        import yaml

        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: not valid YAML: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a spec is a mapping")
        valid = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - valid)
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown}; valid: {', '.join(sorted(valid))}")
        try:
            claims = [Claim(**c) for c in raw.pop("claims", [])]
            spec = cls(claims=claims, **raw)
            spec.check()
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{path}: {e}") from None
        return spec

    def runs(self, seeds: int | None = None, results: str | Path | None = None) -> list[PlannedRun]:
        """Every run this reproduction trains, each seed from the first of the publication in ``results``."""
        if not self.method:
            return []
        named = [(run_name(self.method, r), r, {}) for r in self.regimes]
        named += [(run_name(name, r), r, dict(overrides)) for name, overrides in self.variants.items()
                  for r in self.variant_regimes]
        first = first_seed(results) if results else FIRST_SEED
        return [PlannedRun(name, self.method, regime, k, tuple(sorted(overrides.items())))
                for name, regime, overrides in named for k in seed_numbers(seeds or self.seeds, first)]

    def check(self) -> None:
        """Fail now, not on the page, if a run's overrides do not build or a claim reads no logged metric."""
        from rlkit.tiny.rl import LOGGED_WHEN_STALE, logged_metrics

        planned = {p.name: p for p in self.runs(1)}
        configs = {name: build_config(p.method, self.scale, dict(p.overrides), regime=p.regime)
                   for name, p in planned.items()}
        for k, claim in enumerate(self.claims, 1):
            claim.id = claim.id or f"{self.name}-{k}"
            if not claim.judged:
                continue
            name = run_name(claim.run or self.method or "", claim.regime)
            cfg = configs.get(name)
            if cfg is None:
                raise ValueError(f"claim {claim.claim!r}: run {name!r} is not one of this spec's runs "
                                 f"({', '.join(configs) or 'none'})")
            compared = [] if claim.expect in ("rise", "at_least") or claim.baseline_metric else \
                [claim.baseline, *claim.without]
            # what each run logs: its method's metrics in its regime, with its own overrides (if of this spec)
            needs = [(m, name, cfg.method, claim.regime) for m in claim.metrics()]
            needs += [(claim.metric, n, n.split("-")[0], claim.baseline_regime or claim.regime) for n in compared]
            for metric, run, method, regime in needs:
                own = dict(planned[run].overrides) if run in planned else {}
                logged = logged_metrics(method, regime=regime, overrides=own)
                if metric not in logged:
                    raise ValueError(f"claim {claim.claim!r}: metric {metric!r} is not logged by {run} runs "
                                     f"({regime} regime); logged: {', '.join(sorted(logged))}")
                tail = cfg.policy_eval_tail
                if metric in LOGGED_WHEN_STALE and tail is not None and claim.window > tail:
                    raise ValueError(f"claim {claim.claim!r}: reads the last {claim.window} values of {metric!r}, "
                                     f"logged at every step of a {claim.regime} run's last {tail} only "
                                     "(policy_eval_tail): a longer window would mix in steps far apart")

    def out_dir(self, results: Path) -> Path:
        """Where the executed notebook goes (its runs: ``seed<k>/`` below the run names)."""
        return Path(results) / self.name


@dataclass(frozen=True)
class PlannedRun:
    """One tiny-engine run a reproduction needs: ``<results>/<name>/seed<seed>``."""

    name: str
    method: str
    regime: str
    seed: int
    overrides: tuple[tuple[str, Any], ...] = ()


def load_specs(specs_dir: str | Path | None = None) -> list[Spec]:
    """Every spec in ``specs_dir`` (default: the project's), in notebook order."""
    specs_dir = Path(specs_dir) if specs_dir else paths.specs_dir()
    specs = [Spec.load(p) for p in sorted(specs_dir.glob("*.yaml"))]
    if not specs:
        raise FileNotFoundError(f"no specs in {specs_dir}")
    return sorted(specs, key=lambda s: Path(s.notebook).name)


def get_spec(name: str, specs_dir: str | Path | None = None) -> Spec:
    specs = {s.name: s for s in load_specs(specs_dir)}
    if name not in specs:
        raise KeyError(f"no spec {name!r}; valid: {', '.join(specs)}")
    return specs[name]
