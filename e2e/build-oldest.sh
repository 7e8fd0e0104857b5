#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and etcd of the oldest Kubernetes minor the README promises, pinned in
# e2e/oldest/go.mod, from the Go module proxy into build/e2e/oldest/bin (or $E2E_OLDEST_BIN), once: when the
# binaries there were built from the same go.mod, go.sum and this script, nothing is rebuilt. Versions are stamped
# with -ldflags -X as the projects' own release builds do. Used by `make e2e-oldest`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${E2E_OLDEST_BIN:-build/e2e/oldest/bin}
BINARIES=(kube-apiserver kubectl etcd)
source e2e/lib.sh
key=$(build_key e2e/oldest/go.mod e2e/oldest/go.sum e2e/build-oldest.sh)

# Helm (v4, v3), the descheduler and KubeVirt are those of the main pins (e2e/build.sh, e2e/kubevirt/build.sh), beside this minor's own binaries
MAIN_BIN=$(realpath -m "${E2E_BIN:-build/e2e/bin}")
mkdir -p "$BIN"
for b in helm helm3 descheduler kubevirt-manifests virt-api virt-controller; do ln -sfn "$MAIN_BIN/$b" "$BIN/$b"; done

if up_to_date .key "$key" "${BINARIES[@]}"; then
  echo "e2e-oldest: binaries up to date in $BIN (key $key)"
  exit 0
fi
go_env "e2e-oldest: 'go' not found: make e2e-oldest builds kube-apiserver, kubectl and etcd with Go 1.26+"
version() { (cd e2e/oldest && go list -m -f '{{.Version}}' "$1"); }
K8S=$(version k8s.io/kubernetes)
ETCD=$(version go.etcd.io/etcd/server/v3)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
echo "e2e-oldest: building kubernetes $K8S (kube-apiserver, kubectl) and etcd $ETCD into $BIN"
mkdir -p "$BIN"
abs_bin=$(cd "$BIN" && pwd)
start=$(date +%s)
go_build e2e/oldest "$abs_bin/" "$(k8s_ldflags "$K8S" "$DATE")" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
go_build e2e/oldest "$abs_bin/etcd" "" go.etcd.io/etcd/server/v3
echo "$key" > "$BIN/.key"
echo "e2e-oldest: build took $(( $(date +%s) - start )) s; binaries: $(du -sh "$BIN" | cut -f1)"
