"""Each route names its error envelope once (`Endpoint.envelope`); `service.errors` shapes the
bodies and looks at no path."""

from __future__ import annotations

import inspect

from service import errors
from service.errors import Envelope, InvalidInput
from service.protocols.routes import ENDPOINTS, envelope_of


def test_each_dialect_answers_errors_in_its_own_envelope() -> None:
    by_prefix = {"/v1/": Envelope.OPENAI, "/v2/": Envelope.COHERE}
    for e in ENDPOINTS:
        want = next((v for k, v in by_prefix.items() if e.path.startswith(k)), Envelope.SERVICE)
        assert e.envelope is want, e.path
        assert envelope_of(e.path) is want, e.path
    assert envelope_of("/") is Envelope.SERVICE
    assert envelope_of("/v1/models") is Envelope.OPENAI
    # No route: the envelope of the dialect the prefix names (a 404 an SDK can read).
    assert envelope_of("/v1/nothing") is Envelope.OPENAI
    assert envelope_of("/v2/nothing") is Envelope.COHERE
    assert envelope_of("/nothing") is Envelope.SERVICE


def test_the_envelopes_bodies() -> None:
    error = InvalidInput("inputs[0] is empty")
    assert Envelope.SERVICE.content(error, "r1") == {
        "error": "inputs[0] is empty",
        "error_type": "invalid_input",
        "request_id": "r1",
    }
    assert Envelope.OPENAI.content(error, "r1") == {
        "error": {
            "message": "inputs[0] is empty",
            "type": "invalid_input",
            "param": None,
            "code": 422,
        }
    }
    assert Envelope.COHERE.content(error, "r1") == {"id": "r1", "message": "inputs[0] is empty"}


def test_errors_look_at_no_path() -> None:
    source = inspect.getsource(errors)
    assert '"/v1' not in source and '"/v2' not in source and "startswith" not in source
