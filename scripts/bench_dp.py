#!/usr/bin/env python3
"""Helpers of scripts/bench-dp.sh (the privacy-utility figures of docs/privacy.md).

  bench_dp.py leaf SITESDIR OUT.json
      The three breast-cancer sites of bench_sites_data.py (site1..3.csv,
      each with its own label spelling and column order) as one LEAF file:
      three users, the 30 features in sklearn's order, y = 1 malignant,
      0 benign. simulate reads it with --partition natural (one client per
      site) and standardises it with --standardize global.

  bench_dp.py sites TITLE CENTRAL.json FEDERATED.json DECLARED.json EPS8.json... -- EPS3.json... -- EPS1.json...
      The schema pipeline's table (bench-dp.sh's `sites` part): one row
      per algorithm, held-out accuracy / ROC AUC in % of the federation
      (the final round's evaluation on every site's held-out rows): the
      centralised reference (simulate's optimum with the declared
      preprocessing, from DECLARED.json), the non-private run with the
      statistics phase's federated preprocessing (FEDERATED.json; its
      optimum in CENTRAL.json, the same file), the non-private run with the
      declared preprocessing, and each epsilon as mean +- sd over its
      files (one per noise seed), with the epsilon spent and z.

  bench_dp.py spread TITLE MODE NONPRIVATE.json RESULTS.json... [-- MODE NONPRIVATE.json RESULTS.json...]
      Rows of (algorithm, MODE), columns non-private and each epsilon
      budget found in the RESULTS files (one file per noise seed): final
      test accuracy in %, mean +- sd over the seeds, with the epsilon spent
      and z (bench-dp.sh's `dist` part: central against distributed DP).

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
import statistics
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


def _final_eval(run):
    ev = [r["eval"] for r in run["rounds"] if r.get("eval")][-1]["federation"]
    return 100 * ev["accuracy"], 100 * ev["auc"]


def _load(p):
    with open(p) as f:
        return json.load(f)


def sites(title, args):
    groups, cur = [], []
    for a in args:
        if a == "--":
            groups.append(cur)
            cur = []
        else:
            cur.append(a)
    groups.append(cur)
    (central, federated, declared), eps_groups = groups[0][:3], [groups[0][3:]] + groups[1:]
    fed, dec = _load(federated), _load(declared)
    algos = [r["algo"] for r in dec["runs"]]
    ref_fed = fed["optimum"]["eval"]["federation"]
    ref_dec = dec["optimum"]["eval"]["federation"]
    cols = ["centralised reference, declared preprocessing", "non-private, federated preprocessing",
            "non-private, declared preprocessing"]
    rows = {a: [f"{100 * ref_dec['accuracy']:.1f} / {100 * ref_dec['auc']:.1f}"] for a in algos}
    for a in algos:
        acc, auc = _final_eval(next(r for r in fed["runs"] if r["algo"] == a))
        rows[a].append(f"{acc:.1f} / {auc:.1f}")
        acc, auc = _final_eval(next(r for r in dec["runs"] if r["algo"] == a))
        rows[a].append(f"{acc:.1f} / {auc:.1f}")
    for files in eps_groups:
        res = [_load(p) for p in files]
        budget = res[0]["runs"][0]["dp"]["epsilon_budget"]
        cols.append(f"epsilon {budget:g}")
        for a in algos:
            accs, aucs, eps, z = [], [], 0, 0
            for r in res:
                run = next(x for x in r["runs"] if x["algo"] == a)
                acc, auc = _final_eval(run)
                accs.append(acc)
                aucs.append(auc)
                eps, z = run["dp"]["epsilon"], run["dp"]["noise_multiplier"]
            rows[a].append(f"{statistics.mean(accs):.1f} ± {statistics.stdev(accs):.1f} / "
                           f"{statistics.mean(aucs):.1f} ± {statistics.stdev(aucs):.1f} (eps {eps:.3g}, z {z:.3g})")
    print(f"### {title}\n")
    print(f"(centralised reference with the federated preprocessing: {100 * ref_fed['accuracy']:.1f} / {100 * ref_fed['auc']:.1f})\n")
    print("| algorithm | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for a in algos:
        print(f"| {a} | " + " | ".join(rows[a]) + " |")
    print()


def _final_acc(run):
    return 100 * [r for r in run["rounds"] if r.get("test_accuracy") is not None][-1]["test_accuracy"]


def spread(title, args):
    groups, cur = [], []
    for a in args + ["--"]:
        if a == "--":
            groups.append(cur)
            cur = []
        else:
            cur.append(a)
    budgets, rows = [], []
    for mode, plain, *files in groups:
        res = [_load(p) for p in files]
        for b in (r["runs"][0]["dp"]["epsilon_budget"] for r in res):
            if b not in budgets:
                budgets.append(b)
        for run in _load(plain)["runs"]:
            a = run["algo"]
            cells = [f"{_final_acc(run):.1f}"]
            for b in budgets:
                runs = [x for r in res for x in r["runs"] if x["algo"] == a and x["dp"]["epsilon_budget"] == b]
                accs = [_final_acc(x) for x in runs]
                cells.append(f"{statistics.mean(accs):.1f} ± {statistics.stdev(accs):.1f} "
                             f"(eps {runs[0]['dp']['epsilon']:.3g}, z {runs[0]['dp']['noise_multiplier']:.3g}, {len(accs)} seeds)")
            rows.append((f"{a}, {mode}", cells))
    cols = ["non-private"] + [f"epsilon {b:g}" for b in budgets]
    print(f"### {title}\n")
    print("| algorithm, mode | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for label, cells in rows:
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()


if __name__ == "__main__":
    if sys.argv[1] == "leaf":
        leaf(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "sites":
        sites(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "spread":
        spread(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
