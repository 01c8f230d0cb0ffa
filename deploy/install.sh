#!/bin/sh
# Installs telemetryd and telemetry-sim from this checkout into
# $(go env GOBIN), or $(go env GOPATH)/bin when GOBIN is unset, with the
# version and commit set at link time, so `telemetryd -version` names
# the commit however Go was told to stamp builds (GOFLAGS=-buildvcs=false
# leaves the VCS stamp out).
#
#   deploy/install.sh            # from anywhere in the checkout
#
# The version is the tag at HEAD, or "devel". Without git (a source
# tarball), set TELEMETRY_VERSION and TELEMETRY_COMMIT yourself.
set -eu
cd "$(dirname "$0")/.."

version=${TELEMETRY_VERSION:-}
commit=${TELEMETRY_COMMIT:-}
when=""
if [ -z "$commit" ] && git rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git rev-parse HEAD)
  when=$(TZ=UTC git show -s --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD)
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    commit="$commit-dirty"
  fi
  [ -n "$version" ] || version=$(git describe --tags --exact-match 2>/dev/null || true)
fi
[ -n "$version" ] || version=devel
[ -n "$commit" ] || commit=unknown

pkg=github.com/telemetryd/telemetryd/cmd/internal/cliflag
go install \
  -ldflags "-X $pkg.version=$version -X $pkg.commit=$commit -X $pkg.commitTime=$when" \
  ./cmd/telemetryd ./cmd/telemetry-sim
bin=$(go env GOBIN)
[ -n "$bin" ] || bin="$(go env GOPATH)/bin"
echo "installed telemetryd and telemetry-sim $version ($commit) in $bin" >&2
