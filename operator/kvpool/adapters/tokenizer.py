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
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

log = logging.getLogger("kvpool.tokenizer")

TOKENS_PER_MESSAGE_WITHOUT_TEMPLATE = 8


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer and the chat template found beside it."""

    path: str
    tokenizer: Tokenizer
    chat_template: Any | None  # a compiled jinja2 Template, or None
    special_tokens: dict[str, str]  # bos_token, eos_token... for the template

    def count_text(self, text: str, *, special: bool = True) -> int:
        """Tokens of one text."""
        return len(self.tokenizer.encode(text, add_special_tokens=special).ids)

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
            content = message.get("content") if isinstance(message, dict) else None
            total += TOKENS_PER_MESSAGE_WITHOUT_TEMPLATE
            if isinstance(content, str):
                total += self.count_text(content, special=False)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        total += self.count_text(part["text"], special=False)
        return total


def _raise(message: str) -> None:
    raise ValueError(message)


def _load_template(folder: Path) -> tuple[Any | None, dict[str, str]]:
    specials: dict[str, str] = {}
    source: str | None = None
    config_file = folder / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value
        if isinstance(config.get("chat_template"), str):
            source = config["chat_template"]
    template_file = folder / "chat_template.jinja"
    if source is None and template_file.is_file():
        source = template_file.read_text(encoding="utf-8")
    if source is None:
        return None, specials
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(source), specials


class TokenizerCache:
    """Tokenizers by path, loaded once (thread-safe; failures are remembered as None)."""

    def __init__(self) -> None:
        self._loaded: dict[str, LoadedTokenizer | None] = {}
        self._lock = threading.Lock()

    def get(self, path: str | None) -> LoadedTokenizer | None:
        """The tokenizer at ``path`` (a tokenizer.json, or a folder holding one), or None."""
        if not path:
            return None
        with self._lock:
            if path in self._loaded:
                return self._loaded[path]
            loaded = fetch_tokenizer(path)
            self._loaded[path] = loaded
            return loaded


def fetch_tokenizer(path: str) -> LoadedTokenizer | None:
    """Load a tokenizer.json (and the chat template beside it); None if it cannot be read."""
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # missing file, bad JSON, unknown model type...
        log.warning("no tokenizer at %s (%s); prompt tokens will be estimated", path, exc)
        return None
    try:
        template, specials = _load_template(file.parent)
    except Exception as exc:
        log.warning("chat template beside %s unusable (%s); counting contents only", path, exc)
        template, specials = None, {}
    return LoadedTokenizer(
        path=str(file), tokenizer=tokenizer, chat_template=template, special_tokens=specials
    )
