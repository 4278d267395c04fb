#!/usr/bin/env bash
# Reproduces the compression figures of docs/results.md: Fashion-MNIST, 100 clients,
# classes:2, 10 per round, 100 rounds, multinomial logistic regression,
# FedProx and FedProx:FedSplit, one run per uplink codec (same data, selection
# and seeds), then the codec throughput benchmarks.
# Usage: scripts/bench-codec.sh [OUTDIR] [CODEC...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}; shift || true
codecs=${*:-fp32 fp16 q8 qsgd:16 qsgd:4 topk:0.3+q4 topk:0.2+q4 topk:0.12+q4 topk:0.05+q8 topk:0.01+qsgd:16 dct:28x28x10+topk:0.16+q4+ac dct:28x28x10+topk:0.05+q4+ac}
mkdir -p "$out/codec"
go build -o "$out/broker-agg" ./cmd/broker-agg
ba="$out/broker-agg"
files=()
for c in $codecs; do
  d="$out/codec/$(echo "$c" | tr ':+' '_-')"
  "$ba" simulate --dataset idx:/usr/share/datasets/fashion-mnist --partition classes:2 --clients 100 --per-round 10 \
    --model logreg --l2 1e-3 --epochs 5 --batch 10 --lr 0.01 --mu 1 --step 3 --gamma 1e-6 --rounds 100 --seed 1 \
    --algo fedprox,fedproxsplit --codec "$c" --optimum-cache "$out/optima" --out "$d" 2>"$d.log" >/dev/null
  files+=("$d/results.json")
  echo "## codec $c (raw float32 update: $((4 * 7850)) bytes)"
  "$ba" report --metric bytes_up --at 1,100 "$d/results.json"
  "$ba" report --metric accuracy --at 25,50,100 "$d/results.json"
done
echo "## codec throughput (one core)"
go test -run '^$' -bench . -benchtime 200ms ./learn/quant/ | tee "$out/codec-bench.txt"
