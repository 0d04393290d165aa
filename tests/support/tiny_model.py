"""The tiny random-weight Llama that every real-engine test serves, generated once and cached.

Why: no model can be downloaded here, and a real model would be far too slow on 2 CPU
cores. ``make_tiny_model.py`` (run with the vLLM venv's python, which has torch and
transformers) writes a 2-layer Llama with a byte-level BPE tokenizer; this module decides
*where* it lives and makes sure it exists.

Cache: ``.cache/tiny-model/<hash>`` under the repo root (override the root with
``KVPOOL_CACHE_DIR``). The hash covers the spec below *and* the generator script's source,
so editing either produces a new directory and never a stale model. Generation takes ~4 s;
a cached model is found in microseconds. Concurrent sessions (several engineers, or
pytest-xdist workers) are serialised with a file lock and each model is written to a temp
directory and renamed into place, so a reader never sees a half-written model.

Facts the tests rely on (pinned in tests/integration/test_real_parts.py):

- KV cache costs ``KV_BYTES_PER_TOKEN`` = 2 layers * 2 (K, V) * 4 KV heads * 32 head_dim *
  2 bytes (bf16) = 1024 bytes a token.
- The tokenizer adds no BOS/EOS, so ``len(Tokenizer.from_file(tokenizer_json()).encode(p).ids)``
  equals vLLM's ``usage.prompt_tokens`` for a /v1/completions prompt ``p``.
- ``tokenizer_config.json`` carries a chat template (``<|role|>\\ncontent</s>\\n``), so
  /v1/chat/completions works.
- Weights are random: output text is gibberish and may end early on ``</s>``; pass
  ``"ignore_eos": true`` when a test needs exactly ``max_tokens`` output tokens.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATOR = Path(__file__).with_name("make_tiny_model.py")

KV_BYTES_PER_TOKEN = 1024
"""KV cache bytes per token of the default spec (see the module docstring)."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Generator parameters; every field is part of the cache key."""

    seed: int = 0  # seeds the training text and the weights
    sentences: int = 20_000  # training sentences for the BPE tokenizer
    vocab_size: int = 2048  # tokenizer target vocabulary and model vocab size
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    head_dim: int = 32  # CPU attention accepts 32, 64, 80, 96, 112, 128, ...
    max_position_embeddings: int = 2048

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token costs in bf16: layers * (K, V) * kv heads * dim * 2."""
        return self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * 2


DEFAULT_SPEC = TinyModelSpec()


def cache_root() -> Path:
    """The folder holding cached artefacts (git-ignored ``.cache`` by default)."""
    return Path(os.environ.get("KVPOOL_CACHE_DIR", REPO_ROOT / ".cache"))


def vllm_venv() -> Path:
    """The vLLM venv made by scripts/ensure-vllm.sh (``KVPOOL_VLLM_VENV`` overrides)."""
    path = Path(os.environ.get("KVPOOL_VLLM_VENV", REPO_ROOT / ".cache" / "vllm-venv"))
    return path if path.is_absolute() else REPO_ROOT / path


def vllm_python() -> Path:
    """The python interpreter of the vLLM venv."""
    return vllm_venv() / "bin" / "python"


def spec_hash(spec: TinyModelSpec = DEFAULT_SPEC) -> str:
    """A short, stable hash of the spec and the generator's source code."""
    digest = hashlib.sha256()
    digest.update(json.dumps(asdict(spec), sort_keys=True).encode())
    digest.update(GENERATOR.read_bytes())
    return digest.hexdigest()[:16]


def _is_complete(path: Path) -> bool:
    return (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()


def tiny_model_dir(spec: TinyModelSpec = DEFAULT_SPEC) -> Path:
    """Return the model directory for ``spec``, generating it first if it is not cached.

    Raises ``FileNotFoundError`` when the vLLM venv is missing (run ``make deps``) and
    ``RuntimeError`` (with the generator's output) when generation fails.
    """
    target = cache_root() / "tiny-model" / spec_hash(spec)
    if _is_complete(target):
        return target
    python = vllm_python()
    if not python.exists():
        raise FileNotFoundError(
            f"vLLM venv python not found at {python}: run `make deps` "
            "(or scripts/ensure-vllm.sh) to install it"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_complete(target):  # another process generated it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            started = time.monotonic()
            result = subprocess.run(
                [str(python), str(GENERATOR), str(tmp), json.dumps(asdict(spec))],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"tiny model generation failed ({result.returncode}):\n"
                    f"{result.stdout}\n{result.stderr}"
                )
            (tmp / "kvpool-tiny-model.json").write_text(
                json.dumps(
                    {"spec": asdict(spec), "seconds": round(time.monotonic() - started, 2)},
                    indent=2,
                )
                + "\n"
            )
            tmp.chmod(0o755)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def tokenizer_json(spec: TinyModelSpec = DEFAULT_SPEC) -> Path:
    """Path of the model's ``tokenizer.json`` (load it with ``tokenizers.Tokenizer.from_file``)."""
    return tiny_model_dir(spec) / "tokenizer.json"


def generation_seconds(model_dir: Path) -> float | None:
    """How long generating ``model_dir`` took, as recorded when it was made."""
    meta = model_dir / "kvpool-tiny-model.json"
    if not meta.is_file():
        return None
    return float(json.loads(meta.read_text())["seconds"])
