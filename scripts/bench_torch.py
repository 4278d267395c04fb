#!/usr/bin/python3
"""The PyTorch side of scripts/bench-torch.sh.

gen:   write the benchmark's data set, a CSV with a header (label y, then
       features f0..f{D-1}): Gaussian features, labels from a random linear
       teacher (argmax of x W + b), as `edge-agent bench` draws its synthetic
       data. edge-agent reads the same file through its --config.
train: the local FedProx solve that `edge-agent bench` times, as a
       well-written PyTorch loop: float32 tensors, nn.Linear layers,
       torch.optim.SGD with weight_decay (the L2 term, on every parameter as
       in edgefl), the proximal term mu (w - anchor) added to the gradient in
       place, one shuffle per epoch and mini-batches as views of the shuffled
       tensor (no per-batch gather). Like edge-agent bench it evaluates the
       full loss and gradient at the anchor first and at the returned point
       last, and reports training samples per second over the epochs only
       (wall clock), and the process CPU time of the whole solve, those two
       passes included (solve_cpu_seconds, as edge-agent bench's). Prints
       one JSON object.
"""
import argparse
import json
import resource
import sys
import time

import numpy as np


def gen(a):
    rng = np.random.default_rng(a.seed)
    teacher_w = rng.standard_normal((a.features, a.classes))
    teacher_b = rng.standard_normal(a.classes)
    x = rng.standard_normal((a.samples, a.features))
    y = np.argmax(x @ teacher_w + teacher_b, axis=1)
    header = "y," + ",".join(f"f{j}" for j in range(a.features))
    data = np.column_stack([y.astype(np.float64), x])
    fmt = ["%d"] + ["%.6g"] * a.features
    np.savetxt(a.out, data, fmt=fmt, delimiter=",", header=header, comments="")


def train(a):
    t_start = time.perf_counter()
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    raw = np.loadtxt(a.csv, delimiter=",", skiprows=1, dtype=np.float32)
    y = torch.from_numpy(raw[:, 0].astype(np.int64))
    x = torch.from_numpy(np.ascontiguousarray(raw[:, 1:]))
    n, d = x.shape
    classes = int(y.max()) + 1
    if a.model == "logreg":
        net = torch.nn.Linear(d, classes)
        torch.nn.init.zeros_(net.weight)
        torch.nn.init.zeros_(net.bias)
    else:
        net = torch.nn.Sequential(torch.nn.Linear(d, a.hidden), torch.nn.ReLU(), torch.nn.Linear(a.hidden, classes))
    params = list(net.parameters())
    # The anchor (the global model), and mu * anchor precomputed: the prox
    # gradient mu (w - a) is added as g += mu w; g -= mu a, both in place.
    mu_anchor = [p.detach().clone().mul_(a.mu) for p in params]
    opt = torch.optim.SGD(params, lr=a.lr, weight_decay=a.l2)

    def full_pass():
        net.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        return loss.item()

    cpu0 = time.process_time()
    anchor_loss = full_pass()
    gen_t = torch.Generator().manual_seed(a.seed)
    t0 = time.perf_counter()
    for _ in range(a.epochs):
        perm = torch.randperm(n, generator=gen_t)
        xs, ys = x[perm], y[perm]
        for lo in range(0, n, a.batch):
            xb, yb = xs[lo:lo + a.batch], ys[lo:lo + a.batch]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(xb), yb).backward()
            with torch.no_grad():
                for p, ma in zip(params, mu_anchor):
                    p.grad.add_(p, alpha=a.mu).sub_(ma)
            opt.step()
    train_s = time.perf_counter() - t0
    loss = full_pass()
    solve_cpu = time.process_time() - cpu0
    with torch.no_grad():
        acc = (net(x).argmax(1) == y).float().mean().item()
    print(json.dumps({
        "torch": torch.__version__, "threads": torch.get_num_threads(), "dtype": "float32",
        "model": a.model, "samples": n, "features": d, "classes": classes, "epochs": a.epochs, "batch": a.batch,
        "anchor_loss": anchor_loss, "loss": loss, "train_accuracy": acc,
        "train_seconds": train_s, "samples_per_second": n * a.epochs / train_s,
        "solve_cpu_seconds": solve_cpu,
        "process_seconds": time.perf_counter() - t_start,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--samples", type=int, default=2000)
    g.add_argument("--features", type=int, default=784)
    g.add_argument("--classes", type=int, default=10)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--out", required=True)
    t = sub.add_parser("train")
    t.add_argument("--csv", required=True)
    t.add_argument("--model", choices=["logreg", "mlp"], default="logreg")
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--epochs", type=int, default=20)
    t.add_argument("--batch", type=int, default=10)
    t.add_argument("--lr", type=float, default=0.01)
    t.add_argument("--mu", type=float, default=1.0)
    t.add_argument("--l2", type=float, default=1e-4)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    gen(a) if a.cmd == "gen" else train(a)


if __name__ == "__main__":
    sys.exit(main())
