"""Parse and check an OpenAI request body before anything else looks at it.

Why this module exists: bad input must be a clear 4xx, never a 500 or a crash, and the
later steps (classify, estimate, budget, admit) should see typed values only. Checks, in
order, each a 400 with a JSON error unless noted:

- the body is UTF-8 (``invalid_encoding``) and JSON (``invalid_json``; nesting so deep
  that the parser recurses out, and ``NaN``/``Infinity``, are also ``invalid_json``) and
  an object (``invalid_body``);
- ``model`` is a non-empty string (``missing_model``; an unknown one is a 404 later);
- ``stream`` is a boolean or null; ``stream_options`` an object or null;
- ``max_tokens`` / ``max_completion_tokens`` / ``n`` are integers (not booleans, not
  floats) or null (``invalid_type``); their ranges are the estimate's business;
- chat: ``messages`` is a non-empty list of objects with a string ``role``; a content is a
  string, a list of parts, or null;
- completions: ``prompt`` is a string, a list of token ids, or a non-empty list of strings
  and/or lists of token ids (several prompts, as vLLM serves them: each prompt is its own
  sequence(s), and the estimate reserves and charges each one);
- ``max_tokens``: chat takes ``max_completion_tokens`` when set, else ``max_tokens`` (vLLM's
  rule); completions *without* the field get the OpenAI/vLLM default of
  :data:`COMPLETIONS_DEFAULT_MAX_TOKENS`, an explicit ``null`` means "up to the context".

The caller's ``priority`` field is removed here (the tier decides the engine priority);
:func:`build_upstream_body` builds what the engine is sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from kvpool.gateway.errors import GatewayError

Kind = Literal["chat", "completions"]

CALLER_FIELDS_STRIPPED = ("priority",)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default (as OpenAI's)


@dataclass(frozen=True)
class ParsedRequest:
    """A checked request body and the facts later steps need."""

    kind: Kind
    body: dict[str, Any]  # the caller's body without the fields we strip
    model: str
    stream: bool
    include_usage: bool  # the caller asked for a usage chunk in the stream
    max_tokens: int | None
    n: int
    prompt: Any  # the first completions prompt (str or token ids) or None
    messages: list[dict[str, Any]] | None  # chat messages or None
    prompt_utf8_bytes: int  # UTF-8 length of the prompt text (all contents for chat)
    prompts: tuple[Any, ...] = ()  # every completions prompt (one or more), () for chat
    prompt_sizes: tuple[int, ...] = ()  # UTF-8 length of each of ``prompts``


def _bad(code: str, message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, code, message, param=param)


def _optional_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad("invalid_type", f"{name} must be an integer", name)
    return value


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _content_bytes(content: Any, index: int) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _utf8_len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if not isinstance(part, dict):
                raise _bad("invalid_type", f"messages[{index}].content parts must be objects")
            text = part.get("text")
            if isinstance(text, str):
                total += _utf8_len(text)
        return total
    raise _bad("invalid_type", f"messages[{index}].content must be a string, a list or null")


def _check_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("invalid_messages", "messages must be a non-empty list", "messages")
    total = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(
                "invalid_messages", f"messages[{index}] must be an object with a string role"
            )
        total += _content_bytes(message.get("content"), index)
    return messages, total


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _prompt_size(prompt: Any) -> int | None:
    """The UTF-8 length of one prompt (token ids count 4 bytes each), None if not a prompt."""
    if isinstance(prompt, str):
        return _utf8_len(prompt)
    if _is_token_ids(prompt):
        return 4 * len(prompt)
    return None


def _check_prompt(body: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    prompt = body.get("prompt")
    single = _prompt_size(prompt)
    if single is not None:
        return (prompt,), (single,)
    if isinstance(prompt, list) and prompt:
        sizes = [_prompt_size(p) for p in prompt]
        if all(size is not None for size in sizes):
            return tuple(prompt), tuple(size or 0 for size in sizes)
    raise _bad(
        "invalid_prompt",
        "prompt must be a string, a list of token ids, or a non-empty list of those",
        "prompt",
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_request(kind: Kind, raw: bytes) -> ParsedRequest:
    """The checked request, or a GatewayError (400) saying what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad("invalid_encoding", f"the body is not UTF-8 (byte {exc.start})") from exc
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise _bad("invalid_json", f"the body is not valid JSON: {str(exc)[:200]}") from exc
    if not isinstance(body, dict):
        raise _bad("invalid_body", "the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("missing_model", "model must be a non-empty string", "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("invalid_type", "stream must be a boolean", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("invalid_type", "stream_options must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    max_tokens = _optional_int(body, "max_tokens")
    max_completion = _optional_int(body, "max_completion_tokens")  # type-checked everywhere
    if kind == "chat" and max_completion is not None:
        max_tokens = max_completion  # chat's newer name wins; completions do not know it
    if kind == "completions" and "max_tokens" not in body:
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    n = _optional_int(body, "n")
    messages: list[dict[str, Any]] | None = None
    prompts: tuple[Any, ...] = ()
    sizes: tuple[int, ...] = ()
    if kind == "chat":
        messages, prompt_bytes = _check_messages(body)
    else:
        prompts, sizes = _check_prompt(body)
        prompt_bytes = sum(sizes)
    for name in CALLER_FIELDS_STRIPPED:
        body.pop(name, None)
    return ParsedRequest(
        kind=kind,
        body=body,
        model=model,
        stream=bool(stream),
        include_usage=include_usage,
        max_tokens=max_tokens,
        n=1 if n is None else n,
        prompt=prompts[0] if prompts else None,
        messages=messages,
        prompt_utf8_bytes=prompt_bytes,
        prompts=prompts,
        prompt_sizes=sizes,
    )


def upstream_output_bound(parsed: ParsedRequest, output_limit: int) -> int | None:
    """The most tokens a sequence of the upstream call can generate, as
    :func:`build_upstream_body` bounds it (None: unbounded by the body)."""
    if output_limit >= 1 and (parsed.max_tokens is None or parsed.max_tokens > output_limit):
        return output_limit
    return parsed.max_tokens


def build_upstream_body(
    parsed: ParsedRequest, output_limit: int, engine_priority: int | None
) -> bytes:
    """The body sent to the engine: the caller's (without ``priority``), with its output
    bounded to what was charged, the tier's engine priority, and a usage request.

    - output: the estimate charges ``min(max_tokens, max_model_len - prompt)`` per
      sequence from the gateway's prompt count. The engine counts the prompt itself, so
      when the caller's limit is absent or above the charged bound the body states the
      bound explicitly (chat: ``max_completion_tokens``, which vLLM prefers over
      ``max_tokens``; completions: ``max_tokens``). With an exact prompt count this
      changes nothing the engine would do; with an inexact one it keeps "generated <=
      charged";
    - ``priority``: the tier's ``enginePriority`` (None: the engines do not schedule by
      priority, and the field stays out);
    - streams always ask for ``stream_options.include_usage``: the relay meters the final
      usage chunk (and removes it again when the caller did not ask for it,
      :mod:`kvpool.gateway.upstream`).
    """
    body = dict(parsed.body)
    if upstream_output_bound(parsed, output_limit) != parsed.max_tokens:
        body["max_completion_tokens" if parsed.kind == "chat" else "max_tokens"] = output_limit
    if engine_priority is not None:
        body["priority"] = engine_priority
    if parsed.stream:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
    return json.dumps(body, separators=(",", ":")).encode()
