#!/bin/sh
# runtime-setup.sh: the running image's one step, run as root in a Debian bookworm system with packages.runtime
# installed, before /opt/guard is copied in. Debian's python3 has no pip; ensurepip's module goes too, and the build
# fails if any installer is importable. Then the guard's numeric user (image/config: USER).
set -eu
rm -rf /usr/lib/python3*/ensurepip /usr/lib/python3/dist-packages/pip /usr/lib/python3/dist-packages/setuptools
! python3 -c "import pip" 2>/dev/null
! python3 -c "import setuptools" 2>/dev/null
! python3 -c "import ensurepip" 2>/dev/null
groupadd --system --gid 10001 guard
useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin guard
