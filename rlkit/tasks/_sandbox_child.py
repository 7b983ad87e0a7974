"""The inside half of :mod:`rlkit.tasks.sandbox`: confine this process, then exec Python on the untrusted script.

Run as ``python -I _sandbox_child.py CONFIG_JSON``, never imported; standard library only. Steps, each recorded
in the report written to the status pipe (``cfg["status_fd"]``); any failure before step 7 ends the process:

1. namespaces: network, PID, IPC, UTS (root: plus mount; others: in a user namespace); fork, the child PID 1.
2. root only: a directory closing Python off from other users is covered by a tmpfs with only what it needs.
3. ``no_new_privs``: set-uid binaries cannot raise privileges (Landlock requires it).
4. Landlock (Linux ≥ 5.13): writes only in the work dir and ``/dev/null``; ABI 4: no TCP; ABI 6: no signals out.
5. rlimits: CPU seconds, address space, file size, open files, no core files, process count.
6. root only: a fresh uid/gid (``cfg["uid_base"]`` + this launcher's PID), so RLIMIT_NPROC binds.
7. ``execv`` Python on the script under an audit hook that refuses ``connect``/``bind``/``sendto``.
"""

import ctypes
import json
import os
import resource
import signal
import struct
import sys
import traceback

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
# Landlock syscalls share these numbers on every architecture (asm-generic table)
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_RULE_PATH_BENEATH = 1
FS_WRITE_FILE = 1 << 1
FS_WRITE_ANY = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write, remove, make any node
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

# The untrusted script runs under this: the last and weakest network barrier (ctypes can still reach libc).
RUNNER = """
import runpy, sys
_DENY = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}
def _no_network(event, args):
    if event in _DENY:
        raise PermissionError(f"network access is disabled in the sandbox ({event})")
sys.addaudithook(_no_network)
del sys.argv[0]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def _check(ok, what):
    if not ok:
        errno = ctypes.get_errno()
        raise OSError(errno, f"sandbox: {what}: {os.strerror(errno)}")


def enter_namespaces():
    """New namespaces (module doc, step 1); returns their names ([] where the kernel or container refuses)."""
    flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if os.geteuid() == 0:
        # no user namespace for root: inside one, root could not switch to an unmapped sandbox uid
        if libc.unshare(ctypes.c_int(flags | CLONE_NEWNS)) != 0:
            return []
        # keep every mount made from now on out of the host's namespace
        _check(libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) == 0, "private mounts")
        return ["net", "pid", "ipc", "mount"]
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(ctypes.c_int(CLONE_NEWUSER | flags)) != 0:
        return []
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return ["user", "net", "pid", "ipc"]


def _blocking_dir(path):
    """The first directory above ``path`` that other users may not enter, or None."""
    parts = path.split("/")
    for i in range(2, len(parts)):
        parent = "/".join(parts[:i])
        if not os.stat(parent).st_mode & 0o001:
            return parent, "/".join(parts[: i + 1])
    return None


def expose(paths, stage):
    """Module doc, step 2: cover each blocking directory with a tmpfs that holds only the needed entries."""
    covers = {}
    for path in paths:
        found = _blocking_dir(path)
        if found:
            covers.setdefault(found[0], set()).add(found[1])
    for blocked, entries in sorted(covers.items()):
        staged = []
        for entry in sorted(entries):  # park each entry on a bind mount, cover the dir, move it back
            park = os.path.join(stage, f".mnt{len(staged)}")
            os.mkdir(park) if os.path.isdir(entry) else open(park, "x").close()
            _check(libc.mount(entry.encode(), park.encode(), None, ctypes.c_ulong(MS_BIND | MS_REC), None) == 0,
                   f"bind {entry}")
            staged.append((park, entry))
        _check(libc.mount(b"tmpfs", blocked.encode(), b"tmpfs", ctypes.c_ulong(0), b"mode=0711,size=64k") == 0,
               f"tmpfs on {blocked}")
        for park, entry in staged:
            os.mkdir(entry, 0o755) if os.path.isdir(park) else open(entry, "x").close()
            _check(libc.mount(park.encode(), entry.encode(), None, ctypes.c_ulong(MS_MOVE), None) == 0,
                   f"move {entry}")
            os.rmdir(park) if os.path.isdir(park) else os.unlink(park)
    return ["expose"] if covers else []


def landlock(workdir):
    """Module doc, step 4; returns the layers applied ([] where the kernel lacks Landlock)."""
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return []
    fs = FS_WRITE_ANY | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("=QQQ", fs, net, scoped)[: 24 if abi >= 6 else 16 if abi >= 4 else 8]
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    _check(ruleset >= 0, "landlock ruleset")
    for path, access in ((workdir, fs), ("/dev/null", FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0))):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = struct.pack("=Qi", access, fd)  # struct landlock_path_beneath_attr (packed)
        _check(libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                            rule, ctypes.c_uint32(0)) == 0, f"landlock rule {path}")
        os.close(fd)
    _check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) == 0,
           "landlock restrict")
    os.close(ruleset)
    return ["landlock-fs"] + (["landlock-net"] if net else []) + (["landlock-signal"] if scoped else [])


def set_limits(cfg):
    """Module doc, step 5. Soft = hard: at the CPU limit the kernel sends SIGKILL, which no handler can catch
    (PID 1 of a namespace would ignore the SIGXCPU of a lower soft limit anyway)."""
    for res, value in ((resource.RLIMIT_CPU, cfg["cpu_seconds"]), (resource.RLIMIT_AS, cfg["memory_bytes"]),
                       (resource.RLIMIT_FSIZE, cfg["file_bytes"]), (resource.RLIMIT_NOFILE, cfg["open_files"]),
                       (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, cfg["nproc"])):
        resource.setrlimit(res, (value, value))


def confine_and_exec(cfg, namespaces, uid):
    """Steps 2–7 of the module doc, in the process that becomes the untrusted script."""
    layers = ["rlimits"] + namespaces
    if uid is not None and "mount" in namespaces:
        layers += expose(cfg["python_paths"], cfg["workdir"])
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "no_new_privs")
    layers += landlock(cfg["workdir"])
    set_limits(cfg)
    if uid is not None:
        os.chown(cfg["workdir"], uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        layers.append("uid")
        if not os.access(sys.executable, os.X_OK):
            raise PermissionError(f"sandbox: the sandbox uid cannot run {sys.executable}: a directory above it is "
                                  "closed to other users and no mount namespace was available to expose it; "
                                  "install Python where other users can read it")
    if "pid" in namespaces:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    layers.append("audit-hook")
    with os.fdopen(cfg["status_fd"], "w") as status:
        json.dump({"layers": layers, "uid": uid}, status)
    os.execv(sys.executable, [sys.executable, "-I", "-c", RUNNER, cfg["script"]])


def main():
    cfg = json.loads(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid = cfg["uid_base"] + os.getpid() if os.geteuid() == 0 else None  # PID before any new PID namespace
    namespaces = enter_namespaces()
    pid = os.fork() if "pid" in namespaces else 0
    if pid == 0:
        try:
            confine_and_exec(cfg, namespaces, uid)
        except BaseException:  # confinement failed: report it and never run the script
            traceback.print_exc()
        os._exit(126)
    os.close(cfg["status_fd"])
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the confined child may not ptrace this unconfined parent
    # the sandbox stops a run with SIGTERM: end the whole namespace, reap it, exit (no orphans left behind)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):  # die of the child's signal, so the sandbox sees it
        if os.WTERMSIG(status) != signal.SIGKILL:
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
