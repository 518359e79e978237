"""The layout's rules (docs/architecture.md, "Layering"), checked on the source itself.

- The modules of `vllm_use` and `handlers` import each other without a cycle. Counted: the
  imports a module runs when it is loaded (its top level, `if`/`try` blocks included; not those
  under `if TYPE_CHECKING:` and not those inside functions), each with the packages above it,
  which Python loads first.
- Nothing in `vllm_use` imports `handlers` except the composition root, `vllm_use.app`.
- Nothing in `tests` imports `tools` (tools may use `tests.fakes` and `tests.support`, never the
  other way round): the fakes and helpers the tests need live under tests/.
- Each table is queried in one home: its peewee class is named only in storage.py (the declaration)
  and its domain's store, and nothing reaches for peewee's private `_meta.database` (docs/architecture.md,
  "Storage").
- No child runs Python code between `fork` and `exec`: no `preexec_fn` in `vllm_use` (docs/architecture.md,
  "Children").
- No module reads another library's private state: `x._name` only on `self`, `cls`, `super()`, or
  for a name the module defines itself (tornado's `IOStream._read_buffer_size` once decided whether
  an upstream connection was reused).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support import REPO

PACKAGES = ("vllm_use", "handlers")
COMPOSITION_ROOT = "vllm_use.app"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _loaded_imports(body: list[ast.stmt]) -> Iterator[str]:
    """The modules named by the imports that run when `body` runs (absolute imports only: the
    project uses no relative ones, and `test_no_relative_imports` keeps it so)."""
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _loaded_imports(node.orelse)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # a submodule, maybe
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                yield from _loaded_imports(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _loaded_imports(handler.body)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """module → the project modules it loads when it is loaded (with their parent packages)."""
    sources = _sources()
    graph: dict[str, set[str]] = {}
    for name, path in sources.items():
        edges: set[str] = set()
        for target in _loaded_imports(ast.parse(path.read_text(encoding="utf-8")).body):
            parts = target.split(".")
            edges.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        graph[name] = {t for t in edges if t in sources and t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_modules_import_each_other_without_a_cycle() -> None:
    graph = import_graph()
    assert "vllm_use.registry" in graph and "handlers.base" in graph  # the walk saw the tree
    assert "vllm_use.errors" in graph["vllm_use.registry"] or graph["vllm_use.registry"]
    assert cycles(graph) == []


def test_only_the_composition_root_imports_handlers() -> None:
    graph = import_graph()
    assert any(t.startswith("handlers") for t in graph[COMPOSITION_ROOT])  # the walk sees imports
    for name, path in _sources().items():
        if not name.startswith("vllm_use.") or name == COMPOSITION_ROOT:
            continue
        every = set(_every_import(path))  # function-level imports count here too
        assert not {t for t in every if t == "handlers" or t.startswith("handlers.")}, name


def _every_import(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_no_relative_imports() -> None:
    relative = [
        f"{name}:{node.lineno}"
        for name, path in _sources().items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert relative == []


def test_tests_import_nothing_from_tools() -> None:
    sources = sorted((REPO / "tests").glob("*.py")) + sorted((REPO / "tests").glob("*/*.py"))
    assert REPO / "tests" / "conftest.py" in sources and REPO / "tests" / "fakes" / "vllm.py" in sources
    from_tools = [
        f"{path.relative_to(REPO)}: {target}"
        for path in sources
        for target in _every_import(path)
        if target == "tools" or target.startswith("tools.")
    ]
    assert from_tools == []


def test_no_child_runs_python_between_fork_and_exec() -> None:
    calls = [
        f"{name}:{node.lineno}"
        for name, path in _sources().items()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.keyword) and node.arg == "preexec_fn"
    ]
    assert calls == []


def _private_reads(tree: ast.Module) -> list[ast.Attribute]:
    """`x._name` (not dunder) where x is not self, cls or super(), and no class or function of the
    module defines `_name`."""
    own = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    own |= {
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
    }
    reads = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            continue
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            continue
        if node.attr not in own:
            reads.append(node)
    return reads


def test_the_private_read_finder_finds_one() -> None:
    tree = ast.parse("def f(stream):\n    return stream._read_buffer_size == 0\n")
    assert [node.attr for node in _private_reads(tree)] == ["_read_buffer_size"]
    assert _private_reads(ast.parse("class A:\n    def _b(self):\n        return other._b\n")) == []


def test_no_module_reads_another_librarys_private_state() -> None:
    reads = [
        f"{name}:{node.lineno}: {ast.unparse(node)}"
        for name, path in _sources().items()
        for node in _private_reads(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert reads == []


TABLE_HOMES = {
    "ApiKeyTable": {"vllm_use.keys.store"},
    "SettingTable": {"vllm_use.settings"},
    "AuditTable": {"vllm_use.gateway.audit"},
    "ModelTable": {"vllm_use.models.store"},
    "DownloadTaskTable": {"vllm_use.models.store"},
    "DeploymentTable": {"vllm_use.deployments.store"},
    "UsageDailyTable": {"vllm_use.usage.store"},
}
# The SQL table names, which raw queries name instead of the class.
SQL_NAMES = {
    "ApiKeyTable": "api_keys",
    "SettingTable": "settings",
    "AuditTable": "audit_records",
    "ModelTable": "models",
    "DownloadTaskTable": "download_tasks",
    "DeploymentTable": "deployments",
    "UsageDailyTable": "usage_daily",
}


def test_each_table_is_queried_only_in_its_store() -> None:
    from vllm_use import storage

    assert {table.__name__ for table in storage.TABLES} == set(TABLE_HOMES)
    assert {table.__name__: table._meta.table_name for table in storage.TABLES} == SQL_NAMES
    strays = []
    for name, path in _sources().items():
        if name == "vllm_use.storage":
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        named = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        named |= {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
        }
        sql = " ".join(
            node.value.upper()
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        )
        for table, homes in TABLE_HOMES.items():
            in_sql = any(f"{verb} {SQL_NAMES[table].upper()}" in sql for verb in ("FROM", "INTO", "UPDATE"))
            if (table in named or in_sql) and name not in homes:
                strays.append(f"{name}: {table}")
        if "_meta.database" in text:
            strays.append(f"{name}: _meta.database")
    assert strays == []


def test_every_package_is_listed_for_the_wheel() -> None:
    """setup.cfg names its packages one by one: a new package left out would be missing from an
    installed vllm-use while the editable checkout still finds it."""
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    listed = set(config["options"]["packages"].split())
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for package in PACKAGES
        for init in (REPO / package).rglob("__init__.py")
    }
    assert on_disk <= listed, sorted(on_disk - listed)
