"""The worked examples in the pure layers' docstrings are true (run as doctests).

Why: docstrings of domain/ and api/ carry worked examples (the planner's numbers, the lease
allocation, verdicts); an example that drifts from the code misleads the next reader."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import kvpool.api
import kvpool.domain


def _modules() -> list[str]:
    names: list[str] = []
    for package in (kvpool.domain, kvpool.api):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed"
