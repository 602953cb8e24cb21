"""The import graph of `service/`: no cycle between its layers, and no import from a layer to
a higher one. Each module's layer is its subpackage (a top-level module is `app` if named so
below, else `bottom`); a module may import its own layer and any layer below it:

| rank | layer | what |
| --- | --- | --- |
| 8 | app | app.py, cli.py, worker.py, gunicorn_conf.py: the application and the process |
| 7 | http | http/: the edge (connections, framing, head limits, head sheds), request context |
| 6 | protocols | protocols/: by what is served (embedding, classification, rerank, tokens) |
| 5 | admission | admission/: the policy (admit, hold, shed, refuse), tarpit, shed budget, API key |
| 4 | runtime | runtime/: readiness, draining, reading the body, submit and await |
| 3 | engine | engine/: jobs, loading, forward, pooling and heads, batching |
| 2 | backends | backends/: how a batch is computed (tensors in, tensors out) |
| 1 | bottom | settings.py, errors.py, log.py, metrics.py (and any other top-level module) |

For the layers every `import` counts, wherever it is (inside functions and under
`if TYPE_CHECKING:` too), so a lazy import cannot hide an upward arrow. Between modules, no
cycle of the imports run when a module is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[1] / "service"
#: highest first
LAYERS = ["app", "http", "protocols", "admission", "runtime", "engine", "backends", "bottom"]
APP_MODULES = [
    "service.app",
    "service.cli",
    "service.worker",
    "service.gunicorn_conf",
    "service.bake",
]
RANK = {name: len(LAYERS) - i for i, name in enumerate(LAYERS)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVICE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """service.http.edge -> http; service.app -> app; service.settings -> bottom."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (SERVICE / parts[1]).is_dir()):
        return parts[1]
    return "app" if module in APP_MODULES else "bottom"


def rank(module: str) -> int:
    return RANK.get(layer_of(module), 0)  # a subpackage with no layer fails its own test


def imports_of(path: Path, module: str, *, at_import: bool = False) -> set[str]:
    """The service modules (or packages) `path` imports, as dotted names; `at_import`: only
    those imported when the module itself is (not in functions or `if TYPE_CHECKING:`)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in walk(ast.parse(path.read_text(), str(path)), at_import):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m == "service" or m.startswith("service.")}


def walk(node: ast.AST, at_import: bool) -> list[ast.AST]:
    """`ast.walk`, less function bodies and `if TYPE_CHECKING:` blocks when `at_import`."""
    out = [node]
    for child in ast.iter_child_nodes(node):
        if at_import and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if at_import and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(child.test):
            out.extend(x for e in child.orelse for x in walk(e, at_import))
            continue
        out.extend(walk(child, at_import))
    return out


def graph(*, at_import: bool = False) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in sorted(SERVICE.rglob("*.py"))}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        # an imported name that is not a module is an attribute of the module before it
        found = imports_of(path, name, at_import=at_import)
        targets = {t if t in modules else t.rpartition(".")[0] for t in found}
        edges[name] = {t for t in targets if t in modules and t != name}
    return edges


def test_every_subpackage_has_a_layer() -> None:
    unknown = sorted(
        p.name
        for p in SERVICE.iterdir()
        if p.is_dir() and (p / "__init__.py").exists() and p.name not in RANK
    )
    assert not unknown, f"subpackages with no layer in tests/test_layers.py: {unknown}"


def test_no_import_runs_up_a_layer() -> None:
    upward = [
        f"{src} ({layer_of(src)}) imports {dst} ({layer_of(dst)})"
        for src, dsts in sorted(graph().items())
        for dst in sorted(dsts)
        if dst != "service" and rank(dst) > rank(src)
    ]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_cycle_between_layers() -> None:
    layer_edges: dict[str, set[str]] = {}
    for src, dsts in graph().items():
        for dst in dsts:
            if dst != "service" and layer_of(src) != layer_of(dst):
                layer_edges.setdefault(layer_of(src), set()).add(layer_of(dst))
    cycle = find_cycle(layer_edges)
    assert cycle is None, "a cycle between layers: " + " -> ".join(cycle or [])


def test_no_cycle_between_modules() -> None:
    """Within a layer too, no module needs another one that needs it back when imported
    (an import for type hints only, under `if TYPE_CHECKING:`, or inside a function is not
    run at import)."""
    edges = {m: {d for d in ds if d != "service"} for m, ds in graph(at_import=True).items()}
    cycle = find_cycle(edges)
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])


def test_no_cycle_between_modules_even_for_type_hints() -> None:
    """Counting every import (type hints and lazy imports too): two modules that need each
    other are one concept split in two, or a dependency to pass in as data."""
    edges = {m: {d for d in ds if d != "service"} for m, ds in graph().items()}
    cycle = find_cycle(edges)
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_checks_catch_what_they_look_for() -> None:
    """The checks themselves: a known cycle is found, layers rank as the table says."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert layer_of("service.settings") == "bottom"
    assert layer_of("service.app") == "app"
    assert RANK["http"] > RANK["protocols"] > RANK["admission"] > RANK["runtime"]
    assert RANK["runtime"] > RANK["engine"] > RANK["bottom"]
    assert "service.engine.batching.batcher" in graph()


DIALECTS = {"hf", "tei", "openai", "cohere", "jina"}


def is_dialect(module: str) -> bool:
    """A dialect codec: `service.protocols.<task>.<dialect>` (e.g. `...embedding.tei`)."""
    parts = module.split(".")
    return len(parts) == 4 and parts[1] == "protocols" and parts[3] in DIALECTS


def test_no_dialect_module_imports_another() -> None:
    """Each dialect is a thin codec: what two share lives in the task's own module or a shared
    shapes module, never in another dialect's codec."""
    sideways = [
        f"{src} imports {dst}"
        for src, dsts in sorted(graph().items())
        if is_dialect(src)
        for dst in sorted(dsts)
        if is_dialect(dst)
    ]
    assert not sideways, "dialect modules importing each other:\n" + "\n".join(sideways)
    dialects = [m for m in graph() if is_dialect(m)]
    assert "service.protocols.embedding.tei" in dialects and len(dialects) >= 8


#: The rooms of `service/engine/`, highest first: a module may import its own room and any room
#: below it. The face is the engine's only door for the floors above (see the next test).
ENGINE_ROOMS = [
    "face",
    "batching",
    "loading",
    "llm_rerank",
    "multi_vector",
    "static",
    "forward",
    "pooling",
    "types",
    "jobs",
    "params",
    "folders",
]
ENGINE_RANK = {name: len(ENGINE_ROOMS) - i for i, name in enumerate(ENGINE_ROOMS)}


def engine_room(module: str) -> str | None:
    """service.engine.loading.choice.ranking -> loading; service.engine.jobs -> jobs."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "engine" else None


def test_every_engine_room_has_a_rank() -> None:
    rooms = {engine_room(m) for m in graph()} - {None}
    assert rooms <= set(ENGINE_RANK), f"engine rooms with no rank: {rooms - set(ENGINE_RANK)}"


def test_no_import_runs_up_a_room_of_the_engine() -> None:
    upward = [
        f"{src} imports {dst}"
        for src, dsts in sorted(graph().items())
        for dst in sorted(dsts)
        if (a := engine_room(src)) and (b := engine_room(dst)) and ENGINE_RANK[b] > ENGINE_RANK[a]
    ]
    assert not upward, "imports from a lower engine room to a higher one:\n" + "\n".join(upward)


def test_nothing_above_the_engine_reaches_past_its_face() -> None:
    """Admission, runtime, protocols, the edge and the app ask the engine through
    `service.engine.face` (and its value types: jobs, types); never through the batcher."""
    reaching = [
        f"{src} imports {dst}"
        for src, dsts in sorted(graph().items())
        if rank(src) > RANK["engine"]
        for dst in sorted(dsts)
        if engine_room(dst) == "batching"
    ]
    assert not reaching, "modules above the engine importing its batching:\n" + "\n".join(reaching)
    assert engine_room("service.engine.loading.choice.ranking") == "loading"
    assert "service.engine.face" in graph()["service.runtime.runtime"]


def test_the_environment_is_read_and_written_in_settings_only() -> None:
    """Settings are read once per process and handed down: no module but `service.settings`
    reads or writes `os.environ` (or `os.getenv`, `os.putenv`)."""
    touching = []
    for path in sorted(SERVICE.rglob("*.py")):
        if path == SERVICE / "settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr in ("environ", "getenv", "putenv", "unsetenv")
            ):
                touching.append(f"{path.relative_to(SERVICE.parent)}:{node.lineno} os.{node.attr}")
    assert not touching, "the environment touched outside settings.py:\n" + "\n".join(touching)


#: the most lines (docstring included) a function and a class of `service/` may span
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 60, 200


def oversized(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of each function over MAX_FUNCTION_LINES and each class over
    MAX_CLASS_LINES in `tree`."""
    found = []
    for node in ast.walk(tree):
        limit = (
            MAX_FUNCTION_LINES
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            else MAX_CLASS_LINES
            if isinstance(node, ast.ClassDef)
            else None
        )
        if limit is not None:
            size = (node.end_lineno or node.lineno) - node.lineno + 1  # type: ignore[attr-defined]
            if size > limit:
                found.append((node.name, node.lineno, size))  # type: ignore[attr-defined]
    return found


def test_no_function_over_60_lines_and_no_class_over_200() -> None:
    big = [
        f"{path.relative_to(SERVICE.parent)}:{line} {name}: {size} lines"
        for path in sorted(SERVICE.rglob("*.py"))
        for name, line, size in oversized(ast.parse(path.read_text()))
    ]
    assert not big, "split these:\n" + "\n".join(big)


def test_the_size_rule_sees_a_long_function_and_a_long_class() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    assert oversized(ast.parse(f"def f():\n{body}\n")) == [("f", 1, 61)]
    assert oversized(ast.parse(f"def f():\n{body[: body.rindex(chr(10))]}\n")) == []
    methods = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(67))
    assert oversized(ast.parse(f"class C:\n{methods}")) == [("C", 1, 201)]
