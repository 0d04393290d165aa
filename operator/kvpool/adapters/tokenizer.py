"""Count prompt tokens with the pool's own tokenizer (HF ``tokenizers``, ``tokenizer.json``).

Why this module exists: the KV reservation of a request starts with its prompt length, and
the only honest count is the model's tokenizer. A pool's ``tokenizerPath`` points to its
``tokenizer.json``; this module loads it once per path (a cache shared by every request
and kept across config reloads), and counts:

- completions: the ``prompt`` string (or a list of strings: the sum; or a list of token
  ids: its length), encoded with the tokenizer's special tokens, as vLLM does;
- chat: the messages rendered with the model's chat template (``chat_template`` in the
  ``tokenizer_config.json`` or ``chat_template.jinja`` beside ``tokenizer.json``, rendered
  with a sandboxed Jinja2 environment with ``add_generation_prompt``), encoded without
  adding special tokens (the template carries them), as vLLM does. Without a template (or
  if it fails to render) the count is the sum of the contents plus 8 tokens a message.

A missing path, an unreadable file or content the tokenizer cannot count gives ``None``:
the domain then uses its byte-based fallback estimate and the gateway counts that in the
``kvpool_gateway_estimates_total{method="fallback"}`` metric. A tokenizer never makes a
request fail.

A path must never freeze the gateway (issue 18.2). ``Tokenizer.from_file`` holds the GIL
while it opens and reads, so a FIFO (or a hung NFS/CSI volume) froze every thread of the
process, ``/healthz`` included, and ``/dev/zero`` grew it to 2 GB in a second. So the
files are read here, in Python, on a thread of their own: opened without blocking
(``O_NONBLOCK``: a FIFO opens at once), refused unless a *regular file* of at most
``max_bytes`` (64 MiB: the largest tokenizer.json files known are ~35 MB), read in chunks
(``os.read`` releases the GIL) against a deadline, then built with ``Tokenizer.from_str``.
The caller waits at most ``load_seconds`` (10 s); a load still stuck in the kernel after
that is abandoned (its daemon thread may stay blocked; the pool counts by the byte
estimate, with a log line saying why).

:meth:`TokenizerCache.get` loads (blocking the calling thread, bounded);
:meth:`TokenizerCache.peek` never blocks: the tokenizer if it is loaded, else None;
:meth:`TokenizerCache.loaded` awaits a load for a bounded time on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

log = logging.getLogger("kvpool.tokenizer")

TOKENS_PER_MESSAGE_WITHOUT_TEMPLATE = 8
MAX_TOKENIZER_BYTES = 64 * 1024 * 1024  # larger files are refused (not read)
MAX_TEMPLATE_BYTES = 4 * 1024 * 1024  # tokenizer_config.json, chat_template.jinja
LOAD_SECONDS = 10.0  # a load not done by then is abandoned (the byte estimate is used)
READ_CHUNK = 1024 * 1024


class TokenizerFileError(OSError):
    """A tokenizer path that is not a regular file under the cap, or not read in time."""


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words (for the messages).

    >>> file_kind(stat.S_IFIFO), file_kind(stat.S_IFCHR), file_kind(stat.S_IFREG)
    ('a FIFO (named pipe)', 'a character device', 'a regular file')
    """
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def read_regular_file(path: str | Path, max_bytes: int, deadline: float) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, read by ``deadline``
    (``time.monotonic()``); raises :class:`TokenizerFileError` (or OSError) otherwise.
    Opened with ``O_NONBLOCK`` so that a FIFO does not wait for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TokenizerFileError(f"{path} is {file_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise TokenizerFileError(
                f"{path} has {info.st_size} bytes, more than the {max_bytes} a tokenizer may have"
            )
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, READ_CHUNK):  # releases the GIL
            size += len(chunk)
            if size > max_bytes:  # grew while read
                raise TokenizerFileError(f"{path} has more than {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise TokenizerFileError(f"{path} was not read within the load time")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_optional(path: Path, deadline: float) -> str | None:
    """A small text file beside the tokenizer, or None when there is none."""
    try:
        data = read_regular_file(path, MAX_TEMPLATE_BYTES, deadline)
    except FileNotFoundError:
        return None
    return data.decode("utf-8")


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer and the chat template found beside it."""

    path: str
    tokenizer: Tokenizer
    chat_template: Any | None  # a compiled jinja2 Template, or None
    special_tokens: dict[str, str]  # bos_token, eos_token... for the template

    def count_text(self, text: str, *, special: bool = True) -> int:
        """Tokens of one text, by the batch call: ``Tokenizer.encode`` holds the GIL for
        the whole encoding (a 100k-token prompt: 130 ms in which the event loop, waiting
        for the GIL, relayed nothing), the batch calls release it. Only the count is used,
        so where the library has it (tokenizers >= 0.21) the encoding also skips the
        character offsets: 0.16 s of CPU for 100k tokens with them, 0.08-0.10 s without
        (bench/proxy_cpu.py)."""
        encode = getattr(self.tokenizer, "encode_batch_fast", None) or self.tokenizer.encode_batch
        return len(encode([text], add_special_tokens=special)[0].ids)

    def count_prompt(self, prompt: Any) -> int | None:
        """Tokens of a /v1/completions ``prompt`` (string, list of strings, or token ids)."""
        if isinstance(prompt, str):
            return self.count_text(prompt)
        if isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) for p in prompt):
                return sum(self.count_text(p) for p in prompt)
            if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
                return len(prompt)
        return None

    def count_chat(self, messages: Sequence[Any]) -> int | None:
        """Tokens of /v1/chat/completions ``messages`` after the chat template."""
        if self.chat_template is not None:
            try:
                rendered = self.chat_template.render(
                    messages=list(messages), add_generation_prompt=True, **self.special_tokens
                )
            except Exception as exc:  # a template may raise on content it does not expect
                log.debug("chat template failed for %s: %s", self.path, exc)
            else:
                return self.count_text(rendered, special=False)
        total = 0
        for message in messages:
            total += TOKENS_PER_MESSAGE_WITHOUT_TEMPLATE
            for text in message_texts(message):
                total += self.count_text(text, special=False)
        return total


def message_texts(message: Any) -> list[str]:
    """The texts of one chat message: its string content, or the ``text`` of its parts."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
    return []


def _raise(message: str) -> None:
    raise ValueError(message)


def _load_template(folder: Path, deadline: float) -> tuple[Any | None, dict[str, str]]:
    specials: dict[str, str] = {}
    source: str | None = None
    config_text = _read_optional(folder / "tokenizer_config.json", deadline)
    if config_text is not None:
        config = json.loads(config_text)
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value
        if isinstance(config.get("chat_template"), str):
            source = config["chat_template"]
    if source is None:
        source = _read_optional(folder / "chat_template.jinja", deadline)
    if source is None:
        return None, specials
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(source), specials


class TokenizerCache:
    """Tokenizers by path, loaded once each on a thread of its own (failures, and loads
    abandoned after ``load_seconds``, are remembered as None). Thread-safe."""

    def __init__(
        self, *, max_bytes: int = MAX_TOKENIZER_BYTES, load_seconds: float = LOAD_SECONDS
    ) -> None:
        self.max_bytes = max_bytes
        self.load_seconds = load_seconds
        self._loads: dict[str, Future[LoadedTokenizer | None]] = {}
        self._lock = threading.Lock()  # held only to look up or start a load, never during one

    def _load(self, path: str) -> Future[LoadedTokenizer | None]:
        """The load of ``path``, started on a daemon thread if it was not yet."""
        with self._lock:
            load = self._loads.get(path)
            if load is not None:
                return load
            load = self._loads[path] = Future()
        deadline = time.monotonic() + self.load_seconds

        def run() -> None:
            try:
                loaded = fetch_tokenizer(path, max_bytes=self.max_bytes, deadline=deadline)
            except BaseException as exc:  # never leave the future pending
                log.warning("no tokenizer at %s (%s); prompt tokens will be estimated", path, exc)
                loaded = None
            with self._lock:
                if not load.done():
                    load.set_result(loaded)

        threading.Thread(target=run, name="kvpool-tokenizer-load", daemon=True).start()
        timer = threading.Timer(self.load_seconds, self._abandon, (path, load))
        timer.daemon = True
        timer.start()
        load.add_done_callback(lambda _: timer.cancel())
        return load

    def _abandon(self, path: str, load: Future[LoadedTokenizer | None]) -> None:
        with self._lock:
            if load.done():
                return
            load.set_result(None)
        log.warning(
            "tokenizer at %s did not load within %.0f s (a hung volume?); prompt tokens of "
            "its pools will be estimated from bytes",
            path,
            self.load_seconds,
        )

    def get(self, path: str | None) -> LoadedTokenizer | None:
        """The tokenizer at ``path`` (a tokenizer.json, or a folder holding one), or None;
        waits for its load (at most ``load_seconds``)."""
        if not path:
            return None
        return self._load(path).result()

    def pending(self, path: str | None) -> bool:
        """Whether the load of ``path`` is still under way."""
        if not path:
            return False
        return not self._load(path).done()

    def peek(self, path: str | None) -> LoadedTokenizer | None:
        """The tokenizer at ``path`` if it is loaded, else None (its load is started);
        never waits."""
        if not path:
            return None
        load = self._load(path)
        return load.result() if load.done() else None

    async def loaded(self, path: str | None, timeout: float) -> LoadedTokenizer | None:
        """The tokenizer at ``path``, waiting for its load on the event loop at most
        ``timeout`` seconds (None when it is not loaded by then)."""
        if not path:
            return None
        load = self._load(path)
        if load.done():
            return load.result()
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(load)), timeout)
        except TimeoutError:
            return None


def fetch_tokenizer(
    path: str, *, max_bytes: int = MAX_TOKENIZER_BYTES, deadline: float | None = None
) -> LoadedTokenizer | None:
    """Load a tokenizer.json (and the chat template beside it); None if it cannot be read
    (not a regular file, larger than ``max_bytes``, not read by ``deadline``, not a
    tokenizer). Blocks the calling thread: call it off the event loop."""
    if deadline is None:
        deadline = time.monotonic() + LOAD_SECONDS
    file = Path(path)
    try:
        if stat.S_ISDIR(os.stat(file).st_mode):
            file = file / "tokenizer.json"
        text = read_regular_file(file, max_bytes, deadline).decode("utf-8")
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # missing file, FIFO, device, too large, bad JSON...
        log.warning("no tokenizer at %s (%s); prompt tokens will be estimated", path, exc)
        return None
    try:
        template, specials = _load_template(file.parent, deadline)
    except Exception as exc:
        log.warning("chat template beside %s unusable (%s); counting contents only", path, exc)
        template, specials = None, {}
    return LoadedTokenizer(
        path=str(file), tokenizer=tokenizer, chat_template=template, special_tokens=specials
    )
