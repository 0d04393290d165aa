"""Load manifests from files and directories, and validate them: the I/O half of validation.

``kvpool validate`` and ``kvpool plan`` take ``-f PATH`` arguments: files, or directories
searched recursively for ``*.yaml`` / ``*.yml`` (``-`` reads standard input). Every file
is split into YAML documents here; the checks themselves are pure
(:mod:`kvpool.api.validation`). What cannot be loaded - a missing file, an empty path,
a directory without manifests, malformed YAML, a duplicate mapping key (which YAML
would silently resolve to the last value) - becomes a :class:`Problem`, never a
traceback. Built-in kinds are checked with kubernetes-validate (strict), whose schemas
are files on disk, hence here rather than in the pure layer.

Usage from another command::

    validated = load_and_validate(["examples/"])
    if not validated.ok:
        for problem in validated.problems:
            print(problem.format())
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from kvpool.adapters.tokenizer import file_kind
from kvpool.api.validation import (
    Document,
    Finding,
    Problem,
    Skipped,
    ValidatedSet,
    validate_documents,
)
from kvpool.api.validation.schema import format_path
from kvpool.api.validation.semantic import SPECIAL_FILE_ROOTS
from kvpool.domain.api_keys import api_key_digest

MANIFEST_SUFFIXES = (".yaml", ".yml")


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that rejects duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return dict(loader.construct_mapping(node))


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _yaml_reason(error: yaml.YAMLError) -> tuple[str, str]:
    """A place and a one-line reason for a YAML error."""
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return where, f"malformed YAML: {problem}"


def parse_documents(source: str, text: str) -> tuple[list[Document], list[Problem]]:
    """The YAML documents of one file's text; documents before a syntax error are kept."""
    documents: list[Document] = []
    try:
        for index, body in enumerate(yaml.load_all(text, Loader=_StrictLoader), start=1):
            documents.append(Document(source, index, body))
    except yaml.YAMLError as error:
        where, reason = _yaml_reason(error)
        return documents, [Problem(source, "", "", where, reason)]
    return documents, []


def find_manifest_files(path: Path) -> list[Path]:
    """``path`` itself when a file, else the ``*.yaml``/``*.yml`` files below it, sorted."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
    return [path]


def fetch_documents(paths: Iterable[str]) -> tuple[list[Document], list[Problem]]:
    """Read and split every named file; unreadable paths become problems."""
    documents: list[Document] = []
    problems: list[Problem] = []
    for raw in paths:
        if raw == "-":
            found, bad = parse_documents("<stdin>", sys.stdin.read())
            documents += found
            problems += bad
            continue
        if not raw.strip():
            problems.append(Problem("''", "", "", "", "empty path"))
            continue
        path = Path(raw)
        if not path.exists():
            problems.append(Problem(raw, "", "", "", "no such file or directory"))
            continue
        files = find_manifest_files(path)
        if not files:
            problems.append(Problem(raw, "", "", "", "no *.yaml or *.yml files in this directory"))
        for file in files:
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                problems.append(Problem(str(file), "", "", "", f"cannot read: {error}"))
                continue
            found, bad = parse_documents(str(file), text)
            documents += found
            problems += bad
    return documents, problems


def check_builtin(body: Mapping[str, Any]) -> list[Finding]:
    """Strict kubernetes-validate findings for a built-in object (first error only)."""
    try:
        kubernetes_validate.validate(dict(body), kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        parts = list(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = error.schema.get("properties", {})
            return [
                Finding(format_path([*parts, key]), "unknown field")
                for key in error.instance
                if key not in known
            ]
        return [Finding(format_path(parts) or "(object)", error.message)]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [Finding("kind", str(error))]
    return []


def check_tokenizer_paths(documents: Iterable[Document]) -> list[Problem]:
    """ModelPools whose ``tokenizerPath`` is, on this machine, a FIFO, a device or a socket
    (the gateway would find nothing to read there; a FIFO blocked it for good). A path
    that does not exist here is not judged: it lives inside the gateway's pod. ``stat``
    only: nothing is opened."""
    problems = []
    for doc in documents:
        body = doc.body
        if not isinstance(body, dict) or body.get("kind") != "ModelPool":
            continue
        spec = body.get("spec")
        model = spec.get("model") if isinstance(spec, dict) else None
        path = model.get("tokenizerPath") if isinstance(model, dict) else None
        if not isinstance(path, str) or path.startswith(SPECIAL_FILE_ROOTS):
            continue  # /dev/... is the semantic check's
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            continue
        metadata = body.get("metadata")
        name = str(metadata.get("name")) if isinstance(metadata, dict) else ""
        problems.append(
            Problem(
                doc.source,
                "ModelPool",
                name,
                "spec.model.tokenizerPath",
                f"{path!r} is {file_kind(mode)} on this machine, not a tokenizer.json; point "
                "it to the model's tokenizer.json (a regular file) or the folder holding it",
            )
        )
    return problems


def load_and_validate(paths: Iterable[str], *, require_secrets: bool = False) -> ValidatedSet:
    """Load every manifest under ``paths`` and validate the set (see kvpool.api.validation).

    Loading problems come first; an empty set of objects is a problem too. With
    ``require_secrets`` a Secret missing from the set is a problem, not a warning.
    """
    paths = list(paths)
    documents, load_problems = fetch_documents(paths)
    validated = validate_documents(
        documents, check_builtin=check_builtin, key_digest=api_key_digest
    )
    problems = [*load_problems, *validated.problems, *check_tokenizer_paths(documents)]
    warnings = validated.warnings
    if require_secrets:
        problems, warnings = [*problems, *warnings], []
    if not problems and validated.object_count == 0:
        where = ", ".join(paths) or "''"
        reason = "no objects found"
        if validated.skipped:
            reason = f"no kvpool objects found ({skipped_note(validated.skipped)})"
        problems.append(Problem(where, "", "", "", reason))
    return dataclasses.replace(validated, problems=problems, warnings=warnings)


def skipped_note(skipped: Sequence[Skipped], shown: int = 4) -> str:
    """One line for the documents left unchecked, naming the first few.

    >>> skipped_note([Skipped("a.yaml", "apps/v1 Deployment/redis")])
    'skipped 1 document kvpool does not check: apps/v1 Deployment/redis (a.yaml)'
    """
    count = len(skipped)
    named = ", ".join(item.format() for item in skipped[:shown])
    more = f" and {count - shown} more" if count > shown else ""
    noun = "document" if count == 1 else "documents"
    return f"skipped {count} {noun} kvpool does not check: {named}{more}"
