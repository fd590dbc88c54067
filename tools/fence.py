"""The kernel fence around a sandbox worker (Linux): what holds when RestrictedPython does not.

``wall_in`` runs in the freshly forked worker, after it has imported everything actions may use
and before it runs the first action. In order:

1. its own session (the host kills the whole group), descriptors 0-2 on /dev/null, the channel
   on descriptor 3, every other descriptor closed (no other episode's pipe, no log, no cache);
2. rlimits set once: address space (what an action may add), CPU time for the worker's whole
   life (the host's clock enforces the per-action limit), no core files, no file growth, and
   no descriptor numbers beyond 3;
3. started as root: no supplementary groups, an unprivileged uid/gid (``nobody``); always: no
   capabilities (ambient ones included) and no processes of its own (RLIMIT_NPROC 0);
4. the parent-death signal, so a worker never outlives its zygote;
5. no-new-privs and a seccomp-bpf filter built once per zygote with libseccomp (``pyseccomp``):
   an allow-list of what running Python needs - reading and writing descriptors it already has,
   memory, futexes, signal masks and handlers, clocks, exit - and EPERM for everything else:
   open/openat, stat of paths, socket/connect, execve, fork/clone, kill, ptrace, setrlimit,
   ioctl, dup, pipe, mount, unshare ...

The zygote itself enters a new network namespace when the kernel lets it (``unshare_network``;
without root, inside a new user namespace where unprivileged ones are allowed),
so a worker has no interface but a downed loopback even before seccomp.

What still reaches a worker that has escaped the language layer: its own memory, the CPU it is
allowed, its one channel to the host (which believes nothing it says), reads of its own
descriptors, and time. The host verifies the fence from outside (``/proc/PID/status``) rather
than trusting the worker's word, and records what held as the trajectory's ``isolation``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import resource
import signal
import sys

CHANNEL_FD = 3
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
BPF_INSTRUCTION_BYTES = 8
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
AT_EMPTY_PATH = 0x1000
NOBODY = 65534
CPU_HARD_MARGIN = 5  # seconds between SIGXCPU (soft) and SIGKILL (hard) at the end of a worker's life

ALLOWED_SYSCALLS = (
    "read", "readv", "pread64", "write", "writev", "close", "lseek", "fstat",
    "mmap", "munmap", "mremap", "mprotect", "brk", "madvise", "futex",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack", "restart_syscall",
    "clock_gettime", "clock_getres", "gettimeofday", "time", "nanosleep", "clock_nanosleep",
    "getpid", "gettid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid",
    "getrusage", "getrandom", "sched_yield", "exit", "exit_group",
)


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    """libc, found once in the zygote (``find_library`` runs a subprocess; a worker cannot)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def build_seccomp_filter():
    """The worker's filter, compiled once in the zygote: (BPF program, None), or (None, why not)."""
    if not sys.platform.startswith("linux"):
        return None, f"seccomp is Linux only (this is {sys.platform})"
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError, AttributeError) as error:  # the binding, or libseccomp.so.2, is missing
        return None, f"libseccomp is not available ({type(error).__name__}: {error})"
    try:
        syscall_filter = seccomp.SyscallFilter(seccomp.ERRNO(errno.EPERM))
        for name in ALLOWED_SYSCALLS:
            try:
                syscall_filter.add_rule(seccomp.ALLOW, name)
            except (OSError, ValueError, RuntimeError):  # not a syscall on this architecture
                continue
        # fstat() is newfstatat(fd, "", AT_EMPTY_PATH) in glibc: allowed for descriptors, never for paths
        for name, flags_argument in (("newfstatat", 3), ("statx", 2)):
            try:
                syscall_filter.add_rule(seccomp.ALLOW, name, seccomp.Arg(flags_argument, seccomp.MASKED_EQ, AT_EMPTY_PATH, AT_EMPTY_PATH))
            except (OSError, ValueError, RuntimeError):
                continue
        # getrlimit() is prlimit64(0, resource, NULL, old): reading limits yes, setting them no
        syscall_filter.add_rule(seccomp.ALLOW, "prlimit64", seccomp.Arg(2, seccomp.EQ, 0))
        program = _export_bpf(syscall_filter)
    except Exception as error:  # libseccomp refused to build it: run without, and say so
        return None, f"libseccomp could not build the filter ({type(error).__name__}: {error})"
    return program, None


class _SockFilterProgram(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _export_bpf(syscall_filter) -> bytes:
    """libseccomp's compiled BPF program, so that each worker loads it with one prctl()."""
    import tempfile

    with tempfile.TemporaryFile() as handle:
        syscall_filter.export_bpf(handle)
        handle.seek(0)
        return handle.read()


def _load_bpf(program: bytes) -> None:
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    buffer = ctypes.create_string_buffer(program, len(program))
    header = _SockFilterProgram(len(program) // BPF_INSTRUCTION_BYTES, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(header), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def prepare() -> None:
    """Everything the fence needs that a fenced worker could not do (or would do slowly) itself;
    run in the zygote: find libc and resolve the functions the workers call."""
    if sys.platform.startswith("linux"):
        libc = _libc()
        for name in ("prctl", "capset", "unshare"):
            getattr(libc, name)


def unshare_network() -> str | None:
    """Put the calling process (the zygote) in a new network namespace; None, or why not."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) == 0:
        return None
    first = os.strerror(ctypes.get_errno())
    # Without privileges, a new user namespace may grant the right to make a network namespace.
    if os.geteuid() != 0 and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return None
    return f"unshare(CLONE_NEWNET) failed: {first}"


def wall_in(channel: int, memory_bytes: int, episode_cpu_seconds: int, zygote_pid: int, address_space: int,
            seccomp_program: bytes | None) -> list[str]:
    """Fence the calling (worker) process; returns notes on what could not be done."""
    notes: list[str] = []
    os.setsid()
    _descriptors(channel)
    _limits(address_space + memory_bytes, episode_cpu_seconds)
    if os.geteuid() == 0:
        _drop_privileges()
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no processes of its own (root ignores it, so after the drop)
    if sys.platform.startswith("linux"):
        _drop_capabilities()
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != zygote_pid:  # the zygote died before the signal was armed
            os._exit(0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (CHANNEL_FD + 1, CHANNEL_FD + 1))
    if seccomp_program is not None:
        _load_bpf(seccomp_program)
    return notes


def _descriptors(channel: int) -> None:
    if channel != CHANNEL_FD:
        os.dup2(channel, CHANNEL_FD)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    os.closerange(CHANNEL_FD + 1, max(os.sysconf("SC_OPEN_MAX"), 1 << 16))
    os.set_inheritable(CHANNEL_FD, False)


def address_space() -> int:
    """The calling process's address-space size (the zygote's, which a worker starts with), or 0."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * resource.getpagesize()
    except OSError:  # no /proc (not Linux): the limit is then the budget itself
        return 0


def _limits(address_space_limit: int, episode_cpu_seconds: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (address_space_limit, address_space_limit))
    resource.setrlimit(resource.RLIMIT_CPU, (episode_cpu_seconds, episode_cpu_seconds + CPU_HARD_MARGIN))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilitySet(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> None:
    """No capabilities at all, ambient ones included (a non-root host may hold some)."""
    libc = _libc()
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if libc.capset(ctypes.byref(_CapabilityHeader(CAPABILITY_VERSION_3, 0)), (_CapabilitySet * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "capset() failed")


def _drop_privileges() -> None:
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
