#!/usr/bin/env python3
"""Helpers of scripts/bench-dp.sh (issue 13's privacy-utility figures).

  bench_dp.py leaf SITESDIR OUT.json
      The three breast-cancer sites of bench_sites_data.py (site1..3.csv,
      each with its own label spelling and column order) as one LEAF file:
      three users, the 30 features in sklearn's order, y = 1 malignant,
      0 benign. simulate reads it with --partition natural (one client per
      site) and standardises it with --standardize global.

  bench_dp.py table TITLE RESULTS.json...
      A markdown table: one row per algorithm, one column per results.json
      (the non-private run first): final test accuracy in %, and under DP
      the epsilon spent, the largest per-site epsilon without amplification
      by subsampling (what holds against anyone who knows the selection)
      and the noise multiplier z.
"""
import csv
import json
import os
import sys

MALIGNANT = {"M", "0", "malignant"}


def leaf(sites, out):
    users, nums, data = [], [], {}
    features = None
    for s in (1, 2, 3):
        with open(os.path.join(sites, f"site{s}.csv")) as f:
            rows = list(csv.DictReader(f))
        if features is None:
            features = [c for c in rows[0] if c not in ("diagnosis", "record_id")]
            features.sort()
        uid = f"site{s}"
        users.append(uid)
        nums.append(len(rows))
        data[uid] = {"x": [[float(r[c]) for c in features] for r in rows],
                     "y": [1.0 if r["diagnosis"] in MALIGNANT else 0.0 for r in rows]}
    with open(out, "w") as f:
        json.dump({"users": users, "num_samples": nums, "user_data": data}, f)


def table(title, paths):
    cols, algos, cells = [], [], {}
    for p in paths:
        with open(p) as f:
            res = json.load(f)
        col = None
        for run in res["runs"]:
            dp = run.get("dp")
            if col is None:
                col = "non-private" if dp is None else f"epsilon {dp['epsilon_budget']:g}"
                cols.append(col)
            last = [r for r in run["rounds"] if r.get("test_accuracy") is not None][-1]
            acc = 100 * last["test_accuracy"]
            cell = f"{acc:.2f}"
            if dp is not None:
                cell += f" (eps {dp['epsilon']:.3g}, per site {dp.get('epsilon_unamplified', 0):.3g}, z {dp['noise_multiplier']:.3g})"
            if run["algo"] not in algos:
                algos.append(run["algo"])
            cells[(run["algo"], col)] = cell
    print(f"### {title}\n")
    print("| algorithm | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for a in algos:
        print(f"| {a} | " + " | ".join(cells.get((a, c), "-") for c in cols) + " |")
    print()


if __name__ == "__main__":
    if sys.argv[1] == "leaf":
        leaf(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
