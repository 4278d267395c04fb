#!/usr/bin/env bash
# The privacy-utility figures (docs/privacy.md, "Using --dp"): test accuracy of FedAvg, FedProx and
# FedProx:FedSplit under central client-level DP (broker-agg simulate --dp central) at
# epsilon = 1, 3, 8 (delta = 1e-5), next to the non-private run on the same
# data, SGD order and seed. For each target the noise multiplier z is
# calibrated (dp.CalibrateNoise) so that the run's rounds at its sampling
# rate q spend exactly that budget; the run reports the epsilon it spent and
# the largest per-site epsilon without amplification by subsampling (q = 1
# over the rounds a site contributed to: what holds against anyone who
# knows the selection, docs/privacy.md "Sampling rate"). Under DP the
# selection is Poisson (each client with probability q, --dp's default,
# drawn from a key derived from the seed); the non-private run selects
# exactly K uniformly. Under DP FedAvg's sample weights are replaced by the
# fixed-denominator mean (docs/privacy.md), so FedAvg and FedProx differ
# only by the local solve (FedProx's proximal term). FedProx:FedSplit (step
# s = 3) runs in sum mode under --dp: the aggregator keeps S = sum of the
# sites' contributions over a roster of m sites fixed when round 1 is drawn
# (each starting at the public x_0, so m tells nobody who was drawn) and
# publishes S/m (docs/privacy.md, "FedSplit"); its noise accumulates in S.
# Under --dp the total sample count is not announced, so FedSplit's
# per-site step is uniform.
#
#   Fashion-MNIST: 100 clients (classes:2), 10 per round (q = 0.1; under DP
#     10 on average),
#     ROUNDS_FMNIST rounds (default 40), 2 local epochs, clip C = CLIP_FMNIST.
#   Breast cancer: the three hospitals of scripts/bench-sites.sh (as a LEAF
#     file, one client per site, --standardize global, 25 % of each site's
#     rows held out), every site every round (q = 1: no amplification),
#     ROUNDS_BC rounds (default 10), clip C = CLIP_BC.
#
#   Breast cancer with the schema pipeline (part `sites`): the same three
#     hospitals as CSVs read by a federation schema (simulate --schema, the
#     daemons' pipeline: TestSimSchemaDPMatchesLive), every site every round
#     (q = 1), ROUNDS_BC rounds, clip C = CLIP_BC, the schema's 20 % of each
#     site's rows held out. Under --dp the schema declares its preprocessing
#     (schema-dp.json of scripts/bench_sites_data.py: each feature's
#     published range mapped to [-1, 1], no statistics phase); next to it the
#     non-private runs with the statistics phase's federated preprocessing
#     and with the declared one, and the centralised reference (simulate's
#     optimum on the pooled training rows, declared preprocessing). The
#     noise is drawn from five noise seeds (--dp-noise-seed 1..5):
#     mean +- sd of held-out accuracy / AUC.
#
#   Breast cancer under distributed DP (part `dist`): the bc federation
#     under central DP and under --secagg --dp distributed, at each epsilon
#     over SEEDS_DIST noise seeds (default 20: one run's final accuracy on
#     143 test rows swings by 10-20 points with the noise, so five seeds do
#     not tell the two modes apart), next to the non-private runs
#     without and with --secagg: under distributed DP every
#     site rounds its clipped update to the secagg grid and adds a discrete
#     Gaussian share of variance (z C)^2 / (t - c), t the secagg threshold
#     (2 of the 3 sites) and c = 1 the collusion bound (--dp-colluders), so
#     the 3 shares sum to 3 times the central noise's variance: the price
#     of tolerating a dropout and one colluding site), and the aggregator
#     unmasks only the sum; the accountant charges q = 1 as in bc. The
#     FedAvg/FedProx mean is uniform under --secagg (sample weights would
#     reveal the counts), as it is under central DP.
#
# DP_NOISE_SEED, when set, is the noise seed of parts fmnist and bc (it
# keys the noise and, under Poisson sampling, the selection; default
# --seed, 1): one draw against another.
#
# In parts fmnist, bc and dist the centralised optimum is not computed
# (--optimum-evals 1): those tables are test accuracy only.
#
# Usage: scripts/bench-dp.sh [OUTDIR] [PART...]   (default bench-results/dp;
# parts fmnist, bc, dist, sites; default all four)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/dp}
shift || true
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(fmnist bc dist sites)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
rf=${ROUNDS_FMNIST:-40}
rb=${ROUNDS_BC:-10}
cf=${CLIP_FMNIST:-1}
cb=${CLIP_BC:-0.25}
sd=${SEEDS_DIST:-20}
py=/usr/bin/python3
src=/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv
if [[ ! -f $src ]]; then
  echo "installing python3-sklearn (for $src)" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo=sudo
  $sudo apt-get install -y -q python3-sklearn >&2
fi
mkdir -p "$out"
go build -o "$out/broker-agg" ./cmd/broker-agg
ba="$out/broker-agg"

fmnist=(--dataset idx:/usr/share/datasets/fashion-mnist --partition classes:2 --clients 100 --per-round 10
  --model logreg --l2 1e-3 --epochs 2 --batch 10 --lr 0.01 --mu 1 --rounds "$rf" --seed 1
  --algo fedavg,fedprox,fedproxsplit:step=3:label=fedproxsplit --codec fp32 --optimum-evals 1 --eval-every 10)
$py scripts/bench_sites_data.py "$out/bc-sites" >/dev/null
$py scripts/bench_dp.py leaf "$out/bc-sites" "$out/bc.json"
bc=(--dataset "leaf:$out/bc.json" --partition natural --clients 3 --per-round 3 --standardize global --test-fraction 0.25
  --model logreg --l2 0.002 --epochs 20 --batch 10 --lr 0.01 --mu 1 --rounds "$rb" --seed 1
  --algo fedavg,fedprox,fedproxsplit:step=3:label=fedproxsplit --codec fp32 --optimum-evals 1)

for eps in none 8 3 1; do
  for set in fmnist bc; do
    want $set || continue
    if [[ $set == fmnist ]]; then args=("${fmnist[@]}"); clip=$cf; else args=("${bc[@]}"); clip=$cb; fi
    dp=()
    [[ $eps == none ]] || dp=(--dp central --dp-clip "$clip" --dp-epsilon "$eps" --dp-delta 1e-5 ${DP_NOISE_SEED:+--dp-noise-seed "$DP_NOISE_SEED"})
    "$ba" simulate "${args[@]}" "${dp[@]}" --out "$out/$set-$eps" 2>"$out/$set-$eps.log" >/dev/null
  done
done
want fmnist && $py scripts/bench_dp.py table "Fashion-MNIST, 100 clients (classes:2), 10 per round, $rf rounds, C = $cf: test accuracy (%)" \
  "$out"/fmnist-{none,8,3,1}/results.json
want bc && $py scripts/bench_dp.py table "Breast cancer, 3 hospitals, all every round, $rb rounds, C = $cb: test accuracy (%)" \
  "$out"/bc-{none,8,3,1}/results.json

if want dist; then
  "$ba" simulate "${bc[@]}" --out "$out/dist-plain" 2>"$out/dist-plain.log" >/dev/null
  "$ba" simulate "${bc[@]}" --secagg --out "$out/dist-secagg" 2>"$out/dist-secagg.log" >/dev/null
  central=() distributed=()
  for eps in 8 3 1; do
    for seed in $(seq 1 "$sd"); do
      "$ba" simulate "${bc[@]}" --dp central --dp-clip "$cb" --dp-epsilon "$eps" --dp-delta 1e-5 --dp-noise-seed "$seed" \
        --out "$out/dist-central-$eps-$seed" 2>"$out/dist-central-$eps-$seed.log" >/dev/null
      "$ba" simulate "${bc[@]}" --secagg --dp distributed --dp-clip "$cb" --dp-epsilon "$eps" --dp-delta 1e-5 --dp-noise-seed "$seed" \
        --out "$out/dist-distributed-$eps-$seed" 2>"$out/dist-distributed-$eps-$seed.log" >/dev/null
      central+=("$out/dist-central-$eps-$seed/results.json")
      distributed+=("$out/dist-distributed-$eps-$seed/results.json")
    done
  done
  $py scripts/bench_dp.py spread "Breast cancer, 3 hospitals, all every round, $rb rounds, C = $cb: central DP against distributed DP under secure aggregation (discrete Gaussian shares, t = 2 of 3), test accuracy (%), mean ± sd over noise seeds 1-$sd" \
    central "$out/dist-plain/results.json" "${central[@]}" -- \
    "distributed (secagg)" "$out/dist-secagg/results.json" "${distributed[@]}"
fi

if want sites; then
  start=$(date +%s)
  sites=(--dataset "csv:$out/bc-sites/combined.csv" --site-column site --partition natural
    --model logreg --l2 0.002 --epochs 20 --batch 10 --lr 0.01 --mu 1 --rounds "$rb" --seed 1
    --algo fedavg,fedprox --codec fp32 --eval-every "$rb")
  "$ba" simulate --schema "$out/bc-sites/schema.json" "${sites[@]}" --out "$out/sites-federated" 2>"$out/sites-federated.log" >/dev/null
  "$ba" simulate --schema "$out/bc-sites/schema-dp.json" "${sites[@]}" --out "$out/sites-declared" 2>"$out/sites-declared.log" >/dev/null
  args=()
  for eps in 8 3 1; do
    [[ $eps == 8 ]] || args+=(--)
    for seed in 1 2 3 4 5; do
      "$ba" simulate --schema "$out/bc-sites/schema-dp.json" "${sites[@]}" --optimum-evals 1 \
        --dp central --dp-clip "$cb" --dp-epsilon "$eps" --dp-delta 1e-5 --dp-noise-seed "$seed" \
        --out "$out/sites-$eps-$seed" 2>"$out/sites-$eps-$seed.log" >/dev/null
      args+=("$out/sites-$eps-$seed/results.json")
    done
  done
  $py scripts/bench_dp.py sites "Breast cancer, schema pipeline, 3 hospitals, all every round, $rb rounds, C = $cb: held-out accuracy / AUC (%)" \
    "$out/sites-federated/results.json" "$out/sites-federated/results.json" "$out/sites-declared/results.json" "${args[@]}"
  echo "(part sites: $(( $(date +%s) - start )) s)"
fi
