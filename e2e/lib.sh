# e2e/lib.sh, sourced by the Go build scripts (e2e/build.sh, e2e/build-oldest.sh, e2e/kubevirt/build.sh) from the
# repository's root: the check that finds their binaries up to date, the Go environment they build in and their one
# build step. Each script's key hashes this file too, so a change here rebuilds what the scripts build.

# build_key FILE...: the key of a set of binaries, a hash of their inputs and of this library
build_key() { cat "$@" e2e/lib.sh | sha256sum | cut -c1-16; }

# up_to_date KEYFILE KEY BINARY...: every BINARY is in $BIN, built from the inputs whose key $BIN/KEYFILE holds
up_to_date() {
  local keyfile=$1 key=$2 b
  shift 2
  for b in "$@"; do [ -x "$BIN/$b" ] || return 1; done
  [ "$(cat "$BIN/$keyfile" 2>/dev/null)" = "$key" ]
}

# go_env MESSAGE: stops with MESSAGE when there is no Go; else the environment every build runs in. go.sum is the
# trust anchor (sum.golang.org is not needed); a module missing from it fails the build.
go_env() {
  if ! command -v go >/dev/null 2>&1; then
    echo "$1" >&2
    exit 2
  fi
  export GOFLAGS="-mod=readonly -trimpath" GOSUMDB=off GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0
}

# k8s_ldflags VERSION DATE: Kubernetes' version, stamped with -X as its release builds do
k8s_ldflags() {
  local minor=${1#v1.} pkg flags=""
  minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=$2"
  done
  echo "$flags"
}

# go_build MODULE OUTPUT LDFLAGS PACKAGE...: one stripped `go build` in the module's folder per set of version flags,
# sharing the compile cache
go_build() {
  local dir=$1 out=$2 ldflags=$3 t0
  shift 3
  t0=$(date +%s)
  (cd "$dir" && go build -o "$out" -ldflags "-s -w $ldflags" "$@")
  echo "e2e: built $* in $(( $(date +%s) - t0 )) s"
}
