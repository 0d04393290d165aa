"""The one definition of an API key's digest, shared by the operator and the gateway.

Why this module exists: the operator stores each tenant's key as a SHA-256 digest in the
compiled config (from the Secret's bytes) and the gateway digests the key a client
presents (from the ``Authorization`` header's text). Both must reduce the same key to the
same digest, byte for byte, or the tenant cannot authenticate. Computed in three places
before, they disagreed on whitespace: ``bytes.strip()`` removes ASCII whitespace only,
``str.strip()`` also removes Unicode whitespace such as U+00A0 (no-break space), so a key
ending in one authenticated nowhere.

The rule: the key's bytes (text is UTF-8; the lone surrogates by which a server decodes
bytes that are not UTF-8, ``surrogateescape``, go back to those bytes) without surrounding
ASCII whitespace (space, tab, CR, LF, VT, FF: a Secret written with ``echo`` ends in a
newline), hashed with SHA-256, as lowercase hex. Any other character, non-ASCII
whitespace included, is part of the key.

>>> api_key_digest(b"sk-test\\n") == api_key_digest("sk-test") == api_key_digest(" sk-test")
True
>>> api_key_digest("sk-test\\u00a0") == api_key_digest("sk-test")
False
"""

from __future__ import annotations

import hashlib

ASCII_WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes


def api_key_bytes(key: str | bytes) -> bytes:
    """The bytes of ``key`` that are digested (see the module docstring)."""
    if isinstance(key, bytes):
        return key.strip(ASCII_WHITESPACE)
    try:
        raw = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no decoder made: keep it distinct
        raw = key.encode("utf-8", "surrogatepass")
    return raw.strip(ASCII_WHITESPACE)


def api_key_digest(key: str | bytes) -> str:
    """SHA-256 hex digest of an API key, as the compiled config stores it."""
    return hashlib.sha256(api_key_bytes(key)).hexdigest()
