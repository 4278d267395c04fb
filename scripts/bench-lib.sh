# Shell helpers of the loadtest benchmarks (bench-console.sh, bench-e2e.sh,
# bench-flood.sh), sourced by them from the repository root.

# build_bin PKG...: go build the packages into a temporary directory $bin,
# removed when the script exits.
build_bin() {
  bin=$(mktemp -d)
  trap 'rm -rf "$bin"' EXIT
  go build -o "$bin/" "$@"
}

need_mosquitto() {
  [ -x /usr/sbin/mosquitto ] || { echo "needs /usr/sbin/mosquitto (apt-get install mosquitto)" >&2; exit 1; }
}

# loadtest_data DIR SEED: the loadtest's IDX data in DIR, generated once.
loadtest_data() {
  [ -f "$1/train-images-idx3-ubyte" ] || "$bin/loadtest" gen --dir "$1" --seed "$2"
}

# train_flags: the training flags the benchmarks give loadtest run (and
# simulate, to compare with it).
train_flags=(--solver sgd --mu 1 --gamma 1e-3 --batch 10 --lr 0.01 --step 1 --l2 1e-4)
