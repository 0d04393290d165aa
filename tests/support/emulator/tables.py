"""What ``kubectl get`` shows: meta.k8s.io/v1 Tables from a CRD's printer columns.

Why it exists: the printer columns are part of kvpool's API (what on-call reads at a
glance), so the emulator answers ``Accept: ...;as=Table`` with the columns a real server
would compute from the CRD's JSONPaths, and tests can check them with kubectl itself.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from typing import Any

from tests.support.emulator.resources import ApiResource, Obj

TABLE_ACCEPT = "as=Table"


_JSONPATH_STEP = re.compile(
    r"\.(?P<field>[A-Za-z0-9_-]+)|\[(?P<index>-?\d+)\]|\[\*\]"
    r"|\[\?\(@\.(?P<fkey>[A-Za-z0-9_.-]+)\s*==\s*[\"'](?P<fval>[^\"']*)[\"']\)\]"
)


def eval_jsonpath(obj: Any, path: str) -> list[Any]:
    """Values at a printer-column JSONPath (the subset CRDs use: fields, [i], [*], [?(@.k=="v")]).

    >>> eval_jsonpath({"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
    ...               '.status.conditions[?(@.type=="Ready")].status')
    ['True']
    """
    nodes, pos, path = [obj], 0, path.strip().removeprefix("{").removesuffix("}").strip()
    while pos < len(path) and nodes:
        m = _JSONPATH_STEP.match(path, pos)
        if m is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {pos}")
        pos = m.end()
        if m["field"] is not None:
            nodes = [n[m["field"]] for n in nodes if isinstance(n, dict) and m["field"] in n]
        elif m["index"] is not None:
            i = int(m["index"])
            nodes = [n[i] for n in nodes if isinstance(n, list) and -len(n) <= i < len(n)]
        elif m["fkey"] is not None:
            nodes = [
                item
                for n in nodes
                if isinstance(n, list)
                for item in n
                if eval_jsonpath(item, "." + m["fkey"]) == [m["fval"]]
            ]
        else:
            nodes = [item for n in nodes if isinstance(n, list) for item in n]
    return nodes


def human_age(timestamp: str, now: datetime.datetime) -> str:
    """How kubectl shows a ``date`` column: the age of an RFC 3339 time, short.

    >>> human_age("2026-01-01T00:00:00Z", datetime.datetime(2026, 1, 1, 2, 5, tzinfo=datetime.UTC))
    '125m'
    """
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int((now - then).total_seconds()))
    minutes, hours = seconds // 60, seconds // 3600
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def build_table(resource: ApiResource, items: list[Obj], resource_version: int) -> Obj:
    """A meta.k8s.io/v1 Table (what ``kubectl get`` asks for) from the printer columns."""
    columns = list(resource.printer_columns) or [
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]
    definitions = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "priority": 0,
            "description": "Name of the object.",
        }
    ] + [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": c.get("priority", 0),
        }
        for c in columns
    ]

    def cell(obj: Obj, column: Mapping[str, Any]) -> Any:
        values = eval_jsonpath(obj, column["jsonPath"])
        if not values:
            return None
        if column.get("type") == "date" and isinstance(values[0], str):
            return human_age(values[0], datetime.datetime.now(datetime.UTC))
        texts = [
            v if isinstance(v, str | int | float) else json.dumps(v, separators=(",", ":"))
            for v in values
        ]
        return texts[0] if len(texts) == 1 else ",".join(map(str, texts))

    rows = [
        {
            "cells": [obj["metadata"]["name"]] + [cell(obj, c) for c in columns],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            },
        }
        for obj in items
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": str(resource_version)},
        "columnDefinitions": definitions,
        "rows": rows,
    }
