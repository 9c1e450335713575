# syntax=docker/dockerfile:1
# gpu-exporter image: amd64 and arm64 (Jetson, IGX, Grace) from the same file, one manifest list:
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg BUILD_DATE=$(git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ) \
#     -t gpu-exporter:0.1.0 .
# (tools/image.py does the same without buildx or a registry: docs/testing.md.)
# Every dependency ships wheels for both architectures, so no stage needs a compiler; the final
# stage has neither a compiler nor pip. The vendor libraries come from the host, not from the image:
# NVML (libnvidia-ml.so.1) through the NVIDIA container runtime, a Jetson's files through the /sys and
# /proc mounts, and ROCm's libamd_smi.so through a read-only /opt/rocm mount (deploy/components/amd).
# The image carries AMD SMI's Python package (pure Python, about 0.3 MB), which must match the host's
# ROCm: the default pins the 7.0 series (ROCm 7.0.x); for a ROCm 6.x fleet build a variant with e.g.
#   --build-arg AMDSMI='amdsmi==6.4.*' --build-arg VERSION=0.1.0-rocm6.4
# and --build-arg AMDSMI= (empty) leaves it out.
#
# Behind a proxy or a network that intercepts TLS, pip needs that network's CA to reach PyPI: pass the
# certificate(s) as PEM text, e.g. --build-arg EXTRA_CA_CERTS="$(cat corp-ca.crt)". They are trusted
# in the build stage only, added to pip's own bundle, and never reach the runtime image.
# tools/image.py builds and runs this image on a machine without a registry (docs/testing.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: install the package and its runtime dependencies into a virtual environment ---
FROM ${PYTHON_IMAGE} AS build
ARG AMDSMI="amdsmi==7.0.*"
ARG EXTRA_CA_CERTS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ONLY_BINARY=:all:
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The CA bundle is the virtual environment's pip's: a base whose Python has no pip of its own (Debian's
# python3.11 with python3.11-venv) builds as the official image does.
RUN python -m venv /opt/gpu-exporter \
 && if [ -n "$EXTRA_CA_CERTS" ]; then \
      bundle="$(/opt/gpu-exporter/bin/python -c 'import pip._vendor.certifi as c; print(c.where())')" \
      && { cat "$bundle"; printf '%s\n' "$EXTRA_CA_CERTS"; } > /tmp/ca.pem \
      && export PIP_CERT=/tmp/ca.pem; \
    fi \
 && /opt/gpu-exporter/bin/pip install ".[kubernetes]" ${AMDSMI:+"$AMDSMI"} \
 && /opt/gpu-exporter/bin/pip uninstall -y pip setuptools wheel \
 && /opt/gpu-exporter/bin/python -m compileall -q /opt/gpu-exporter/lib \
 && rm -f /tmp/ca.pem
# What `gpu-exporter --version` and gpu_exporter_build_info report (src/gpu_exporter/buildinfo.py),
# written into the installed package. Declared after the install, so that a new revision reuses the
# installed environment from the build cache (under emulation that install takes many minutes).
ARG REVISION=unknown
ARG BUILD_DATE=unknown
RUN package="$(echo /opt/gpu-exporter/lib/python3*/site-packages/gpu_exporter)" \
 && printf '{"revision": "%s", "build_date": "%s"}\n' "$REVISION" "$BUILD_DATE" > "$package/_build.json"

# --- runtime: the slim base without pip, plus the virtual environment ---
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG BUILD_DATE=unknown
LABEL org.opencontainers.image.title="gpu-exporter" \
      org.opencontainers.image.description="Node-level GPU metrics exporter for edge Kubernetes: Prometheus endpoint plus store-and-forward over MQTT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.com/gpu-exporter"
# pip goes where the base has one (the official image; Debian's python3.11 has none).
RUN export PYTHONDONTWRITEBYTECODE=1 \
 && if python -m pip --version >/dev/null 2>&1; then python -m pip uninstall -y pip setuptools wheel; fi \
 && rm -rf /usr/local/lib/python3.11/ensurepip /usr/local/lib/python3.11/idlelib \
           /usr/local/lib/python3.11/lib2to3 /usr/local/lib/python3.11/pydoc_data \
 && groupadd --system --gid 65532 gpu-exporter \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin gpu-exporter \
 && mkdir -p /var/lib/gpu-exporter && chown 65532:65532 /var/lib/gpu-exporter
COPY --from=build /opt/gpu-exporter /opt/gpu-exporter
ENV PATH=/opt/gpu-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["gpu-exporter"]
