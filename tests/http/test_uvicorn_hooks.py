"""The uvicorn internals the edge builds on (`service.http.bounded`, `service.http.edge`).

The edge subclasses uvicorn's httptools protocol and overrides or calls private hooks that
uvicorn does not promise to keep. pyproject.toml pins uvicorn to the range this was tested on;
this test names the hook that moved, so an upgrade past that range fails here, by name, and
not somewhere in the real-server tests.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

#: Methods of HttpToolsProtocol the edge overrides or calls, with the parameters it passes.
PROTOCOL_HOOKS = {
    "__init__": ["self", "config", "server_state", "app_state", "_loop"],
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "on_headers_complete": ["self"],
    "on_message_complete": ["self"],
    "on_response_complete": ["self"],
    "_start_asgi_task": ["self", "cycle", "app"],
    "_unset_keepalive_if_required": ["self"],
    "handle_websocket_upgrade": ["self"],
}

#: Attributes of a protocol instance the edge reads or sets.
PROTOCOL_ATTRIBUTES = (
    "transport",
    "flow",
    "cycle",
    "pipeline",
    "client",
    "server_state",
    "parser",
    "loop",
    "connections",
    "headers",
    "app",
)

#: Attributes of a RequestResponseCycle the edge reads or sets.
CYCLE_ATTRIBUTES = (
    "scope",
    "disconnected",
    "response_started",
    "response_complete",
    "message_event",
    "keep_alive",
)


@pytest.mark.parametrize("name", sorted(PROTOCOL_HOOKS))
def test_each_protocol_hook_the_edge_overrides_is_there_with_its_parameters(name: str) -> None:
    hook = getattr(HttpToolsProtocol, name, None)
    assert hook is not None, f"uvicorn's HttpToolsProtocol has no {name} any more"
    params = list(inspect.signature(hook).parameters)
    assert params == PROTOCOL_HOOKS[name], f"HttpToolsProtocol.{name}{params} changed"


def test_the_module_names_the_edge_imports_are_there() -> None:
    assert isinstance(httptools_impl.STATUS_LINE, dict) and 503 in httptools_impl.STATUS_LINE
    assert httptools_impl.STATUS_LINE[503].startswith(b"HTTP/1.1 503")


def test_a_protocol_and_its_cycle_hold_the_attributes_the_edge_uses() -> None:
    loop = asyncio.new_event_loop()
    try:
        config = Config(app=_app, http="httptools", log_config=None)
        config.load()
        protocol = HttpToolsProtocol(config, ServerState(), {}, loop)
        missing = [a for a in PROTOCOL_ATTRIBUTES if not hasattr(protocol, a)]
        assert not missing, f"HttpToolsProtocol instances lack {missing}"
        cycle_params = list(inspect.signature(RequestResponseCycle.__init__).parameters)
        assert "scope" in cycle_params and "keep_alive" in cycle_params
        cycle = RequestResponseCycle(
            **{
                name: None
                for name in cycle_params[1:]
                if name not in ("scope", "keep_alive", "message_event")
            },
            scope={"type": "http"},
            keep_alive=True,
            message_event=asyncio.Event(),
        )
        missing = [a for a in CYCLE_ATTRIBUTES if not hasattr(cycle, a)]
        assert not missing, f"RequestResponseCycle instances lack {missing}"
    finally:
        loop.close()


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("never called")
