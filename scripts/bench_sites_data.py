#!/usr/bin/env python3
"""Three hospital sites from scikit-learn's breast-cancer data (docs/results.md, "Model quality at the sites").

Usage: bench_sites_data.py OUTDIR

Reads Debian's python3-sklearn copy of the data
(/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv: a
metadata line "569,30,malignant,benign", then 30 features and the target,
0 = malignant as in load_breast_cancer) and writes, deterministically:

  site1.csv     160 rows, 75 % malignant, label M/B
  site2.csv     233 rows, 13 % malignant, label 0/1 (sklearn's coding), an
                extra column record_id the schema does not use
  site3.csv     176 rows, 35 % malignant, label malignant/benign, the
                columns in another order (reversed)
  combined.csv  every row once with a `site` column (rows in the source's
                order, so each site's rows keep their order)
  schema.json   the federation schema: 30 numeric features by sklearn's
                names, binary label "diagnosis" (benign, malignant) with
                the three sites' raw values
  schema-dp.json  the same schema with its preprocessing declared (what
                --dp needs: no statistics phase): each feature centred at
                the midpoint of the published range in PUBLISHED_RANGE and
                scaled by its half-width, so the published range maps to
                [-1, 1] (deploy/schema-dp.example.json is this file)

Every row is used once. The deal: malignant and benign rows each sorted by
SHA-256 of "edgefl-bench-sites:<row>", then cut at the site counts.
"""
import csv
import hashlib
import json
import os
import sys

SRC = "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv"

# sklearn.datasets.load_breast_cancer().feature_names
FEATURES = [
    "mean radius", "mean texture", "mean perimeter", "mean area", "mean smoothness",
    "mean compactness", "mean concavity", "mean concave points", "mean symmetry",
    "mean fractal dimension", "radius error", "texture error", "perimeter error",
    "area error", "smoothness error", "compactness error", "concavity error",
    "concave points error", "symmetry error", "fractal dimension error", "worst radius",
    "worst texture", "worst perimeter", "worst area", "worst smoothness",
    "worst compactness", "worst concavity", "worst concave points", "worst symmetry",
    "worst fractal dimension",
]

# The published minimum and maximum of each feature: the "Summary
# Statistics" table of the dataset's description (sklearn's
# load_breast_cancer().DESCR, from UCI's wdbc.names), the stand-in for a
# clinical reference range a federation would declare. It was computed on
# all 569 rows, so it is public here but not independent of the data.
PUBLISHED_RANGE = [
    (6.981, 28.11), (9.71, 39.28), (43.79, 188.5), (143.5, 2501.0), (0.053, 0.163),
    (0.019, 0.345), (0.0, 0.427), (0.0, 0.201), (0.106, 0.304), (0.05, 0.097),
    (0.112, 2.873), (0.36, 4.885), (0.757, 21.98), (6.802, 542.2), (0.002, 0.031),
    (0.002, 0.135), (0.0, 0.396), (0.0, 0.053), (0.008, 0.079), (0.001, 0.03),
    (7.93, 36.04), (12.02, 49.54), (50.41, 251.2), (185.2, 4254.0), (0.071, 0.223),
    (0.027, 1.058), (0.0, 1.252), (0.0, 0.291), (0.156, 0.664), (0.055, 0.208),
]

# (malignant, benign) rows per site: 120/160 = 75 %, 30/233 = 12.9 %, 62/176 = 35.2 %.
COUNTS = [(120, 40), (30, 203), (62, 114)]
# Raw label values per site: (malignant, benign).
LABELS = [("M", "B"), ("0", "1"), ("malignant", "benign")]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with open(SRC) as f:
        rows = list(csv.reader(f))
    meta, data = rows[0], rows[1:]
    n, d = int(meta[0]), int(meta[1])
    assert meta[2:] == ["malignant", "benign"], meta
    assert len(data) == n == 569 and all(len(r) == d + 1 == 31 for r in data), "unexpected file format"
    key = lambda i: hashlib.sha256(f"edgefl-bench-sites:{i}".encode()).hexdigest()
    mal = sorted((i for i, r in enumerate(data) if r[d] == "0"), key=key)
    ben = sorted((i for i, r in enumerate(data) if r[d] == "1"), key=key)
    assert len(mal) == sum(c[0] for c in COUNTS) and len(ben) == sum(c[1] for c in COUNTS)
    site_of = {}
    mi = bi = 0
    for s, (m, b) in enumerate(COUNTS):
        for i in mal[mi:mi + m] + ben[bi:bi + b]:
            site_of[i] = s
        mi, bi = mi + m, bi + b
    assert len(site_of) == n

    headers = [
        FEATURES + ["diagnosis"],
        ["record_id"] + FEATURES + ["diagnosis"],
        ["diagnosis"] + FEATURES[::-1],
    ]
    writers, files = [], []
    for s in range(3):
        f = open(os.path.join(out, f"site{s + 1}.csv"), "w", newline="")
        w = csv.writer(f, lineterminator="\n")
        w.writerow(headers[s])
        files.append(f)
        writers.append(w)
    cf = open(os.path.join(out, "combined.csv"), "w", newline="")
    cw = csv.writer(cf, lineterminator="\n")
    cw.writerow(["site"] + FEATURES + ["diagnosis"])
    for i, r in enumerate(data):
        s = site_of[i]
        cell = dict(zip(FEATURES, r[:d]))
        cell["diagnosis"] = LABELS[s][0] if r[d] == "0" else LABELS[s][1]
        cell["record_id"] = f"R{i:04d}"
        writers[s].writerow([cell[c] for c in headers[s]])
        cw.writerow([f"site{s + 1}"] + [cell[c] for c in FEATURES + ["diagnosis"]])
    for f in files + [cf]:
        f.close()

    schema = {
        "task": "binary",
        "features": [{"name": c, "type": "numeric"} for c in FEATURES],
        "label": {"column": "diagnosis", "classes": [
            {"name": "benign", "values": ["B", "benign", "1"]},
            {"name": "malignant", "values": ["M", "malignant", "0"]},
        ]},
        "min_site_samples": 10,
        "standardize": "federation",
        "holdout": 0.2,
        "holdout_seed": 1,
    }
    with open(os.path.join(out, "schema.json"), "w") as f:
        json.dump(schema, f, indent=2)
        f.write("\n")
    declared = dict(schema, features=[
        {"name": c, "type": "numeric", "center": round((lo + hi) / 2, 6), "scale": round((hi - lo) / 2, 6)}
        for c, (lo, hi) in zip(FEATURES, PUBLISHED_RANGE)])
    with open(os.path.join(out, "schema-dp.json"), "w") as f:
        json.dump(declared, f, indent=2)
        f.write("\n")
    for s, (m, b) in enumerate(COUNTS):
        print(f"site{s + 1}: {m + b} rows, {m} malignant ({100 * m / (m + b):.1f} %)")


if __name__ == "__main__":
    main()
