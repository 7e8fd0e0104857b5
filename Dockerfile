# syntax=docker/dockerfile:1
# kubevirt-eviction-guard: build a virtualenv from hash-pinned wheels, then copy it alone onto a clean Debian
# bookworm with Python and no installer: the running image can install nothing.
# Every step is a file of image/ (package lists, scripts, config) that `make image` (image/build.sh) also follows,
# building the same image from Debian packages without a registry (tests/test_image.py holds the two together).
# The base is Debian bookworm's slim image, the system the Python of constraints.txt (`make constraints`) comes from.
# Pin it by digest for a release (docker buildx imagetools inspect debian:bookworm-slim) and update both together.
ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${DEBIAN_IMAGE} AS build
COPY image/packages.build image/install-packages.sh /image/
RUN sh /image/install-packages.sh /image/packages.build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt build-constraints.txt ./
COPY app ./app
COPY image ./image
RUN sh image/build-venv.sh /src

FROM ${DEBIAN_IMAGE}
LABEL org.opencontainers.image.title="kubevirt-eviction-guard" \
      org.opencontainers.image.description="Admission webhook that stops rebalancers from churning KubeVirt VMs with live migrations" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY image/packages.runtime image/install-packages.sh image/runtime-setup.sh /image/
RUN sh /image/install-packages.sh /image/packages.runtime && sh /image/runtime-setup.sh && rm -rf /image
COPY --from=build /opt/guard /opt/guard
ENV PATH=/opt/guard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8443/tcp 8080/tcp
ENTRYPOINT ["kubevirt-eviction-guard", "serve"]
