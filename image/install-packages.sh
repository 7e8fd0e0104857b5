#!/bin/sh
# install-packages.sh LIST: apt-get install the packages named in LIST (comments and blank lines skipped), then drop
# apt's lists. The Dockerfile runs it; `make image` (image/build.sh) passes the same lists to mmdebstrap instead.
set -eu
pkgs=$(sed -e 's/#.*//' "$1" | tr -s ' \n' ' ')
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $pkgs
apt-get clean
rm -rf /var/lib/apt/lists/*
