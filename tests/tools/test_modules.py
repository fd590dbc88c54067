"""The optional modules: an explicit allow-list of names per module, in one table (tools.modules)."""

import importlib

import pytest

from paper_explorer.corpus import BM25Index
from paper_explorer.tools.modules import DEFAULT_MODULES, MODULE_EXPORTS, VETTED_MODULES
from paper_explorer.tools.sandbox import Limits, Sandbox
from paper_explorer.tools.worker import module_view


@pytest.mark.parametrize("name", sorted(MODULE_EXPORTS))
def test_every_listed_name_exists_and_is_exactly_what_an_action_gets(name):
    module = importlib.import_module(name)
    missing = [key for key in MODULE_EXPORTS[name] if not hasattr(module, key)]
    assert not missing, (name, missing)
    assert sorted(dir(module_view(name))) == sorted(MODULE_EXPORTS[name])


def test_defaults_are_in_the_table():
    assert set(DEFAULT_MODULES) <= set(VETTED_MODULES)


DOORS = {
    # attribute copying by name, eval of annotations, str.format behind a class, exec of generated source
    "functools": ["update_wrapper", "wraps", "singledispatch", "total_ordering", "cached_property", "lru_cache", "GenericAlias"],
    "collections": ["UserString", "UserDict", "UserList", "namedtuple", "ChainMap", "abc"],
    "re": ["DEBUG", "template", "enum", "functools", "copyreg", "Pattern", "Match", "sre_compile"],
    "statistics": ["NormalDist", "sys", "math", "random"],
    "datetime": ["tzinfo", "sys", "datetime_CAPI"],
    "json": ["decoder", "encoder", "scanner", "JSONEncoder", "codecs"],
}


@pytest.mark.parametrize("module, name", [(m, n) for m, names in DOORS.items() for n in names])
def test_the_doors_found_in_the_audit_are_not_there(small_demo, module, name):
    limits = Limits(allowed_modules=tuple(VETTED_MODULES), wall_seconds=5)
    with Sandbox(small_demo, limits, index=BM25Index.build(small_demo)) as sandbox:
        result = sandbox.execute(f"import {module}\n{module}.{name}")
        assert result.error and result.error.startswith("AttributeError"), result
        result = sandbox.execute(f"from {module} import {name}")
        assert result.error, result


def test_the_listed_names_work(small_demo):
    limits = Limits(allowed_modules=tuple(VETTED_MODULES), wall_seconds=5)
    code = """
import collections, functools, itertools, statistics, heapq, bisect, datetime, math, re, json
print(collections.Counter('aab').most_common(1), functools.reduce(lambda a, b: a + b, [1, 2, 3]))
print(list(itertools.islice(itertools.count(), 3)), statistics.median([3, 1, 2]), heapq.nsmallest(1, [5, 4]))
print(bisect.bisect([1, 3], 2), datetime.date(2020, 1, 2).isoformat(), math.isqrt(17), re.findall('a+', 'aa b a'))
print(json.dumps({'k': [1]}), datetime.datetime.strptime('2021-03-04', '%Y-%m-%d').day)
"""
    with Sandbox(small_demo, limits, index=BM25Index.build(small_demo)) as sandbox:
        result = sandbox.execute(code)
    assert result.error is None, result
    assert result.stdout.splitlines() == [
        "[('a', 2)] 6",
        "[0, 1, 2] 2 [4]",
        "1 2020-01-02 4 ['aa', 'a']",
        '{"k": [1]} 4',
    ]


@pytest.mark.parametrize("module", ["os", "string", "sys", "importlib", "random", "operator", "ctypes", "warnings"])
def test_modules_outside_the_table_cannot_be_allowed(module):
    with pytest.raises(ValueError, match="cannot be allowed"):
        Limits(allowed_modules=(module,))
