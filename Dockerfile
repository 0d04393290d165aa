# kvpool operator and gateway image (one image, two commands):
#   kvpool operator [--namespace NS]      kvpool gateway --config FILE [--redis URL]
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --create-home kvpool
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
ENTRYPOINT ["kvpool"]
CMD ["--help"]
