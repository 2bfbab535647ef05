#!/usr/bin/env bash
# testenv.sh builds what syncloop's tests and demo run against: the local
# control plane — etcd, kube-apiserver and kube-controller-manager, compiled
# from Go modules pinned in hack/controlplane/{etcd,kube} (docs/development.md) —
# kube-scheduler and kubectl from the same module, kwok (hack/kwok), krew
# (hack/krew: the plugin manifest's test installs with it), and helm 3 and
# 4, from the modules pinned in hack/helm and hack/helm4, for the chart's
# tests.
#
# Binaries go to a cache outside the checkout, keyed by version:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/syncloop/testenv/<versions>/
#   ${XDG_CACHE_HOME:-$HOME/.cache}/syncloop/testenv/helm-<version>/helm   (helm 3 and helm 4)
# A binary already there, or in $KUBEBUILDER_ASSETS, is not built again, so a
# second call costs a few milliseconds. The last line of output is the folder
# that holds the binaries (with --print-dir, the only line).
#
# Usage: hack/testenv.sh [--print-dir]
set -euo pipefail

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
HELM_VERSION=v3.22.0
HELM4_VERSION=v4.3.2
KWOK_VERSION=v0.8.0
KREW_VERSION=v0.4.3

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/syncloop/testenv
cache=${SYNCLOOP_TESTENV_DIR:-$cache_root/kube-${KUBE_VERSION}_etcd-${ETCD_VERSION}}
helm_cache=${SYNCLOOP_HELM_DIR:-$cache_root/helm-${HELM_VERSION}}
helm4_cache=$cache_root/helm-${HELM4_VERSION}
kwok_cache=$cache_root/kwok-${KWOK_VERSION}
krew_cache=$cache_root/krew-${KREW_VERSION}
quiet=false
[[ "${1:-}" == "--print-dir" ]] && quiet=true

log() { $quiet || echo "testenv: $*" >&2; }

# have NAME: the binary exists in $KUBEBUILDER_ASSETS or in the cache.
have() {
  [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/$1" ]] || [[ -x "$cache/$1" ]]
}

mkdir -p "$cache"
export GOWORK=off GOFLAGS=-mod=readonly

if ! have etcd; then
  log "building etcd $ETCD_VERSION (about 1 minute on 2 cores)"
  start=$SECONDS
  (cd "$here/controlplane/etcd" &&
    go build -trimpath -ldflags "-s -w" -o "$cache/.etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$cache/.etcd.tmp" "$cache/etcd"
  log "etcd built in $((SECONDS - start))s"
fi

missing=()
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  have "$b" || missing+=("$b")
done
if ((${#missing[@]})); then
  log "building ${missing[*]} $KUBE_VERSION (about 10 minutes on 2 cores the first time)"
  start=$SECONDS
  minor=${KUBE_VERSION#v1.}
  minor=${minor%%.*}
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  tmp=$(mktemp -d "$cache/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  pkgs=()
  for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$here/controlplane/kube" && go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
  for b in "${missing[@]}"; do mv "$tmp/$b" "$cache/$b"; done
  log "${missing[*]} built in $((SECONDS - start))s"
fi

# kubectl, of the same pinned module, for the test of `kubectl syncloop`
# (syncloop as a kubectl plugin): about 1 minute more.
if ! have kubectl; then
  log "building kubectl $KUBE_VERSION (about 1 minute on 2 cores)"
  start=$SECONDS
  (cd "$here/controlplane/kube" && go build -trimpath -ldflags "-s -w" -o "$cache/.kubectl.tmp" k8s.io/kubernetes/cmd/kubectl)
  mv "$cache/.kubectl.tmp" "$cache/kubectl"
  log "kubectl built in $((SECONDS - start))s"
fi

# build_tool NAME VERSION MODULE_DIR PACKAGE DEST TAKES builds PACKAGE from
# the pinned module in MODULE_DIR into DEST/NAME unless it is there.
build_tool() {
  local name=$1 version=$2 dir=$3 pkg=$4 dest=$5 takes=$6
  [[ -x "$dest/$name" ]] && return
  log "building $name $version ($takes on 2 cores)"
  local start=$SECONDS
  mkdir -p "$dest"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$dest/.$name.tmp" "$pkg")
  mv "$dest/.$name.tmp" "$dest/$name"
  log "$name built in $((SECONDS - start))s"
}

# kwok, from the module pinned in hack/kwok: the kubelet of a fake Node,
# so that the Pods of Deployments become Running and Ready (with
# kube-scheduler and kube-controller-manager's deployment and replicaset
# controllers; internal/testenv's Options.Workloads).
build_tool kwok "$KWOK_VERSION" "$here/kwok" sigs.k8s.io/kwok/cmd/kwok "$kwok_cache" "about 1 minute"
# kwok's fast stages (as kwokctl's defaults): a Node becomes Ready at once,
# a Pod scheduled on it Running and Ready; kwok run alone needs them given.
if [[ ! -s "$kwok_cache/stages.yaml" ]]; then
  src=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$src/kustomize/stage/$f"
  done > "$kwok_cache/.stages.tmp"
  mv "$kwok_cache/.stages.tmp" "$kwok_cache/stages.yaml"
fi

# krew, kubectl's plugin manager, from the module pinned in hack/krew: the
# test of `make krew` installs syncloop with it from the manifest it writes.
build_tool krew "$KREW_VERSION" "$here/krew" sigs.k8s.io/krew/cmd/krew "$krew_cache" "about 15 seconds"

# build_helm VERSION MODULE_DIR MAJOR DEST builds helm from the pinned
# scratch module into DEST/helm unless it is there.
build_helm() {
  local version=$1 dir=$2 major=$3 dest=$4
  [[ -x "$dest/helm" ]] && return
  log "building helm $version (about 2 minutes on 2 cores)"
  local start=$SECONDS
  mkdir -p "$dest"
  (cd "$dir" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/$major/internal/version.version=$version" \
    -o "$dest/.helm.tmp" "helm.sh/helm/$major/cmd/helm")
  mv "$dest/.helm.tmp" "$dest/helm"
  log "helm $version built in $((SECONDS - start))s"
}
# Helm 3 and Helm 4: the chart must work with both.
build_helm "$HELM_VERSION" "$here/helm" v3 "$helm_cache"
build_helm "$HELM4_VERSION" "$here/helm4" v4 "$helm4_cache"

# Report the folder the harness should use. KUBEBUILDER_ASSETS wins when it
# holds the binaries; the harness looks in both, binary by binary.
if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" ]]; then
  echo "$KUBEBUILDER_ASSETS"
else
  echo "$cache"
fi
