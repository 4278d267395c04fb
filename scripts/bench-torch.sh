#!/usr/bin/env bash
# The local solve against PyTorch (docs/results.md, "Local solve versus
# PyTorch"): `edge-agent bench` and a well-written PyTorch loop
# (scripts/bench_torch.py) run the same FedProx local solve (SGD, batch 10,
# lr 0.01, mu 1, L2 1e-4, 20 epochs) on the same data, a CSV of 2,000 x 784
# Gaussian features with 10 classes from a random linear teacher, which
# edge-agent reads through a site configuration (standardize = none, so both
# train on the file's values). Models: logistic regression (784-10) and the
# MLP 784-64-10 (ReLU).
#
# Both run on one thread: the solve is one goroutine, and torch gets
# set_num_threads(1) (TORCH_THREADS). The runs are interleaved (edge-agent,
# PyTorch, then the BEFORE binary if any, per model) and repeated RUNS times:
# on a shared machine, take the ratios within a repetition, not absolute
# figures across runs.
#
# Figures per run: solve only, training samples/s over the epochs (both sides
# leave out the anchor and final full passes); whole process, wall seconds and
# peak RSS of the command (/usr/bin/time), data loading and, for PyTorch,
# `import torch` included.
#
# Usage: scripts/bench-torch.sh [OUTDIR]   (default bench-results/torch)
# Environment: RUNS (default 3), EPOCHS (default 20), TORCH_THREADS (default 1),
# PYTHON (default /usr/bin/python3, with python3-torch from Debian),
# BEFORE (a git revision: its edge-agent runs too, for before/after figures).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/torch}
runs=${RUNS:-3}
epochs=${EPOCHS:-20}
threads=${TORCH_THREADS:-1}
py=${PYTHON:-/usr/bin/python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
command -v jq >/dev/null || { echo "bench-torch.sh needs jq" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench-torch.sh needs /usr/bin/time" >&2; exit 1; }
"$py" -c 'import torch, numpy' 2>/dev/null || { echo "bench-torch.sh needs PyTorch and numpy under $py (apt-get install python3-torch)" >&2; exit 1; }

go build -trimpath -o "$out/edge-agent" ./cmd/edge-agent
bins=(edge-agent)
if [ -n "${BEFORE:-}" ]; then
  src=$(mktemp -d)
  trap 'rm -rf "$src"' EXIT
  git archive "$BEFORE" | tar -x -C "$src"
  (cd "$src" && go build -trimpath -o "$out/edge-agent-before" ./cmd/edge-agent)
  bins+=(edge-agent-before)
fi

data=$out/data.csv
[ -s "$data" ] || "$py" scripts/bench_torch.py gen --samples 2000 --features 784 --classes 10 --seed 1 --out "$data"
cat >"$out/edge-agent.conf" <<CONF
site_id = bench
federation = bench
broker = tcp://127.0.0.1:1
password_file = $out/no-password
data = csv:$data:label=y
standardize = none
state_file = $out/state/edge.db
CONF

common=(--epochs "$epochs" --batch 10 --lr 0.01 --mu 1 --l2 1e-4 --seed 1)
# run NAME MODEL: one timed run; NAME.json holds the report plus wall_seconds
# and max_rss_kb of the whole process.
run() {
  local name=$1 m=$2 f="$out/$1-$2-$rep"
  if [ "$name" = torch ]; then
    /usr/bin/time -f '%e %M' -o "$f.time" "$py" scripts/bench_torch.py train --csv "$data" --model "$m" --hidden 64 --threads "$threads" "${common[@]}" >"$f.raw"
  else
    /usr/bin/time -f '%e %M' -o "$f.time" "$out/$name" bench --config "$out/edge-agent.conf" --model "$m" --hidden 64 --solver sgd --deadline 10m "${common[@]}" --json >"$f.raw"
  fi
  read -r wall rss <"$f.time"
  jq --argjson w "$wall" --argjson r "$rss" '. + {wall_seconds: $w, max_rss_kb: $r}' "$f.raw" >"$f.json"
}

echo "## local solve versus PyTorch ($(git describe --always --dirty))"
echo
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x$(nproc), load $(cut -d' ' -f1-3 /proc/loadavg), $(go version | cut -d' ' -f3), torch $("$py" -c 'import torch; print(torch.__version__)') with $threads thread(s)"
echo "solve: SGD batch 10, $epochs epochs, lr 0.01, mu 1, L2 1e-4, 2,000 x 784, 10 classes; edgefl float64, PyTorch float32"
echo
echo "| run | model | program | samples/s | vs PyTorch | wall s | peak RSS MiB | wall vs PyTorch | RSS vs PyTorch | final loss |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
for ((rep = 1; rep <= runs; rep++)); do
  for m in logreg mlp; do
    for b in "${bins[@]}"; do
      run "$b" "$m"
      [ "$b" = edge-agent ] && run torch "$m"
    done
    t="$out/torch-$m-$rep.json"
    for b in "${bins[@]}" torch; do
      jq -r --slurpfile t "$t" --arg run "$rep" --arg m "$m" --arg b "$b" '
        [$run, $m, $b,
         (.samples_per_second | floor | tostring),
         ((.samples_per_second / $t[0].samples_per_second) * 100 | round / 100 | tostring) + "x",
         (.wall_seconds | tostring),
         ((.max_rss_kb / 1024) * 10 | round / 10 | tostring),
         (($t[0].wall_seconds / .wall_seconds) * 100 | round / 100 | tostring) + "x",
         (($t[0].max_rss_kb / .max_rss_kb) * 10 | round / 10 | tostring) + "x",
         (.loss * 10000 | round / 10000 | tostring)]
        | "| " + join(" | ") + " |"' "$out/$b-$m-$rep.json"
    done
  done
done
echo
echo "vs PyTorch: samples/s over PyTorch's, and PyTorch's wall time and peak RSS over the program's (higher is better for edgefl), within one run."
echo
echo "| model | program | solve vs PyTorch: median (min-max) | whole process wall: median (min-max) | peak RSS: median |"
echo "|---|---|---|---|---|"
for m in logreg mlp; do
  for b in "${bins[@]}"; do
    for ((rep = 1; rep <= runs; rep++)); do
      jq -r --slurpfile t "$out/torch-$m-$rep.json" '[.samples_per_second / $t[0].samples_per_second, $t[0].wall_seconds / .wall_seconds, $t[0].max_rss_kb / .max_rss_kb] | @tsv' "$out/$b-$m-$rep.json"
    done | sort -g | awk -v m="$m" -v b="$b" '
      { s[NR] = $1; w[NR] = $2; r[NR] = $3 }
      function med(a, n,   i, j, t, c) { for (i = 1; i <= n; i++) c[i] = a[i]; for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (c[j] < c[i]) { t = c[i]; c[i] = c[j]; c[j] = t }; return n % 2 ? c[(n + 1) / 2] : (c[n / 2] + c[n / 2 + 1]) / 2 }
      function lo(a, n,   i, v) { v = a[1]; for (i = 2; i <= n; i++) if (a[i] < v) v = a[i]; return v }
      function hi(a, n,   i, v) { v = a[1]; for (i = 2; i <= n; i++) if (a[i] > v) v = a[i]; return v }
      END { printf "| %s | %s | %.2fx (%.2f-%.2f) | %.2fx (%.2f-%.2f) | %.1fx |\n", m, b, med(s, NR), lo(s, NR), hi(s, NR), med(w, NR), lo(w, NR), hi(w, NR), med(r, NR) }'
  done
done
echo
echo "Raw JSON: $out/*.json"
