#!/usr/bin/env bash
# Reproduces the learning-core figures of docs/results.md: FedSplit exactness,
# stragglers (the FedProx paper's setting, 3 seeds), Fashion-MNIST, and the
# solver benchmarks. Usage: scripts/bench-core.sh [OUTDIR] [PART...]
# PART is any of exactness stepscan stragglers fmnist solver (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}; shift || true
parts=${*:-exactness stepscan stragglers fmnist solver}
mkdir -p "$out"
go build -o "$out/broker-agg" ./cmd/broker-agg
ba="$out/broker-agg"
want() { [[ " $parts " == *" $1 "* ]]; }

if want exactness; then
  # All 30 clients every round; FedSplit's prox solved by L-BFGS to gamma 1e-9;
  # FedAvg and FedProx with E = 20 SGD epochs (batch 10, lr 0.01).
  "$ba" simulate --dataset synthetic:1,1 --partition natural --clients 30 --per-round 30 \
    --l2 0.01 --algo fedavg,fedprox:solver=sgd:mu=1:label=fedprox-mu1,fedsplit --solver lbfgs --gamma 1e-9 --step 10 \
    --epochs 20 --batch 10 --lr 0.01 --rounds 150 --seed 1 --out "$out/exactness" 2>"$out/exactness.log"
  echo "## exactness: relative gap (F(x^t) - F*)/F*"
  "$ba" report --metric relgap --at 10,25,50,75,100,150 --below 1e-8 "$out/exactness/results.json"
fi

if want stepscan; then
  # How FedSplit's step size s sets the linear rate (same problem as above).
  "$ba" simulate --dataset synthetic:1,1 --partition natural --clients 30 --per-round 30 --l2 0.01 \
    --algo fedsplit:step=1,fedsplit:step=3,fedsplit:step=10,fedsplit:step=30,fedsplit:step=100 --gamma 1e-9 \
    --rounds 60 --seed 1 --out "$out/stepscan" 2>"$out/stepscan.log"
  echo "## FedSplit step size scan: relative gap"
  "$ba" report --metric relgap --at 20,40,60 "$out/stepscan/results.json"
fi

if want stragglers; then
  for p in 0 0.5 0.9; do
    for s in 1 2 3; do
      "$ba" simulate --dataset synthetic:1,1 --partition natural --clients 30 --per-round 10 \
        --epochs 20 --batch 10 --lr 0.01 --rounds 200 --stragglers $p --seed $s --step 10 \
        --algo fedavg,fedprox:mu=0,fedprox:mu=1,fedproxsplit --optimum-cache "$out/optima" --out "$out/stragglers/p$p/seed$s" 2>"$out/stragglers-p$p-s$s.log"
    done
    echo "## stragglers p=$p: test accuracy (%) and training loss after 200 rounds, mean ± sd over seeds 1-3"
    "$ba" report --metric accuracy --at 200 "$out"/stragglers/p$p/seed*/results.json
    "$ba" report --metric loss --at 200 "$out"/stragglers/p$p/seed*/results.json
  done
fi

if want fmnist; then
  "$ba" simulate --dataset idx:/usr/share/datasets/fashion-mnist --partition classes:2 --clients 100 --per-round 10 \
    --model logreg --l2 1e-3 --epochs 20 --batch 10 --lr 0.01 --mu 1 --step 3 --gamma 1e-6 --rounds 100 --seed 1 \
    --algo fedavg,fedprox,fedsplit,fedproxsplit --optimum-cache "$out/optima" --out "$out/fmnist" 2>"$out/fmnist.log"
  echo "## Fashion-MNIST, 100 clients, classes:2, 10 per round: test accuracy (%)"
  "$ba" report --metric accuracy --at 25,50,100 "$out/fmnist/results.json"
fi

if want solver; then
  echo "## solver benchmarks"
  go test -run '^$' -bench . -benchmem -count 3 ./learn/proxsolver/ | tee "$out/solver-bench.txt"
fi
