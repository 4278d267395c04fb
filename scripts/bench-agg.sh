#!/usr/bin/env bash
# Reproduces the aggregator comparison of docs/results.md (issue: the papers'
# aggregators). Usage: scripts/bench-agg.sh [OUTDIR] [PART...]
# PART is any of fmnist synthetic faulty cost (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}; shift || true
parts=${*:-fmnist synthetic faulty cost}
mkdir -p "$out/agg"
go build -o "$out/broker-agg" ./cmd/broker-agg
ba="$out/broker-agg"
want() { [[ " $parts " == *" $1 "* ]]; }
# Every aggregator, with similarity on weights (as the papers write) and on updates.
# (The similarity aggregators default to on=updates; the labels say which is which.)
algos="fedavg,fedprox,fedproxsplit,simprox:on=weights:label=simprox-w,simprox:label=simprox-upd,fedsim:on=weights:label=fedsim-w,fedsim:label=fedsim-upd,fedsim-cluster:k=3,fedsiam:on=weights:label=fedsiam-w,fedsiam:label=fedsiam-upd,median,trimmed:beta=0.2"

if want fmnist; then
  for s in 1 2 3; do
    "$ba" simulate --dataset idx:/usr/share/datasets/fashion-mnist --partition dirichlet:0.5 --clients 20 --per-round 6 \
      --select window --model logreg --l2 1e-3 --epochs 1 --batch 10 --lr 0.01 --mu 0.01 --step 3 --rounds 100 --seed $s \
      --eval-every 10 --algo "$algos" --optimum-cache "$out/optima" --out "$out/agg/fmnist/seed$s" 2>"$out/agg/fmnist-$s.log" >/dev/null
  done
  echo "## Fashion-MNIST, Dirichlet(0.5), 20 clients, 6 per round (sliding window): test accuracy (%), mean ± sd over seeds 1-3"
  "$ba" report --metric accuracy --at 10,50,100 "$out"/agg/fmnist/seed*/results.json
fi

if want synthetic; then
  for d in synthetic-iid synthetic:0,0 synthetic:0.5,0.5 synthetic:1,1; do
    for s in 1 2 3; do
      "$ba" simulate --dataset $d --partition natural --clients 30 --per-round 10 --epochs 10 --batch 10 --lr 0.01 \
        --mu 0.01 --step 10 --rounds 100 --seed $s --eval-every 10 --algo "$algos" --optimum-cache "$out/optima" \
        --out "$out/agg/$d/seed$s" 2>"$out/agg/$d-$s.log" >/dev/null
    done
    echo "## $d, 30 clients, 10 per round: test accuracy (%), mean ± sd over seeds 1-3"
    "$ba" report --metric accuracy --at 10,50,100 "$out"/agg/$d/seed*/results.json
  done
fi

if want faulty; then
  "$ba" simulate --dataset idx:/usr/share/datasets/fashion-mnist --partition dirichlet:0.5 --clients 20 --per-round 6 \
    --select window --model logreg --l2 1e-3 --epochs 1 --batch 10 --lr 0.01 --rounds 50 --seed 1 --eval-every 10 \
    --faulty 1 --faulty-scale 1000 --algo fedavg,median,trimmed:beta=0.2,normbound:mult=3:inner=fedavg \
    --optimum-cache "$out/optima" --out "$out/agg/faulty" 2>"$out/agg/faulty.log" >/dev/null
  echo "## one faulty client (delta x 1000, every round), Fashion-MNIST Dirichlet(0.5): test accuracy (%)"
  "$ba" report --metric accuracy --at 10,50 "$out/agg/faulty/results.json"
fi

if want cost; then
  echo "## aggregation cost per round, d = 7,850"
  go test ./learn/aggregate/ -run '^$' -bench 'Aggregate/' -benchtime 3x | tee "$out/agg-bench.txt"
fi
