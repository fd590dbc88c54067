"""The census of the seccomp filter: every syscall a worker may make, and the argument conditions
it must meet, against a table reviewed by hand; then, for every argument condition, an escaped
worker (plain Python, ``restricted=False``) that tries the hole it closes and gets EPERM, while the
worker's own uses of the same syscall still work.

The holes are tried against targets the kernel itself would let the worker reach, so that the
EPERM is the filter's, as root and as a user alike: as root the worker runs as ``nobody``, as is
its sibling worker (same uid, so the kernel allows prlimit64 on it); as a user both run under that
user's uid. Another process's CPU clock and stat of a readable path need no permission at all.
"""

import ast
import errno
import re

import pytest

from paper_explorer.tools import fence
from paper_explorer.tools.sandbox import Sandbox
from paper_explorer.tools.zygote import Zygote
from tests.tools.test_sandbox_fence import LIMITS, escaped, run  # noqa: F401 (escaped is a fixture)

# What the filter allows, one syscall per line: the argument conditions ("" for none), as
# ``fence.SYSCALL_RULES`` renders them. A new syscall, or a looser condition, must be argued here.
EXPECTED_RULES = {
    "read": "",
    "readv": "",
    "pread64": "",
    "write": "",
    "writev": "",
    "close": "",
    "lseek": "",
    "fstat": "",
    "mmap": "",
    "munmap": "",
    "mremap": "",
    "mprotect": "",
    "brk": "",
    "madvise": "",
    "futex": "op & ~0x100 in {0x80, 0x81, 0x83, 0x84, 0x85, 0x89, 0x8a}",
    "rt_sigaction": "",
    "rt_sigprocmask": "",
    "rt_sigreturn": "",
    "sigaltstack": "",
    "restart_syscall": "",
    "clock_gettime": "clockid < 16",
    "clock_getres": "clockid < 16",
    "clock_nanosleep": "clockid < 16",
    "gettimeofday": "",
    "time": "",
    "nanosleep": "",
    "getpid": "",
    "gettid": "",
    "getppid": "",
    "getuid": "",
    "geteuid": "",
    "getgid": "",
    "getegid": "",
    "getresuid": "",
    "getresgid": "",
    "getrusage": "who < 2",
    "prlimit64": "pid == 0 and new_limit == 0",
    "getrandom": "",
    "sched_yield": "",
    "exit": "",
    "exit_group": "",
}

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
STATX_BASIC_STATS = 0x7FF
RLIMIT_CPU = 0
RUSAGE_SELF, RUSAGE_CHILDREN, RUSAGE_THREAD = 0, -1, 1
CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID = 1, 2, 3
CPUCLOCK_SCHED = 2
FUTEX_WAIT, FUTEX_WAKE, FUTEX_TRYLOCK_PI, FUTEX_PRIVATE_FLAG = 0, 1, 8, 0x80
PID_OF_NOBODY = (1 << 22) + 1  # above the kernel's largest pid_max: no process has it

# Runs in the escaped worker: ``call(number, *arguments)`` is libc's syscall() with every integer
# passed as a full 64-bit register, returning (result, errno).
PRELUDE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(number, *arguments):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) if isinstance(a, int) else a for a in arguments))
    return result, ctypes.get_errno()
buffer = ctypes.create_string_buffer(4096)
no_time = ctypes.create_string_buffer(16)  # a zero timespec: a sleep that returns at once
word = ctypes.c_uint32(0)
results = {}
"""


def rendered(allowance: fence.Allowance) -> str:
    return " and ".join(str(condition) for condition in allowance.conditions)


def test_the_filter_allows_exactly_the_reviewed_table():
    assert {name: rendered(allowance) for name, allowance in fence.SYSCALL_RULES.items()} == EXPECTED_RULES


def test_every_allowance_gives_its_reason_in_one_line():
    for name, allowance in fence.SYSCALL_RULES.items():
        assert allowance.reason.strip() and "\n" not in allowance.reason, name


def test_no_syscall_that_takes_a_path_is_allowed():
    path_syscalls = {
        "open",
        "openat",
        "openat2",
        "stat",
        "lstat",
        "newfstatat",
        "statx",
        "access",
        "faccessat",
        "faccessat2",
        "readlink",
        "readlinkat",
        "getdents64",
        "chdir",
        "execve",
        "execveat",
        "name_to_handle_at",
        "open_tree",
        "fsopen",
        "mknodat",
        "truncate",
        "statfs",
        "getxattr",
    }
    assert not path_syscalls & set(fence.SYSCALL_RULES)


@pytest.fixture(scope="module")
def seccomp():
    return pytest.importorskip("pyseccomp")


def test_every_name_is_a_syscall_on_x86_64_or_aarch64(seccomp):
    """A misspelt name would otherwise allow nothing, silently; ``time`` exists on x86_64 only."""
    for name in fence.SYSCALL_RULES:
        numbers = [seccomp.resolve_syscall(arch, name) for arch in (seccomp.Arch.X86_64, seccomp.Arch.AARCH64)]
        assert max(numbers) >= 0, name


def compiled_rules(pseudocode: str) -> dict[str, set[int]]:
    """syscall -> the argument indices its rules test, read from libseccomp's pseudo filter code."""
    rules: dict[str, set[int]] = {}
    current = None
    for line in pseudocode.splitlines():
        named = re.match(r'\s*# filter for syscall "(\w+)"', line)
        if named:
            current = rules.setdefault(named.group(1), set())
        elif line.strip().startswith("#"):
            current = None
        elif current is not None:
            current.update(int(index) for index in re.findall(r"\$a(\d)", line))
    return rules


def test_the_compiled_filter_holds_the_table_and_refuses_everything_else(seccomp):
    pseudocode = fence.filter_pseudocode()
    native = {name: allowance for name, allowance in fence.SYSCALL_RULES.items() if seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0}
    assert compiled_rules(pseudocode) == {name: {c.argument for c in allowance.conditions} for name, allowance in native.items()}
    default = pseudocode.split("# default action", 1)[1].split("\n")[1].strip()
    foreign = pseudocode.split("# invalid architecture action", 1)[1].split("\n")[1].strip()
    assert default == f"action ERRNO({errno.EPERM});" and foreign == "action KILL;"


# -- the holes, tried by an escaped worker ------------------------------------------------------


@pytest.fixture
def number(seccomp):
    """This machine's number for a syscall name (the worker gets numbers, not names)."""

    def resolve(name: str) -> int:
        found = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
        if found < 0:
            pytest.skip(f"{name} is not a syscall on this architecture")
        return found

    return resolve


@pytest.fixture
def sibling(small_demo, index):
    """Another episode's worker in flight: the target of cross-process probes."""
    with Sandbox(small_demo, LIMITS, index=index) as other:
        assert other.execute("1").error is None
        yield other.pid


def attempts(sandbox, calls: dict[str, str]) -> dict[str, tuple[int, int]]:
    """label -> (result, errno) of each ``call(...)`` expression, run in order in the escaped worker."""
    lines = [PRELUDE] + [f"results[{label!r}] = {expression}" for label, expression in calls.items()] + ["print(repr(results))"]
    return ast.literal_eval(run(sandbox, "\n".join(lines)).stdout)


def cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time (the kernel's MAKE_PROCESS_CPUCLOCK)."""
    return (~pid << 3) | CPUCLOCK_SCHED


def path_probes(number, sibling: int) -> tuple[dict, dict]:
    """AT_EMPTY_PATH with a non-empty path is a plain path lookup: the kernel ignores the flag."""
    newfstatat, statx = number("newfstatat"), number("statx")
    holes = {}
    for path in (b"/etc/passwd", b"/proc/1", f"/proc/{sibling}".encode()):
        for flags in (0, AT_EMPTY_PATH):
            named = f"{AT_FDCWD}, ctypes.c_char_p({path!r})"
            holes[f"newfstatat {path} {flags:#x}"] = f"call({newfstatat}, {named}, buffer, {flags})"
            holes[f"statx {path} {flags:#x}"] = f"call({statx}, {named}, {flags}, {STATX_BASIC_STATS}, buffer)"
    holes["newfstatat of its channel"] = f"call({newfstatat}, 3, ctypes.c_char_p(b''), buffer, {AT_EMPTY_PATH})"
    holes["statx of its channel"] = f"call({statx}, 3, ctypes.c_char_p(b''), {AT_EMPTY_PATH}, {STATX_BASIC_STATS}, buffer)"
    return {"fstat of its channel": f"call({number('fstat')}, 3, buffer)"}, holes


def legacy_stat_probes(number, sibling: int) -> tuple[dict, dict]:
    stat, lstat = number("stat"), number("lstat")  # x86_64 has them; aarch64 does not
    return {}, {
        "stat": f"call({stat}, ctypes.c_char_p(b'/etc/passwd'), buffer)",
        "lstat": f"call({lstat}, ctypes.c_char_p(b'/proc/1'), buffer)",
    }


def prlimit64_probes(number, sibling: int) -> tuple[dict, dict]:
    prlimit64 = number("prlimit64")
    own = {"its own limits, read": f"call({prlimit64}, 0, {RLIMIT_CPU}, None, buffer)"}
    holes = {
        "a sibling worker's limits": f"call({prlimit64}, {sibling}, {RLIMIT_CPU}, None, buffer)",
        "the zygote's limits": f"call({prlimit64}, os.getppid(), {RLIMIT_CPU}, None, buffer)",
        "its own pid, named": f"call({prlimit64}, os.getpid(), {RLIMIT_CPU}, None, buffer)",
        "its own limits, set to what they are": f"call({prlimit64}, 0, {RLIMIT_CPU}, buffer, None)",
    }
    return own, holes


def clock_probes(name: str):
    def probes(number, sibling: int) -> tuple[dict, dict]:
        syscall = number(name)
        extra = ", 0, no_time, None" if name == "clock_nanosleep" else ", buffer"
        own = {
            f"clock {clock}": f"call({syscall}, {clock}{extra})"
            for clock in (CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID)
        }
        holes = {
            "a sibling worker's CPU clock": f"call({syscall}, {cpu_clock(sibling)}{extra})",
            "the same, as a 32-bit int": f"call({syscall}, {cpu_clock(sibling) & 0xFFFFFFFF}{extra})",
            "the zygote's CPU clock": f"call({syscall}, (~os.getppid() << 3) | {CPUCLOCK_SCHED}{extra})",
            "its own CPU clock by pid 0 (every negative id is refused)": f"call({syscall}, {cpu_clock(0)}{extra})",
            "a descriptor's clock": f"call({syscall}, (~3 << 3) | 3{extra})",
        }
        return own, holes

    return probes


def getrusage_probes(number, sibling: int) -> tuple[dict, dict]:
    getrusage = number("getrusage")
    own = {"itself": f"call({getrusage}, {RUSAGE_SELF}, buffer)", "its thread": f"call({getrusage}, {RUSAGE_THREAD}, buffer)"}
    holes = {
        "its children": f"call({getrusage}, {RUSAGE_CHILDREN}, buffer)",
        "its children, as a 32-bit int": f"call({getrusage}, {RUSAGE_CHILDREN & 0xFFFFFFFF}, buffer)",
    }
    return own, holes


def futex_probes(number, sibling: int) -> tuple[dict, dict]:
    futex = number("futex")

    def on_word(value: int, operation: int, argument: int = 0) -> str:
        return f"(setattr(word, 'value', {value}), call({futex}, ctypes.byref(word), {operation}, {argument}, None, None, 0))[1]"

    own = {
        "wake, private": on_word(0, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1),
        "wait on a changed word, private": on_word(1, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, 0),
    }
    holes = {
        "trylock-pi on a word naming a sibling": on_word(sibling, FUTEX_TRYLOCK_PI | FUTEX_PRIVATE_FLAG),
        "trylock-pi on a word naming no process": on_word(PID_OF_NOBODY, FUTEX_TRYLOCK_PI | FUTEX_PRIVATE_FLAG),
        "wake, shared": on_word(0, FUTEX_WAKE, 1),
    }
    return own, holes


# syscall -> (calls of the worker's own that must work, calls that try a hole and must get EPERM)
ARGUMENT_PROBES = {
    "prlimit64": prlimit64_probes,
    "clock_gettime": clock_probes("clock_gettime"),
    "clock_getres": clock_probes("clock_getres"),
    "clock_nanosleep": clock_probes("clock_nanosleep"),
    "getrusage": getrusage_probes,
    "futex": futex_probes,
}
PROBES = {**ARGUMENT_PROBES, "paths": path_probes, "legacy stat": legacy_stat_probes}


def test_every_argument_condition_has_a_hole_probe():
    assert set(ARGUMENT_PROBES) == {name for name, rule in EXPECTED_RULES.items() if rule}


# Holes whose call the kernel itself may answer EPERM from an unfenced worker, so that the control
# cannot tell: a root zygote's limits (the worker is ``nobody``), and a PI lock naming a live process
# of another address space (6.x kernels refuse it; naming no process still answers ESRCH: the oracle).
KERNEL_MAY_REFUSE = {"the zygote's limits", "trylock-pi on a word naming a sibling"}


@pytest.fixture(scope="module")
def unfenced_zygote():
    zygote = Zygote(kernel_fence=False)
    yield zygote
    zygote.close()


@pytest.fixture
def unfenced(small_demo, index, unfenced_zygote):
    """A worker with every wall but seccomp (as root it is ``nobody`` too): the control."""
    with Sandbox(small_demo, LIMITS, index=index, restricted=False, zygote=unfenced_zygote) as sandbox:
        yield sandbox


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_the_fence_refuses_each_hole_and_admits_the_worker_itself(escaped, number, sibling, probe):
    own, holes = PROBES[probe](number, sibling)
    results = attempts(escaped, {**own, **holes})  # its own uses first: they leave a valid rlimit in the buffer
    assert all(results[label][1] != errno.EPERM for label in own), results
    assert all(results[label] == (-1, errno.EPERM) for label in holes), results


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_without_the_filter_each_hole_is_open(unfenced, number, sibling, probe):
    """The same calls from a worker with the same uid and no seccomp are not refused: the EPERM is the filter's."""
    _, holes = PROBES[probe](number, sibling)
    results = attempts(unfenced, {label: call for label, call in holes.items() if label not in KERNEL_MAY_REFUSE})
    assert all(error != errno.EPERM for _, error in results.values()), results


def test_the_workers_own_clocks_limits_and_sleep_still_work(escaped):
    result = run(
        escaped,
        """
        import resource, time
        start = time.monotonic()
        time.sleep(0.01)
        print(time.monotonic() > start, time.process_time() > 0, time.thread_time() > 0,
              resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0,
              time.clock_getres(time.CLOCK_PROCESS_CPUTIME_ID) > 0)
    """,
    )
    assert result.stdout.split() == ["True", "True", "True", "(0,", "0)", "True", "True"]
