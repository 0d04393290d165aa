"""kvpool: admission and capacity control for multi-model vLLM inference pools.

The package is layered (enforced by import-linter, see pyproject.toml):
``api`` (typed resources) < ``domain`` (pure decisions) < ``adapters`` (I/O)
< ``controller`` | ``gateway`` (orchestration) < ``cli``.
"""

__version__ = "0.1.0.dev0"
