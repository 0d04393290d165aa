"""The API-key digest: one definition for the operator (a Secret's bytes) and the gateway
(the text of an ``Authorization`` header), so the same key always meets the same digest.

Each row is a key as the Secret holds it and as a client presents it; both sides must
agree, and the row's digest is SHA-256 of the bytes the rule keeps (an independent oracle:
``hashlib`` on literal bytes). Before one definition, the gateway stripped Unicode
whitespace from the header and the operator only ASCII from the Secret: the rows
``trailing-no-break-space`` and ``leading-em-space`` authenticated nowhere.
"""

from __future__ import annotations

import hashlib

import pytest

from kvpool.domain.api_keys import api_key_bytes, api_key_digest


@pytest.mark.parametrize(
    ("secret", "header", "kept"),
    [
        (b"sk-1", "sk-1", b"sk-1"),
        (b"sk-1\n", "sk-1", b"sk-1"),
        (b"\t sk-1 \r\n", " sk-1\t", b"sk-1"),
        (b"sk-1\x0b\x0c", "sk-1", b"sk-1"),
        (b"sk-1\xc2\xa0", "sk-1\u00a0", b"sk-1\xc2\xa0"),
        (b"\xe2\x80\x83sk-1", "\u2003sk-1", b"\xe2\x80\x83sk-1"),
        (b"sk-1\xe3\x80\x80", "sk-1\u3000", b"sk-1\xe3\x80\x80"),
        (b"cl\xc3\xa9-1", "clé-1", b"cl\xc3\xa9-1"),
        (b"sk-\xff\xfe", "sk-\udcff\udcfe", b"sk-\xff\xfe"),
        (b"sk 1", "sk 1", b"sk 1"),
    ],
    ids=[
        "plain",
        "trailing-newline",
        "surrounding-ascii-whitespace",
        "vertical-tab-and-form-feed",
        "trailing-no-break-space",
        "leading-em-space",
        "trailing-ideographic-space",
        "non-ascii-letter",
        "bytes-not-utf8-as-a-server-decodes-them",
        "inner-space",
    ],
)
def test_the_secret_and_the_header_meet_the_same_digest(
    secret: bytes, header: str, kept: bytes
) -> None:
    expected = hashlib.sha256(kept).hexdigest()
    assert api_key_bytes(secret) == kept
    assert api_key_bytes(header) == kept
    assert api_key_digest(secret) == expected, f"the Secret's {secret!r}"
    assert api_key_digest(header) == expected, f"the header's {header!r}"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("sk-1", "sk-1\u00a0"),
        ("sk-1", "sk-2"),
        ("sk-\ud800", "sk-"),
    ],
    ids=["no-break-space-is-part-of-the-key", "different-keys", "lone-surrogate"],
)
def test_different_keys_get_different_digests(one: str, other: str) -> None:
    assert api_key_digest(one) != api_key_digest(other)
