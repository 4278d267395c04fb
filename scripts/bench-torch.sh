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
# Figures per run, each as edgefl's advantage over PyTorch in the same
# repetition (higher is better for edgefl):
#   solve, wall     training samples/s over the epochs by the wall clock
#                   (edge-agent's samples_per_second; both leave out the
#                   anchor and final full passes)
#   solve, CPU      epochs x samples over the process CPU time of the whole
#                   solve, the two full passes included (solve_cpu_seconds):
#                   what the solve costs, whatever else the machine runs
#   process wall, process CPU, peak RSS: of the whole command (/usr/bin/time),
#                   data loading and, for PyTorch, `import torch` included
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
# run NAME MODEL: one timed run; NAME-MODEL-REP.json holds the report plus
# the whole process's wall_seconds, cpu_seconds and max_rss_kb.
run() {
  local name=$1 m=$2 f="$out/$1-$2-$rep"
  if [ "$name" = torch ]; then
    /usr/bin/time -f '%e %U %S %M' -o "$f.time" "$py" scripts/bench_torch.py train --csv "$data" --model "$m" --hidden 64 --threads "$threads" "${common[@]}" >"$f.raw"
  else
    /usr/bin/time -f '%e %U %S %M' -o "$f.time" "$out/$name" bench --config "$out/edge-agent.conf" --model "$m" --hidden 64 --solver sgd --deadline 10m "${common[@]}" --json >"$f.raw"
  fi
  read -r wall usr sys rss <"$f.time"
  jq --argjson w "$wall" --argjson c "$(awk -v u="$usr" -v s="$sys" 'BEGIN { print u + s }')" --argjson r "$rss" \
    '. + {wall_seconds: $w, cpu_seconds: $c, max_rss_kb: $r}' "$f.raw" >"$f.json"
}

# ratios FILE TORCHFILE: samples/s (wall), samples/s (CPU), process wall s,
# process CPU s, peak RSS MiB, final loss, then the five ratios to PyTorch;
# -1 for the CPU figures of an edge-agent too old to report solve_cpu_seconds.
ratios() {
  jq -r --slurpfile t "$2" --argjson n "$((2000 * epochs))" '
    def cpu_sps: if .solve_cpu_seconds then $n / .solve_cpu_seconds else -1 end;
    [.samples_per_second, cpu_sps, .wall_seconds, .cpu_seconds, .max_rss_kb / 1024, .loss,
     .samples_per_second / $t[0].samples_per_second, (if cpu_sps < 0 then -1 else cpu_sps / ($t[0] | cpu_sps) end),
     $t[0].wall_seconds / .wall_seconds, $t[0].cpu_seconds / .cpu_seconds, $t[0].max_rss_kb / .max_rss_kb] | @tsv' "$1"
}

echo "## local solve versus PyTorch ($(git describe --always --dirty))"
echo
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x$(nproc), load $(cut -d' ' -f1-3 /proc/loadavg) at the start, $(go version | cut -d' ' -f3), torch $("$py" -c 'import torch; print(torch.__version__)') with $threads thread(s)"
echo "solve: SGD batch 10, $epochs epochs, lr 0.01, mu 1, L2 1e-4, 2,000 x 784, 10 classes; edgefl float64, PyTorch float32"
echo
echo "| run | model | program | solve samples/s, wall | vs PyTorch | solve samples/s, CPU | vs PyTorch | process wall s | vs PyTorch | process CPU s | vs PyTorch | peak RSS MiB | vs PyTorch | final loss |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for ((rep = 1; rep <= runs; rep++)); do
  for m in logreg mlp; do
    for b in "${bins[@]}"; do
      run "$b" "$m"
      [ "$b" = edge-agent ] && run torch "$m"
    done
    for b in "${bins[@]}" torch; do
      ratios "$out/$b-$m-$rep.json" "$out/torch-$m-$rep.json" | awk -F'\t' -v r="$rep" -v m="$m" -v b="$b" '
        { c = $2 < 0 ? "n/a | n/a" : sprintf("%.0f | %.2fx", $2, $8)
          printf "| %s | %s | %s | %.0f | %.2fx | %s | %.2f | %.2fx | %.2f | %.2fx | %.1f | %.1fx | %.4f |\n",
            r, m, b, $1, $7, c, $3, $9, $4, $10, $5, $11, $6 }'
    done
  done
done
echo
echo "vs PyTorch: edgefl's advantage within the same run (samples/s over PyTorch's; PyTorch's seconds and"
echo "peak RSS over the program's): higher is better for edgefl."
echo
echo "| model | program | solve, wall | solve, CPU | process wall | process CPU | peak RSS |"
echo "|---|---|---|---|---|---|---|"
for m in logreg mlp; do
  for b in "${bins[@]}"; do
    for ((rep = 1; rep <= runs; rep++)); do
      ratios "$out/$b-$m-$rep.json" "$out/torch-$m-$rep.json"
    done | awk -F'\t' -v m="$m" -v b="$b" '
      { for (k = 7; k <= 11; k++) v[k, NR] = $k }
      function stat(k,   i, j, t, c, n) {
        n = 0; for (i = 1; i <= NR; i++) if (v[k, i] >= 0) c[++n] = v[k, i]
        if (n == 0) return "n/a"
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (c[j] < c[i]) { t = c[i]; c[i] = c[j]; c[j] = t }
        return sprintf("%.2fx (%.2f-%.2f)", n % 2 ? c[(n + 1) / 2] : (c[n / 2] + c[n / 2 + 1]) / 2, c[1], c[n])
      }
      END { printf "| %s | %s | %s | %s | %s | %s | %s |\n", m, b, stat(7), stat(8), stat(9), stat(10), stat(11) }'
  done
done
echo
echo "Each cell: the median over $runs runs (min-max). Raw JSON: $out/*.json"
