# syntax=docker/dockerfile:1
# kubevirt-eviction-guard: build a virtualenv from pinned wheels, then copy it alone onto a clean slim image.
# The Python minor version matches the one constraints.txt was frozen with (`make constraints`).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
RUN python -m venv /opt/guard
COPY pyproject.toml README.md constraints.txt ./
COPY app ./app
# The project is pure Python; every dependency comes as a pinned binary wheel, so nothing is compiled here either.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/guard/bin/pip install --only-binary=:all: --constraint constraints.txt /wheels/*.whl \
 && /opt/guard/bin/pip uninstall --yes pip \
 && find /opt/guard -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kubevirt-eviction-guard" \
      org.opencontainers.image.description="Admission webhook that stops rebalancers from churning KubeVirt VMs with live migrations" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 guard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin guard
COPY --from=build /opt/guard /opt/guard
ENV PATH=/opt/guard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8443 8080
ENTRYPOINT ["kubevirt-eviction-guard", "serve"]
