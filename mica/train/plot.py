"""`mica plot out_dir`: the run's loss curves as a PNG (needs matplotlib)."""
import json
import os

from ..errors import MicaError


def read_metrics(out_dir):
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise MicaError(f"{path} does not exist: give the out_dir of a run" if not os.path.isdir(out_dir) or
                        not os.listdir(out_dir) else f"{path} does not exist: train into {out_dir} first")
    if not os.path.isfile(path):
        raise MicaError(f"{path} is not a file: it should be the metrics a run in {out_dir} wrote")
    iters, evals = {}, {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        for n, line in enumerate(lines, 1):
            try:
                m = json.loads(line)
            except (ValueError, RecursionError):
                if not line.endswith("\n"):  # the last line of a run killed mid-write: the rest stands
                    print(f"note: {path}:{n} was cut off mid-write; plotting the lines before it")
                    break
                raise MicaError(f"{path}:{n} is not JSON; mend or delete that line (each line is one JSON object a "
                                "run wrote)") from None
            if not isinstance(m, dict):
                raise MicaError(f"{path}:{n} is not a JSON object")
            if _numbers(m, "iter", "loss"):
                iters[m["iter"]] = m["loss"]
            if _numbers(m, "step", "val_loss"):  # (the speedrun's validations carry no train estimate)
                evals[m["step"]] = (m["train_loss"] if _numbers(m, "train_loss") else None, m["val_loss"])
    except OSError as e:
        raise MicaError(f"cannot read {path} ({e.strerror})") from None
    return iters, evals


def _numbers(m, *keys):
    return all(isinstance(m.get(k), (int, float)) and not isinstance(m.get(k), bool) for k in keys)


def plot(out_dir, out=None):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MicaError("mica plot needs matplotlib: pip install matplotlib") from None
    out = out or os.path.join(out_dir, "loss.png")
    if os.path.isdir(out):
        raise MicaError(f"--out {out} is a folder; give the path of the image to write, e.g. "
                        f"{os.path.join(out, 'loss.png')}")
    if not os.path.splitext(out)[1]:
        out += ".png"  # (matplotlib's own choice for a name without an extension, said as written)
    iters, evals = read_metrics(out_dir)
    if not iters and not evals:
        raise MicaError(f"{out_dir}/metrics.jsonl holds no losses yet")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if iters:
        xs = sorted(iters)
        ax.plot(xs, [iters[x] for x in xs], lw=0.6, alpha=0.5, label="train (each iteration)")
    if evals:
        xs = sorted(evals)
        trained = [x for x in xs if evals[x][0] is not None]
        if trained:
            ax.plot(trained, [evals[x][0] for x in trained], "o-", label="train (estimate)")
        # (nanoGPT's validations are estimates over eval_iters batches; the speedrun's cover all val_tokens)
        ax.plot(xs, [evals[x][1] for x in xs], "o-", label="val (estimate)" if trained else "val")
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.set_title(os.path.basename(os.path.abspath(out_dir)))
    ax.grid(alpha=0.3)
    ax.legend()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)  # (as export makes --to's folders)
        fig.savefig(out, dpi=120, bbox_inches="tight")
    except OSError as e:
        raise MicaError(f"cannot write {out} ({e.strerror}); pass --out PATH somewhere writable") from None
    except ValueError as e:  # matplotlib: a file name whose extension is no image format
        raise MicaError(f"cannot write {out}: {str(e).splitlines()[0]}; name it .png") from None
    finally:
        plt.close(fig)
    return out
