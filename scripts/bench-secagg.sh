#!/usr/bin/env bash
# Secure aggregation's cost per round over MQTT with the daemons
# (docs/privacy.md, "Cost over MQTT"), against the same round without it.
#
#   scripts/bench-secagg.sh [OUTDIR]        (default bench-results; writes OUTDIR/secagg)
#
# Environment: KS ("10 100": the per-round K values, with N = K sites),
# DROPS ("0 0.1 0.3": the shares of each round's sites that drop out after
# their masked input), ROUNDS (4: the first warms up, the others are
# measured), EPOCHS (1), SEED (1).
#
# Setup: e2e/cmd/loadtest runs Mosquitto (password file, the shipped ACL),
# `broker-agg run --broker` as its own process and N edge agents (package
# agent, as edge-agent runs it) in one process, each with its own bbolt
# state file; FedProx (mean) with SGD (EPOCHS local epochs, batch 10, lr
# 0.01, mu 1, gamma 1e-3) on multinomial logistic regression, 784 x 10
# (7,850 parameters), over loadtest's synthetic MNIST-shaped data split iid;
# fp32 uplink; every site selected every round (K = N, quorum 1).
#
# Per configuration, over rounds 2..ROUNDS: the seconds from a round's
# announcement to its aggregation (broker-agg's log), broker-agg's CPU
# seconds in that span (/proc/PID/stat, sampled every 10 ms: +-0.01 s), and
# the bytes the aggregator received and sent for the round divided by K
# (its round history: every message on the site topics in; every
# announcement once per online site, receipts and ShareLists out). With a
# drop share F, the first round(F K) sites of every round stop once their
# masked input is stored (their offline status goes out) and are restarted
# once the round is aggregated.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
out=${1:-bench-results}/secagg
KS=${KS:-"10 100"}
DROPS=${DROPS:-"0 0.1 0.3"}
ROUNDS=${ROUNDS:-4}
EPOCHS=${EPOCHS:-1}
SEED=${SEED:-1}
mkdir -p "$out"
build_bin ./cmd/broker-agg ./e2e/cmd/loadtest
need_mosquitto

data="$out/data"
loadtest_data "$data" "$SEED"

field() { sed -n "s/^ROUNDS .*$1=\([0-9.e+-]*\).*/\1/p" "$2"; }
rows=()
for K in $KS; do
  for mode in plain $DROPS; do
    if [ "$mode" = plain ]; then
      name="k$K-plain"
      flags=(--drop 0)
      label="without --secagg"
    else
      name="k$K-secagg-drop$mode"
      flags=(--secagg --drop "$mode" --secagg-timeout 60s)
      label="--secagg, $(awk -v d="$mode" 'BEGIN { printf "%g", 100 * d }')% drop"
    fi
    echo "== K = $K: $label"
    "$bin/loadtest" run --broker-agg "$bin/broker-agg" --data "$data" --clients "$K" --per-round "$K" \
      --rounds "$ROUNDS" --epochs "$EPOCHS" --seed "$SEED" --algorithm fedprox "${train_flags[@]}" "${flags[@]}" \
      | tee "$out/$name.txt"
    f="$out/$name.txt"
    rows+=("| $K | $label | $(field up_bytes_per_site "$f") | $(field down_bytes_per_site "$f") | $(field round_s_mean "$f") | $(field aggregator_cpu_s_per_round "$f") | $(field dropped_sites_total "$f") |")
  done
done

echo
echo "## Secure aggregation over MQTT: cost per round (784 x 10 logreg, 7,850 parameters; rounds 2..$ROUNDS; $(nproc) cores)"
echo
echo "| K | run | up B/site | down B/site | round s | broker-agg CPU s | sites dropped (all rounds) |"
echo "|---:|---|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
