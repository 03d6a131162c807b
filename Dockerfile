# gpufleet: one image for the controller (`gpufleet controller serve`) and the node agent (`gpufleet agent`).
# Build: docker build -t ghcr.io/gpufleet/gpufleet:0.1.0 .
# Linted by hadolint in tests/k8s/test_deploy.py. Base pinned to an exact Python/Debian release.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/gpufleet
COPY pyproject.toml README.md ./
COPY src ./src
# the runtime extras only: PostgreSQL driver, NVML bindings, the Kubernetes client (no torch, no dev tools)
RUN /opt/gpufleet/bin/pip install --no-compile ".[postgres,nvml,kubernetes]" \
 && /opt/gpufleet/bin/pip uninstall --yes pip setuptools wheel

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpufleet" \
      org.opencontainers.image.description="Reliability control plane for GPU training clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 gpufleet \
 && useradd --system --uid 10001 --gid gpufleet --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpufleet
COPY --from=build /opt/gpufleet /opt/gpufleet
ENV PATH=/opt/gpufleet/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8470 9400
ENTRYPOINT ["gpufleet"]
CMD ["--help"]
