#!/usr/bin/env bash
# The edge footprint table of docs/results.md: binary sizes per target
# (scripts/cross-compile.sh), and edge-agent's peak resident memory and
# throughput on a FedProx local solve of multinomial logistic regression on
# 2,000 Fashion-MNIST-sized synthetic samples (784 features, 10 classes,
# `edge-agent bench`), natively and under qemu user-mode emulation.
#
# Under qemu the figures are a functional check only: the peak RSS includes
# the emulator itself and its translation cache, and emulated throughput says
# nothing about a real Raspberry Pi or Jetson. Run `edge-agent bench` on the
# device for its figures.
#
# Usage: scripts/bench-edge.sh [OUTDIR]   (default bench-results/edge)
# Environment: EPOCHS (default 20), RUNS per configuration (default 3; the
# table shows the median samples/s and the largest peak RSS).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/edge}
epochs=${EPOCHS:-20}
runs=${RUNS:-3}
mkdir -p "$out"
command -v jq >/dev/null || { echo "bench-edge.sh needs jq" >&2; exit 1; }

# A binary over its size budget is reported below, not fatal here.
budget_msg=""
if ! scripts/cross-compile.sh "$out/dist" >"$out/cross-compile.txt" 2>"$out/cross-compile.err"; then
  [ -x "$out/dist/edge-agent-linux-arm64" ] || { cat "$out/cross-compile.err" >&2; exit 1; }
  budget_msg=$(cat "$out/cross-compile.err")
fi
version=$(sed -n 's/^version \([^,]*\),.*/\1/p' "$out/cross-compile.txt")

echo "## edge footprint (edgefl $version)"
echo
echo "host: $(uname -m), $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//') x$(nproc), $(go version | cut -d' ' -f3)"
echo
echo "### binary sizes (static, stripped: scripts/cross-compile.sh)"
echo
echo "| binary | target | bytes | MiB |"
echo "|---|---|---:|---:|"
for c in edge-agent broker-agg; do
  for t in linux-arm64 linux-armv7 linux-amd64; do
    size=$(stat -c %s "$out/dist/$c-$t")
    awk -v c="$c" -v t="$t" -v s="$size" 'BEGIN { printf "| %s | %s | %d | %.2f |\n", c, t, s, s / 1048576 }'
  done
done
echo
[ -z "$budget_msg" ] || printf '**over budget:** %s\n\n' "$budget_msg"

args=(bench --samples 2000 --features 784 --classes 10 --model logreg --solver sgd --epochs "$epochs" --batch 10 --json)
have_time=false
[ -x /usr/bin/time ] && /usr/bin/time -v true >/dev/null 2>&1 && have_time=true

# measure LABEL EMULATOR BINARY: RUNS runs of the bench; one table row.
measure() {
  local label=$1 emu=$2 bin=$3 i sps=() rss=0 trss=0 json v
  if [ -n "$emu" ] && ! command -v "$emu" >/dev/null 2>&1; then
    echo "| $label | $emu not installed | | | | |"
    return
  fi
  for ((i = 1; i <= runs; i++)); do
    json="$out/bench-$(echo "$label" | tr ' /' '__')-$i.json"
    if $have_time; then
      /usr/bin/time -v -o "$json.time" $emu "$bin" "${args[@]}" >"$json"
      v=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$json.time")
      [ "$v" -gt "$trss" ] && trss=$v
    else
      $emu "$bin" "${args[@]}" >"$json"
    fi
    sps+=("$(jq -r .samples_per_second "$json")")
    v=$(jq -r .peak_rss_bytes "$json")
    [ "$v" -gt "$rss" ] && rss=$v
  done
  local med src
  med=$(printf '%s\n' "${sps[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  src=$(jq -r .peak_rss_source "$json")
  [ "$src" = VmHWM ] || src="not VmHWM: $src"
  [ "$trss" -gt 0 ] && trss=$(awk -v t="$trss" 'BEGIN { printf "%.1f", t / 1024 }') || trss=n/a
  awk -v l="$label" -v r="$rss" -v t="$trss" -v s="$med" -v src="$src" \
    'BEGIN { printf "| %s | %.1f%s | %s | %.0f | %.4f |\n", l, r / 1048576, (src == "VmHWM" ? "" : " (" src ")"), t, s, 2000 / s }'
}

host_arch=$(go env GOARCH)
echo "### edge-agent bench: logreg, 2,000 x 784 features, 10 classes, SGD $epochs epochs, batch 10 (median of $runs runs)"
echo
echo "| run | peak RSS MiB (bench) | peak RSS MiB (/usr/bin/time -v) | samples/s | s/epoch |"
echo "|---|---:|---:|---:|---:|"
case $host_arch in
  amd64) measure "native linux/amd64" "" "$out/dist/edge-agent-linux-amd64" ;;
  arm64) measure "native linux/arm64" "" "$out/dist/edge-agent-linux-arm64" ;;
esac
measure "qemu-aarch64 linux/arm64" qemu-aarch64-static "$out/dist/edge-agent-linux-arm64"
measure "qemu-arm linux/armv7" qemu-arm-static "$out/dist/edge-agent-linux-armv7"
echo
echo "qemu rows are a functional check: their RSS includes the emulator and its"
echo "translation cache, and emulated samples/s say nothing about a device."
echo "Raw JSON: $out/bench-*.json"
