#!/usr/bin/env bash
# Builds the real components pinned in e2e/go.mod (kube-apiserver, kubectl, the node's kubelet, kube-scheduler,
# kube-controller-manager and kube-proxy, etcd, descheduler, helm v4 and helm v3 as helm3) from the Go
# module proxy into build/e2e/bin (or $E2E_BIN), once: when the binaries there were built from the same go.mod,
# go.sum and this script, nothing is rebuilt. Each binary reports its true version, set with -ldflags -X as the
# projects' own release builds do. Go's module and build caches (GOMODCACHE, GOCACHE) make a rebuild cheap too.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${E2E_BIN:-build/e2e/bin}
BINARIES=(kube-apiserver kubectl kubelet kube-scheduler kube-controller-manager kube-proxy etcd descheduler helm helm3)
key=$(cat e2e/go.mod e2e/go.sum e2e/build.sh | sha256sum | cut -c1-16)

cached=1
for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || cached=0; done
if [ "$cached" = 1 ] && [ "$(cat "$BIN/.key" 2>/dev/null)" = "$key" ]; then
  echo "e2e: binaries up to date in $BIN (key $key)"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "e2e: 'go' not found: make e2e builds kube-apiserver, etcd, the descheduler and helm with Go 1.26+" >&2
  exit 2
fi
# go.sum is the trust anchor (sum.golang.org is not needed); a module missing from it fails the build.
export GOFLAGS="-mod=readonly -trimpath" GOSUMDB=off GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0
version() { (cd e2e && go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' "$1"); }
K8S=$(version k8s.io/kubernetes)
ETCD=$(version go.etcd.io/etcd/server/v3)
DESCHEDULER=$(version sigs.k8s.io/descheduler)
HELM=$(version helm.sh/helm/v4)
HELM3=$(version helm.sh/helm/v3)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
minor=${K8S#v1.}; minor=${minor%%.*}
echo "e2e: building kubernetes $K8S, etcd $ETCD, descheduler $DESCHEDULER, helm $HELM and $HELM3 into $BIN (cold: about 15-25 min on 2 cores)"
mkdir -p "$BIN"
abs_bin=$(cd "$BIN" && pwd)
start=$(date +%s)

build() {  # build OUTPUT LDFLAGS PACKAGE...: one `go build` per set of version flags, sharing the compile cache
  local out=$1 ldflags=$2; shift 2
  local t0=$(date +%s)
  (cd e2e && go build -o "$out" -ldflags "-s -w $ldflags" "$@")
  echo "e2e: built $* in $(( $(date +%s) - t0 )) s"
}

kv=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv+=" -X $pkg.gitVersion=$K8S -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=$DATE"
done
build "$abs_bin/" "$kv" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-proxy
build "$abs_bin/etcd" "" go.etcd.io/etcd/server/v3  # etcd's version is a constant of its api module
# the descheduler's release builds stamp vDATE-vX.Y.Z, the form its version parser reads
build "$abs_bin/" "-X sigs.k8s.io/descheduler/pkg/version.version=v$(date -u +%Y%m%d)-$DESCHEDULER -X sigs.k8s.io/descheduler/pkg/version.buildDate=$DATE" \
  sigs.k8s.io/descheduler/cmd/descheduler
build "$abs_bin/" "-X helm.sh/helm/v4/internal/version.version=$HELM -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
  helm.sh/helm/v4/cmd/helm
build "$abs_bin/helm3" "-X helm.sh/helm/v3/internal/version.version=$HELM3 -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
  helm.sh/helm/v3/cmd/helm

echo "$key" > "$BIN/.key"
elapsed=$(( $(date +%s) - start ))
echo "e2e: build took ${elapsed} s; disk: $(du -sh "$BIN" | cut -f1) binaries," \
  "$(du -sh "$(go env GOMODCACHE)" 2>/dev/null | cut -f1) module cache, $(du -sh "$(go env GOCACHE)" 2>/dev/null | cut -f1) build cache"
