"""Drift: which fields kvpool owns in a child object no longer say what kvpool wrote.

Why it exists: the operator writes a child only when its ``kvpool.dev/spec-hash``
annotation differs from the desired object's, so that server-side defaults (fields the
API server adds: ``imagePullPolicy``, ``terminationMessagePath``, a Service's
``clusterIP``...) never cause a write. But a hand edit (``kubectl set image``, a patched
selector) leaves the annotation as it was, so the hash alone would never see it. This
module compares the desired object with the stored one, field by field, tolerating
exactly what an API server does to what we send:

- a mapping matches when every key we set matches (keys we do not set are the server's
  or someone else's: defaults, status, other controllers' annotations) - except the
  free-form maps we own whole (:data:`EXACT_MAPS`: selectors, ``nodeSelector``, resource
  ``requests``/``limits``), where an added key is drift too (an extra selector label
  would select no pod);
- a list matches when it has the same length and each item matches (we own the whole
  list: an added env var or container is drift);
- a scalar matches when equal, equal as text (``8000`` and ``"8000"``), or the same
  Kubernetes quantity (``"1000m"`` and ``"1"``, ``"1Gi"`` and ``"1073741824"``: the API
  server stores quantities in canonical form).

Worked example: desired ``{"containers": [{"name": "engine", "image": "vllm:1"}]}`` against
stored ``{"containers": [{"name": "engine", "image": "vllm:2", "imagePullPolicy":
"IfNotPresent"}]}`` gives ``["containers[0].image"]``.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

# Free-form maps kvpool sets whole; an API server never adds keys to these.
EXACT_MAPS = frozenset({"selector", "matchLabels", "nodeSelector", "requests", "limits"})

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity as a number, or None when it is not one.

    >>> quantity("1500m") == quantity("1.5"), quantity("1Gi") == quantity(1073741824)
    (True, True)
    >>> quantity("x") is None
    True
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    match = _QUANTITY.match(str(value))
    if match is None:
        return None
    try:
        number, suffix = Decimal(match.group(1)), match.group(2) or ""
    except InvalidOperation:
        return None
    if suffix[:1] in ("e", "E"):
        return number * (Decimal(10) ** int(suffix[1:]))
    return number * _SUFFIX[suffix]


def _same_scalar(want: Any, have: Any) -> bool:
    if want == have or (not isinstance(want, bool) and str(want) == str(have)):
        return True
    a, b = quantity(want), quantity(have)
    return a is not None and a == b


def find_drift(desired: Any, current: Any, path: str = "") -> list[str]:
    """Paths (``spec.template.spec.containers[0].image``) where ``current`` no longer holds
    what ``desired`` sets; empty when nothing we own drifted.

    >>> find_drift({"a": {"b": 1}, "l": [1]}, {"a": {"b": 1, "c": 2}, "l": [1]})
    []
    >>> find_drift({"l": ["x"]}, {"l": ["x", "y"]}), find_drift({"a": 1}, {})
    (['l'], ['a'])
    >>> find_drift({"selector": {"app": "a"}}, {"selector": {"app": "a", "x": "y"}})
    ['selector.x']
    """
    if isinstance(desired, dict):
        if not isinstance(current, dict):
            return [path or "."]
        drifted: list[str] = []
        if path.rsplit(".", 1)[-1] in EXACT_MAPS:
            drifted += [f"{path}.{key}" for key in current if key not in desired]
        for key, want in desired.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in current:
                drifted.append(where)
            else:
                drifted += find_drift(want, current[key], where)
        return drifted
    if isinstance(desired, list):
        if not isinstance(current, list) or len(current) != len(desired):
            return [path or "."]
        return [
            p
            for index, (want, have) in enumerate(zip(desired, current, strict=True))
            for p in find_drift(want, have, f"{path}[{index}]")
        ]
    return [] if _same_scalar(desired, current) else [path or "."]
