"""kvpool: admission and capacity control for multi-model vLLM inference pools.

The package is layered (enforced by import-linter, see pyproject.toml):
``api`` (typed resources) < ``domain`` (pure decisions) < ``adapters`` (I/O)
< ``controller`` | ``gateway`` (orchestration) < ``cli``.
"""

# The one version of kvpool: the package's (pyproject reads it), the image's tag and the
# chart's appVersion; the chart's version is its SemVer spelling (0.1.0.dev0 -> 0.1.0-dev.0).
# tests/unit/test_install.py fails when charts/kvpool/Chart.yaml does not follow it.
__version__ = "0.1.0.dev0"
