"""`mica plot out_dir`: the run's loss curves as a PNG (needs matplotlib)."""
import json
import os

from ..errors import MicaError


def read_metrics(out_dir):
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise MicaError(f"{path} does not exist: train into {out_dir} first")
    iters, evals = {}, {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                m = json.loads(line)
            except ValueError:
                raise MicaError(f"{path} line {n} is not JSON") from None
            if m.get("loss") is not None and "iter" in m:
                iters[m["iter"]] = m["loss"]
            if m.get("val_loss") is not None and "step" in m:
                evals[m["step"]] = (m["train_loss"], m["val_loss"])
    return iters, evals


def plot(out_dir, out=None):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MicaError("mica plot needs matplotlib: pip install matplotlib") from None
    iters, evals = read_metrics(out_dir)
    if not iters and not evals:
        raise MicaError(f"{out_dir}/metrics.jsonl holds no losses yet")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if iters:
        xs = sorted(iters)
        ax.plot(xs, [iters[x] for x in xs], lw=0.6, alpha=0.5, label="train (each iteration)")
    if evals:
        xs = sorted(evals)
        ax.plot(xs, [evals[x][0] for x in xs], "o-", label="train (estimate)")
        ax.plot(xs, [evals[x][1] for x in xs], "o-", label="val (estimate)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.set_title(os.path.basename(os.path.abspath(out_dir)))
    ax.grid(alpha=0.3)
    ax.legend()
    out = out or os.path.join(out_dir, "loss.png")
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out
