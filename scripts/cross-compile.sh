#!/usr/bin/env bash
# Static, stripped release builds of edge-agent (Raspberry Pi / Jetson
# gateways: linux/arm64, 32-bit linux/arm v7) and broker-agg (the on-prem box,
# usually linux/amd64), for every target, into OUTDIR (default dist/, which git
# ignores) with OUTDIR/SHA256SUMS. Prints each binary's size and fails when
# edge-agent for linux/arm64 exceeds the 8 MiB budget.
# Usage: scripts/cross-compile.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
version=$(git describe --always --dirty 2>/dev/null || echo dev)
limit=$((8 << 20)) # edge-agent linux/arm64
targets=(linux/arm64 linux/arm/7 linux/amd64)
cmds=(edge-agent broker-agg)

mkdir -p "$out"
rm -f "$out/SHA256SUMS"
bins=()
for t in "${targets[@]}"; do
  IFS=/ read -r goos goarch goarm <<<"$t"
  for c in "${cmds[@]}"; do
    bin="$c-$goos-$goarch${goarm:+v$goarm}"
    # CGO_ENABLED=0: pure Go, statically linked (no libc to match on the
    # device); -trimpath: no build paths in the binary; -s -w: no symbol
    # table or DWARF (panics still print file:line).
    env CGO_ENABLED=0 GOOS="$goos" GOARCH="$goarch" ${goarm:+GOARM=$goarm} \
      go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$out/$bin" "./cmd/$c"
    bins+=("$bin")
  done
done
(cd "$out" && sha256sum "${bins[@]}" >SHA256SUMS)

status=0
echo "version $version, into $out/"
printf '%-28s %12s %9s\n' binary bytes MiB
for b in "${bins[@]}"; do
  size=$(stat -c %s "$out/$b")
  awk -v b="$b" -v s="$size" 'BEGIN { printf "%-28s %12d %9.2f\n", b, s, s / 1048576 }'
  if command -v readelf >/dev/null 2>&1 && readelf -l "$out/$b" | grep -q INTERP; then
    echo "$b: dynamically linked (has a program interpreter)" >&2
    status=1
  fi
done
size=$(stat -c %s "$out/edge-agent-linux-arm64")
if [ "$size" -gt "$limit" ]; then
  echo "edge-agent-linux-arm64 is $size bytes, over the $limit-byte (8 MiB) budget: see cmd/edge-agent/deps_test.go" >&2
  status=1
fi
echo "checksums: $out/SHA256SUMS"
exit $status
