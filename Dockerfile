# syntax=docker/dockerfile:1
# kubevirt-eviction-guard: build a virtualenv from hash-pinned wheels, then copy it alone onto a clean slim image
# from which pip, setuptools and wheel are removed: the running image can install nothing.
# The Python version matches the one constraints.txt was compiled with (`make constraints`).
# The base image is pinned by digest (the multi-arch index of python:3.11.7-slim-bookworm). This digest was taken
# from a public, Renovate-maintained pin, not pulled here: verify it before a release with
#   docker buildx imagetools inspect python:3.11.7-slim-bookworm
# and update both the tag and the digest together.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm@sha256:d11b9bd5e49ea7401753d78f4d3b56f3aec952b85b49bcae88981f0452818e0b

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md constraints.txt build-constraints.txt ./
COPY app ./app
# A build environment with the pinned build backend, which builds the project's wheel; then the image's virtualenv,
# created without pip, gets every dependency from constraints.txt (exact versions, hashes checked, binary wheels
# only: nothing is compiled) and the project's wheel, installed by the build environment's pip.
RUN python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps --only-binary=:all: -r build-constraints.txt \
 && /opt/build/bin/pip wheel --no-build-isolation --no-deps --wheel-dir /wheels . \
 && python -m venv --without-pip /opt/guard \
 && /opt/build/bin/pip --python /opt/guard/bin/python install --require-hashes --no-deps --only-binary=:all: \
      -r constraints.txt \
 && /opt/build/bin/pip --python /opt/guard/bin/python install --no-deps --no-index /wheels/*.whl \
 && find /opt/guard -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kubevirt-eviction-guard" \
      org.opencontainers.image.description="Admission webhook that stops rebalancers from churning KubeVirt VMs with live migrations" \
      org.opencontainers.image.licenses="Apache-2.0"
# The base image's own installers go too (its system pip, setuptools and wheel, and ensurepip's bundled copies).
RUN python -m pip uninstall --yes pip setuptools wheel \
 && rm -rf /usr/local/bin/pip* /usr/local/lib/python3.*/ensurepip \
 && ! python -c "import pip" 2>/dev/null && ! python -c "import setuptools" 2>/dev/null \
 && groupadd --system --gid 10001 guard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin guard
COPY --from=build /opt/guard /opt/guard
ENV PATH=/opt/guard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8443 8080
ENTRYPOINT ["kubevirt-eviction-guard", "serve"]
