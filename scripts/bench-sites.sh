#!/usr/bin/env bash
# The model-quality figures (docs/results.md): a three-hospital federation on scikit-learn's
# breast-cancer data (skewed case mix 75 / 13 / 35 % malignant, another
# column order and other label spellings at each site, an extra column at
# one), per site and federation accuracy and ROC AUC on the sites'
# held-out rows, for:
#   - the centralised reference: logistic regression on the pooled training
#     rows with the same preprocessing and l2 (simulate's optimum, L-BFGS
#     to ||grad|| <= 1e-10; cross-checked with scikit-learn),
#   - edgefl with federated preprocessing (the default),
#   - edgefl with standardize = client.
# First with broker-agg simulate --schema (the daemons' pipeline in one
# process), then over MQTT with the daemons: broker-agg run (embedded
# broker, per-site passwords from `broker-agg pki passwd`, --schema) and
# three edge-agent run processes, each reading its own site CSV, once with
# the schema's default and once with a schema saying standardize = client.
# The daemons' figures are read from the final bundle the aggregator
# writes; every site's model_out must be byte-identical to it, and its
# weights must equal those of simulate run with the wire's precision
# (--codec fp32 --downlink fp32), bit for bit. Also measured: the
# statistics phase's time and bytes (the aggregator's log), the bundle's
# size, edge-agent predict on 100,000 rows.
#
# Usage: scripts/bench-sites.sh [OUTDIR]   (default bench-results/sites)
# Generated data, results, bundles and the daemons' state and logs go
# under OUTDIR, not the repo. ROUNDS, L2 and SETTLE (the aggregator's
# --settle, default 200ms) may be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/sites}
rounds=${ROUNDS:-100}
l2=${L2:-0.002}
settle=${SETTLE:-200ms}
py=/usr/bin/python3 # Debian's python3, where python3-sklearn lives
src=/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv
if [[ ! -f $src ]]; then
  echo "installing python3-sklearn (for $src)" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo=sudo
  $sudo apt-get install -y -q python3-sklearn >&2
fi
mkdir -p "$out/bin"
go build -o "$out/bin/broker-agg" ./cmd/broker-agg
go build -o "$out/bin/edge-agent" ./cmd/edge-agent
ba="$out/bin/broker-agg"
ea="$out/bin/edge-agent"

$py scripts/bench_sites_data.py "$out/data"
data="$out/data"
common=(--schema "$data/schema.json" --dataset "csv:$data/combined.csv" --site-column site --partition natural
  --rounds "$rounds" --eval-every 10 --l2 "$l2" --seed 1)

# edgefl, federated preprocessing (the schema's default) and standardize = client.
# FedProx:FedSplit with an L-BFGS prox and step 20 (the default step 1 is
# slow on this ill-conditioned problem: gap 1.3e-3 after 100 rounds, 3.7e-7
# with step 20); FedAvg with its local SGD defaults.
algos=fedproxsplit:solver=lbfgs:step=20:label=fedproxsplit,fedavg
"$ba" simulate "${common[@]}" --algo "$algos" --out "$out/federation" \
  --bundle-out "$out/federation/final.bundle.json" 2>"$out/federation.log" >"$out/federation.txt"
"$ba" simulate "${common[@]}" --algo "$algos" --standardize client --out "$out/client" \
  --bundle-out "$out/client/final.bundle.json" 2>"$out/client.log" >"$out/client.txt"

# The fedproxsplit rows again with the daemons' wire precision: the uplink
# and the downlink carry float32 (broker-agg run's --codec fp32 and
# --downlink fp32), where simulate's default is exact float64 vectors.
# These are what the daemons must reproduce bit for bit.
fp32=(--algo fedproxsplit:solver=lbfgs:step=20:label=fedproxsplit --codec fp32 --downlink fp32)
"$ba" simulate "${common[@]}" "${fp32[@]}" --out "$out/federation-fp32" \
  --bundle-out "$out/federation-fp32/final.bundle.json" 2>"$out/federation-fp32.log" >/dev/null
"$ba" simulate "${common[@]}" "${fp32[@]}" --standardize client --out "$out/client-fp32" \
  --bundle-out "$out/client-fp32/final.bundle.json" 2>"$out/client-fp32.log" >/dev/null

# scikit-learn on the same rows, preprocessing and objective; also writes
# each site's held-out rows as its own CSV.
$py scripts/bench_sites_ref.py "$data" "$l2" "$out/sklearn.json"

# The bundle path: edge-agent evaluate on each site's held-out rows (its
# own CSV, its column order and label spelling) must give the figures the
# federation computed.
bundle="$out/federation/final-fedproxsplit.bundle.json"
for s in 1 2 3; do
  "$ea" evaluate --model "$bundle" --data "csv:$data/site$s-holdout.csv" --json >"$out/bundle-eval-site$s.json"
  # The standardize = client model's bundle carries the pooled statistics:
  # its weights used with the federation's preprocessing.
  "$ea" evaluate --model "$out/client/final-fedproxsplit.bundle.json" --data "csv:$data/site$s-holdout.csv" --json >"$out/client-bundle-eval-site$s.json"
done

# The daemons: the same federation over MQTT on loopback. The schema with
# standardize = client is the generated one with that one key changed.
$py - "$data/schema.json" "$data/schema-client.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
s["standardize"] = "client"
with open(sys.argv[2], "w") as f:
    json.dump(s, f, indent=2)
    f.write("\n")
EOF
pids=()
cleanup() { # the processes this script started, by pid
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
freeport() { $py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# daemons NAME SCHEMA: broker-agg run and three edge-agent run in
# $out/daemons-NAME, until the run ends (exit_when_finished) and every site
# wrote its model_out.
daemons() {
  local d="$out/daemons-$1" schema=$2 port k id apid t0 t1 agents=()
  rm -rf "$d"
  mkdir -p "$d"
  port=$(freeport)
  for k in 1 2 3; do
    id=site$k
    { head -c 18 /dev/urandom | base64 | tr -d '+/=\n'; echo; } >"$d/$id.password"
    chmod 600 "$d/$id.password"
    "$ba" pki passwd --file "$d/passwd" --user "$id" --password-stdin <"$d/$id.password" >/dev/null
  done
  # The simulate fedproxsplit row's algorithm and parameters (simulate's
  # defaults where the script gives none: mu 1, gamma 1e-3, 20 epochs,
  # relax 1, the robust server step), every site every round; the wire
  # carries float32 both ways (fp32 is broker-agg run's default codec).
  cat >"$d/aggregator.conf" <<EOF
federation = bench-sites
listen = 127.0.0.1:$port
password_file = $d/passwd
schema = $schema
state_file = $d/aggregator.db
metrics_addr =
model = logreg
l2 = $l2
algorithm = fedproxsplit
aggregator = fedsplit-robust
solver = lbfgs
step = 20
relax = 1
mu = 1
gamma = 0.001
max_epochs = 20
codec = fp32
downlink = fp32
init = zeros
rounds = $rounds
eval_every = 10
per_round = 3
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
  for k in 1 2 3; do
    id=site$k
    cat >"$d/$id.conf" <<EOF
site_id = $id
federation = bench-sites
broker = tcp://127.0.0.1:$port
username = $id
password_file = $d/$id.password
data = csv:$data/$id.csv
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
  local limit=$((SECONDS + 600))
  while kill -0 "$apid" 2>/dev/null; do
    if ((SECONDS > limit)); then
      echo "daemons $1: the aggregator did not finish within 600 s (see $d/aggregator.log)" >&2
      exit 1
    fi
    sleep 0.2
  done
  if ! wait "$apid"; then
    echo "daemons $1: broker-agg run failed (see $d/aggregator.log)" >&2
    exit 1
  fi
  t1=$(date +%s.%N)
  # The sites got the final bundle before the aggregator (and its embedded
  # broker) exited, or never will: a short wait for the files to appear.
  for k in 1 2 3; do
    for _ in $(seq 50); do
      [[ -f $d/site$k.bundle.json ]] && break
      sleep 0.1
    done
  done
  kill "${agents[@]}" 2>/dev/null || true
  wait "${agents[@]}" 2>/dev/null || true
  echo "$t0 $t1" >"$d/elapsed"
}
daemons federation "$data/schema.json"
daemons client "$data/schema-client.json"

# predict throughput on 100,000 rows (site 3's layout: reversed columns).
$py - "$data/site3.csv" "$out/predict-in.csv" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines()
with open(sys.argv[2], "w") as f:
    f.write(lines[0] + "\n")
    body = lines[1:]
    for i in range(100000):
        f.write(body[i % len(body)] + "\n")
EOF
# With the daemons' final bundle: what a site has in its model_out.
t0=$(date +%s.%N)
"$ea" predict --model "$out/daemons-federation/site3.bundle.json" --data "csv:$out/predict-in.csv" --out "$out/predict-out.csv"
t1=$(date +%s.%N)

$py - "$out" "$t0" "$t1" "$bundle" "$settle" <<'EOF'
import json, os, sys
from datetime import datetime
out, t0, t1, bundle, settle = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
fed = json.load(open(f"{out}/federation/results.json"))
cli = json.load(open(f"{out}/client/results.json"))
sk = json.load(open(f"{out}/sklearn.json"))
sites = [s["id"] for s in fed["sites"]]
def pct(v): return "-" if v is None else f"{100 * v:.1f}"
def cell(r): return f"{pct(r.get('accuracy', 0))} / {pct(r.get('auc'))}"
def last_eval(res, algo):
    run = next(r for r in res["runs"] if r["algo"] == algo)
    return [r for r in run["rounds"] if r.get("eval")][-1]["eval"]
rows = [("centralised logistic regression, pooled training rows, same preprocessing (reference; edgefl L-BFGS optimum)", fed["optimum"]["eval"]),
        ("the same with scikit-learn LogisticRegression (cross-check)", sk)]
for algo in ("fedproxsplit", "fedavg"):
    rows.append((f"edgefl {algo}, federated preprocessing (default), round {last_eval(fed, algo)['round']}", last_eval(fed, algo)))
for algo in ("fedproxsplit", "fedavg"):
    rows.append((f"edgefl {algo}, `standardize = client`, round {last_eval(cli, algo)['round']}", last_eval(cli, algo)))
rows.append(("centralised optimum with `standardize = client` preprocessing (where that federation converges)", cli["optimum"]["eval"]))
daemon = {m: json.load(open(f"{out}/daemons-{m}/final.bundle.json")) for m in ("federation", "client")}
rows.append((f"edgefl over MQTT (daemons), fedproxsplit, federated preprocessing (default), round {daemon['federation']['evaluation']['round']}", daemon["federation"]["evaluation"]))
rows.append((f"edgefl over MQTT (daemons), fedproxsplit, `standardize = client`, round {daemon['client']['evaluation']['round']}", daemon["client"]["evaluation"]))
# The client-mode fedproxsplit weights with the pooled preprocessing (its
# bundle, edge-agent evaluate); federation figures combined as edgefl does.
reps = {s: json.load(open(f"{out}/client-bundle-eval-site{k + 1}.json")) for k, s in enumerate(sites)}
n = sum(r["n"] for r in reps.values())
pooled = {"accuracy": sum(r["accuracy"] * r["n"] for r in reps.values()) / n,
          "auc": sum(r["auc"] * r["n"] for r in reps.values()) / n}
rows.append(("the `standardize = client` fedproxsplit weights used with pooled statistics (its bundle, edge-agent evaluate)", {"sites": reps, "federation": pooled}))
info = {s["id"]: s for s in fed["sites"]}
head = " | ".join(f"{s} ({info[s]['holdout_rows']} held out)" for s in sites)
print(f"Held-out accuracy / ROC AUC (%), l2 = {fed['config']['l2']}, {fed['config']['rounds']} rounds, every site every round\n")
print(f"| preprocessing | {head} | federation |")
print("|---|" + "---|" * (len(sites) + 1))
for name, ev in rows:
    print(f"| {name} | " + " | ".join(cell(ev["sites"][s]) for s in sites) + f" | {cell(ev['federation'])} |")
print()
print(f"objective at the optimum: edgefl {fed['optimum']['train_loss']:.12g} (||grad|| {fed['optimum']['grad_norm']:.1e}), scikit-learn {sk['objective']:.12g}")
for algo in ("fedproxsplit", "fedavg"):
    run = next(r for r in fed["runs"] if r["algo"] == algo)
    print(f"{algo}: gap F - F* after {run['rounds'][-1]['round']} rounds {run['rounds'][-1]['gap']:.3e}")
# The bundle path against the federation path.
ev = last_eval(fed, "fedproxsplit")
same = True
for k, s in enumerate(sites):
    b = json.load(open(f"{out}/bundle-eval-site{k + 1}.json"))
    f = ev["sites"][s]
    same &= b["n"] == f["n"] and b["accuracy"] == f["accuracy"] and b.get("auc") == f.get("auc") and abs(b["loss"] - f["loss"]) <= 1e-12 * abs(f["loss"])
print(f"edge-agent evaluate of the final bundle on each site's held-out CSV equals the federation's per-site figures: {'yes' if same else 'NO'}")
print("statistics a site sends (prep.Stats JSON): " + ", ".join(f"{s['id']} {s['stats_bytes']} B" for s in fed["sites"]))
print(f"bundle: {os.path.getsize(bundle)} bytes ({os.path.basename(bundle)})")
print(f"edge-agent predict on 100,000 rows (the daemons' bundle, site 3's CSV layout): {t1 - t0:.2f} s, {100000 / (t1 - t0):,.0f} rows/s (process start included)")

# The daemons against simulate.
def ts(line):
    return datetime.fromisoformat(line["time"].replace("Z", "+00:00")).timestamp()
for m, sim_exact, label in (("federation", fed, "federated preprocessing"), ("client", cli, "standardize = client")):
    d = f"{out}/daemons-{m}"
    log = [json.loads(l) for l in open(f"{d}/aggregator.log") if l.startswith("{")]
    first = lambda msg: next(l for l in log if l["msg"] == msg)
    announced, fitted = first("statistics phase announced"), first("federation preprocessing fitted")
    stats = [l for l in log if l["msg"] == "statistics stored"]
    rounds_ann = [l for l in log if l["msg"] == "round announced"]
    ended = first("the run has ended: waiting for the sites' evaluation of the final model")
    written = first("final model bundle written")
    t_start, t_end = (float(v) for v in open(f"{d}/elapsed").read().split())
    b = daemon[m]
    raw = open(f"{d}/final.bundle.json", "rb").read()
    print()
    print(f"daemons, {label}: {t_end - t_start:.1f} s from starting broker-agg run to its exit; "
          f"{len(rounds_ann)} rounds, {1000 * (ts(ended) - ts(rounds_ann[0])) / max(len(rounds_ann), 1):.0f} ms a round (--settle {settle})")
    # Each site's own view: statistics sent -> STATISTICS receipt.
    rtt = []
    for k in (1, 2, 3):
        sl = [json.loads(l) for l in open(f"{d}/site{k}.log") if l.startswith("{")]
        sent = next(l for l in sl if l["msg"].startswith("statistics phase: this site's statistics sent"))
        got = next(l for l in sl if l["msg"] == "statistics receipted")
        rtt.append(f"site{k} {1000 * (ts(got) - ts(sent)):.0f} ms")
    print(f"  statistics phase: announced -> preprocessing fitted {1000 * (ts(fitted) - ts(announced)):.0f} ms "
          f"(the three edge-agent processes start meanwhile), last statistics stored -> fitted {1000 * (ts(fitted) - ts(stats[-1])):.0f} ms; "
          f"statistics sent -> receipt at the sites: {', '.join(rtt)}")
    print(f"  statistics bytes: {len(stats)} SiteStatistics messages: " + ", ".join(f"{l['client']} {l.get('bytes', '?')} B" for l in stats)
          + f", {sum(l.get('bytes', 0) for l in stats)} B in all (whole messages: envelope and prep.Stats JSON)")
    same = [open(f"{d}/site{k}.bundle.json", "rb").read() == raw if os.path.exists(f"{d}/site{k}.bundle.json") else None for k in (1, 2, 3)]
    print(f"  final bundle: {len(raw)} bytes, round {b['provenance']['round']}, digest {b['digest'][:16]}, written "
          f"{1000 * (ts(written) - ts(ended)):.0f} ms after the last aggregation; each site's model_out byte-identical to it: "
          + ", ".join(f"site{k} {'yes' if v else ('NOT WRITTEN' if v is None else 'NO')}" for k, v in zip((1, 2, 3), same)))
    sim32 = json.load(open(f"{out}/{m}-fp32/final.bundle.json"))
    wd, ws = b["model"]["weights"], sim32["model"]["weights"]
    ev_same = json.dumps(b["evaluation"], sort_keys=True) == json.dumps(sim32["evaluation"], sort_keys=True)
    print(f"  against simulate --codec fp32 --downlink fp32: weights "
          + ("bit-identical" if wd == ws else f"DIFFER (max |dw| {max(abs(x - y) for x, y in zip(wd, ws)):.3e})")
          + f", evaluation (every figure, per site and federation) {'identical' if ev_same else 'DIFFERS'}")
    se = json.load(open(f"{out}/{m}/final-fedproxsplit.bundle.json"))
    fe, fd = se["evaluation"], b["evaluation"]
    eq = all(fd["sites"][s]["accuracy"] == fe["sites"][s]["accuracy"] and fd["sites"][s].get("auc") == fe["sites"][s].get("auc") for s in sites)
    print(f"  against simulate's exact float64 row: max |dw| {max(abs(x - y) for x, y in zip(wd, se['model']['weights'])):.2e} "
          f"(max |w| {max(abs(x) for x in wd):.2f}), federation held-out loss {fd['federation']['loss']:.8f} vs {fe['federation']['loss']:.8f}, "
          f"accuracy and AUC {'equal at every site' if eq else 'DIFFER'}")

EOF
