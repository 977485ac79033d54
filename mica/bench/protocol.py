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

On an NVIDIA card (device="cuda"): Mica's CUDA trainer against the same model on PyTorch's cuda,
float32 on both sides, TF32 on both only together (tf32=True). Also recorded: each process's peak
GPU memory as nvidia-smi lists it (sampled beside the RSS; unknown, never zero, where nvidia-smi
is absent or does not list the process), PyTorch's own peak (max_memory_reserved and
max_memory_allocated), the NVIDIA libraries each side mapped, and whether Mica's trainer mapped
NVRTC (it should not). A mode that fails or runs out of the GPU's memory stays in the table as
failed or OOM, with its reason (the report's amendment 5).
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from ..errors import MicaError

LINE = re.compile(r"^iter (\d+): loss ([-\d.naif]+)(?:, time ([\d.]+)ms)?")
# the speedrun seed's heartbeat, printed after step N - 1 (it carries no loss)
SPEEDRUN_LINE = re.compile(r"^step:(\d+)/\d+ train_time:[\d.]+s step_avg:[\d.]+ms$")
PLAN = re.compile(r"^memory plan \(exact, before the first step\): the trainer holds ([\d,]+) bytes")
TORCH_CUDA_MEMORY = re.compile(r"^cuda memory: max_memory_reserved (\d+) bytes, max_memory_allocated (\d+) bytes")

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
# the speedrun recipe's CPU config (mica train speedrun_tiny) against the seed's loop in PyTorch
DEFAULTS["speedrun_tiny"] = dict(data_dir="data/speedrun_tiny", rounds=3, warmup=10, window=20, every=10,
                                 modes=("eager", "default"))
DEFAULTS["gpt2"] = DEFAULTS["gpt2-medium"] = dict(data_dir="data/openwebtext", rounds=2, warmup=2, window=4,
                                                  every=1, modes=TORCH_MODES)
# on a card, every model by the report's window: 400 steps a run, the first 100 never measured
# (compilations, kernel tuning, graph capture, memory pools growing, clocks rising), five rounds
CUDA_DEFAULTS = {name: dict(d, rounds=5, warmup=100, window=300, every=10) for name, d in DEFAULTS.items()
                 if name != "tutorial"}

NVIDIA_SMI = ("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
GPU_SAMPLE_S = 0.5  # nvidia-smi takes tens to hundreds of ms a call: at most one this often
# NVIDIA's shared objects, by file name (libcuda is the driver; libcurl, libcups are not NVIDIA's)
NVIDIA_LIBRARY = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|cudnn\w*|cufft\w*|curand|cusparse\w*|cusolver\w*|"
                            r"cupti|cufile\w*|nvrtc(-builtins)?|nvJitLink|nvToolsExt|nvidia-[\w-]+|nccl|nvshmem\w*|"
                            r"nvperf\w*|nvblas)\.so")
SHARED_OBJECT = re.compile(r"\.so(\.[0-9][\w.]*)?$")
OOM = re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
                 r"the GPU has no room", re.I)


def parse_compute_apps(text, pid):
    """MiB of GPU memory nvidia-smi's compute-apps list (pid,used_memory, csv, no header, no units)
    gives `pid`, summed over its lines (one a GPU); None when the pid is not listed or its number
    is unreadable ([N/A], [Not Supported], garbage)."""
    total, seen = 0, False
    for line in str(text).splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2 or not all(re.fullmatch(r"[0-9]{1,12}", f, re.A) for f in fields):
            continue
        if int(fields[0]) == pid:
            total, seen = total + int(fields[1]), True
    return total if seen else None


def gpu_memory_sampler():
    """A function pid -> (MiB or None, why None) reading nvidia-smi once; None when nvidia-smi is
    not installed."""
    exe = shutil.which(NVIDIA_SMI[0])
    if exe is None:
        return None

    def sample(pid):
        try:
            r = subprocess.run([exe, *NVIDIA_SMI[1:]], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"nvidia-smi failed ({e})"
        if r.returncode != 0:
            return None, f"nvidia-smi failed ({(r.stdout + r.stderr).strip()[:100] or r.returncode})"
        return parse_compute_apps(r.stdout, pid), "nvidia-smi did not list the process"
    return sample


def maps_libraries(text):
    """The shared objects a /proc/PID/maps text maps (paths; a deleted file's too)."""
    libs = set()
    for line in str(text).splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            path = path[:-len(" (deleted)")]
        if path.startswith("/") and SHARED_OBJECT.search(os.path.basename(path)):
            libs.add(path)
    return libs


def nvidia_libraries(paths):
    """The NVIDIA ones among shared-object paths, by file name, sorted."""
    return sorted({os.path.basename(p) for p in paths if NVIDIA_LIBRARY.match(os.path.basename(p))})


def nvrtc_mapped(paths):
    return any(os.path.basename(p).startswith("libnvrtc") for p in paths)


_BOILERPLATE = re.compile(r"Set TORCHDYNAMO_VERBOSE|You can suppress this exception|TORCHDYNAMO_|^-+$|^\s*$")
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b:?")


def failure_reason(err, returncode):
    """The line of a failed run's stderr that says why: Mica's own sentence, else the last
    exception line (torch.compile ends its reports with boilerplate about TORCHDYNAMO_VERBOSE, which
    says nothing), else the last line that is not boilerplate, else the exit status."""
    lines = [line.strip() for line in err.splitlines() if not _BOILERPLATE.search(line.strip())]
    for pick in ([line for line in lines if line.startswith("mica: error:")],
                 [line for line in lines if _EXCEPTION.match(line)], lines):
        if pick:
            return pick[-1]
    return f"exit status {returncode}"


def failure_kind(reason):
    """OOM when a failure's reason says the GPU's (or the host's) memory ran out, else failed."""
    return "OOM" if OOM.search(str(reason)) else "failed"


def _sample_proc(pid, out, stop, gpu=None):
    """Poll /proc while the process lives: peak RSS (kB) and the shared objects it maps. `mica
    train` execs the native trainer: what counts is the final program, so the readings restart
    when the process image changes. Also how many tasks the machine had runnable (its own threads
    included), averaged over the run: on a shared machine, how contended the run was. With `gpu`
    (gpu_memory_sampler's function, or None where nvidia-smi is absent), the process's peak GPU
    memory in MiB too, or why it is unknown."""
    libs, peak, exe, runnable = set(), 0, None, []
    gpu_peak, gpu_next = None, 0.0
    gpu_why = "nvidia-smi is not installed" if gpu is None else "the process ended before nvidia-smi was read"
    while not stop.is_set():
        try:
            with open("/proc/loadavg") as f:
                runnable.append(int(f.read().split()[3].split("/")[0]))
            now_exe = os.readlink(f"/proc/{pid}/exe")
            if now_exe != exe:
                exe, libs, peak, gpu_peak = now_exe, set(), 0, None
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
            with open(f"/proc/{pid}/maps") as f:
                libs |= maps_libraries(f.read())
        except (OSError, ValueError):
            # between two images (/proc/PID/exe is briefly missing while `mica train` execs the
            # trainer), or ended and not yet reaped: this reading is skipped; run_once stops the loop
            stop.wait(0.01)
            continue
        if gpu is not None and time.monotonic() >= gpu_next:
            mib, why = gpu(pid)
            if mib is not None:
                gpu_peak = mib if gpu_peak is None else max(gpu_peak, mib)
            elif gpu_peak is None:
                gpu_why = why
            gpu_next = time.monotonic() + GPU_SAMPLE_S
        stop.wait(0.05)
    out["peak_rss_kb"], out["libraries"], out["program"] = peak, sorted(libs), exe
    if runnable:
        out["runnable"] = sum(runnable) / len(runnable)
    if out.get("gpu_sampled"):
        out["peak_gpu_mib"] = gpu_peak
        if gpu_peak is None:
            out["peak_gpu_unknown"] = gpu_why


def run_once(cmd, env, warmup, window, gpu=False):
    """Run one program; returns the stamps and what it needed. Raises on failure (recorded). With
    gpu, its peak GPU memory is sampled from nvidia-smi too."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, bufsize=1)
    info, stop = {"gpu_sampled": True} if gpu else {}, threading.Event()
    sampler = threading.Thread(target=_sample_proc, args=(proc.pid, info, stop, gpu_memory_sampler() if gpu else None),
                               daemon=True)
    sampler.start()
    stamps, losses, own, plan = {}, {}, {}, {}
    try:
        err = _read_lines(proc, stamps, losses, own, plan)
    except BaseException:  # (Ctrl-C sent to this process alone, or any failure here: the run goes with it)
        proc.kill()
        proc.wait()
        raise
    finally:
        stop.set()
        sampler.join()
    if proc.returncode != 0 or warmup not in stamps or warmup + window not in stamps:
        raise RuntimeError(failure_reason(err, proc.returncode))
    first = min(stamps)
    info.pop("gpu_sampled", None)
    return {"step_ms": (stamps[warmup + window] - stamps[warmup]) / window * 1000,
            "first_step_s": stamps[first] - start, "losses": losses, "line_ms": own, **plan, **info}


def _read_lines(proc, stamps, losses, own, plan):
    """A run's output line by line as it prints (each line's time stamped), until it ends; its stderr."""
    for line in proc.stdout:
        t = time.perf_counter()
        m = PLAN.match(line)
        if m:  # Mica's trainer: what its memory plan says it will hold
            plan["plan_bytes"] = int(m.group(1).replace(",", ""))
        m = TORCH_CUDA_MEMORY.match(line)
        if m:  # PyTorch's side on a card: its caching allocator's own peaks
            plan["torch_max_reserved_bytes"], plan["torch_max_allocated_bytes"] = int(m.group(1)), int(m.group(2))
        m = SPEEDRUN_LINE.match(line)
        if m:
            stamps[int(m.group(1))] = t
        m = LINE.match(line)
        if m:
            it = int(m.group(1))
            stamps[it] = t
            losses[it] = float(m.group(2))
            if m.group(3):
                own[it] = float(m.group(3))
    err = proc.stderr.read()
    proc.wait()
    return err


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


def torch_runner_cmd(cfg, data_dir, mode, iters, every, eval_every, eval_batches, threads=None, device="cpu",
                     tf32=False, dtype="float32"):
    """The PyTorch side's process (mica.bench.torch_runner) for nanoGPT settings `cfg`."""
    return [sys.executable, "-m", "mica.bench.torch_runner", "--data", data_dir, "--mode", mode, "--iters", str(iters),
            "--every", str(every), "--eval_every", str(eval_every), "--eval_batches", str(eval_batches),
            "--config", json.dumps(cfg)] + (["--threads", str(threads)] if threads else []) + (
            ["--device", device] + (["--tf32"] if tf32 else []) if device != "cpu" else []) + (
            ["--dtype", dtype] if dtype != "float32" else [])


def _mica_cmd(model, data_dir, out_dir, iters, threads, opt_level, every=10, device="cpu", tf32=False,
              simulate=False, dtype="float32", batch_size=None, memory_budget=None, half_roundings=False):
    settings = {**_model(model, batch_size), "max_iters": iters, "eval_interval": iters + 100, "eval_iters": 1,
                "log_interval": every, "always_save_checkpoint": False, "out_dir": out_dir,
                "device": device, "data_dir": data_dir, "threads": threads, "opt_level": opt_level,
                "time_every_iter": True}
    if dtype != "float32":  # (a CPU run without a dtype is float32, as nanoGPT's)
        settings["dtype"] = dtype
    if memory_budget is not None:  # (as the user wrote it: `auto` is read by the trainer when it starts)
        settings["memory_budget"] = memory_budget
    if half_roundings:
        settings["fp_half_intermediates"] = True
    if device == "cuda":  # the dtype said (a card's default is bfloat16), TF32 only when both sides may
        settings.update(dtype=dtype, tf32=bool(tf32), **({"simulate": True} if simulate else {}))
    return mica_train_cmd(settings)


def _speedrun_settings(data_dir, iters, every):
    """speedrun_tiny's overrides for a bench run: `iters` steps (the schedule over them), validation
    only before the first step, a heartbeat every `every` steps, the shards of data_dir."""
    return [f"--train_files={data_dir}/train_*.bin", f"--val_files={data_dir}/val_*.bin", f"--train_steps={iters}",
            f"--val_every={iters + 100}", f"--log_interval={every}", "--dtype=float32"]


def _speedrun_mica_cmd(data_dir, out_dir, iters, threads, opt_level, every):
    return [sys.executable, "-m", "mica.cli", "train", "speedrun_tiny", *_speedrun_settings(data_dir, iters, every),
            f"--out_dir={out_dir}", f"--threads={threads}", f"--opt_level={opt_level}", "--time_every_iter=True"]


def _speedrun_torch_cmd(data_dir, mode, iters, threads, every):
    from ..train import config as config_mod
    from ..train import run as train_run

    cfg = config_mod.check_speedrun(config_mod.load("speedrun_tiny", _speedrun_settings(data_dir, iters, every)))
    cfg["vocab_size"] = train_run.speedrun_vocab(cfg, log=lambda *a: None)
    return [sys.executable, "-m", "mica.bench.torch_speedrun", "--config", json.dumps(cfg), "--mode", mode,
            "--threads", str(threads)]


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


def _torch_cmd(model, data_dir, mode, iters, threads, every=10, device="cpu", tf32=False, dtype="float32",
               batch_size=None):
    # nanoGPT (and Mica's trainer) evaluate once before the first step; so does this side, on as many
    # batches as Mica's run (eval_iters 1), so the time to the first step counts the same work
    return torch_runner_cmd({**_model(model, batch_size), "seed": 1337}, data_dir, mode, iters, every, iters + 100, 1,
                            threads, device, tf32, dtype)


def _model(model, batch_size=None):
    """MODELS[model], at another batch size where one is given."""
    return MODELS[model] if batch_size is None else {**MODELS[model], "batch_size": batch_size}


def mica_config_name(opt_level, budget=None, half_roundings=False):
    """A Mica configuration's name in the table: its opt level, its memory budget where it has one, and
    fp_half_intermediates where the build takes PyTorch's half roundings."""
    return (f"mica O{opt_level}" + ("" if budget is None else f" budget={budget}")
            + (" fp_half_intermediates" if half_roundings else ""))


HALF_BUILDS = {"both": (True, False), "on": (True,), "off": (False,)}


def half_builds(dtype, which):
    """The fp_half_intermediates settings of Mica's builds: in a half type the report publishes the
    build with PyTorch's half roundings and puts the one with every digit kept beside it (`both`);
    float32 (and the models timed in float32 only) have one build."""
    if which not in HALF_BUILDS:
        raise MicaError(f"--fp_half_intermediates must be both, on or off, got {which!r}")
    if dtype == "float32":
        if which == "on":
            raise MicaError("--fp_half_intermediates=on names the half types' roundings; pass it with --dtype "
                            "bfloat16 or float16")
        return (False,)
    return HALF_BUILDS[which]


def check_settings(rounds, warmup, window, every, threads, opt_levels, torch_modes):
    """The protocol's counts, Mica's opt levels and PyTorch's modes, each wrong one a sentence before
    anything is built or run."""
    def whole(name, value, least):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise MicaError(f"--{name} must be a whole number, {least} or more; got {value!r}")

    whole("rounds", rounds, 1)
    whole("warmup", warmup, 0)
    whole("window", window, 1)
    whole("every", every, 1)
    whole("threads", threads if threads is not None else 0, 0)
    if not opt_levels or any(o not in (0, 1, 2) or isinstance(o, bool) for o in opt_levels):
        raise MicaError(f"--opt_levels takes Mica's levels 0, 1 and 2 (gcc -O1, -O2, -O3); got "
                        f"{' '.join(map(str, opt_levels)) or 'none'}")
    unknown = [m for m in torch_modes if m not in TORCH_MODES]
    if unknown:
        raise MicaError(f"--modes: {unknown[0]!r} is not one of PyTorch's modes ({', '.join(TORCH_MODES)})")
    for name, values in (("opt_levels", opt_levels), ("modes", torch_modes)):
        if len(set(values)) < len(values):
            raise MicaError(f"--{name} names one twice; give each once")


def check_mica_options(model, batch_size, memory_budgets):
    """batch_size and memory_budgets as bench() takes them, or the sentence why not: only nanoGPT's
    models take them (the tutorial's step and the speedrun recipe have their own shapes); each
    budget is None or what `mica train --memory_budget` reads (bytes, a size, auto)."""
    from ..train.memory_plan import parse_budget

    budgets = list(memory_budgets) if memory_budgets else [None]
    if (batch_size is not None or budgets != [None]) and model not in MODELS:
        raise MicaError(f"--batch_size and --memory_budgets set nanoGPT's settings; --model {model} has its own "
                        f"step, so drop them or choose from {', '.join(MODELS)}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise MicaError(f"--batch_size must be a whole number of sequences, 1 or more; got {batch_size!r}")
    out = []
    for b in budgets:
        b = None if b is None or str(b).strip().lower() == "none" else str(b).strip()
        if b is not None and b.lower() == "auto":
            b = "auto"
        elif b is not None:
            parse_budget(b)  # (its own sentence for a bad one, before anything runs)
        if b in out:
            raise MicaError(f"--memory_budgets names {b or 'none'} twice; give each budget once")
        out.append(b)
    return out


def _mica_own_ms(out_dir, warmup, window, first=1):
    """Mica's own clock over the window, from its per-iteration times in metrics.jsonl (the
    window's first iteration is warmup + first: nanoGPT's line N follows iteration N, the
    speedrun's step:N follows its step N - 1)."""
    times = {}
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "iter" in m and "time_ms" in m:
                times[m["iter"]] = m["time_ms"]
    steps = range(warmup + first, warmup + window + first)
    if not all(i in times for i in steps):
        return None
    return sum(times[i] for i in steps) / window


def check_data(model, data_dir):
    """The data folder exists (every configuration would fail without it); the GPT-2 models need a
    GPT-2 vocabulary (a character-level folder would train another model)."""
    from ..data.prepare import hint

    if model not in GPT2_MODELS:
        if model != "tutorial" and not os.path.isdir(data_dir):  # (the tutorial's step draws its own data)
            make = ("mica prepare text --input FILE --tokenizer bpe:4096 --format shards --out " + data_dir
                    if model == "speedrun_tiny" else hint(data_dir, "shakespeare_char"))  # (nanoGPT's char configs)
            raise MicaError(f"--model {model} trains on the data in {data_dir}, which does not exist; make it with "
                            f"{make}, or give --data_dir")
        return
    from ..train import run as train_run

    if not os.path.isdir(data_dir):
        raise MicaError(f"--model {model} trains on a folder of GPT-2 tokens; {data_dir} does not exist (make one "
                        f"with mica prepare text --input FILE --tokenizer gpt2 --out {data_dir}, or give --data_dir)")
    vocab, _ = train_run.vocab_size(data_dir, log=lambda *a: None)
    if vocab < GPT2_VOCAB:
        raise MicaError(f"--model {model} needs GPT-2's vocabulary ({GPT2_VOCAB:,} tokens or more), but {data_dir} has "
                        f"{vocab:,}; prepare one with mica prepare text --tokenizer gpt2 and pass it as --data_dir")


def cuda_problem():
    """None when both sides can train on an NVIDIA GPU here, else why not (a few words)."""
    from ..train import config as config_mod

    why = [config_mod.cuda_unusable()]
    try:
        import torch
    except ImportError:
        why.append("PyTorch is not installed")
    else:
        if not torch.version.cuda:
            why.append(f"PyTorch {torch.__version__} here is built without CUDA")
        elif why[0] is None and not torch.cuda.is_available():
            why.append(f"PyTorch {torch.__version__} finds no usable GPU")
    why = [w for w in why if w]
    return " and ".join(why) if why else None


def check_device(device="cpu", tf32=False, simulate=False, what="--device=cuda"):
    """The device both sides run on ("cpu" or "cuda"), or the one sentence why not, before anything runs.
    simulate: Mica's CUDA trainer on the CPU simulator and PyTorch on the CPU (for tests, no GPU)."""
    from ..train import config as config_mod

    device = config_mod.device(device)
    if tf32 and device != "cuda":
        raise MicaError("--tf32 lets both sides' products use TF32 on an NVIDIA GPU; pass it with --device=cuda")
    if simulate and device != "cuda":
        raise MicaError("--simulate runs Mica's CUDA trainer on the CPU simulator; pass it with --device=cuda")
    if device == "cuda" and not simulate:
        why = cuda_problem()
        if why:
            raise MicaError(f"{what} trains both sides on an NVIDIA GPU, but {why}; pass --device=cpu to measure "
                            "on the CPU")
        from ..backends.cuda import build as cuda_build

        cuda_build.nvcc(), cuda_build.cuda_libraries()  # (each raises its own sentence)
    return device


def bench(model="cpu", data_dir=None, rounds=None, warmup=None, window=None, threads=None, opt_levels=(2,),
          torch_modes=None, out="bench", log=print, every=None, device="cpu", tf32=False, simulate=False,
          dtype="float32", batch_size=None, memory_budgets=None, fp_half_intermediates="both"):
    """Run the protocol; settings left as None take the model's DEFAULTS (on a card, CUDA_DEFAULTS).
    batch_size: the model's batch at another size (both sides). memory_budgets: one Mica
    configuration per budget (None: no budget; bytes, a size such as 12GB, or auto), each named
    by it. fp_half_intermediates (a half dtype): Mica's build with PyTorch's half roundings (on),
    without them (off), or both beside each other (the report's tables)."""
    if model not in DEFAULTS:
        raise MicaError(f"unknown model {model!r}: choose from {', '.join(DEFAULTS)}")
    if model == "tutorial" and device != "cpu":
        raise MicaError(f"--model tutorial times the tutorial's step on the CPU only; on --device={device} choose "
                        f"from {', '.join(CUDA_DEFAULTS)}")
    device = check_device(device, tf32, simulate)
    on_card = device == "cuda" and not simulate  # (simulated: PyTorch's side stays on the CPU)
    d = (CUDA_DEFAULTS if device == "cuda" else DEFAULTS)[model]
    data_dir = d["data_dir"] if data_dir is None else data_dir
    rounds = d["rounds"] if rounds is None else rounds
    warmup = d["warmup"] if warmup is None else warmup
    window = d["window"] if window is None else window
    every = d["every"] if every is None else every
    torch_modes = d["modes"] if torch_modes is None else torch_modes
    check_settings(rounds, warmup, window, every, threads, opt_levels, torch_modes)
    check_data(model, data_dir)
    budgets = check_mica_options(model, batch_size, memory_budgets)
    halves = half_builds(dtype, fp_half_intermediates)
    if device == "cpu" and dtype == "bfloat16":  # (a MICA_BF16_GEMM this processor cannot run: said now, not
        from ..backends.c import bf16gemm      # in a table cell after PyTorch's side has run)

        bf16gemm.choose()
    if model == "speedrun_tiny" and (device != "cpu" or dtype != "float32"):
        raise MicaError("--model speedrun_tiny is benchmarked on the CPU in float32 for now; drop --device and --dtype")
    threads = threads or os.cpu_count() or 1
    if every < 1 or warmup % every or window % every:
        raise MicaError(f"the warm-up ({warmup}) and the window ({window}) must be multiples of every ({every}): "
                         "both sides print a line every that many steps")
    iters = warmup + window
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    configs = {mica_config_name(o, b, h): ("mica", (o, b, h)) for o in opt_levels for b in budgets for h in halves}
    configs.update({f"pytorch {m}": ("torch", m) for m in torch_modes})
    runs = {name: [] for name in configs}
    failures, extras = {}, {}
    if dtype not in ("float32", "bfloat16", "float16"):
        raise MicaError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r}")
    if dtype != "float32" and model == "tutorial":
        raise MicaError("--dtype: the tutorial's model is benchmarked in float32 only; drop --dtype or pick a GPT model")
    mica_device = dict(device=device, tf32=tf32, simulate=simulate, dtype=dtype)
    torch_device = dict(device="cuda" if on_card else "cpu", tf32=tf32 and on_card, dtype=dtype)
    if batch_size is not None:
        mica_device["batch_size"] = torch_device["batch_size"] = batch_size
    gpu = device == "cuda"

    def once(name):
        kind, arg = configs[name]
        budget, half = None, False
        if kind == "mica":
            arg, budget, half = arg  # (an opt level, a memory budget and the half roundings: nanoGPT's models)
        if model == "tutorial":
            r = run_once(_tutorial_cmd(kind, arg, iters, threads, every), env, warmup, window)
            if kind == "mica":
                r["own_step_ms"] = own = _lines_own_ms(r, warmup, window, every)
                r["void"] = own is None or abs(own - r["step_ms"]) / r["step_ms"] > 0.01
        elif model == "speedrun_tiny":
            run_dir = os.path.join(out, name.replace(" ", "_"))
            if kind == "mica":
                r = run_once(_speedrun_mica_cmd(data_dir, run_dir, iters, threads, arg, every), env, warmup, window)
                r["own_step_ms"] = own = _mica_own_ms(run_dir, warmup, window, first=0)
                r["void"] = own is None or abs(own - r["step_ms"]) / r["step_ms"] > 0.01
            else:
                r = run_once(_speedrun_torch_cmd(data_dir, arg, iters, threads, every), env, warmup, window)
        elif kind == "mica":
            run_dir = os.path.join(out, re.sub(r"[^\w.-]+", "_", name))
            if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
                os.unlink(os.path.join(run_dir, "metrics.jsonl"))
            budgeted = dict(mica_device, memory_budget=budget) if budget is not None else mica_device
            if half:
                budgeted = dict(budgeted, half_roundings=True)
            r = run_once(_mica_cmd(model, data_dir, run_dir, iters, threads, arg, every, **budgeted), env, warmup,
                         window, gpu)
            own = _mica_own_ms(run_dir, warmup, window)
            r["own_step_ms"] = own
            r["void"] = own is None or abs(own - r["step_ms"]) / r["step_ms"] > 0.01
        else:
            r = run_once(_torch_cmd(model, data_dir, arg, iters, threads, every, **torch_device), env, warmup, window,
                         gpu)
        return r

    for name in list(configs):  # one discarded run each: builds, caches, compiles
        try:
            r = once(name)
            extras[name] = {"first_step_s_cold": r["first_step_s"]}
            log(f"{name}: discarded first run {r['step_ms']:.1f} ms/step")
        except Exception as e:  # a mode that fails (or runs out of memory) is recorded, not dropped
            failures[name] = str(e)
            log(f"{name}: {failure_kind(e)} ({e})")
    live = [n for n in configs if n not in failures]
    for k in range(rounds if live else 0):
        order = live[k % len(live):] + live[:k % len(live)]
        for name in order:
            try:
                runs[name].append(once(name))
            except Exception as e:
                failures.setdefault(name, str(e))
        log(f"round {k + 1}: " + ", ".join(f"{n} {runs[n][-1]['step_ms']:.1f}" for n in order if runs[n]))
    result = summarize(model, threads, rounds, warmup, window, runs, failures, extras)
    result["dtype"] = dtype
    result["machine"] = machine(dtype if device == "cpu" else None)
    result["batch_size"] = _model(model, batch_size).get("batch_size") if model in MODELS else None
    if device == "cuda":
        result.update(device="cuda", tf32=bool(tf32), gpu=gpu_name(), simulated=bool(simulate))
    path, tmp = os.path.join(out, f"bench-{result_stem(result)}.json"), None
    try:  # (a file that cannot be written leaves the table, which the caller prints, and a sentence)
        fd, tmp = tempfile.mkstemp(dir=out, prefix=".bench-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, path)
        tmp = None
        result["charts"] = charts(result, runs, out)
    except OSError as e:
        result["unsaved"] = f"{path if tmp else e.filename or path}: {e.strerror}"
        if tmp:
            os.unlink(tmp)
    return result


def result_stem(res):
    """The results' file names: the model's, and the dtype's where it is not float32, so that runs of
    one model in other dtypes keep their own files in one --out folder."""
    return res["model"] + (f"-{res['dtype']}" if res.get("dtype", "float32") != "float32" else "")


def machine(dtype=None):
    """What the runs ran on: the processor (/proc/cpuinfo's model name), its cores, PyTorch's version
    and, for a half dtype on the CPU, the bfloat16 product kernel Mica's builds took."""
    from importlib import metadata

    from ..backends.c import bf16gemm

    m = {"processor": bf16gemm.machine_model() or "unknown", "cores": os.cpu_count()}
    flags = bf16gemm.machine_flags()
    m["vector"] = next((f for f in ("avx512_bf16", "avx512f", "avx2") if f in flags), "none").upper()
    try:
        m["torch"] = metadata.version("torch")
    except metadata.PackageNotFoundError:
        m["torch"] = None
    if dtype == "bfloat16":
        m["bf16_gemm"] = bf16gemm.choose()
    return m


def gpu_name():
    """The first GPU's name as nvidia-smi gives it, or None."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = r.stdout.strip().splitlines() if r.returncode == 0 else []
    return lines[0].strip() if lines else None


def _gpu_summary(rs):
    """Peak GPU memory over a configuration's runs (nvidia-smi, MiB) and PyTorch's own peaks (MiB),
    where its runs sampled them; an unknown reading is None, with why."""
    c = {}
    if any("peak_gpu_mib" in r for r in rs):
        known = [r["peak_gpu_mib"] for r in rs if r.get("peak_gpu_mib") is not None]
        c["peak_gpu_mb"] = max(known) if known else None  # (nvidia-smi's MiB, as RSS is MiB here)
        if not known:
            c["peak_gpu_unknown"] = next(r["peak_gpu_unknown"] for r in rs if "peak_gpu_unknown" in r)
    for key in ("torch_max_reserved", "torch_max_allocated"):
        if all(f"{key}_bytes" in r for r in rs) and rs:
            c[f"{key}_mb"] = max(r[f"{key}_bytes"] for r in rs) / 2 ** 20
    return c


def summarize(model, threads, rounds, warmup, window, runs, failures, extras):
    res = {"model": model, "threads": threads, "rounds": rounds, "warmup": warmup, "window": window,
           "date": time.strftime("%Y-%m-%d"), "configs": {}, "failures": failures,
           "failure_kinds": {name: failure_kind(why) for name, why in failures.items()}}
    for name, rs in runs.items():
        if not rs:
            continue
        times = [r["step_ms"] for r in rs]
        counted = [r["step_ms"] for r in rs if not r.get("void")] or times  # (a void run is left out: all void, said)
        c = {"step_ms": times, "median_ms": statistics.median(counted), "min_ms": min(counted),
             "max_ms": max(counted),
             "peak_rss_mb": max(r.get("peak_rss_kb", 0) for r in rs) / 1024,
             "first_step_s": statistics.median(r["first_step_s"] for r in rs),
             "program": rs[0].get("program"), "libraries": rs[0].get("libraries", []),
             "footprint_mb": _footprint(rs[0].get("libraries", []) + [rs[0].get("program") or ""]) / 2 ** 20,
             **extras.get(name, {}), **_gpu_summary(rs)}
        if "peak_gpu_mb" in c or "torch_max_reserved_mb" in c:  # on a card: what of NVIDIA's it opened
            c["nvidia_libraries"] = nvidia_libraries(c["libraries"])
            c["nvrtc"] = nvrtc_mapped(c["libraries"])
        if all("runnable" in r for r in rs):
            c["runnable"] = [r["runnable"] for r in rs]
        if "plan_bytes" in rs[0]:  # Mica's compile-time plan of what its trainer holds (MB as RSS is: MiB)
            c["plan_mb"] = rs[0]["plan_bytes"] / 2 ** 20
        if "own_step_ms" in rs[0]:
            c["own_step_ms"] = [r["own_step_ms"] for r in rs]
            c["void_runs"] = sum(1 for r in rs if r["void"])
        res["configs"][name] = c
    # the comparison is against the fastest of the modes that ran every run (amendment 5)
    torch = {n: c for n, c in res["configs"].items() if n.startswith("pytorch") and n not in failures}
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


def _mb(x):
    return "unknown" if x is None else f"{x:.0f}"


def _nvidia(c, mica):
    libs = ", ".join(n.split(".so")[0] for n in c.get("nvidia_libraries", [])) or "none"
    return libs + (" — NVRTC MAPPED" if mica and c.get("nvrtc") else "")


def table(res):
    if res.get("device") == "cuda":
        return cuda_table(res)
    dtype = res.get("dtype", "float32")
    precision = f", {dtype} (both sides under autocast)" if dtype != "float32" else ""
    batch = f", batch {res['batch_size']}" if res.get("batch_size") else ""
    lines = [f"model {res['model']}{batch}{precision}, {res['threads']} threads, warm-up {res['warmup']} steps then a window of "
             f"{res['window']}, {_rounds(res['rounds'])}, {res['date']}"]
    if res.get("machine"):
        lines.append(_machine_line(res["machine"]))
    lines += ["",
              "| configuration | median ms/step | range | peak RSS MB | memory plan MB | first step s | "
              "libraries (MB on disk) | runnable tasks | verdict |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, c in res["configs"].items():
        lines.append(f"| {name} | {_ms(c['median_ms'])} | {_ms(c['min_ms'])} – {_ms(c['max_ms'])} | "
                     f"{c['peak_rss_mb']:.0f} | {_plan(c)} | {c['first_step_s']:.1f} | {len(c['libraries'])} "
                     f"({c['footprint_mb']:.0f}) | {_runnable(c)} | {_verdict(c, res)} |")
    lines += _failure_rows(res, 7)
    if "fastest_pytorch" in res:
        lines.append("")
        lines.append(f"PyTorch's fastest mode as measured: {res['fastest_pytorch']}.")
    if any(n.startswith("mica O") for n in res["configs"]) and res["model"] != "tutorial":
        lines.append("mica ON: Mica's native trainer built at opt level N; each side trains from its own nanoGPT-style "
                     "init (other random generators), so their losses differ from the first step (`mica check` "
                     "compares the models).")
    busy = _busy(res)
    if busy:
        lines.append(busy)
    return "\n".join(lines)


def _rounds(n):
    return f"{n} round" if n == 1 else f"{n} rounds"


def _machine_line(m):
    line = f"on {m['processor']} ({m['cores']} cores, {m['vector']}), PyTorch {m.get('torch') or 'not installed'}"
    if m.get("bf16_gemm"):
        from ..backends.c import bf16gemm

        line += f"; Mica's bfloat16 products: the {m['bf16_gemm']} kernel ({bf16gemm.WHAT[m['bf16_gemm']]})"
    return line


def _runnable(c):
    """The tasks the machine had runnable during a configuration's runs (their median; its own threads
    among them), as /proc/loadavg counts them."""
    return f"{statistics.median(c['runnable']):.1f}" if c.get("runnable") else ""


def _busy(res):
    """A sentence when other work shared the machine: more runnable tasks than the runs' threads and
    one more (the reader), on median, in any configuration."""
    most = max((statistics.median(c["runnable"]) for c in res["configs"].values() if c.get("runnable")), default=0)
    if most > res["threads"] + 1.5:
        return (f"The machine was shared: up to {most:.1f} tasks were runnable during the runs of {res['threads']} "
                "threads, so these times are not a fair measure; run again on a quiet machine.")
    return ""


def _verdict(c, res=None):
    verdict = f"{c['verdict']} ({c['ratio']:.2f}x)" if "verdict" in c else ""
    if verdict and res is not None and res.get("rounds", 3) < 3:
        verdict += f", from {_rounds(res['rounds'])} only"
    if c.get("void_runs"):
        every = c["void_runs"] == len(c["step_ms"])
        verdict += f", {c['void_runs']} void" + (" (all counted: no other run)" if every else " (left out)")
    return verdict


def _cut(text, most):
    """text whole, or cut at a word before `most` characters with an ellipsis (a table cell)."""
    text = " ".join(str(text).split())
    if len(text) <= most:
        return text
    return text[:most].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def _failure_rows(res, blanks):
    kinds = res.get("failure_kinds", {})
    return [f"| {name} | {kinds.get(name) or failure_kind(why)}: {_cut(why, 160)} |" + " |" * blanks
            for name, why in res["failures"].items()]


def cuda_table(res):
    """The table on a card: GPU memory (nvidia-smi's, per process; PyTorch's allocator's own) and the
    NVIDIA libraries each side mapped beside the step times; failed and OOM modes kept as rows."""
    where = ("Mica's CUDA trainer on the CPU simulator beside PyTorch on the CPU (a test: no GPU)"
             if res.get("simulated") else res.get("gpu") or "an NVIDIA GPU")
    lines = [f"model {res['model']} on {where}, float32 with TF32 {'on' if res.get('tf32') else 'off'} on both "
             f"sides, warm-up {res['warmup']} steps then a window of {res['window']}, {_rounds(res['rounds'])}, "
             f"{res['date']}", "",
             "| configuration | median ms/step | range | peak GPU MB (nvidia-smi) | PyTorch max reserved MB "
             "(allocated) | peak RSS MB | memory plan MB | first step s | NVIDIA libraries mapped | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in res["configs"].items():
        torch_mem = (f"{c['torch_max_reserved_mb']:.0f} ({c['torch_max_allocated_mb']:.0f})"
                     if "torch_max_reserved_mb" in c else "")
        lines.append(f"| {name} | {_ms(c['median_ms'])} | {_ms(c['min_ms'])} – {_ms(c['max_ms'])} | "
                     f"{_mb(c.get('peak_gpu_mb'))} | {torch_mem} | {c['peak_rss_mb']:.0f} | {_plan(c)} | "
                     f"{c['first_step_s']:.1f} | {_nvidia(c, name.startswith('mica'))} | {_verdict(c, res)} |")
    lines += _failure_rows(res, 8)
    unknown = sorted({c["peak_gpu_unknown"] for c in res["configs"].values() if c.get("peak_gpu_unknown")})
    if unknown:
        lines += ["", f"Peak GPU memory unknown where {'; '.join(unknown)}."]
    if "fastest_pytorch" in res:
        lines += ["", f"PyTorch's fastest mode as measured: {res['fastest_pytorch']}."]
    return "\n".join(lines)


def charts(res, runs, out):
    """The step and loss charts as PNGs in `out`; returns the paths written (none without
    matplotlib, or when every configuration failed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = list(res["configs"])
    if not names:  # every configuration failed: the table says why, there is nothing to draw
        return []
    med = [res["configs"][n]["median_ms"] for n in names]
    lo = [res["configs"][n]["median_ms"] - res["configs"][n]["min_ms"] for n in names]
    hi = [res["configs"][n]["max_ms"] - res["configs"][n]["median_ms"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(names, med, yerr=[lo, hi], capsize=4)
    ax.set_ylabel("ms per step (median, range)")
    what = res["model"] + (f", {res['dtype']}" if res.get("dtype", "float32") != "float32" else "")
    ax.set_title(f"{what}: one training step")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.savefig(os.path.join(out, f"steps-{result_stem(res)}.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for n in names:
        if runs[n]:
            ls = runs[n][0]["losses"]
            xs = sorted(ls)
            ax.plot(xs, [ls[x] for x in xs], label=n, lw=1)
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss")
    ax.set_title(f"{what}: the first run's training loss")
    ax.legend()
    fig.savefig(os.path.join(out, f"losses-{result_stem(res)}.png"), dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [os.path.join(out, f"{kind}-{result_stem(res)}.png") for kind in ("steps", "losses")]
