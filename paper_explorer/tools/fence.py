"""The kernel fence around a sandbox worker (Linux): what holds when RestrictedPython does not.

``wall_in`` runs in the freshly forked worker, after it has imported everything actions may use
and before it runs the first action. In order:

1. its own session (the host kills the whole group), descriptors 0-2 on /dev/null, the channel
   on descriptor 3, every other descriptor closed (no other episode's pipe, no log, no cache);
2. rlimits set once: address space (what an action may add), CPU time for the worker's whole
   life (the host's clock enforces the per-action limit), no core files, no file growth, and
   no new descriptor at all (RLIMIT_NOFILE 0: the four it holds stay usable, but a number it
   closes cannot be taken again, for a file, a socket or a copy of its channel: without seccomp,
   and without root to drop to ``nobody``, a file it could open would be any of the user's);
3. started as root: no supplementary groups, an unprivileged uid/gid (``nobody``); always: no
   capabilities (ambient ones included) and no processes of its own (RLIMIT_NPROC 0);
4. the parent-death signal, so a worker never outlives its zygote;
5. no-new-privs and a seccomp-bpf filter built once per zygote with libseccomp (``pyseccomp``)
   from ``SYSCALL_RULES``: each allowed syscall with the argument conditions it must meet and
   why it is allowed. Everything else fails with EPERM.

What the filter allows, and why that is all
-------------------------------------------
* **No path reaches the kernel.** Every syscall that takes a path is refused, whatever its
  flags: open/openat, stat/lstat, and also newfstatat and statx, which glibc uses for
  ``fstat(fd)`` with an empty path and AT_EMPTY_PATH - a flag the kernel ignores when the path
  is not empty, and seccomp cannot read the path, so no flag test can tell the two apart. A
  worker needs no stat once fenced (traced with strace over the sandbox tests: it reads, writes,
  maps memory and asks ``getrusage``); the ``fstat`` syscall, which takes a descriptor and
  nothing else, stays allowed. With glibc >= 2.33 ``os.fstat`` itself goes through newfstatat
  and so fails with EPERM in a worker; the same holds on aarch64, which has an ``fstat``
  syscall too (80) but whose glibc also calls newfstatat. Architectures with neither (older
  loongarch64 kernels: statx only) simply have no stat in a worker.
* **No process but itself.** Arguments that may name another process are pinned to the worker:
  ``prlimit64`` only with pid 0 and no new limit (``getrlimit``); the clock calls only for the
  standard clock ids (a negative id encodes another process's or thread's CPU clock, ``~pid <<
  3``, or a descriptor's clock); ``getrusage`` only for itself or its thread (never
  RUSAGE_CHILDREN); ``futex`` only process-private and never a priority-inheritance operation
  (those look up the task id stored in the word: an oracle for which pids exist; a shared futex
  on a file page, such as libc's, is a rendezvous with other processes mapping that file).
* Seccomp compares the raw 64-bit register, so each condition tests ``argument & mask`` against
  the allowed values over all 64 bits: a value the kernel would truncate to a forbidden 32-bit
  int (say 0xFFFFFFFA, clock -6) differs from every allowed one and is refused too.
* Syscalls of another ABI fail: a filter's default for a foreign architecture (i386 through
  ``int 0x80``) is KILL, and x32 numbers (bit 30 set) match no allowed number.

The zygote itself enters a new network namespace when the kernel lets it (``unshare_network``;
without root, inside a new user namespace where unprivileged ones are allowed),
so a worker has no interface but a downed loopback even before seccomp.

What still reaches a worker that has escaped the language layer: its own memory, the CPU it is
allowed, its one channel to the host (which believes nothing it says), reads of its own
descriptors, the standard clocks, and a few facts about itself: its pid and its parent's (the
zygote's; pids are global, so their growth says how many processes the machine starts), its
uid, its own limits and resource usage, what ``fstat`` says of its own descriptors (its channel's
inode number, a global counter like pids; ``/dev/null``'s device, inode and times), and which
CPU it runs on (``sched_getcpu`` is answered by the vDSO, without a syscall). ``madvise`` is not restricted: KSM merging
(MADV_MERGEABLE) can time whether another opted-in process holds a page, which needs a
colluding process, as does timing the shared CPU. The host verifies the fence from outside
(``/proc/PID/status``) rather than trusting the worker's word, and records what held as the
trajectory's ``isolation``. ``tests/tools/test_fence_census.py`` holds the expected table: a
new allowance, or a looser condition, fails it until it is argued in review.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import itertools
import os
import resource
import signal
import sys
from typing import NamedTuple

CHANNEL_FD = 3
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
BPF_INSTRUCTION_BYTES = 8
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
NOBODY = 65534
CPU_HARD_MARGIN = 5  # seconds between SIGXCPU (soft) and SIGKILL (hard) at the end of a worker's life

ALL_BITS = (1 << 64) - 1
STANDARD_CLOCKS = 16  # CLOCK_REALTIME (0) .. CLOCK_TAI (11); 12-15 are unassigned (EINVAL)
FUTEX_PRIVATE_FLAG, FUTEX_CLOCK_REALTIME = 0x80, 0x100
# WAIT, WAKE, REQUEUE, CMP_REQUEUE, WAKE_OP, WAIT_BITSET, WAKE_BITSET: none reads a task id from memory
FUTEX_PLAIN_OPERATIONS = (0, 1, 3, 4, 5, 9, 10)


class Condition(NamedTuple):
    """One argument test as seccomp makes it: ``(argument & mask)`` is one of ``values``, on all 64 bits."""

    argument: int
    name: str
    mask: int
    values: tuple[int, ...]

    def __str__(self) -> str:
        """As the census test's table spells it: ``pid == 0``, ``clockid < 16``, ``op & ~0x100 in {...}``."""
        cleared = ~self.mask & ALL_BITS
        if cleared == 0 and len(self.values) == 1:
            return f"{self.name} == {self.values[0]}"
        if self.values == (0,) and cleared & (cleared + 1) == 0:  # only low bits may be set: an unsigned bound
            return f"{self.name} < {cleared + 1}"
        return f"{self.name} & ~{cleared:#x} in {{{', '.join(f'{value:#x}' for value in self.values)}}}"


def equals(argument: int, name: str, *values: int) -> Condition:
    return Condition(argument, name, ALL_BITS, values)


def below(argument: int, name: str, bound: int) -> Condition:
    """``0 <= argument < bound`` as an unsigned 64-bit value (bound a power of two): no negative int passes."""
    assert bound & (bound - 1) == 0, bound
    return Condition(argument, name, ALL_BITS & ~(bound - 1), (0,))


class Allowance(NamedTuple):
    conditions: tuple[Condition, ...]  # all must hold; none: any arguments
    reason: str


def _any(reason: str) -> Allowance:
    return Allowance((), reason)


OWN_DESCRIPTORS = "descriptors 0-3 only (/dev/null and the channel): no open, dup or pipe, RLIMIT_NOFILE 0"
OWN_MEMORY = "its own address space, within RLIMIT_AS"
OWN_SIGNALS = "its own signal handlers, mask and stack"
SYSCALL_RULES: dict[str, Allowance] = {
    "read": _any(OWN_DESCRIPTORS),
    "readv": _any(OWN_DESCRIPTORS),
    "pread64": _any(OWN_DESCRIPTORS),
    "write": _any(OWN_DESCRIPTORS),
    "writev": _any(OWN_DESCRIPTORS),
    "close": _any(OWN_DESCRIPTORS),
    "lseek": _any(OWN_DESCRIPTORS),
    "fstat": _any("a descriptor's metadata; it takes no path (newfstatat and statx, which do, are refused)"),
    "mmap": _any(OWN_MEMORY + "; neither of its descriptors can be mapped (/dev/null, a socket)"),
    "munmap": _any(OWN_MEMORY),
    "mremap": _any(OWN_MEMORY),
    "mprotect": _any(OWN_MEMORY),
    "brk": _any(OWN_MEMORY),
    "madvise": _any(OWN_MEMORY + "; KSM merging needs a colluding process (see the module docstring)"),
    "futex": Allowance(
        (Condition(1, "op", ALL_BITS & ~FUTEX_CLOCK_REALTIME, tuple(FUTEX_PRIVATE_FLAG | op for op in FUTEX_PLAIN_OPERATIONS)),),
        "locks in its own memory: private (no key shared with other processes) and no PI operation (they look up a task id)",
    ),
    "rt_sigaction": _any(OWN_SIGNALS),
    "rt_sigprocmask": _any(OWN_SIGNALS),
    "rt_sigreturn": _any(OWN_SIGNALS),
    "sigaltstack": _any(OWN_SIGNALS),
    "restart_syscall": _any("resumes its own interrupted sleep"),
    "clock_gettime": Allowance(
        (below(0, "clockid", STANDARD_CLOCKS),),
        "the standard clocks, its own CPU clocks included; a negative id names another process's clock",
    ),
    "clock_getres": Allowance((below(0, "clockid", STANDARD_CLOCKS),), "as clock_gettime"),
    "clock_nanosleep": Allowance((below(0, "clockid", STANDARD_CLOCKS),), "time.sleep(); as clock_gettime"),
    "gettimeofday": _any("the wall clock"),
    "time": _any("the wall clock"),
    "nanosleep": _any("sleeps on its own"),
    "getpid": _any("its own pid"),
    "gettid": _any("its own thread id"),
    "getppid": _any("its parent, the zygote, whose pid the worker was forked knowing"),
    "getuid": _any("its own credentials"),
    "geteuid": _any("its own credentials"),
    "getgid": _any("its own credentials"),
    "getegid": _any("its own credentials"),
    "getresuid": _any("its own credentials"),
    "getresgid": _any("its own credentials"),
    "getrusage": Allowance((below(0, "who", 2),), "RUSAGE_SELF or RUSAGE_THREAD, never RUSAGE_CHILDREN (-1)"),
    "prlimit64": Allowance(
        (equals(0, "pid", 0), equals(2, "new_limit", 0)), "getrlimit(): its own limits (pid 0), read only (no new limit)"
    ),
    "getrandom": _any("random bytes from the kernel"),
    "sched_yield": _any("gives up its own time slice"),
    "exit": _any("ends itself"),
    "exit_group": _any("ends itself"),
}


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
        program = _export_bpf(_syscall_filter(seccomp))
    except Exception as error:  # libseccomp refused to build it: run without, and say so
        return None, f"libseccomp could not build the filter ({type(error).__name__}: {error})"
    return program, None


def filter_pseudocode() -> str:
    """The filter as libseccomp compiles it, in its pseudo filter code (PFC): for tests and review.
    Raises ImportError where libseccomp is missing."""
    import tempfile

    import pyseccomp as seccomp

    with tempfile.TemporaryFile("w+") as handle:
        _syscall_filter(seccomp).export_pfc(handle)
        handle.seek(0)
        return handle.read()


def _syscall_filter(seccomp):
    """``SYSCALL_RULES`` as a libseccomp filter: EPERM unless one rule admits the call. A condition
    with several values becomes one rule per value (seccomp's rules for one syscall are alternatives)."""
    syscall_filter = seccomp.SyscallFilter(seccomp.ERRNO(errno.EPERM))
    for name, allowance in SYSCALL_RULES.items():
        if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) < 0:  # not a syscall here (``time`` on aarch64)
            continue
        for values in itertools.product(*(condition.values for condition in allowance.conditions)):
            arguments = [
                seccomp.Arg(condition.argument, seccomp.EQ, value)
                if condition.mask == ALL_BITS
                else seccomp.Arg(condition.argument, seccomp.MASKED_EQ, condition.mask, value)
                for condition, value in zip(allowance.conditions, values)
            ]
            syscall_filter.add_rule(seccomp.ALLOW, name, *arguments)
    return syscall_filter


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


def wall_in(
    channel: int, memory_bytes: int, episode_cpu_seconds: int, zygote_pid: int, address_space: int, seccomp_program: bytes | None
) -> list[str]:
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
    # No new descriptor, not even in a number it closed (with a limit of 4, closing /dev/null freed one).
    resource.setrlimit(resource.RLIMIT_NOFILE, (0, 0))
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
