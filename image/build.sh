#!/usr/bin/env bash
# `make image`: the project's image as an OCI archive, built from Debian packages without a registry or a daemon,
# following the Dockerfile's recipe step for step: the same package lists (packages.build, packages.runtime), the same
# scripts (build-venv.sh, runtime-setup.sh) and the same configuration (config). mmdebstrap makes each stage's
# Debian bookworm system (minbase with the slim image's dpkg path excludes, as the official debian:bookworm-slim), the
# scripts run in it by chroot, umoci packs the running stage's tree as one layer and writes the config.
# Output: build/image/kubevirt-eviction-guard.oci.tar (OCI image layout, tar) with one image tagged with the project's
# version (a bare tag: `ctr images import --base-name REPOSITORY` or `skopeo copy oci-archive:...` name it). Built once
# per recipe and sources: when they are unchanged (build/image/key), nothing is rebuilt. `image/build.sh --key` prints
# that key (a hash of every input: image/ with its package lists and scripts, app/, pyproject.toml, README.md and the
# pins) and builds nothing.
# Across checkouts, a per-user cache (IMAGE_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/kubevirt-eviction-guard/image)
# keeps the downloaded .debs, the pinned wheels pip fetched and the finished archives by key: a fresh clone whose key
# is there copies that archive instead of building one.
# Needs root (chroot), mmdebstrap and umoci (Debian packages; installed here when missing) and network access to the
# Debian mirror and the Python package index.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${IMAGE_OUT:-build/image}
TAG=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
SUITE=bookworm
start=$(date +%s)
archive="$OUT/kubevirt-eviction-guard.oci.tar"
key=$(find image app pyproject.toml README.md constraints.txt build-constraints.txt -type f ! -name '*.pyc' -print0 |
      sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
if [ "${1:-}" = --key ]; then echo "$key"; exit 0; fi
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9  # one build at a time: a second caller waits, then finds the archive up to date
# how the archive in $OUT came to be (built, or reused from the cache), said again while it is up to date
if [ -f "$archive" ] && [ "$(cat "$OUT/key" 2>/dev/null)" = "$key" ]; then
  made=$(cat "$OUT/made" 2>/dev/null || echo "made before")
  echo "image: $archive up to date (key $key; $made), $(du -m "$archive" | cut -f1) MB"
  exit 0
fi
rm -f "$OUT/key" "$OUT/made"
CACHE=${IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-eviction-guard/image}
mkdir -p "$CACHE/debs" "$CACHE/wheels" "$CACHE/archives"
CACHE=$(cd "$CACHE" && pwd)
exec 8>"$CACHE/.lock"
flock 8  # checkouts share the cache: one build at a time writes it (always taken after $OUT's lock)
cached="$CACHE/archives/$key.oci.tar"
# an archive counts only with its checksum beside it, both renamed into place after they were written whole
if [ -f "$cached" ] && [ -f "$cached.sha256" ] &&
   [ "$(sha256sum < "$cached" | cut -d' ' -f1)" = "$(cat "$cached.sha256")" ]; then
  cp "$cached" "$archive.tmp" && mv "$archive.tmp" "$archive"
  touch "$cached"
  echo "reused from cache $CACHE" > "$OUT/made"
  echo "$key" > "$OUT/key"
  echo "image: $archive reused from cache (key $key), $(du -m "$archive" | cut -f1) MB"
  exit 0
fi
if [ -f "$cached" ]; then echo "image: $cached does not match its checksum; building anew" >&2; fi
rm -f "$cached" "$cached.sha256"
if ! command -v mmdebstrap >/dev/null || ! command -v umoci >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends mmdebstrap umoci >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends mmdebstrap umoci >/dev/null; }
fi
work=$(mktemp -d "$OUT/work.XXXXXX")
trap 'rm -rf --one-file-system "$work"' EXIT
src=$(pwd)
list() { sed -e 's/#.*//' "$1" | tr -s ' \n' ','; }
# debian:bookworm-slim's sources and the path excludes of its slim variant (debuerreotype's slimify)
sources=("deb http://deb.debian.org/debian $SUITE main" "deb http://deb.debian.org/debian $SUITE-updates main"
         "deb http://deb.debian.org/debian-security $SUITE-security main")
slim=()
for d in doc info linda lintian/overrides locale man groff; do slim+=("--dpkgopt=path-exclude=/usr/share/$d/*"); done
slim+=("--dpkgopt=path-include=/usr/share/doc/*/copyright")
# Downloaded .debs are kept in the cache for the next build (mmdebstrap's documented cache hooks).
debs="$CACHE/debs"
mm() {
  mmdebstrap --quiet --mode=root --variant=minbase --format=directory "${slim[@]}" --skip=download/empty \
    --setup-hook='mkdir -p "$1/var/cache/apt/archives"' --setup-hook="sync-in '$debs' /var/cache/apt/archives" \
    "$@" --customize-hook="sync-out /var/cache/apt/archives '$debs'" \
    --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' "$SUITE" "$target" "${sources[@]}"
}

# The build stage reaches the package index trusting what this machine trusts (a TLS-inspecting proxy's CA, say);
# only the build stage, which is thrown away, gets that bundle.
host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
target="$work/build"
# build stage: Debian + packages.build, the sources in /src, build-venv.sh
mm --include="$(list image/packages.build)" \
  --customize-hook="mkdir -p \"\$1/src\" && tar -C '$src' -c pyproject.toml README.md constraints.txt build-constraints.txt app image | tar -C \"\$1/src\" -x" \
  --customize-hook='cp /etc/resolv.conf "$1/etc/resolv.conf"' \
  --customize-hook="cp '$host_ca' \"\$1/etc/ssl/certs/ca-certificates.crt\"" \
  --customize-hook="mkdir -p \"\$1/var/cache/wheels\" && cp -a '$CACHE/wheels/.' \"\$1/var/cache/wheels/\"" \
  --customize-hook='env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CERT WHEELHOUSE=/var/cache/wheels chroot "$1" sh /src/image/build-venv.sh /src' \
  --customize-hook="cp -a \"\$1/var/cache/wheels/.\" '$CACHE/wheels/'"


target="$work/rootfs"
# running stage: Debian + packages.runtime, runtime-setup.sh, then /opt/guard from the build stage
mm --include="$(list image/packages.runtime)" \
  --customize-hook="mkdir -p \"\$1/image\" && cp '$src/image/runtime-setup.sh' \"\$1/image/\"" \
  --customize-hook='chroot "$1" sh /image/runtime-setup.sh' \
  --customize-hook='rm -rf "$1/image"' \
  --customize-hook="cp -a '$work/build/opt/guard' \"\$1/opt/guard\""

layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$TAG"
umoci unpack --image "$layout:$TAG" "$work/bundle" >/dev/null
rm -rf "$work/bundle/rootfs" && mv "$work/rootfs" "$work/bundle/rootfs"
umoci repack --image "$layout:$TAG" "$work/bundle"
cfg=(--author kubevirt-eviction-guard --config.workingdir / --clear=config.env --clear=config.entrypoint
     --clear=config.cmd --clear=config.exposedports)
while IFS='=' read -r name value; do
  case "$name" in
    USER) cfg+=(--config.user "$value") ;;
    ENTRYPOINT) for word in $value; do cfg+=(--config.entrypoint "$word"); done ;;
    ENV) cfg+=(--config.env "$value") ;;
    EXPOSE) cfg+=(--config.exposedports "$value") ;;
    ""|\#*) ;;
    *) echo "image/config: unknown key $name" >&2; exit 2 ;;
  esac
done < image/config
umoci config --image "$layout:$TAG" "${cfg[@]}" \
  --config.label org.opencontainers.image.title=kubevirt-eviction-guard \
  --config.label org.opencontainers.image.licenses=Apache-2.0
umoci gc --layout "$layout"
tar -C "$layout" -cf "$archive.tmp" . && mv "$archive.tmp" "$archive"
took=$(( $(date +%s) - start ))
echo "built in $took s" > "$OUT/made"
echo "$key" > "$OUT/key"
cp "$archive" "$cached.tmp" && sha256sum < "$cached.tmp" | cut -d' ' -f1 > "$cached.sha256.tmp"
mv "$cached.tmp" "$cached" && mv "$cached.sha256.tmp" "$cached.sha256"
# the cache keeps the three archives used last
ls -t "$CACHE"/archives/*.oci.tar | tail -n +4 | while read -r old; do rm -f "$old" "$old.sha256"; done
echo "image: $archive (tag $TAG), $(du -m "$archive" | cut -f1) MB compressed," \
  "$(du -sm "$work/bundle/rootfs" | cut -f1) MB unpacked, user $(sed -n 's/^USER=//p' image/config)," \
  "built in $took s (key $key)"
