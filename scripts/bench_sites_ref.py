#!/usr/bin/env python3
"""scikit-learn cross-check of the bench-sites reference (docs/results.md, "Model quality at the sites").

Usage: bench_sites_ref.py DATADIR L2 OUT.json

Reads DATADIR/site{1,2,3}.csv by header name through DATADIR/schema.json
(the label's raw values mapped to classes), splits each site's rows into
training and held-out rows with the schema's rule (schema.HoldoutRow: a
splitmix64 hash of holdout_seed and the row index, compared with the
holdout share), standardises with the pooled training mean and population
standard deviation (what edgefl's federated preprocessing computes), fits
scikit-learn's LogisticRegression to edgefl's objective

    (1/n) sum_i logloss_i + (l2/2) (||w||^2 + b^2)

(the bias is penalised too: a constant column, fit_intercept=False,
C = 1/(n l2)), and writes per site and pooled held-out accuracy and ROC
AUC of P(malignant) to OUT.json, with the objective at its solution. It
also writes DATADIR/site{k}-holdout.csv, each site's held-out rows as the
site's own CSV (for edge-agent evaluate on the bundle).
"""
import csv
import json
import sys

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, roc_auc_score

M64 = (1 << 64) - 1


def holdout_row(i, seed, share):
    if share <= 0:
        return False
    z = (seed + i * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return (z >> 11) / float(1 << 53) < share


def main():
    data, l2, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    with open(f"{data}/schema.json") as f:
        schema = json.load(f)
    feats = [c["name"] for c in schema["features"]]
    label = schema["label"]["column"]
    cls = {v: k for k, c in enumerate(schema["label"]["classes"]) for v in c["values"]}
    seed, share = schema.get("holdout_seed", 1), schema.get("holdout", 0.2)
    sites = []
    for s in (1, 2, 3):
        path = f"{data}/site{s}.csv"
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        header = list(rows[0].keys())
        X = np.array([[float(r[c]) for c in feats] for r in rows])
        y = np.array([cls[r[label]] for r in rows], dtype=float)
        hold = np.array([holdout_row(i, seed, share) for i in range(len(rows))])
        with open(f"{data}/site{s}-holdout.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
            w.writeheader()
            w.writerows(r for r, h in zip(rows, hold) if h)
        sites.append((f"site{s}", X, y, hold))
    Xtr = np.vstack([X[~h] for _, X, _, h in sites])
    ytr = np.concatenate([y[~h] for _, _, y, h in sites])
    mean, sd = Xtr.mean(axis=0), Xtr.std(axis=0)
    sd[sd == 0] = 1
    aug = lambda X: np.hstack([(X - mean) / sd, np.ones((len(X), 1))])
    n = len(ytr)
    lr = LogisticRegression(C=1 / (n * l2), fit_intercept=False, tol=1e-12, max_iter=100000)
    lr.fit(aug(Xtr), ytr)
    w = lr.coef_.ravel()
    z = aug(Xtr) @ w
    obj = float(np.mean(np.logaddexp(0, z) - ytr * z) + l2 / 2 * w @ w)
    res = {"train_rows": n, "objective": obj, "sites": {}}
    ys, ps = [], []
    for name, X, y, h in sites:
        p = lr.predict_proba(aug(X[h]))[:, 1]
        res["sites"][name] = {"n": int(h.sum()), "accuracy": accuracy_score(y[h], p > 0.5),
                              "auc": roc_auc_score(y[h], p)}
        ys.append(y[h])
        ps.append(p)
    y, p = np.concatenate(ys), np.concatenate(ps)
    # The federation's figures as evaluate.Combine computes them: accuracy
    # of the pooled held-out rows, AUC the sample-weighted mean of the sites'.
    res["federation"] = {"n": len(y), "accuracy": accuracy_score(y, p > 0.5),
                         "auc": sum(v["auc"] * v["n"] for v in res["sites"].values()) / len(y),
                         "pooled_auc": roc_auc_score(y, p)}
    with open(out, "w") as f:
        json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
