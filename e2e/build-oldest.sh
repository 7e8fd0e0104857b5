#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and etcd of the oldest Kubernetes minor the README promises, pinned in
# e2e/oldest/go.mod, from the Go module proxy into build/e2e/oldest/bin (or $E2E_OLDEST_BIN), once: when the
# binaries there were built from the same go.mod, go.sum and this script, nothing is rebuilt. Versions are stamped
# with -ldflags -X as the projects' own release builds do. Used by `make e2e-oldest`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${E2E_OLDEST_BIN:-build/e2e/oldest/bin}
BINARIES=(kube-apiserver kubectl etcd)
key=$(cat e2e/oldest/go.mod e2e/oldest/go.sum e2e/build-oldest.sh | sha256sum | cut -c1-16)

# Helm (v4, v3), the descheduler and KubeVirt are those of the main pins (e2e/build.sh, e2e/kubevirt/build.sh), beside this minor's own binaries
MAIN_BIN=$(realpath -m "${E2E_BIN:-build/e2e/bin}")
mkdir -p "$BIN"
for b in helm helm3 descheduler kubevirt-manifests virt-api virt-controller; do ln -sfn "$MAIN_BIN/$b" "$BIN/$b"; done

cached=1
for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || cached=0; done
if [ "$cached" = 1 ] && [ "$(cat "$BIN/.key" 2>/dev/null)" = "$key" ]; then
  echo "e2e-oldest: binaries up to date in $BIN (key $key)"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "e2e-oldest: 'go' not found: make e2e-oldest builds kube-apiserver, kubectl and etcd with Go 1.26+" >&2
  exit 2
fi
export GOFLAGS="-mod=readonly -trimpath" GOSUMDB=off GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0
version() { (cd e2e/oldest && go list -m -f '{{.Version}}' "$1"); }
K8S=$(version k8s.io/kubernetes)
ETCD=$(version go.etcd.io/etcd/server/v3)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
minor=${K8S#v1.}; minor=${minor%%.*}
echo "e2e-oldest: building kubernetes $K8S (kube-apiserver, kubectl) and etcd $ETCD into $BIN"
mkdir -p "$BIN"
abs_bin=$(cd "$BIN" && pwd)
start=$(date +%s)
kv=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv+=" -X $pkg.gitVersion=$K8S -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=$DATE"
done
(cd e2e/oldest && go build -o "$abs_bin/" -ldflags "-s -w $kv" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl)
(cd e2e/oldest && go build -o "$abs_bin/etcd" -ldflags "-s -w" go.etcd.io/etcd/server/v3)
echo "$key" > "$BIN/.key"
echo "e2e-oldest: build took $(( $(date +%s) - start )) s; binaries: $(du -sh "$BIN" | cut -f1)"
