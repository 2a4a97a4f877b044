"""The sandbox's bootstrap: runs *inside* the child (``python -I -S -B _sandbox_child.py '<json>'``).

Standard library only, imported by nothing: :mod:`hybrid_rl.reward.sandbox` starts it as a script. It
narrows its own process, then runs ``main.py`` of its working folder as ``__main__``. In order:

1. ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the child dies with the process that started it (a scorer
   killed by the reward guard takes its sandbox with it).
2. rlimits: CPU seconds (``SIGXCPU``, then ``SIGKILL`` one second later), address space, file size,
   no core files, 256 open files.
3. seccomp (x86_64, aarch64): ``fork``/``vfork``/``clone`` without ``CLONE_THREAD`` fail with
   ``EAGAIN`` and ``clone3`` with ``ENOSYS`` (glibc then creates threads with ``clone``). It binds root
   too, unlike ``RLIMIT_NPROC``; elsewhere ``RLIMIT_NPROC`` is the fallback (not for root).
4. Landlock (Linux >= 5.13): writes, deletes, renames and new files only beneath the folder (and
   ``/dev/null``); with ABI >= 4 no TCP ``bind``/``connect``; with ABI >= 6 no signals to processes
   outside the sandbox.
5. An audit hook (``sys.addaudithook``, not a security boundary on its own, PEP 578) that refuses
   process creation, writes outside the folder, signals to other processes and ``ctypes`` imports
   (and ``_posixsubprocess`` where seccomp did not take hold), and reports each refusal's reason to
   the parent on ``report_fd``: the kernel layers refuse silently, the hook says why.

The layers that took hold are reported as ``layer:<name>`` lines; failures as ``reason:<name>``.
"""

import json
import os
import resource
import signal
import struct
import sys
import traceback
import types

_REPORTED = set()
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {  # audit event -> positions of the path arguments it changes
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (1,),
    "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
    "os.chflags": (0,), "os.lchflags": (0,), "os.lchmod": (0,), "os.lchown": (0,), "shutil.rmtree": (0,),
    "os.mkfifo": (0,), "os.mknod": (0,),
}
_PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "subprocess.Popen", "os.startfile"}
_BLOCKED_IMPORTS = {"ctypes", "_ctypes"}  # calls into C past the hook (and past seccomp's absence)


def _report(fd, line):
    if line not in _REPORTED:
        _REPORTED.add(line)
        try:
            os.write(fd, (line + "\n").encode())
        except OSError:
            pass  # the parent is gone or the program closed the descriptor: nothing to tell


def _libc():
    import ctypes  # imported here only; removed from sys.modules before the program runs

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def _limit(which, soft, hard):
    """Lower a limit, never above the hard limit this process inherited (raising it needs root)."""
    inherited = resource.getrlimit(which)[1]
    if inherited != resource.RLIM_INFINITY:
        soft, hard = min(soft, inherited), min(hard, inherited)
    resource.setrlimit(which, (soft, hard))


def _set_limits(cfg):
    cpu = int(cfg["cpu_s"])
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)
    _limit(resource.RLIMIT_AS, cfg["memory_bytes"], cfg["memory_bytes"])
    _limit(resource.RLIMIT_FSIZE, cfg["file_bytes"], cfg["file_bytes"])
    _limit(resource.RLIMIT_CORE, 0, 0)
    _limit(resource.RLIMIT_NOFILE, 256, 256)


def _bpf(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


# (AUDIT_ARCH, fork, vfork, clone, clone3); aarch64 has no fork/vfork syscalls (-1 never matches)
_ARCHES = {"x86_64": (0xC000003E, 57, 58, 56, 435), "aarch64": (0xC00000B7, -1, -1, 220, 435)}
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_CLONE_THREAD = 0x00010000


def _seccomp_no_processes(ctypes, libc):
    """A seccomp filter refusing new processes (threads stay allowed); False where it cannot be set."""
    arch = _ARCHES.get(os.uname().machine)
    if arch is None:
        return False
    audit_arch, nr_fork, nr_vfork, nr_clone, nr_clone3 = (v & 0xFFFFFFFF for v in arch)
    program = b"".join([
        _bpf(0x20, 0, 0, 4),                     # 0: A = arch
        _bpf(0x15, 1, 0, audit_arch),            # 1: our arch? -> 3
        _bpf(0x06, 0, 0, _ERRNO | 1),            # 2: another ABI: EPERM
        _bpf(0x20, 0, 0, 0),                     # 3: A = syscall number
        _bpf(0x35, 8, 0, 0x40000000),            # 4: x32 ABI numbers -> 13 (EAGAIN)
        _bpf(0x15, 7, 0, nr_fork),               # 5: fork -> 13
        _bpf(0x15, 6, 0, nr_vfork),              # 6: vfork -> 13
        _bpf(0x15, 6, 0, nr_clone3),             # 7: clone3 -> 14 (ENOSYS: glibc falls back to clone)
        _bpf(0x15, 1, 0, nr_clone),              # 8: clone -> 10
        _bpf(0x06, 0, 0, _ALLOW),                # 9: anything else
        _bpf(0x20, 0, 0, 16),                    # 10: A = low word of clone's flags
        _bpf(0x45, 0, 1, _CLONE_THREAD),         # 11: a thread -> 12, a process -> 13
        _bpf(0x06, 0, 0, _ALLOW),                # 12
        _bpf(0x06, 0, 0, _ERRNO | 11),           # 13: EAGAIN, as RLIMIT_NPROC would answer
        _bpf(0x06, 0, 0, _ERRNO | 38),           # 14: ENOSYS
    ])
    buffer = ctypes.create_string_buffer(program)

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(program) // 8, ctypes.addressof(buffer))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        return False
    return libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


# Landlock filesystem rights that change the tree: WRITE_FILE, REMOVE_DIR .. MAKE_SYM, then REFER
# (ABI 2) and TRUNCATE (ABI 3). Reads and execution are not handled, so they stay allowed everywhere.
_LL_WRITE = (1 << 1) | sum(1 << b for b in range(4, 13))
_LL_FILE_RIGHTS = (1 << 1) | (1 << 14)  # rights a rule on a single file (/dev/null) may carry


def _landlock_writes_beneath(ctypes, libc, folder):
    """Restrict writes to ``folder`` (and /dev/null) with Landlock; False where the kernel lacks it."""
    abi = libc.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return False
    handled = _LL_WRITE | ((1 << 13) if abi >= 2 else 0) | ((1 << 14) if abi >= 3 else 0)
    attr = struct.pack("QQQ", handled, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)  # TCP; scopes
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(444, ctypes.c_char_p(attr), size, 0)
    if ruleset < 0:
        return False
    try:
        for path, rights in ((folder, handled), ("/dev/null", handled & _LL_FILE_RIGHTS)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr (packed)
                if libc.syscall(445, ruleset, 1, ctypes.c_char_p(rule), 0) != 0:
                    return False
            finally:
                os.close(fd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:
            return False
        return libc.syscall(446, ruleset, 0) == 0  # landlock_restrict_self
    finally:
        os.close(ruleset)


def _inside(path, folder):
    if isinstance(path, int):
        return True  # an open descriptor: the kernel layer judges it
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == folder or real.startswith(folder + os.sep) or real == "/dev/null"


def _audit_hook(folder, fd, blocked_imports):
    me = os.getpid()

    def refuse(reason, what):
        _report(fd, "reason:" + reason)
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writes = bool(flags & _WRITE_FLAGS) if isinstance(flags, int) else False
            writes = writes or any(c in str(mode or "") for c in "wax+")
            if writes and not _inside(path, folder):
                refuse("forbidden_write", f"writing {path!r} outside the sandbox folder")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not _inside(args[i], folder):
                    refuse("forbidden_write", f"{event} on {args[i]!r} outside the sandbox folder")
        elif event in _PROCESS_EVENTS:
            refuse("processes", f"{event} (starting a process)")
        elif event in ("os.kill", "os.killpg") and args[0] not in (me, 0):
            refuse("processes", f"{event} of another process")
        elif event == "import" and args[0] in blocked_imports:
            if args[0] == "_posixsubprocess":
                refuse("processes", "import _posixsubprocess (it forks without an audit event)")
            raise ImportError(f"sandbox: import {args[0]} is not allowed")

    sys.addaudithook(hook)


def _narrow(cfg, fd):
    """Steps 1-4 of the module docstring; reports the layers that took hold."""
    ctypes, libc = _libc()
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != cfg["parent_pid"]:
        os._exit(137)  # the parent died before the line above: nobody is waiting for us
    _set_limits(cfg)
    _report(fd, "layer:rlimits")
    if _seccomp_no_processes(ctypes, libc):
        _report(fd, "layer:seccomp")
    elif os.getuid() != 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))  # counts the user's processes: any fork fails
        _report(fd, "layer:nproc")
    if _landlock_writes_beneath(ctypes, libc, cfg["dir"]):
        _report(fd, "layer:landlock")
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]


def _run(cfg, fd):
    path = os.path.join(cfg["dir"], "main.py")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    sys.argv = [path]
    sys.path.insert(0, cfg["dir"])
    # without seccomp, _posixsubprocess.fork_exec would start processes past the hook unseen
    seccomp = "layer:seccomp" in _REPORTED
    _audit_hook(cfg["dir"], fd, _BLOCKED_IMPORTS | (set() if seccomp else {"_posixsubprocess"}))
    _report(fd, "layer:audit")
    module = types.ModuleType("__main__")  # the program's own __main__, as `python main.py` gives it
    module.__file__ = path
    sys.modules["__main__"] = module
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 -- the program's uncaught error: report, show, exit 1
        if isinstance(exc, MemoryError):
            _report(fd, "reason:memory")
        elif isinstance(exc, OSError) and exc.errno == 27:  # EFBIG: past RLIMIT_FSIZE (Python ignores SIGXFSZ)
            _report(fd, "reason:file_size")
        elif isinstance(exc, OSError) and exc.errno in (1, 13) and "layer:landlock" in _REPORTED:
            _report(fd, "reason:forbidden_write")  # Landlock refuses only writes
        # the program's frames only, as `python main.py` would show them
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.exit(1)


def main():
    cfg = json.loads(sys.argv[1])
    fd = cfg["report_fd"]
    _narrow(cfg, fd)
    _run(cfg, fd)


if __name__ == "__main__":
    main()
