# kvpool operator and gateway image (one image, two commands), built by `make image`:
#   kvpool operator [--namespace NS]      kvpool gateway --configmap NS [--redis URL]
#   kvpool gateway -f /manifests --endpoints POOL=URL    (no operator: examples/compose/)
# The wheel is built exactly as `pip install .` builds it (tests/unit/test_install.py
# builds it from the same files).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.source="https://github.com/kvpool/kvpool" \
      org.opencontainers.image.description="kvpool operator and admission gateway for vLLM pools" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN useradd --uid 10001 --create-home kvpool
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
ENTRYPOINT ["kvpool"]
CMD ["--help"]
