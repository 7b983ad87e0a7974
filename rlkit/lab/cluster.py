"""The reproduction's runs on a Ray cluster, each a task of one CPU (``rlkit reproduce --ray-address ADDR``).

:class:`RayRuns` sends every run to the cluster as a ``num_cpus=1`` task that trains it as a local worker does
(:func:`worker_env`), in a scratch folder whose files come back (a killed run sent along and resumed), or with
``shared=True`` straight into results on storage every node mounts. A task lost with its node is retried
(:data:`RETRIES`); a run that raises ends the reproduction."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rlkit import environ, numerics
from rlkit.errors import RunError, UsageError
from rlkit.files import atomic_write

RETRIES = 3
"""Times a task lost with its node or worker is run again (``max_retries``)."""
TICK_S = 5.0
"""How often the waiting loop hands back control without a finished run (the progress bar's clock)."""
RLKIT_ENV = ("RLKIT_NUMERICS", "RLKIT_RETRAIN_SFT")
"""rlkit's own switches that change a run's numbers, passed on to the workers when set here."""


PROBE_S = 10.0
"""Seconds a Ray address has to resolve and to accept a connection before the reproduction is refused."""
CLIENT_PORT = 10001
"""The port of a ``ray://HOST`` address without one (Ray client's default)."""
LOCAL = ("auto", "local")
"""Addresses that name no host: Ray looks the cluster up on this machine itself."""


def address_parts(address: str, origin: str | None = None) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address, None for :data:`LOCAL`; else refused naming ``origin``."""
    origin = origin or f"--ray-address {address}"
    text = address.strip()
    if text in LOCAL:
        return None
    scheme, sep, rest = text.partition("://")
    if sep and scheme != "ray":
        raise UsageError(f"{origin}: a Ray address is HOST:PORT (as `ray start --head` prints it) or "
                         f"ray://HOST:PORT, not a {scheme}:// address")
    rest = rest if sep else text
    host, colon, port = rest.rpartition(":")
    if not colon or "]" in port:  # no port: Ray's client has a default, the cluster address none
        host, port = rest, str(CLIENT_PORT) if sep else ""
    host = host.strip("[]")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        got = f"{port!r} is not a port (1 to 65535)" if port else "it names no port"
        raise UsageError(f"{origin}: {got}; give HOST:PORT as `ray start --head` prints it (its default port "
                         "is 6379)")
    return host, int(port)


def probe(address: str, timeout: float = PROBE_S) -> None:
    """Refuse (:class:`~rlkit.errors.RunError`) a Ray address that does not resolve or answer as Ray."""
    parts = address_parts(address)
    if parts is None:
        return
    host, port = parts
    named = f"the Ray address {address}"
    check = ("check the address (`ray start --head` prints it) and that the cluster is up (`ray status` on "
             "its head node)")
    found: list[Any] = []
    resolve = threading.Thread(target=lambda: found.append(_resolve(host, port)), daemon=True)
    resolve.start()
    resolve.join(timeout)
    if not found:
        raise RunError(f"{named}: the host {host} did not resolve within {timeout:.0f} s: {check}")
    if isinstance(found[0], OSError):
        raise RunError(f"{named}: the host {host} is not known ({found[0].strerror or found[0]}): {check}")
    error: OSError | None = OSError("no address to connect to")
    for family, kind, proto, _, where in found[0]:
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(timeout)
                s.connect(where)
                if _speaks_grpc(s):
                    return
                error = None
        except OSError as e:
            error = e
    if error is None:
        raise RunError(f"{named}: {host}:{port} accepts a connection but does not answer as Ray does (gRPC) "
                       f"within {timeout:.0f} s: another service has that port; {check}")
    reason = (f"no answer within {timeout:.0f} s" if isinstance(error, TimeoutError)
              else getattr(error, "strerror", None) or error)
    raise RunError(f"{named}: nothing accepts a connection at {host}:{port} ({reason}): {check}")


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""What an HTTP/2 client sends first (RFC 9113 §3.4): the preface, then an empty SETTINGS frame."""


def _speaks_grpc(s: socket.socket) -> bool:
    """Whether the server on ``s`` answers the HTTP/2 preface with a SETTINGS frame, as Ray's gRPC does."""
    try:
        s.sendall(HTTP2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = s.recv(9 - len(head))
            if not chunk:
                return False
            head += chunk
    except OSError:
        return False
    return head[3] == 4  # the frame's type: SETTINGS


def _resolve(host: str, port: int) -> list[Any] | OSError:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        return e


def worker_env() -> dict[str, str]:
    """The environment a run's numbers depend on (kernel pins, :data:`RLKIT_ENV`), for every Ray worker."""
    pinned = {key for mode in numerics.MODES.values() for key in mode}
    env = dict(numerics.MODES[numerics.mode()])
    env.update({k: os.environ[k] for k in (*sorted(pinned), *RLKIT_ENV, environ.HOLD) if k in os.environ})
    return env  # environ.HOLD: test support, so that a test holds a remote run at a step as it holds a local one


def run_files(run_dir: Path) -> dict[str, bytes]:
    """The files of a run folder (none when it does not exist), by name."""
    if not run_dir.is_dir():
        return {}
    return {f.name: f.read_bytes() for f in sorted(run_dir.iterdir()) if f.is_file()}


def write_run(run_dir: Path, files: dict[str, bytes]) -> None:
    """Write a run's ``files`` into ``run_dir`` atomically, ``metrics.jsonl`` last (a cut one: unfinished)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda n: n == "metrics.jsonl"):
        with atomic_write(run_dir / name, "wb", fsync=False) as f:
            f.write(files[name])


def _task(train_one: Callable[..., float], run: Any, scale: str, device: str, results: str | None,
          start: dict[str, bytes], token: str | None) -> dict[str, Any]:
    """One run on a node: into shared ``results`` (checked by ``token``), or a scratch folder sent back."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    if results is not None:
        if not (Path(results) / token).exists():
            raise RuntimeError(f"{results} on node {node} is not the launcher's results folder (no {token} in it): "
                               "it is not shared storage; run without --ray-shared to have the files sent back")
        return {"minutes": train_one(run, scale, results, device), "files": None, "node": node}
    with tempfile.TemporaryDirectory(prefix="rlkit-run-") as scratch:
        run_dir = Path(scratch) / run.name / f"seed{run.seed}"
        if start:
            write_run(run_dir, start)
        minutes = train_one(run, scale, scratch, device)
        return {"minutes": minutes, "files": run_files(run_dir), "node": node}


class RayRuns:
    """Runs as one-CPU tasks of the Ray cluster at ``address``: a context manager that connects."""

    def __init__(self, address: str, results: Path, *, shared: bool = False):
        self.address, self.results, self.shared = address, Path(results).resolve(), shared
        self.token: str | None = None
        self._connected_here = False
        self._pending: dict[Any, Any] = {}

    def __enter__(self) -> RayRuns:
        import ray

        if not ray.is_initialized():
            probe(self.address)  # an address that does not answer: refused now, not after minutes
            ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False)
            self._connected_here = True
        if self.shared:
            self.token = f".rlkit-ray-{uuid.uuid4().hex}"
            self.results.mkdir(parents=True, exist_ok=True)
            (self.results / self.token).touch()
        return self

    def __exit__(self, *exc) -> None:
        import ray

        for ref in self._pending:
            ray.cancel(ref, force=True)
        self._pending.clear()
        if self.token:
            (self.results / self.token).unlink(missing_ok=True)
        if self._connected_here:
            ray.shutdown()

    @property
    def cpus(self) -> int:
        """The CPUs of the cluster now: how many runs it trains at a time."""
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def train(self, runs: Sequence[Any], train_one: Callable[..., float], *, scale: str,
              device: str = "cpu", tick: float = TICK_S) -> Iterator[tuple[Any, float] | None]:
        """Send every run as a task; yield ``(run, minutes)`` as each ends, None every ``tick`` seconds."""
        import ray

        if device != "cpu":
            raise ValueError(f"runs on a Ray cluster train on its CPUs, not on {device!r}")
        task = ray.remote(_task)
        env = worker_env()
        for run in runs:
            run_dir = self.results / run.name / f"seed{run.seed}"
            start = {} if self.shared else run_files(run_dir)  # a killed run: resumed on the node, as it is here
            ref = task.options(num_cpus=1, max_retries=RETRIES, name=f"rlkit run {run.name} seed {run.seed}",
                               runtime_env={"env_vars": env}).remote(
                train_one, run, scale, device, str(self.results) if self.shared else None, start, self.token)
            self._pending[ref] = run
        while self._pending:
            finished, _ = ray.wait(list(self._pending), num_returns=1, timeout=tick)
            if not finished:
                yield None
                continue
            run = self._pending.pop(finished[0])
            try:
                out = ray.get(finished[0])
            except Exception as e:
                cause = getattr(e, "cause", None) or e  # a task's own exception, unwrapped from Ray's
                raise RuntimeError(f"run {run.name} seed {run.seed} failed: {type(cause).__name__}: {cause}") from e
            if out["files"] is not None:
                write_run(self.results / run.name / f"seed{run.seed}", out["files"])
            yield run, out["minutes"]
