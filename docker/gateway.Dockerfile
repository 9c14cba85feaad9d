# preft-serve gateway: the OpenAI-compatible front door. Pure Python (no vLLM, no torch).
# Build from the repository root:
#   docker build -f docker/gateway.Dockerfile -t ghcr.io/preft-serve/gateway:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first, from pyproject.toml alone (README.md and the source folders empty):
# a code change reuses that layer and reinstalls only the package itself.
COPY pyproject.toml ./
RUN touch README.md && mkdir services kernels && python -m venv /opt/venv && /opt/venv/bin/pip install ".[tracing]"
COPY README.md ./
COPY services ./services
COPY kernels ./kernels
RUN /opt/venv/bin/pip install --no-deps --force-reinstall .

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /home/app --create-home app
COPY --from=build /opt/venv /opt/venv
WORKDIR /home/app
USER 10001:10001
EXPOSE 8080
# Kubernetes uses the chart's probes; this is for `docker run`.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD ["python3", "-c", "import httpx; httpx.get('http://127.0.0.1:8080/healthz').raise_for_status()"]
ENTRYPOINT ["python3", "-m", "preft_serve.gateway"]
CMD ["--host", "0.0.0.0", "--port", "8080"]
