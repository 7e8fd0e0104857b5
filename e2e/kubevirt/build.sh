#!/usr/bin/env bash
# Builds KubeVirt's virt-api and virt-controller, and kubevirt-manifests (the objects KubeVirt's operator installs,
# printed by KubeVirt's own generators: e2e/kubevirt/manifests), from the release pinned in e2e/kubevirt/go.mod
# (written by e2e/kubevirt/pin.py) into build/e2e/bin (or $E2E_BIN), once: nothing is rebuilt while the binaries
# there were built from the same go.mod, go.sum, manifests program and this script. Static (CGO_ENABLED=0), with
# KubeVirt's version stamped by -ldflags -X as its hack/version.sh does. `make e2e-bin` runs it after e2e/build.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${E2E_BIN:-build/e2e/bin}
BINARIES=(virt-api virt-controller kubevirt-manifests)
source e2e/lib.sh
key=$(build_key e2e/kubevirt/go.mod e2e/kubevirt/go.sum e2e/kubevirt/manifests/main.go e2e/kubevirt/build.sh)

if up_to_date .kubevirt-key "$key" "${BINARIES[@]}"; then
  echo "e2e: KubeVirt binaries up to date in $BIN (key $key)"
  exit 0
fi
go_env "e2e: 'go' not found: make e2e builds KubeVirt's virt-api and virt-controller with Go 1.26+"
cd e2e/kubevirt
KUBEVIRT=$(go list -m -f '{{.Version}}' kubevirt.io/kubevirt)
# the commit of the release tag, as the module proxy recorded it
COMMIT=$(go mod download -json "kubevirt.io/kubevirt@$KUBEVIRT" | sed -n 's/.*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -1)
cd ../..
echo "e2e: building KubeVirt $KUBEVIRT virt-api, virt-controller and kubevirt-manifests into $BIN (cold: about 3 min on 2 idle cores after the Kubernetes build, 8 alone)"
mkdir -p "$BIN"
abs_bin=$(cd "$BIN" && pwd)
start=$(date +%s)
v=kubevirt.io/client-go/version
ldflags="-X $v.gitVersion=$KUBEVIRT -X $v.gitCommit=${COMMIT:-unknown} -X $v.gitTreeState=clean -X $v.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
go_build e2e/kubevirt "$abs_bin/" "$ldflags" kubevirt.io/kubevirt/cmd/virt-api kubevirt.io/kubevirt/cmd/virt-controller
go_build e2e/kubevirt "$abs_bin/kubevirt-manifests" "$ldflags" ./manifests
echo "$key" > "$BIN/.kubevirt-key"
echo "e2e: KubeVirt build took $(( $(date +%s) - start )) s"
