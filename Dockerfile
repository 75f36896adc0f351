# syntax=docker/dockerfile:1
# The allocator image: `docker build -t fairshare:0.1.0 .` (deploy/ runs this tag).
# Two stages: the first installs the project with its `server` extra, at the exact versions
# of requirements.lock, into a virtual environment; the second copies only that environment
# onto the same base image, so no build tooling, pip cache or source tree ships. The
# generated gRPC stubs are committed under fairshare/wire/pb, so nothing is generated here.

# Pinned to a patch release; bump deliberately (and pin the digest in your registry).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/fairshare
WORKDIR /src
# README.m[d]: the readme if there is one (a pattern that matches nothing is skipped).
COPY pyproject.toml requirements.lock README.m[d] ./
COPY fairshare ./fairshare
COPY ha ./ha
COPY server ./server
# A regular (not editable) install: the runtime stage has no /src.
RUN /opt/fairshare/bin/pip install -c requirements.lock '.[server,gateway]' \
    && /opt/fairshare/bin/python -m compileall -q /opt/fairshare/lib

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="fairshare" \
      org.opencontainers.image.description="Highly available fair-share priority allocator for GPU pools running vLLM" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric uid/gid: deploy/base/statefulset.yaml runs as 10001 with runAsNonRoot,
# which needs a number to verify.
RUN groupadd --system --gid 10001 fairshare \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin fairshare
COPY --from=build /opt/fairshare /opt/fairshare
ENV PATH=/opt/fairshare/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The working directory holds the state file of embedded mode (`docker run` without
# etcd). In Kubernetes the root filesystem is read-only and this path is an emptyDir.
RUN install -d -o 10001 -g 10001 -m 0750 /var/lib/fairshare
WORKDIR /var/lib/fairshare
USER 10001:10001
# gRPC (Allocator, Admin, health, reflection) and Prometheus metrics.
EXPOSE 50051 9090
# SIGTERM (the default stop signal) starts the graceful handover.
ENTRYPOINT ["fairshare"]
CMD ["serve", "--config", "/etc/fairshare/pools.yaml"]
