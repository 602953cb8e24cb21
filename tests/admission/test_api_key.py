"""The one API key check (`service.admission.api_key.authorized`), used by the head sheds and
by the routes alike."""

from __future__ import annotations

import pytest

from service.admission.api_key import authorized

KEY = "s3cret"


@pytest.mark.parametrize(
    ("headers", "key", "expected"),
    [
        ([], None, True),  # no key set: everyone
        ([(b"authorization", b"Basic xyz")], None, True),
        ([], KEY, False),  # no header
        ([(b"authorization", b"Bearer s3cret")], KEY, True),
        ([(b"authorization", b"bearer s3cret")], KEY, True),  # the scheme in any case
        ([(b"authorization", b"BEARER  s3cret \t")], KEY, True),  # the token trimmed
        ([(b"authorization", b"Bearer wrong")], KEY, False),
        ([(b"authorization", b"Bearer s3cre")], KEY, False),  # a prefix is not the key
        ([(b"authorization", b"Bearer s3cret2")], KEY, False),
        ([(b"authorization", b"Basic s3cret")], KEY, False),  # another scheme
        ([(b"authorization", b"s3cret")], KEY, False),  # no scheme
        ([(b"authorization", b"Bearer")], KEY, False),
        # the first header counts, as the routes read it
        ([(b"authorization", b"Bearer wrong"), (b"authorization", b"Bearer s3cret")], KEY, False),
        ([(b"authorization", b"Bearer s3cret"), (b"authorization", b"Bearer wrong")], KEY, True),
        ([(b"x-api-key", b"s3cret")], KEY, False),
        # the raw bytes are compared: a key beyond ASCII matches its UTF-8 bytes
        ([(b"authorization", "Bearer clé".encode())], "clé", True),
        ([(b"authorization", "Bearer clé".encode("latin-1"))], "clé", False),
    ],
)
def test_authorized(headers: list[tuple[bytes, bytes]], key: str | None, expected: bool) -> None:
    assert authorized(headers, key) is expected
