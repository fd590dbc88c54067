"""The modules an action may import, and exactly which of their names it gets.

This table is the one place that says what actions can reach beyond the tools. It is an
allow-list by function, not a filter by type: a module is not "safe" because its attributes are
functions; a function is listed only when what it *does* gives no new reach. The audit rule for
each entry: it computes on the values it is given and returns new values; it takes no attribute
or field *names* as strings (``functools.update_wrapper``, ``operator.attrgetter``), evaluates
no strings as code or annotations (``functools.singledispatch``, ``collections.namedtuple``),
formats no strings against objects (``str.format`` behind ``collections.UserString`` or
``string.Formatter``), and touches no files, clocks of other processes, or interpreter state.

Left out on purpose: ``functools.update_wrapper/wraps/singledispatch/total_ordering/
cached_property/lru_cache`` (attribute copying by name, eval of annotations, hidden caches),
``collections.UserString/UserDict/UserList/namedtuple/ChainMap/abc`` (str.format, exec of
generated source, submodules), ``re.DEBUG`` and ``re.template``, ``datetime.tzinfo`` and
``statistics.NormalDist``. Modules not here (``os``, ``sys``, ``string``, ``random``,
``operator``, ``importlib`` ...) cannot be allowed at all.

Only the standard library is imported here, so the sandbox's worker can use this module.
"""

from __future__ import annotations

DEFAULT_MODULES = ("math", "re", "json")

MODULE_EXPORTS: dict[str, tuple[str, ...]] = {
    "math": (
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atan2",
        "atanh",
        "cbrt",
        "ceil",
        "comb",
        "copysign",
        "cos",
        "cosh",
        "degrees",
        "dist",
        "e",
        "erf",
        "erfc",
        "exp",
        "exp2",
        "expm1",
        "fabs",
        "factorial",
        "floor",
        "fmod",
        "frexp",
        "fsum",
        "gamma",
        "gcd",
        "hypot",
        "inf",
        "isclose",
        "isfinite",
        "isinf",
        "isnan",
        "isqrt",
        "lcm",
        "ldexp",
        "lgamma",
        "log",
        "log10",
        "log1p",
        "log2",
        "modf",
        "nan",
        "nextafter",
        "perm",
        "pi",
        "pow",
        "prod",
        "radians",
        "remainder",
        "sin",
        "sinh",
        "sqrt",
        "tan",
        "tanh",
        "tau",
        "trunc",
        "ulp",
    ),
    "re": (
        "compile",
        "search",
        "match",
        "fullmatch",
        "findall",
        "finditer",
        "sub",
        "subn",
        "split",
        "escape",
        "error",
        "IGNORECASE",
        "I",
        "MULTILINE",
        "M",
        "DOTALL",
        "S",
        "VERBOSE",
        "X",
        "ASCII",
        "A",
    ),
    "json": ("dumps", "loads", "JSONDecodeError"),
    "itertools": (
        "accumulate",
        "chain",
        "combinations",
        "combinations_with_replacement",
        "compress",
        "count",
        "cycle",
        "dropwhile",
        "filterfalse",
        "groupby",
        "islice",
        "pairwise",
        "permutations",
        "product",
        "repeat",
        "starmap",
        "takewhile",
        "tee",
        "zip_longest",
    ),
    "functools": ("reduce", "partial", "cmp_to_key"),
    "collections": ("Counter", "defaultdict", "deque", "OrderedDict"),
    "statistics": (
        "mean",
        "fmean",
        "geometric_mean",
        "harmonic_mean",
        "median",
        "median_low",
        "median_high",
        "median_grouped",
        "mode",
        "multimode",
        "quantiles",
        "pstdev",
        "pvariance",
        "stdev",
        "variance",
        "correlation",
        "covariance",
        "linear_regression",
        "StatisticsError",
    ),
    "heapq": ("heappush", "heappop", "heapify", "heapreplace", "heappushpop", "nlargest", "nsmallest", "merge"),
    "bisect": ("bisect", "bisect_left", "bisect_right", "insort", "insort_left", "insort_right"),
    "datetime": ("date", "datetime", "time", "timedelta", "timezone", "MINYEAR", "MAXYEAR"),
}

VETTED_MODULES = tuple(MODULE_EXPORTS)


def check_allowed(names: tuple[str, ...]) -> None:
    """Raise ValueError naming the first module that is not in the table."""
    unvetted = [name for name in names if name not in MODULE_EXPORTS]
    if unvetted:
        raise ValueError(f"module {unvetted[0]!r} cannot be allowed in actions; choose from {', '.join(VETTED_MODULES)}")
