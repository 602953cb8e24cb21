"""No side doors between the modules of `service/`: what one decides, another learns by a typed
call, never by reading response bytes (a status line compared, `b"HTTP/1.1 503"`) or by flags in
the ASGI scope's state. The scope's state carries request data only: its id, its arrival time,
its input count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[1] / "service"
REQUEST_DATA = frozenset({"request_id", "arrived", "inputs"})  # the scope state's only keys
_SEARCHES = frozenset({"startswith", "endswith", "find", "rfind", "index", "rindex", "count"})
_KEYED = frozenset({"get", "pop", "setdefault", "__getitem__", "__setitem__", "__delitem__"})

Finding = tuple[int, str]  # line, what


def status_line_reads(tree: ast.AST) -> list[Finding]:
    """Bytes compared with an HTTP status line (`==`, `in`, `startswith`...)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            operands = list(node.args) if node.func.attr in _SEARCHES else []
        else:
            continue
        for operand in operands:
            value = operand.value if isinstance(operand, ast.Constant) else None
            if isinstance(value, bytes) and value.lstrip().upper().startswith(b"HTTP/"):
                found.append((node.lineno, repr(value)))
    return found


def _is_state(node: ast.AST) -> bool:
    """`<x>["state"]`, `<x>.get("state", ...)`, `<x>.setdefault("state", ...)` or a name
    `state`: the ASGI scope's state dict (a request's, or the lifespan's, which uvicorn copies
    into every request's)."""
    if isinstance(node, ast.Name):
        return node.id == "state"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "state"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        first = node.args[0] if node.args else None
        return (
            node.func.attr in {"get", "setdefault"}
            and isinstance(first, ast.Constant)
            and first.value == "state"
        )
    return False


def state_keys(tree: ast.AST) -> list[Finding]:
    """Keys of the scope's state read or written other than the request's data (a key held in
    a name, such as a module's constant, counts as another key)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_state(node.value):
            key: ast.AST | None = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _is_state(node.func.value)
        ):
            if node.func.attr in _KEYED:
                key = node.args[0] if node.args else None
            elif node.func.attr == "update":
                found.append((node.lineno, "state.update(...)"))
                continue
            else:
                continue
        else:
            continue
        if not (isinstance(key, ast.Constant) and key.value in REQUEST_DATA):
            found.append((node.lineno, ast.unparse(node)))
    return found


def _modules() -> list[Path]:
    return sorted(SERVICE.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICE)))
def test_no_module_reads_a_status_line(path: Path) -> None:
    found = status_line_reads(ast.parse(path.read_text(), str(path)))
    assert not found, f"{path.name} learns a decision from response bytes: {found}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICE)))
def test_the_scope_state_carries_request_data_only(path: Path) -> None:
    found = state_keys(ast.parse(path.read_text(), str(path)))
    assert not found, f"{path.name} passes signals in the scope's state: {found}"


def test_the_checks_catch_the_side_doors_they_look_for() -> None:
    """The side doors the admission code once had are found; the request's data is not."""
    side_doors = """
if data[:12] == b"HTTP/1.1 503":
    shed(data)
if head.startswith(b"HTTP/1.1 5"):
    pass
if b"HTTP/1.1 503" in data:
    pass
scope["state"][HEAD_SHEDDER] = self
scope["state"][CPU_AT] = time.thread_time()
if scope["state"].pop(_PASSED, False):
    pass
began = self.cycle.scope["state"].get(CPU_AT, self._cpu_since)
shedder = request.scope.get("state", {}).get("shedder")
state["flag"] = True
state.update(passed=True)
"""
    tree = ast.parse(side_doors)
    assert [line for line, _ in status_line_reads(tree)] == [2, 4, 6]
    assert [line for line, _ in state_keys(tree)] == [8, 9, 10, 12, 13, 14, 15]
    request_data = """
state = scope.setdefault("state", {})
state["request_id"] = rid
state.setdefault("arrived", time.monotonic())
scope["state"]["arrived"] = now
request.scope["state"]["inputs"] = job.inputs
inputs = scope.get("state", {}).get("inputs", 0)
line = STATUS_LINE[status] + b"".join(parts)
transport.write(b"HTTP/1.1 503 Service Unavailable")
"""
    tree = ast.parse(request_data)
    assert status_line_reads(tree) == [] and state_keys(tree) == []
