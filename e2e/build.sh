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
source e2e/lib.sh
key=$(build_key e2e/go.mod e2e/go.sum e2e/build.sh)

if up_to_date .key "$key" "${BINARIES[@]}"; then
  echo "e2e: binaries up to date in $BIN (key $key)"
  exit 0
fi

go_env "e2e: 'go' not found: make e2e builds kube-apiserver, etcd, the descheduler and helm with Go 1.26+"
version() { (cd e2e && go list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' "$1"); }
K8S=$(version k8s.io/kubernetes)
ETCD=$(version go.etcd.io/etcd/server/v3)
DESCHEDULER=$(version sigs.k8s.io/descheduler)
HELM=$(version helm.sh/helm/v4)
HELM3=$(version helm.sh/helm/v3)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
echo "e2e: building kubernetes $K8S, etcd $ETCD, descheduler $DESCHEDULER, helm $HELM and $HELM3 into $BIN (cold: about 10 min on 2 idle cores, much longer on a busy machine)"
mkdir -p "$BIN"
abs_bin=$(cd "$BIN" && pwd)
start=$(date +%s)

build() { go_build e2e "$@"; }  # build OUTPUT LDFLAGS PACKAGE...

build "$abs_bin/" "$(k8s_ldflags "$K8S" "$DATE")" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl \
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
