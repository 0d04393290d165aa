"""Which objects a list or watch returns: label selectors and field selectors.

Why it exists: the operator sends its selectors to the API server (so it never sees every
Secret and Pod), so the emulator must apply them as a real server does, absence rules
included (``!=`` and ``notin`` match an object without the label).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tests.support.emulator.resources import Obj, kube_error

_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<val>[A-Za-z0-9_.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<vals>[^)]*)\))?\s*$"
)


def parse_label_selector(text: str) -> list[tuple[str, str, frozenset[str]]]:
    """Requirements (key, op, values) of a labelSelector string; ops: = != in notin exists !.

    >>> parse_label_selector("app=x,!legacy")
    [('app', '=', frozenset({'x'})), ('legacy', '!', frozenset())]
    """
    parts = re.split(r",(?![^()]*\))", text) if text.strip() else []
    reqs = []
    for part in parts:
        m = _REQUIREMENT.match(part)
        if m is None or (m["neg"] and (m["op"] or m["setop"])):
            raise kube_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
        if m["setop"]:
            vals = frozenset(v.strip() for v in m["vals"].split(",") if v.strip())
            reqs.append((m["key"], m["setop"], vals))
        elif m["op"]:
            reqs.append((m["key"], "!=" if m["op"] == "!=" else "=", frozenset({m["val"]})))
        else:
            reqs.append((m["key"], "!" if m["neg"] else "exists", frozenset()))
    return reqs


def labels_match(
    reqs: Iterable[tuple[str, str, frozenset[str]]], labels: Mapping[str, str]
) -> bool:
    """Whether labels satisfy every requirement (as Kubernetes: != and notin match absence)."""
    checks = {
        "=": lambda k, vs: k in labels and labels[k] in vs,
        "in": lambda k, vs: k in labels and labels[k] in vs,
        "!=": lambda k, vs: labels.get(k) not in vs,
        "notin": lambda k, vs: labels.get(k) not in vs,
        "exists": lambda k, vs: k in labels,
        "!": lambda k, vs: k not in labels,
    }
    return all(checks[op](key, vals) for key, op, vals in reqs)


def object_selector(params: Mapping[str, str]) -> Callable[[Obj], bool]:
    """A predicate on objects from labelSelector and fieldSelector.

    Field selectors: ``=``, ``==`` and ``!=`` on ``metadata.name``,
    ``metadata.namespace`` and any other dotted field path (kubectl describe selects
    Events by ``involvedObject.name``, ``.namespace``, ``.kind`` and ``.uid``).
    """
    reqs = parse_label_selector(params.get("labelSelector", ""))
    fields: list[tuple[list[str], bool, str]] = []
    for term in filter(None, params.get("fieldSelector", "").split(",")):
        match = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)", term.strip())
        if match is None:
            raise kube_error(400, "BadRequest", f"fieldSelector {term!r} is not emulated")
        fields.append((match[1].split("."), match[2] == "!=", match[3]))

    def field(obj: Obj, path: list[str]) -> str:
        node: Any = obj
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        return "" if node is None else str(node)

    def matches(obj: Obj) -> bool:
        meta = obj["metadata"]
        return labels_match(reqs, meta.get("labels") or {}) and all(
            (field(obj, path) == value) != negated for path, negated, value in fields
        )

    return matches
