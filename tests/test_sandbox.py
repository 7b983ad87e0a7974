"""The sandbox against hostile code: each snippet is stopped or refused within its limits, and the host is
unaffected (this process keeps working, no sandbox process is left running, the work dir is gone)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rlkit.tasks.sandbox import UID_BASE, Limits, run_code

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox relies on Linux rlimits/namespaces")

FAST = Limits(cpu_seconds=1, wall_seconds=3, memory_mb=512, max_processes=8, max_output_bytes=4096)


def _sandbox_processes() -> list[str]:
    """Live processes running sandbox code: a launcher, a script in a sandbox dir, or a sandbox uid."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = dict(line.split(":", 1) for line in Path(f"/proc/{entry.name}/status").read_text().splitlines())
        except (OSError, ValueError):
            continue
        if status["State"].strip().startswith(("Z", "X")):
            continue
        uid = int(status["Uid"].split()[0])
        if "_sandbox_child.py" in cmdline or "rlkit-sandbox-" in cmdline or uid >= UID_BASE:
            found.append(f"{entry.name} uid={uid} {cmdline[:80]}")
    return found


@pytest.fixture(autouse=True)
def host_unaffected():
    yield
    assert _sandbox_processes() == []
    assert subprocess.run(["true"]).returncode == 0  # this process can still start processes


def test_runs_code_in_a_private_dir_that_is_removed():
    r = run_code("import os\nprint(6 * 7)\nprint(os.getcwd(), os.environ['HOME'], os.environ['TMPDIR'])")
    assert r.status == "ok" and r.returncode == 0 and r.ok, r.stderr
    answer, dirs = r.stdout.splitlines()
    cwd, home, tmp = dirs.split()
    assert answer == "42" and cwd == home == tmp and "rlkit-sandbox-" in cwd
    assert not Path(cwd).exists()
    assert {"rlimits", "audit-hook"} <= set(r.isolation)
    if os.geteuid() == 0:
        assert "uid" in r.isolation  # RLIMIT_NPROC does not bind root: the code must not run as root


def test_error_exit_is_reported_with_its_traceback():
    r = run_code("raise ValueError('boom')")
    assert r.status == "error" and r.returncode == 1 and "ValueError: boom" in r.stderr


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    r = run_code("while True:\n    pass", Limits(cpu_seconds=1, wall_seconds=30))
    assert r.status == "timeout" and r.returncode < 0
    assert 0.95 < r.cpu_time < 1.5 and r.wall_time < 20  # the kernel's CPU limit, long before the wall clock


def test_sleeping_is_stopped_by_the_wall_clock():
    r = run_code("import time\ntime.sleep(60)", Limits(wall_seconds=1))
    assert r.status == "timeout" and r.cpu_time < 0.5 and 0.95 < r.wall_time < 4


def test_fork_bomb_is_capped_at_max_processes():
    code = """
import os, time
n = 0
for _ in range(1000):
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n, flush=True)
time.sleep(60)
"""
    r = run_code(code, Limits(cpu_seconds=2, wall_seconds=2, max_processes=8))
    assert r.status == "timeout"
    assert 1 <= int(r.stdout) <= 7  # 8 tasks in all, the script itself included


def test_classic_fork_bomb_is_contained():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_code(code, Limits(cpu_seconds=1, wall_seconds=2, max_processes=8))
    assert r.status == "timeout" and r.wall_time < 4.0


def test_ten_gigabyte_allocation_fails_inside():
    r = run_code("data = bytearray(10 * 1024**3)\nprint('allocated')", FAST)
    assert r.status == "error" and "MemoryError" in r.stderr and "allocated" not in r.stdout


def test_hundred_megabytes_of_output_are_cut_off():
    r = run_code("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)\n", FAST)
    assert r.status == "output_limit"
    assert len(r.stdout) + len(r.stderr) <= FAST.max_output_bytes and r.stdout.startswith("x" * 1000)
    assert r.wall_time < FAST.wall_seconds  # cut off at the cap, not at the deadline


def _write_attempt(target: Path) -> str:
    return f"""
open("inside.txt", "w").write("ok")  # the work dir is writable
try:
    open({str(target)!r}, "w").write("escaped")
    print("WROTE")
except OSError as e:
    print("REFUSED", type(e).__name__)
"""


def test_writing_into_a_host_directory_is_refused(tmp_path):
    target = tmp_path / "escape.txt"
    r = run_code(_write_attempt(target), FAST)
    if not {"uid", "landlock-fs"} & set(r.isolation):
        pytest.skip(f"no write barrier on this host (isolation: {r.isolation}): see rlkit.tasks.sandbox")
    assert r.status == "ok", r.stderr
    assert r.stdout.startswith("REFUSED PermissionError") and not target.exists()


def test_writing_to_world_writable_tmp_is_refused():
    target = Path("/tmp") / f"rlkit-escape-{uuid.uuid4().hex}"
    r = run_code(_write_attempt(target), FAST)
    try:
        if "landlock-fs" not in r.isolation:
            pytest.skip(f"no Landlock on this kernel (isolation: {r.isolation}): /tmp stays writable")
        assert r.stdout.startswith("REFUSED PermissionError") and not target.exists()
    finally:
        target.unlink(missing_ok=True)


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.3)
    yield server
    server.close()


def _assert_no_connection(server: socket.socket) -> None:
    with pytest.raises(TimeoutError):
        server.accept()[0].close()


def test_opening_a_socket_is_refused(listener):
    port = listener.getsockname()[1]
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'leak')"
    r = run_code(code, FAST)
    assert r.status == "error" and "PermissionError" in r.stderr
    _assert_no_connection(listener)


def test_raw_connect_through_ctypes_is_stopped_by_the_kernel(listener):
    """ctypes bypasses the Python audit hook; the network namespace or Landlock must still stop it."""
    port = listener.getsockname()[1]
    code = f"""
import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
addr = struct.pack("=HH4s8x", socket.AF_INET, socket.htons({port}), socket.inet_aton("127.0.0.1"))
print(libc.connect(fd, addr, len(addr)), ctypes.get_errno())
"""
    r = run_code(code, FAST)
    if not {"net", "landlock-net"} & set(r.isolation):
        pytest.skip(f"no network namespace or Landlock here (isolation: {r.isolation})")
    result, errno = map(int, r.stdout.split())
    assert result == -1 and errno != 0
    _assert_no_connection(listener)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="cpu_seconds"):
        Limits(cpu_seconds=0)
    with pytest.raises(ValueError, match="max_processes"):
        Limits(max_processes=1)
    with pytest.raises(TypeError, match="str"):
        run_code(b"print(1)")
