#!/usr/bin/python3
"""Fed-Heart-Disease as FLamby defines it, for scripts/bench-heart.sh.

  bench_heart.py split DATA_DIR OUT_DIR
      FLamby's per-centre train/test split of the four raw UCI exports:
      the binary label num > 0; slope, ca and thal dropped; rows with `?`
      in any other column dropped; per centre
      train_test_split(np.arange(n), test_size=1-0.66, train_size=0.66,
      random_state=43, shuffle=True), stratified by the label when every
      class has more than 2 rows. The rows are written as they are in the
      exports (cells untouched, the dropped columns kept: the schema
      ignores them), under a header: OUT_DIR/<centre>-train.csv and
      <centre>-test.csv for the edge agents (data, eval_data), train.csv
      and test.csv with a `site` column for simulate (--dataset,
      --eval-dataset).

  bench_heart.py sklearn OUT_DIR L2
      scikit-learn's centralised logistic regression on the pooled
      training rows, with the federation's preprocessing (numeric
      features standardised by the pooled training rows' mean and
      population sd, cp and restecg one-hot over every level seen in
      training): LogisticRegression() with its defaults (C = 1, the
      intercept not penalised), and the objective edgefl minimises
      (mean log-loss + L2/2 ||(w, b)||^2: the bias as a constant input,
      C = 1 / (L2 n)); and on FLamby's own inputs (raw numbers, cp and
      restecg with their first level dropped), nearly unregularised.
      Prints one JSON object per line: accuracy on each centre's test
      rows, their mean and the pooled test accuracy.

  bench_heart.py table OUT_DIR SEEDS
      The markdown table of bench-heart.sh's results in OUT_DIR (SEEDS:
      the seeds it ran, space-separated).
"""
import csv
import json
import os
import statistics
import sys

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

CENTRES = ["cleveland", "hungarian", "switzerland", "va"]
COLUMNS = ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg",
           "thalach", "exang", "oldpeak", "slope", "ca", "thal", "num"]
DROPPED = {"slope", "ca", "thal"}
NUMERIC = ["age", "sex", "trestbps", "chol", "fbs", "thalach", "exang", "oldpeak"]
CATEGORICAL = ["cp", "restecg"]
TRAIN_FRACTION = 0.66


def label(row):
    return 0 if float(row[COLUMNS.index("num")]) == 0 else 1


def split(data_dir, out):
    os.makedirs(out, exist_ok=True)
    keep = [i for i, c in enumerate(COLUMNS) if c not in DROPPED]
    pooled = {"train": [], "test": []}
    for centre in CENTRES:
        with open(os.path.join(data_dir, "processed.%s.data" % centre)) as f:
            rows = [r for r in csv.reader(f) if r]
        rows = [r for r in rows if all(r[i].strip() != "?" for i in keep)]
        y = np.array([label(r) for r in rows])
        levels = np.unique(y)
        stratify = y if len(levels) > 1 and all((y == v).sum() > 2 for v in levels) else None
        n = len(rows)
        _, test_idx = train_test_split(np.arange(n), test_size=1.0 - TRAIN_FRACTION,
                                       train_size=TRAIN_FRACTION, random_state=43,
                                       shuffle=True, stratify=stratify)
        test = set(int(i) for i in test_idx)
        parts = {"train": [r for i, r in enumerate(rows) if i not in test],
                 "test": [r for i, r in enumerate(rows) if i in test]}
        for part, rs in parts.items():
            with open(os.path.join(out, "%s-%s.csv" % (centre, part)), "w", newline="") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow(COLUMNS)
                w.writerows(rs)
            pooled[part] += [r + [centre] for r in rs]
        print("%s: %d rows (%d train, %d test), stratified %s" % (
            centre, n, len(parts["train"]), len(parts["test"]), stratify is not None))
    for part, rs in pooled.items():
        with open(os.path.join(out, part + ".csv"), "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(COLUMNS + ["site"])
            w.writerows(rs)


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def level(v):
    # As the schema compares a categorical level that reads as a number:
    # Cleveland's 4.0 and the others' 4 are one level.
    try:
        return repr(float(v))
    except ValueError:
        return v.strip()


def features(rows, mean, sd, levels):
    x = np.array([[float(r[c]) for c in NUMERIC] for r in rows])
    x = (x - mean) / sd
    hot = [np.array([[1.0 if level(r[c]) == l else 0.0 for l in levels[c]] for r in rows]) for c in CATEGORICAL]
    return np.hstack([x] + hot)


def reference(out, l2):
    train = read(os.path.join(out, "train.csv"))
    test = read(os.path.join(out, "test.csv"))
    raw = np.array([[float(r[c]) for c in NUMERIC] for r in train])
    mean, sd = raw.mean(axis=0), raw.std(axis=0)
    sd[sd == 0] = 1
    levels = {c: sorted({level(r[c]) for r in train}) for c in CATEGORICAL}
    xtr, ytr = features(train, mean, sd, levels), np.array([label([r[c] for c in COLUMNS]) for r in train])
    xte, yte = features(test, mean, sd, levels), np.array([label([r[c] for c in COLUMNS]) for r in test])
    site = np.array([r["site"] for r in test])
    n = len(ytr)
    fits = {
        "sklearn LogisticRegression() defaults (C=1, intercept unpenalised)":
            (LogisticRegression(max_iter=10000), xtr, xte),
        "sklearn, edgefl's objective (l2 %g on weights and bias)" % l2:
            (LogisticRegression(C=1.0 / (l2 * n), fit_intercept=False, tol=1e-10, max_iter=100000),
             np.hstack([xtr, np.ones((n, 1))]), np.hstack([xte, np.ones((len(yte), 1))])),
    }
    # FLamby's own inputs: the raw numbers (not standardised) and cp and
    # restecg as pandas.get_dummies(drop_first=True) gives them (the first
    # level of each dropped); nearly unregularised.
    def raw_inputs(rows):
        x = np.array([[float(r[c]) for c in NUMERIC] for r in rows])
        hot = [np.array([[1.0 if level(r[c]) == l else 0.0 for l in levels[c][1:]] for r in rows]) for c in CATEGORICAL]
        return np.hstack([x] + hot)
    fits["sklearn on FLamby's inputs (raw numbers, dummies drop_first), C=1e4"] = (
        LogisticRegression(C=1e4, max_iter=100000), raw_inputs(train), raw_inputs(test))
    for name, (m, a, b) in fits.items():
        m.fit(a, ytr)
        pred = m.predict(b)
        per = {c: float((pred[site == c] == yte[site == c]).mean()) for c in CENTRES}
        print(json.dumps({"name": name, "centres": per, "mean": float(np.mean(list(per.values()))),
                          "pooled": float((pred == yte).mean()), "train_rows": n, "test_rows": len(yte)}))


def figures(ev):
    acc = [ev["sites"][c]["accuracy"] for c in CENTRES]
    return sum(acc) / len(acc), ev["federation"]["accuracy"], acc


def pm(v):
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return "%.3f ± %.3f" % (statistics.mean(v), sd)


def rows(res, seeds, model, flamby):
    for run in res[seeds[0]]["runs"]:
        name = run["algo"]
        means, pooled = [], []
        for s in seeds:
            r = next(x for x in res[s]["runs"] if x["algo"] == name)
            ev = [row for row in r["rounds"] if row.get("eval")][-1]["eval"]
            m, p, per = figures(ev)
            means.append(m)
            pooled.append(p)
            if s == seeds[0]:
                per1 = per
        agg = "" if run["aggregator"] in ("", name) else f" (aggregator {run['aggregator']})"
        print(f"| {name}{model}{agg} | {pm(means)} | {pm(pooled)} | {' / '.join(f'{a:.3f}' for a in per1)} | {flamby.get(name, '-')} |")


def table(out, seeds):
    centres = CENTRES
    flamby = {"fedavg": "0.685", "fedprox": "0.685", "fedadam": "0.726"}
    res = {s: json.load(open(f"{out}/seed{s}/results.json")) for s in seeds}
    mlp = {s: json.load(open(f"{out}/mlp-seed{s}/results.json")) for s in seeds}

    first = res[seeds[0]]
    sites = {s["id"]: s for s in first["sites"]}
    print(f"FLamby's split: train/test rows " + ", ".join(f"{c} {sites[c]['train_rows']}/{sites[c]['holdout_rows']}" for c in centres)
          + f"; l2 {first['config']['l2']}, {first['config']['rounds']} rounds, every site every round, seeds {', '.join(seeds)}\n")
    print("| family | mean accuracy over the 4 centres (± sd over seeds) | pooled accuracy (254 test rows) | per centre (C / H / S / V, seed 1) | FLamby (mean over 5 seeds) |")
    print("|---|---|---|---|---|")
    rows(res, seeds, "", flamby)
    m, p, per = figures(first["optimum"]["eval"])
    print(f"| centralised optimum (simulate, L-BFGS, ||grad|| {first['optimum']['grad_norm']:.0e}) | {m:.3f} | {p:.3f} | {' / '.join(f'{a:.3f}' for a in per)} | 0.735 (pooled training) |")
    rows(mlp, seeds, ", MLP", {})
    opt = [figures(mlp[s]["optimum"]["eval"]) for s in seeds]
    print(f"| centralised optimum, MLP (simulate, L-BFGS from each seed's initialisation: a local optimum) | {pm([o[0] for o in opt])} | {pm([o[1] for o in opt])} | {' / '.join(f'{a:.3f}' for a in opt[0][2])} | |")
    for line in open(f"{out}/sklearn.jsonl"):
        r = json.loads(line)
        print(f"| {r['name']} | {r['mean']:.3f} | {r['pooled']:.3f} | {' / '.join('%.3f' % r['centres'][c] for c in centres)} | |")
    hs = json.load(open(f"{out}/hospital-schema/results.json"))
    for name, ev in (("centralised optimum, deploy/hospital/schema.json (a 0 chol or trestbps is missing)", hs["optimum"]["eval"]),
                     ("fedproxsplit-lbfgs, deploy/hospital/schema.json", [row for row in hs["runs"][0]["rounds"] if row.get("eval")][-1]["eval"])):
        m, p, per = figures(ev)
        print(f"| {name} | {m:.3f} | {p:.3f} | {' / '.join(f'{a:.3f}' for a in per)} | |")
    d = json.load(open(f"{out}/daemons/final.bundle.json"))
    s32 = json.load(open(f"{out}/fp32/final.bundle.json"))
    m, p, per = figures(d["evaluation"])
    print(f"| fedproxsplit-lbfgs over MQTT + mTLS (broker-agg run, 4 edge-agent run), round {d['evaluation']['round']} | {m:.3f} | {p:.3f} | {' / '.join(f'{a:.3f}' for a in per)} | |")
    print()
    same_w = d["model"]["weights"] == s32["model"]["weights"]
    same_e = json.dumps(d["evaluation"], sort_keys=True) == json.dumps(s32["evaluation"], sort_keys=True)
    outs = [json.load(open(f"{out}/daemons/{c}.bundle.json"))["digest"] == d["digest"] for c in centres]
    print(f"daemons over MQTT with mTLS against simulate --codec fp32 --downlink fp32: weights {'bit-identical' if same_w else 'DIFFER'}, "
          f"evaluation (every figure, per site and federation) {'identical' if same_e else 'DIFFERS'}; "
          f"every site's model_out has the aggregator's digest: {'yes' if all(outs) else 'NO'}")
    exact = json.load(open(f"{out}/seed{seeds[0]}/final-fedproxsplit-lbfgs.bundle.json"))
    wd, we = d["model"]["weights"], exact["model"]["weights"]
    print(f"against simulate's exact float64 row (fedproxsplit-lbfgs): max |dw| {max(abs(a - b) for a, b in zip(wd, we)):.1e} (max |w| {max(abs(a) for a in wd):.2f}), "
          f"accuracy at every centre {'equal' if all(exact['evaluation']['sites'][c]['accuracy'] == d['evaluation']['sites'][c]['accuracy'] for c in centres) else 'DIFFERS'}")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "split":
        split(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3].split())
    elif len(sys.argv) == 4 and sys.argv[1] == "sklearn":
        reference(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
