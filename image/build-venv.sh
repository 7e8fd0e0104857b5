#!/bin/sh
# build-venv.sh SRC: the build stage's one step, run as root in a Debian bookworm system with packages.build installed
# and the project's sources in SRC (pyproject.toml, README.md, app/, constraints.txt, build-constraints.txt).
# A build environment with the pinned build backend builds the project's wheel; the image's virtualenv
# /opt/guard, created without pip, gets every dependency from constraints.txt (exact versions, hashes checked, binary
# wheels only: nothing is compiled) and the project's wheel, installed by the build environment's pip.
set -eu
cd "$1"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
python3 -m venv /opt/build
# Where the caller keeps the pinned wheels between builds in WHEELHOUSE (make image: a folder from outside this build
# stage, which is thrown away), pip fetches only those missing there (no index at all when none is) and installs from
# there alone, their hashes checked as from the index; the Dockerfile's build keeps nothing.
if [ -n "${WHEELHOUSE:-}" ]; then
  for pins in build-constraints.txt constraints.txt; do
    /opt/build/bin/pip download -q --require-hashes --no-deps --only-binary=:all: --no-index \
      --find-links "$WHEELHOUSE" -d "$WHEELHOUSE" -r "$pins" >/dev/null 2>&1 ||
      /opt/build/bin/pip download -q --require-hashes --no-deps --only-binary=:all: -d "$WHEELHOUSE" -r "$pins"
  done
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"
fi
/opt/build/bin/pip install -q --require-hashes --no-deps --only-binary=:all: -r build-constraints.txt
/opt/build/bin/pip wheel -q --no-build-isolation --no-deps --wheel-dir /tmp/wheels .
python3 -m venv --without-pip /opt/guard
/opt/build/bin/pip --python /opt/guard/bin/python install -q --require-hashes --no-deps --only-binary=:all: \
  -r constraints.txt
/opt/build/bin/pip --python /opt/guard/bin/python install -q --no-deps --no-index /tmp/wheels/*.whl
find /opt/guard -name __pycache__ -prune -exec rm -rf {} +
rm -rf /tmp/wheels
