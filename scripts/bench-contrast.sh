#!/usr/bin/env bash
# Reproduces the contrastive local objectives' figure of docs/aggregators.md
# ("Contrastive local objectives"): Fashion-MNIST, 100 clients, the MLP,
# FedAvg, FedProx, MOON, FedSiam-DA's dual aggregation alone and FedSiam-DA
# in full, under classes:2 and dirichlet:0.3.
# Usage: scripts/bench-contrast.sh [OUTDIR]; SEEDS (default "1 2 3"),
# ROUNDS (default 100) and AT (default 25,50,100) set the grid.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}
seeds=${SEEDS:-1 2 3}
rounds=${ROUNDS:-100}
at=${AT:-25,50,100}
mkdir -p "$out/contrast"
go build -o "$out/broker-agg" ./cmd/broker-agg
ba="$out/broker-agg"
# mu: the papers' best values (FedProx 0.01, MOON 1 with tau 0.5, FedSiam-DA
# 0.1); fedsiam:mu=0 is the dual aggregation over plain local SGD.
algos="fedavg,fedprox:mu=0.01:label=fedprox,moon:mu=1:tau=0.5:label=moon,fedsiam:mu=0:label=fedsiam-dual,fedsiam-da:mu=0.1:label=fedsiam-da"
for part in classes:2 dirichlet:0.3; do
  for s in $seeds; do
    "$ba" simulate --dataset idx:/usr/share/datasets/fashion-mnist --partition "$part" --clients 100 --per-round 10 \
      --model mlp --hidden 32 --activation relu --epochs 1 --batch 32 --lr 0.05 --rounds "$rounds" --seed "$s" \
      --eval-every 5 --optimum-evals 1 --algo "$algos" --out "$out/contrast/$part/seed$s" \
      2>"$out/contrast/$part-$s.log" >/dev/null
  done
  echo "## Fashion-MNIST, $part, 100 clients, 10 per round, MLP (32 hidden): test accuracy (%), mean ± sd over seeds $seeds"
  "$ba" report --metric accuracy --at "$at" "$out"/contrast/$part/seed*/results.json
done
