#!/usr/bin/env bash
# Fed-Heart-Disease (four real hospitals: Cleveland, Hungary, Switzerland,
# VA Long Beach) as the FLamby benchmark defines it, next to FLamby's
# published figures (docs/results.md, "Fed-Heart-Disease next to FLamby").
#
#   1. scripts/bench_heart.py builds FLamby's split from the raw exports
#      (label num > 0; slope, ca, thal dropped; rows with `?` elsewhere
#      dropped: 740 rows; per centre train_test_split(train_size=0.66,
#      random_state=43, shuffle=True), stratified but at Switzerland): each
#      centre's training and test rows as raw CSV cells under a header.
#   2. broker-agg simulate --schema scripts/bench-heart.schema.json (the
#      daemons' pipeline: statistics, the federation's preprocessing with cp
#      and restecg one-hot from their text cells, training, each site's
#      evaluation) with --eval-dataset: every site trains on its training
#      rows and is evaluated on its FLamby test rows. Every family of
#      --algo, SEEDS seeds (the seed draws the local SGD's order; L-BFGS
#      runs are deterministic: their sd is 0). MOON and FedSiam-DA (the
#      contrastive client losses) need --model mlp: a second simulate per
#      seed on the same split with the MLP, next to FedAvg/FedProx on it.
#   3. scikit-learn's centralised logistic regression on the same rows and
#      preprocessing, and simulate's centralised optimum.
#   4. Once over MQTT with mutual TLS (certificates from broker-agg pki):
#      broker-agg run and four edge-agent run processes, each site with
#      data = its training CSV and eval_data = its test CSV, FedProx:FedSplit
#      with an L-BFGS prox (deploy/hospital's algorithm); its final bundle
#      must equal simulate's with the wire's precision (--codec fp32
#      --downlink fp32) bit for bit.
#
# Metric: accuracy on each centre's test rows, averaged over the four (as
# FLamby), and the pooled accuracy over the 254 test rows.
#
# Usage: scripts/bench-heart.sh [OUTDIR]   (default bench-results/heart)
# DATA (default /work/shared/data/fed-heart-disease, or testkit/heartdisease),
# ROUNDS (50), L2 (0.01), SEEDS ("1 2 3 4 5") and SETTLE (the aggregator's
# --settle, 200ms) may be set in the environment. About 25 s on 2 cores for
# the linear families, plus about 30 s of CPU a seed for the MLP runs.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/heart}
rounds=${ROUNDS:-50}
l2=${L2:-0.01}
seeds=${SEEDS:-1 2 3 4 5}
settle=${SETTLE:-200ms}
data=${DATA:-/work/shared/data/fed-heart-disease}
[[ -f $data/processed.va.data ]] || data=testkit/heartdisease
py=/usr/bin/python3 # Debian's python3, where python3-sklearn lives
$py -c 'import sklearn' 2>/dev/null || { echo "needs python3-sklearn (apt-get install python3-sklearn)" >&2; exit 1; }
schema=scripts/bench-heart.schema.json
rm -rf "$out"
mkdir -p "$out/bin"
go build -o "$out/bin/broker-agg" ./cmd/broker-agg
go build -o "$out/bin/edge-agent" ./cmd/edge-agent
ba="$out/bin/broker-agg"
ea="$out/bin/edge-agent"

$py scripts/bench_heart.py split "$data" "$out/split" | tee "$out/split.txt"
$py scripts/bench_heart.py sklearn "$out/split" "$l2" >"$out/sklearn.jsonl"

common=(--schema "$schema" --dataset "csv:$out/split/train.csv" --eval-dataset "csv:$out/split/test.csv"
  --site-column site --partition natural --rounds "$rounds" --eval-every "$rounds" --l2 "$l2")
# simulate's local defaults unless named: SGD, 20 epochs, batch 10, lr 0.01,
# mu 1; FedSplit step 1. fedsplit is the exact reference: its prox is an
# L-BFGS solve whatever --solver says (deterministic). fedproxsplit-lbfgs is
# deploy/hospital's algorithm, the one run over MQTT below. The aggregators
# (fedsiam ... simprox) are fed by FedProx local training (SGD).
algos=fedavg,fedprox,fedsplit,fedproxsplit
algos+=,fedproxsplit:solver=lbfgs:step=10:label=fedproxsplit-lbfgs
algos+=,fedsiam,fedsiam:w0=fedavg:label=fedsiam-w0fedavg,median,trimmed:beta=0.25,normbound,simprox
# SCAFFOLD (local SGD shifted by c - c_i, global learning rate 1) and the
# server optimisers on FedAvg's mean (their defaults: server lr 0.01, beta1
# 0.9, beta2 0.99, tau 1e-3).
algos+=,scaffold,fedavg:server-opt=adam:label=fedadam,fedavg:server-opt=yogi:label=fedyogi
# The contrastive client losses need a representation layer: the same split
# and schema with --model mlp (64 ReLU units; its initialisation is drawn
# from the seed), next to FedAvg, FedProx and the dual aggregation alone
# (fedsiam over plain local SGD) on the same MLP. mu as the papers' best:
# MOON 1 (tau 0.5), FedSiam-DA 0.1.
mlp_algos=fedavg,fedprox,moon:mu=1:tau=0.5,fedsiam:mu=0:label=fedsiam-dual,fedsiam-da:mu=0.1
for s in $seeds; do
  "$ba" simulate "${common[@]}" --algo "$algos" --seed "$s" --out "$out/seed$s" \
    --bundle-out "$out/seed$s/final.bundle.json" >"$out/seed$s.txt" 2>"$out/seed$s.log"
  "$ba" simulate "${common[@]}" --model mlp --algo "$mlp_algos" --seed "$s" --out "$out/mlp-seed$s" \
    >"$out/mlp-seed$s.txt" 2>"$out/mlp-seed$s.log"
done
# The hospital walk-through's schema reads a 0 cholesterol or blood
# pressure as missing (FLamby keeps it as a value): its optimum and L-BFGS
# FedProx:FedSplit on the same split.
"$ba" simulate --schema deploy/hospital/schema.json "${common[@]:2}" --algo fedproxsplit:solver=lbfgs:step=10:label=fedproxsplit-lbfgs \
  --out "$out/hospital-schema" >"$out/hospital-schema.txt" 2>"$out/hospital-schema.log"

# The same FedProx:FedSplit with the wire's precision: what the daemons
# must reproduce bit for bit.
mqtt_algo=(--algo fedproxsplit:solver=lbfgs:step=10:label=fedproxsplit-lbfgs --codec fp32 --downlink fp32)
"$ba" simulate "${common[@]}" "${mqtt_algo[@]}" --out "$out/fp32" \
  --bundle-out "$out/fp32/final.bundle.json" >"$out/fp32.txt" 2>"$out/fp32.log"

# The daemons over MQTT with mutual TLS on loopback.
sites=(cleveland hungarian switzerland va)
d="$out/daemons"
mkdir -p "$d"
"$ba" pki --dir "$d/pki" --hosts localhost,127.0.0.1 --clients "$(IFS=,; echo "${sites[*]}")" >"$d/pki.txt"
pids=()
cleanup() { # the processes this script started, by pid
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
port=$($py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# simulate's fedproxsplit-lbfgs row: its parameters (simulate's defaults
# where the script gives none), every site every round.
cat >"$d/aggregator.conf" <<EOF
federation = heart
listen = 127.0.0.1:$port
tls_cert = $d/pki/server.crt
tls_key = $d/pki/server.key
tls_client_ca = $d/pki/ca.crt
schema = $schema
state_file = $d/aggregator.db
metrics_addr =
model = logreg
l2 = $l2
algorithm = fedproxsplit
aggregator = fedsplit-robust
solver = lbfgs
step = 10
relax = 1
mu = 1
gamma = 0.001
max_epochs = 20
codec = fp32
downlink = fp32
init = zeros
rounds = $rounds
eval_every = $rounds
per_round = 4
quorum_fraction = 1
round_timeout = 60s
settle = $settle
max_reselections = -1
seed = 1
exit_when_finished = true
log_format = json
log_level = info
EOF
t0=$(date +%s.%N)
"$ba" run --config "$d/aggregator.conf" 2>"$d/aggregator.log" &
apid=$!
pids+=("$apid")
agents=()
for id in "${sites[@]}"; do
  cat >"$d/$id.conf" <<EOF
site_id = $id
federation = heart
broker = ssl://localhost:$port
tls_ca = $d/pki/ca.crt
tls_cert = $d/pki/clients/$id.crt
tls_key = $d/pki/clients/$id.key
data = csv:$out/split/$id-train.csv
eval_data = $out/split/$id-test.csv
state_file = $d/$id.db
model_out = $d/$id.bundle.json
seed = 1
reconnect_min = 200ms
reconnect_max = 1s
log_format = json
log_level = info
EOF
  "$ea" run --config "$d/$id.conf" 2>"$d/$id.log" &
  agents+=($!)
  pids+=($!)
done
limit=$((SECONDS + 120))
while kill -0 "$apid" 2>/dev/null; do
  if ((SECONDS > limit)); then
    echo "the aggregator did not finish within 120 s (see $d/aggregator.log)" >&2
    exit 1
  fi
  sleep 0.2
done
wait "$apid" || { echo "broker-agg run failed (see $d/aggregator.log)" >&2; exit 1; }
t1=$(date +%s.%N)
# The daemons' wall time, broker-agg's start to its exit, and the rounds'
# share of it (first announcement to "federation finished", from its log).
rounds_s=$($py -c '
import sys, json, datetime
ts = lambda r: datetime.datetime.fromisoformat(r["time"].replace("Z", "+00:00"))
recs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
first = next(r for r in recs if r.get("msg") == "round announced")
fin = next(r for r in recs if r.get("msg") == "federation finished")
print(f"{(ts(fin) - ts(first)).total_seconds():.2f}")' "$d/aggregator.log")
awk -v a="$t0" -v b="$t1" -v r="$rounds_s" -v n="$rounds" -v s="$settle" \
  'BEGIN { printf "DAEMONS wall %.2f s (rounds %s s) for %d rounds, --settle %s\n", b - a, r, n, s }' | tee "$d/wall.txt"
for id in "${sites[@]}"; do
  for _ in $(seq 50); do
    [[ -f $d/$id.bundle.json ]] && break
    sleep 0.1
  done
done
kill "${agents[@]}" 2>/dev/null || true
wait "${agents[@]}" 2>/dev/null || true

$py scripts/bench_heart.py table "$out" "$seeds" | tee "$out/table.md"
