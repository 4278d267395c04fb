#!/usr/bin/env bash
# Reproduces the contrastive local objectives' figure of docs/aggregators.md
# ("Contrastive local objectives") and docs/results.md: Fashion-MNIST, 100
# clients, the MLP, FedAvg, FedProx, MOON, FedSiam-DA's dual aggregation
# alone and FedSiam-DA in full, under classes:2 and dirichlet:0.3.
# Usage: scripts/bench-contrast.sh [OUTDIR]; SEEDS (default "1 2 3"),
# ROUNDS (default 100), AT (default 25,50,100), EVERY (evaluation period,
# default 25: the global model is evaluated only every EVERY rounds and at
# the last, so AT should be multiples of it) and ALGOS (default all five)
# set the grid. One simulate per (seed, partition, algorithm) cell, seeds
# outermost, so that a run stopped early leaves whole seeds; the figures do
# not depend on the order or on EVERY (every cell draws its own streams).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}
seeds=${SEEDS:-1 2 3}
rounds=${ROUNDS:-100}
at=${AT:-25,50,100}
every=${EVERY:-25}
algos=${ALGOS:-fedavg fedprox moon fedsiam-dual fedsiam-da}
mkdir -p "$out/contrast"
go build -o "$out/broker-agg" ./cmd/broker-agg
ba="$out/broker-agg"
# mu: the papers' best values (FedProx 0.01, MOON 1 with tau 0.5, FedSiam-DA
# 0.1); fedsiam:mu=0 is the dual aggregation over plain local SGD.
declare -A spec=([fedavg]=fedavg [fedprox]=fedprox:mu=0.01:label=fedprox [moon]=moon:mu=1:tau=0.5:label=moon
  [fedsiam-dual]=fedsiam:mu=0:label=fedsiam-dual [fedsiam-da]=fedsiam-da:mu=0.1:label=fedsiam-da)
parts="classes:2 dirichlet:0.3"
for s in $seeds; do
  for part in $parts; do
    for a in $algos; do
      "$ba" simulate --dataset idx:/usr/share/datasets/fashion-mnist --partition "$part" --clients 100 --per-round 10 \
        --model mlp --hidden 32 --activation relu --epochs 1 --batch 32 --lr 0.05 --rounds "$rounds" --seed "$s" \
        --eval-every "$every" --optimum-evals 1 --workers 1 --algo "${spec[$a]}" --out "$out/contrast/$part/$a/seed$s" \
        2>"$out/contrast/$part-$a-$s.log" >/dev/null
    done
  done
done
for part in $parts; do
  echo "## Fashion-MNIST, $part, 100 clients, 10 per round, MLP (32 hidden): test accuracy (%), mean ± sd over seeds $seeds"
  first=1
  for a in $algos; do
    # report's header (once) and the algorithm's row; its "centralised
    # optimum" row is not one here (--optimum-evals 1 skips that solve).
    "$ba" report --metric accuracy --at "$at" "$out"/contrast/$part/$a/seed*/results.json |
      awk -v first=$first 'NR <= 2 && first || NR > 2 && !/centralised optimum/'
    first=0
  done
done
