# Generates sklearn.json, the expected metrics TestAgainstSklearn checks.
# Run once with Debian's python3-sklearn: /usr/bin/python3 testdata/gen.py
import json
import numpy as np
from sklearn.metrics import (accuracy_score, balanced_accuracy_score, confusion_matrix,
                             log_loss, roc_auc_score, mean_squared_error, r2_score)

rng = np.random.default_rng(11)
cases = []
for n in (7, 50, 333):
    y = rng.integers(0, 2, n)
    p1 = np.clip(0.5 * y + rng.random(n) * 0.6, 0.01, 0.99)
    p1[: n // 5] = np.round(p1[: n // 5], 1)  # ties
    probs = np.stack([1 - p1, p1], axis=1)
    pred = probs.argmax(1)
    cases.append(dict(kind="binary", classes=2, y=y.tolist(), probs=probs.ravel().tolist(),
                      accuracy=accuracy_score(y, pred), balanced_accuracy=balanced_accuracy_score(y, pred),
                      confusion=confusion_matrix(y, pred, labels=[0, 1]).tolist(),
                      loss=log_loss(y, probs, labels=[0, 1]), auc=roc_auc_score(y, p1)))
for n in (30, 200):
    y = rng.integers(0, 3, n)
    raw = rng.random((n, 3)) + np.eye(3)[y] * 0.7
    probs = raw / raw.sum(1, keepdims=True)
    pred = probs.argmax(1)
    cases.append(dict(kind="multiclass", classes=3, y=y.tolist(), probs=probs.ravel().tolist(),
                      accuracy=accuracy_score(y, pred), balanced_accuracy=balanced_accuracy_score(y, pred),
                      confusion=confusion_matrix(y, pred, labels=[0, 1, 2]).tolist(),
                      loss=log_loss(y, probs, labels=[0, 1, 2])))
for n in (5, 120):
    y = rng.normal(3, 2, n)
    pred = y + rng.normal(0, 1, n)
    cases.append(dict(kind="regression", y=y.tolist(), pred=pred.tolist(),
                      rmse=float(np.sqrt(mean_squared_error(y, pred))), r2=r2_score(y, pred),
                      loss=mean_squared_error(y, pred)))
with open("testdata/sklearn.json", "w") as f:
    json.dump(cases, f, indent=1)
