"""`mica bench`: the technical report's measurement protocol, on the CPU.

Each configuration (Mica's trainer at an opt level; PyTorch eager or a torch.compile mode) runs as
its own process, training nanoGPT's loop on the same data (or, for `--model tutorial`, the
tutorial's step on one seeded batch: mica.bench.tutorial_runner). One outside clock (this process) stamps
every line each program prints as it arrives; both print a line every ten steps (`every`; one for
the 10.7M model's short window) right after a read
that waits for the work. A run's step time is the stamp of its line at the end of the warm-up to
the stamp at the end of the window, over the window's steps. Every configuration runs once,
discarded, then once per round, the order rotating each round. Mica's own clock (its per-step
times) must agree with the outside clock within 1% or the run is void.

Also recorded per run: peak resident memory (VmHWM, read while it runs), time to the first step,
the shared libraries it opened (/proc/PID/maps) and their size on disk.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

from ..errors import MicaError

LINE = re.compile(r"^iter (\d+): loss ([-\d.naif]+)(?:, time ([\d.]+)ms)?")
PLAN = re.compile(r"^memory plan \(exact, before the first step\): the trainer holds ([\d,]+) bytes")

MODELS = {
    # nanoGPT's README CPU line on shakespeare_char
    "cpu": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, dropout=0.0, bias=False,
                learning_rate=1e-3, max_iters=2000, lr_decay_iters=2000, min_lr=1e-4, beta2=0.99, warmup_iters=100,
                gradient_accumulation_steps=1, weight_decay=0.1, grad_clip=1.0),
    # config/train_shakespeare_char.py (dropout off so both sides do the same work)
    "shakespeare_char": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, dropout=0.0,
                             bias=False, learning_rate=1e-3, max_iters=5000, lr_decay_iters=5000, min_lr=1e-4,
                             beta2=0.99, warmup_iters=100, gradient_accumulation_steps=1, weight_decay=0.1,
                             grad_clip=1.0),
}
# TR-2's other two models: nanoGPT's config/train_gpt2.py (GPT-2 small, 123.59M) and its gpt2-medium
# shape (353.55M), block 1024, on a GPT-2 vocabulary; one sequence a step (nanoGPT's 12 x 40
# accumulation would make a step minutes long on two cores)
_GPT2 = dict(block_size=1024, batch_size=1, gradient_accumulation_steps=1, dropout=0.0, bias=False,
             learning_rate=6e-4, max_iters=600000, lr_decay_iters=600000, min_lr=6e-5, beta2=0.95, warmup_iters=2000,
             weight_decay=0.1, grad_clip=1.0)
MODELS["gpt2"] = dict(n_layer=12, n_head=12, n_embd=768, **_GPT2)
MODELS["gpt2-medium"] = dict(n_layer=24, n_head=16, n_embd=1024, **_GPT2)
GPT2_MODELS = ("gpt2", "gpt2-medium")
GPT2_VOCAB = 50257

TORCH_MODES = ("eager", "default", "reduce-overhead", "max-autotune")
# what `mica bench --model M` measures when not told: where its data is, and a window that suits
# its step (the GPT-2 models' steps take seconds: a short window, a line every step)
DEFAULTS = {"cpu": dict(data_dir="data/shakespeare_char", rounds=5, warmup=20, window=100, every=10,
                        modes=TORCH_MODES)}
DEFAULTS["shakespeare_char"] = DEFAULTS["tutorial"] = DEFAULTS["cpu"]
DEFAULTS["gpt2"] = DEFAULTS["gpt2-medium"] = dict(data_dir="data/openwebtext", rounds=2, warmup=2, window=4,
                                                  every=1, modes=TORCH_MODES)


def _sample_proc(pid, out, stop):
    """Poll /proc while the process lives: peak RSS (kB) and the shared objects it maps. `mica
    train` execs the native trainer: what counts is the final program, so the readings restart
    when the process image changes. Also how many tasks the machine had runnable (its own threads
    included), averaged over the run: on a shared machine, how contended the run was."""
    libs, peak, exe, runnable = set(), 0, None, []
    while not stop.is_set():
        try:
            with open("/proc/loadavg") as f:
                runnable.append(int(f.read().split()[3].split("/")[0]))
            now_exe = os.readlink(f"/proc/{pid}/exe")
            if now_exe != exe:
                exe, libs, peak = now_exe, set(), 0
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.split()[-1] if len(line.split()) >= 6 else ""
                    if ".so" in path:
                        libs.add(path)
        except (OSError, ValueError):
            break
        stop.wait(0.05)
    out["peak_rss_kb"], out["libraries"], out["program"] = peak, sorted(libs), exe
    if runnable:
        out["runnable"] = sum(runnable) / len(runnable)


def run_once(cmd, env, warmup, window):
    """Run one program; returns the stamps and what it needed. Raises on failure (recorded)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, bufsize=1)
    info, stop = {}, threading.Event()
    sampler = threading.Thread(target=_sample_proc, args=(proc.pid, info, stop), daemon=True)
    sampler.start()
    stamps, losses, own, plan = {}, {}, {}, {}
    for line in proc.stdout:
        t = time.perf_counter()
        m = PLAN.match(line)
        if m:  # Mica's trainer: what its memory plan says it will hold
            plan["plan_bytes"] = int(m.group(1).replace(",", ""))
        m = LINE.match(line)
        if m:
            it = int(m.group(1))
            stamps[it] = t
            losses[it] = float(m.group(2))
            if m.group(3):
                own[it] = float(m.group(3))
    err = proc.stderr.read()
    proc.wait()
    stop.set()
    sampler.join()
    if proc.returncode != 0 or warmup not in stamps or warmup + window not in stamps:
        raise RuntimeError(err.strip().splitlines()[-1] if err.strip() else f"exit status {proc.returncode}")
    first = min(stamps)
    return {"step_ms": (stamps[warmup + window] - stamps[warmup]) / window * 1000,
            "first_step_s": stamps[first] - start, "losses": losses, "line_ms": own, **plan, **info}


def _footprint(paths):
    total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total


def mica_train_cmd(settings):
    """`mica train` with nanoGPT-style --key=value flags for `settings` (strings quoted, as a
    config file would have them)."""
    return [sys.executable, "-m", "mica.cli", "train", *[f"--{k}={v!r}" if isinstance(v, str) else f"--{k}={v}"
                                                        for k, v in settings.items()]]


def torch_runner_cmd(cfg, data_dir, mode, iters, every, eval_every, eval_batches, threads=None):
    """The PyTorch side's process (mica.bench.torch_runner) for nanoGPT settings `cfg`."""
    return [sys.executable, "-m", "mica.bench.torch_runner", "--data", data_dir, "--mode", mode, "--iters", str(iters),
            "--every", str(every), "--eval_every", str(eval_every), "--eval_batches", str(eval_batches),
            "--config", json.dumps(cfg)] + (["--threads", str(threads)] if threads else [])


def _mica_cmd(model, data_dir, out_dir, iters, threads, opt_level, every=10):
    return mica_train_cmd({**MODELS[model], "max_iters": iters, "eval_interval": iters + 100, "eval_iters": 1,
                           "log_interval": every, "always_save_checkpoint": False, "out_dir": out_dir,
                           "device": "cpu", "data_dir": data_dir, "threads": threads, "opt_level": opt_level,
                           "time_every_iter": True})


def _tutorial_cmd(side, arg, iters, threads, every=10):
    how = ["--opt_level", str(arg)] if side == "mica" else ["--mode", arg]
    return [sys.executable, "-m", "mica.bench.tutorial_runner", "--side", side, *how, "--iters", str(iters),
            "--every", str(every), "--threads", str(threads)]


def _lines_own_ms(r, warmup, window, every=10):
    """A runner's own clock over the window, from the times its lines print (since the line before)."""
    steps = range(warmup + every, warmup + window + 1, every)
    if window % every or not all(i in r["line_ms"] for i in steps):
        return None
    return sum(r["line_ms"][i] for i in steps) / window


def _torch_cmd(model, data_dir, mode, iters, threads, every=10):
    # nanoGPT (and Mica's trainer) evaluate once before the first step; so does this side, on as many
    # batches as Mica's run (eval_iters 1), so the time to the first step counts the same work
    return torch_runner_cmd({**MODELS[model], "seed": 1337}, data_dir, mode, iters, every, iters + 100, 1, threads)


def _mica_own_ms(out_dir, warmup, window):
    """Mica's own clock over the window, from its per-iteration times in metrics.jsonl."""
    times = {}
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "iter" in m and "time_ms" in m:
                times[m["iter"]] = m["time_ms"]
    steps = range(warmup + 1, warmup + window + 1)
    if not all(i in times for i in steps):
        return None
    return sum(times[i] for i in steps) / window


def check_data(model, data_dir):
    """The GPT-2 models need a GPT-2 vocabulary (a character-level folder would train another model)."""
    if model not in GPT2_MODELS:
        return
    from ..train import run as train_run

    if not os.path.isdir(data_dir):
        raise MicaError(f"--model {model} trains on a folder of GPT-2 tokens; {data_dir} does not exist (make one "
                        f"with mica prepare text --input FILE --tokenizer gpt2 --out {data_dir}, or give --data_dir)")
    vocab, _ = train_run.vocab_size(data_dir, log=lambda *a: None)
    if vocab < GPT2_VOCAB:
        raise MicaError(f"--model {model} needs GPT-2's vocabulary ({GPT2_VOCAB:,} tokens or more), but {data_dir} has "
                        f"{vocab:,}; prepare one with mica prepare text --tokenizer gpt2 and pass it as --data_dir")


def bench(model="cpu", data_dir=None, rounds=None, warmup=None, window=None, threads=None, opt_levels=(2,),
          torch_modes=None, out="bench", log=print, every=None):
    """Run the protocol; settings left as None take the model's DEFAULTS."""
    if model not in DEFAULTS:
        raise MicaError(f"unknown model {model!r}: choose from {', '.join(DEFAULTS)}")
    d = DEFAULTS[model]
    data_dir = d["data_dir"] if data_dir is None else data_dir
    rounds = d["rounds"] if rounds is None else rounds
    warmup = d["warmup"] if warmup is None else warmup
    window = d["window"] if window is None else window
    every = d["every"] if every is None else every
    torch_modes = d["modes"] if torch_modes is None else torch_modes
    check_data(model, data_dir)
    threads = threads or os.cpu_count() or 1
    if every < 1 or warmup % every or window % every:
        raise MicaError(f"the warm-up ({warmup}) and the window ({window}) must be multiples of every ({every}): "
                         "both sides print a line every that many steps")
    iters = warmup + window
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    configs = {f"mica O{o}": ("mica", o) for o in opt_levels}
    configs.update({f"pytorch {m}": ("torch", m) for m in torch_modes})
    runs = {name: [] for name in configs}
    failures, extras = {}, {}

    def once(name):
        kind, arg = configs[name]
        if model == "tutorial":
            r = run_once(_tutorial_cmd(kind, arg, iters, threads, every), env, warmup, window)
            if kind == "mica":
                r["own_step_ms"] = own = _lines_own_ms(r, warmup, window, every)
                r["void"] = own is None or abs(own - r["step_ms"]) / r["step_ms"] > 0.01
        elif kind == "mica":
            run_dir = os.path.join(out, name.replace(" ", "_"))
            if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
                os.unlink(os.path.join(run_dir, "metrics.jsonl"))
            r = run_once(_mica_cmd(model, data_dir, run_dir, iters, threads, arg, every), env, warmup, window)
            own = _mica_own_ms(run_dir, warmup, window)
            r["own_step_ms"] = own
            r["void"] = own is None or abs(own - r["step_ms"]) / r["step_ms"] > 0.01
        else:
            r = run_once(_torch_cmd(model, data_dir, arg, iters, threads, every), env, warmup, window)
        return r

    for name in list(configs):  # one discarded run each: builds, caches, compiles
        try:
            r = once(name)
            extras[name] = {"first_step_s_cold": r["first_step_s"]}
            log(f"{name}: discarded first run {r['step_ms']:.1f} ms/step")
        except Exception as e:  # a mode that fails is recorded, not dropped
            failures[name] = str(e)
            log(f"{name}: failed ({e})")
    live = [n for n in configs if n not in failures]
    for k in range(rounds):
        order = live[k % len(live):] + live[:k % len(live)]
        for name in order:
            try:
                runs[name].append(once(name))
            except Exception as e:
                failures.setdefault(name, str(e))
        log(f"round {k + 1}: " + ", ".join(f"{n} {runs[n][-1]['step_ms']:.1f}" for n in order if runs[n]))
    result = summarize(model, threads, rounds, warmup, window, runs, failures, extras)
    with open(os.path.join(out, f"bench-{model}.json"), "w") as f:
        json.dump(result, f, indent=1)
    charts(result, runs, out)
    return result


def summarize(model, threads, rounds, warmup, window, runs, failures, extras):
    res = {"model": model, "threads": threads, "rounds": rounds, "warmup": warmup, "window": window,
           "date": time.strftime("%Y-%m-%d"), "configs": {}, "failures": failures}
    for name, rs in runs.items():
        if not rs:
            continue
        times = [r["step_ms"] for r in rs]
        c = {"step_ms": times, "median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
             "peak_rss_mb": max(r.get("peak_rss_kb", 0) for r in rs) / 1024,
             "first_step_s": statistics.median(r["first_step_s"] for r in rs),
             "program": rs[0].get("program"), "libraries": rs[0].get("libraries", []),
             "footprint_mb": _footprint(rs[0].get("libraries", []) + [rs[0].get("program") or ""]) / 2 ** 20,
             **extras.get(name, {})}
        if all("runnable" in r for r in rs):
            c["runnable"] = [r["runnable"] for r in rs]
        if "plan_bytes" in rs[0]:  # Mica's compile-time plan of what its trainer holds (MB as RSS is: MiB)
            c["plan_mb"] = rs[0]["plan_bytes"] / 2 ** 20
        if "own_step_ms" in rs[0]:
            c["own_step_ms"] = [r["own_step_ms"] for r in rs]
            c["void_runs"] = sum(1 for r in rs if r["void"])
        res["configs"][name] = c
    torch = {n: c for n, c in res["configs"].items() if n.startswith("pytorch")}
    micas = {n: c for n, c in res["configs"].items() if n.startswith("mica")}
    if torch and micas:
        fastest = min(torch, key=lambda n: torch[n]["median_ms"])
        res["fastest_pytorch"] = fastest
        for n, c in micas.items():
            t = torch[fastest]
            ratio = c["median_ms"] / t["median_ms"]
            if c["max_ms"] < t["min_ms"]:
                verdict = "faster"
            elif ratio < 1.05:
                verdict = "level"
            else:
                verdict = "slower"
            c.update(verdict=verdict, ratio=ratio, rss_ratio=c["peak_rss_mb"] / max(t["peak_rss_mb"], 1e-9))
    return res


def _ms(x):
    """A step time to three significant figures (the tutorial's steps take a fraction of a ms)."""
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def _plan(c):
    return f"{c['plan_mb']:.0f}" if "plan_mb" in c else ""


def table(res):
    lines = [f"model {res['model']}, {res['threads']} threads, warm-up {res['warmup']} steps then a window of "
             f"{res['window']}, {res['rounds']} rounds, {res['date']}", "",
             "| configuration | median ms/step | range | peak RSS MB | memory plan MB | first step s | "
             "libraries (MB on disk) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for name, c in res["configs"].items():
        verdict = f"{c['verdict']} ({c['ratio']:.2f}x)" if "verdict" in c else ""
        if c.get("void_runs"):
            verdict += f", {c['void_runs']} void"
        lines.append(f"| {name} | {_ms(c['median_ms'])} | {_ms(c['min_ms'])} – {_ms(c['max_ms'])} | "
                     f"{c['peak_rss_mb']:.0f} | {_plan(c)} | {c['first_step_s']:.1f} | {len(c['libraries'])} "
                     f"({c['footprint_mb']:.0f}) | {verdict} |")
    for name, why in res["failures"].items():
        lines.append(f"| {name} | failed: {why[:80]} | | | | | | |")
    if "fastest_pytorch" in res:
        lines.append("")
        lines.append(f"PyTorch's fastest mode as measured: {res['fastest_pytorch']}.")
    return "\n".join(lines)


def charts(res, runs, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(res["configs"])
    med = [res["configs"][n]["median_ms"] for n in names]
    lo = [res["configs"][n]["median_ms"] - res["configs"][n]["min_ms"] for n in names]
    hi = [res["configs"][n]["max_ms"] - res["configs"][n]["median_ms"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(names, med, yerr=[lo, hi], capsize=4)
    ax.set_ylabel("ms per step (median, range)")
    ax.set_title(f"{res['model']}: one training step")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.savefig(os.path.join(out, f"steps-{res['model']}.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for n in names:
        if runs[n]:
            ls = runs[n][0]["losses"]
            xs = sorted(ls)
            ax.plot(xs, [ls[x] for x in xs], label=n, lw=1)
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss")
    ax.legend()
    fig.savefig(os.path.join(out, f"losses-{res['model']}.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)
