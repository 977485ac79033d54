"""The three programs a training run compiles, from a nanoGPT configuration.

- train: one optimizer step — the micro-batches' forward and backward (loss / accumulation
  steps, gradients summed as nanoGPT's .backward() accumulates them), clipping, the learning
  rate from the iteration number (warmup + cosine, or constant), AdamW over nanoGPT's groups;
  parameters and optimizer state are updated in place;
- eval: the loss of one batch with dropout off (estimate_loss);
- logits: every position's logits for one window (sampling).
"""
import contextlib
import math

import mica
from ..models.gpt import GPT, GPTConfig, loss_fn
from ..optim import zero


def model_config(cfg, vocab_size):
    return GPTConfig(block_size=cfg["block_size"], vocab_size=vocab_size, n_layer=cfg["n_layer"],
                     n_head=cfg["n_head"], n_embd=cfg["n_embd"], dropout=cfg["dropout"], bias=cfg["bias"])


def optimizer(cfg, param_specs):
    groups = mica.optim.nanogpt_param_groups(param_specs, cfg["weight_decay"])
    return mica.optim.adamw(lr=cfg["learning_rate"], betas=(cfg["beta1"], cfg["beta2"]),
                            weight_decay=cfg["weight_decay"], param_groups=groups)


def learning_rate(cfg, iter_num):
    if not cfg["decay_lr"]:
        return mica.as_tensor(float(cfg["learning_rate"]), mica.float64)
    return mica.optim.cosine_with_warmup(iter_num, cfg["learning_rate"], cfg["warmup_iters"],
                                         cfg["lr_decay_iters"], cfg["min_lr"])


def precision(cfg):
    """nanoGPT's `ctx`: torch.amp.autocast for a half dtype, else nothing (float32)."""
    if cfg.get("dtype", "float32") == "float32":
        return contextlib.nullcontext()
    return mica.autocast(device_type=cfg.get("device", "cpu"), dtype=getattr(mica, cfg["dtype"]))


def build(cfg, vocab_size, world=1, rank=0):
    """(model, optimizer, {name: Program} for train, eval and logits) for the config's recipe. With
    world > 1 the train program is rank `rank`'s share of a data-parallel step (data_parallel
    below; nanoGPT's recipe only)."""
    if cfg.get("recipe") == "speedrun":
        return build_speedrun(cfg, vocab_size, world, rank)
    return build_nanogpt(cfg, vocab_size, world, rank)


def speedrun_model(cfg, vocab_size):
    from ..models import speedrun

    model = speedrun.build(vocab_size, cfg["num_layers"], cfg["model_dim"], cfg["head_dim"])
    # dtype bfloat16 is the seed's (its embedding is bf16, so the activations are); float32 widens it
    return model if cfg.get("dtype", "bfloat16") == "bfloat16" else model.float()


def build_speedrun(cfg, vocab_size, world=1, rank=0):
    """The speedrun seed's programs: train is one step of its loop (the micro-batches' summed-loss
    gradients added, set_hparams(step), AdamW + Muon); eval the summed loss of one micro-batch;
    logits every position's soft-capped logits of one window. With world > 1 the train program is
    rank `rank`'s: its contiguous share of the micro-batches, the gradients and losses summed across
    the ranks in one process's order (data_parallel), and with shard_muon each rank
    orthogonalizing every world-th matrix of the Muon group (mica/optim/muon.py)."""
    from ..models import speedrun

    model = speedrun_model(cfg, vocab_size)
    specs = model.param_specs()
    opt = speedrun_optimizer(cfg, model)
    if world > 1 and cfg.get("shard_muon", True):
        opt.optimizers["optimizer2"].shard(world, rank)
    layout = zero_layout(cfg, specs, opt, world)
    if layout is not None:
        _adamw(opt).shard(layout, rank)
    mbs, T = cfg["mbs"], cfg["seq_len"]
    accum = cfg["batch_size"] // (mbs * T)
    local = accum // world  # (distributed.ranks checks that the ranks share the micro-batches evenly)

    def across_ranks(micro_grad, count):
        grads, losses = data_parallel(micro_grad, count, world, rank, layout)
        total = losses[0]
        for i in range(1, world * count):
            total = total + losses[i]  # (one process's running sum of the micro-batches' losses)
        return grads, total

    step = speedrun.train_step(model, opt, cfg["train_steps"], cfg["cooldown_frac"],
                               accumulate=across_ranks if world > 1 else None)
    forward = speedrun.loss_fn(model)

    def train(params, opt_state, x, y, iter_num):
        return step(params, opt_state, x, y, iter_num)

    def evaluate(params, x, y):
        return forward(params, x, y)

    def logits(params, idx):
        with model.bind(params):
            return model.logits(idx)

    batch = mica.i64[local, mbs, T]
    train_prog = mica.trace(train, specs, opt.state_specs(specs), batch, batch, mica.i64[()], name="train")
    eval_prog = mica.trace(evaluate, specs, mica.i64[mbs, T], mica.i64[mbs, T], name="eval")
    logits_prog = mica.trace(logits, specs, mica.i64[1, T], name="logits")
    return model, opt, {"train": train_prog, "eval": eval_prog, "logits": logits_prog}


def speedrun_optimizer(cfg, model):
    """The seed's AdamW + Muon over the model's parameters, from the config."""
    from ..models import speedrun

    return speedrun.optimizers(model, cfg["embed_lr"], cfg["head_lr"], cfg["scalar_lr"], cfg["muon_lr"],
                               cfg["muon_weight_decay"], cfg["mu"], ((2.0, -1.5, 0.5),) * cfg["ns_steps"],
                               getattr(mica, cfg["ns_dtype"]))


def muon_sharding_report(cfg, model, opt, world):
    """What each rank of an N-rank speedrun step orthogonalizes, from the compile-time shapes."""
    from ..optim.muon import sharding_plan

    muon = opt.optimizers["optimizer2"]
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if n in muon.managed(
        [n for n, _ in model.named_parameters()])}
    plan = sharding_plan(shapes, world, cfg["ns_steps"])
    total = sum(f for _, f, _ in plan)
    if not cfg.get("shard_muon", True):
        return (f"Muon unsharded (shard_muon=False): every rank orthogonalizes all {len(shapes)} matrices, "
                f"{total / 1e6:,.1f} MFLOP of Newton–Schulz per step")
    per = ", ".join(f"rank {r}: {k} matrices ({f / 1e6:,.1f} MFLOP)" for r, (k, f, _) in enumerate(plan))
    return (f"Muon sharded over {world} ranks (the seed's): Newton–Schulz per step, {per}, against "
            f"{total / 1e6:,.1f} MFLOP in one process; each rank all-gathers {plan[0][2]:,} bytes of updates per step")


def build_nanogpt(cfg, vocab_size, world=1, rank=0):
    """{name: Program} for train, eval and logits, plus the model."""
    model = GPT(model_config(cfg, vocab_size))
    specs = model.param_specs()
    opt = optimizer(cfg, specs)
    layout = zero_layout(cfg, specs, opt, world)
    if layout is not None:
        opt.shard(layout, rank)
    accum, B, T = cfg["gradient_accumulation_steps"], cfg["batch_size"], cfg["block_size"]
    local = accum // world  # (run.py checks that the ranks share the micro-batches evenly)
    forward = loss_fn(model)

    def objective(params, x, y):
        with precision(cfg):
            return forward(params, x, y)

    scaler = mica.amp.GradScaler(enabled=cfg.get("dtype") == "float16")  # (nanoGPT's, for float16 only)

    def train(params, opt_state, x, y, iter_num):
        grads, loss = None, None
        sc = opt_state.get("scaler") if scaler.enabled else None

        def micro_grad(micro):
            return mica.value_and_grad(lambda p: objective(p, x[micro], y[micro]) / accum)(params) \
                if sc is None else _scaled_grad(objective, scaler, sc, params, x[micro], y[micro], accum)

        if world > 1:
            grads, losses = data_parallel(micro_grad, local, world, rank, layout)
            loss = losses[world * local - 1]
        for micro in range(accum if world == 1 else 0):
            loss, g = micro_grad(micro)
            grads = g if grads is None else {n: grads[n] + g[n] for n in grads}
        if sc is not None:
            grads, found_inf = scaler.unscale(grads, sc)
        if cfg["grad_clip"] != 0.0:
            mica.optim.clip_grad_norm(grads, cfg["grad_clip"], gather=None if layout is None else
                                      lambda norms: zero.gather_norms(layout, rank, norms, mica.float32))
        lr = learning_rate(cfg, iter_num)
        if sc is None:
            params, opt_state = opt.update(params, grads, opt_state, lr=lr)
            return params, opt_state, {"loss": loss * accum, "lr": lr}
        inner = {k: v for k, v in opt_state.items() if k != "scaler"}
        new_params, new_inner = opt.update(params, grads, inner, lr=lr)
        params, inner = scaler.step(found_inf, (params, inner), (new_params, new_inner))
        return params, {**inner, "scaler": scaler.update(sc, found_inf)}, {"loss": loss * accum, "lr": lr}

    def evaluate(params, x, y):
        return objective(params, x, y)

    def logits(params, idx):
        out, _ = mica.nn.functional_call(model, params, idx)
        return out

    model.train()
    batch = mica.i64[local, B, T]
    state_specs = opt.state_specs(specs)
    if scaler.enabled:
        state_specs = {**state_specs, "scaler": scaler.state_specs()}
    train_prog = mica.trace(train, specs, state_specs, batch, batch, mica.i64[()], name="train")
    model.eval()
    eval_prog = mica.trace(evaluate, specs, mica.i64[B, T], mica.i64[B, T], name="eval")
    logits_model = GPT(model_config(cfg, vocab_size))
    logits_model.eval()

    def all_logits(params, idx):
        with logits_model.bind(params), precision(cfg):
            return _all_position_logits(logits_model, idx).float()  # (the sampler reads float32)

    logits_prog = mica.trace(all_logits, specs, mica.i64[1, T], name="logits")
    return model, opt, {"train": train_prog, "eval": eval_prog, "logits": logits_prog}


def _adamw(opt):
    """The AdamW among a recipe's optimizers (nanoGPT's only one; the speedrun's optimizer1)."""
    return opt.optimizers["optimizer1"] if isinstance(opt, mica.optim.Optimizers) else opt


def _unsharded_optimizer(cfg, model):
    return speedrun_optimizer(cfg, model) if cfg.get("recipe") == "speedrun" else optimizer(cfg, model.param_specs())


def zero_layout(cfg, specs, opt, world):
    """ZeRO-1's assignment of AdamW's tensors to the ranks (mica/optim/zero.py), or None when the
    run is not sharded (zero_stage=0, or one process)."""
    if world == 1 or not cfg.get("zero_stage"):
        return None
    managed = set(_adamw(opt).managed(list(specs)))
    return zero.Layout({n: s.shape for n, s in specs.items() if n in managed}, world)


def zero_slots(cfg, model, world):
    """[(checkpoint name, shape, dtype, owner rank)] of one process's optimizer state, in its order,
    each AdamW moment owned by its tensor's rank (-1: every rank holds it, as AdamW's step and
    Muon's momenta), or None when the run is not sharded: what each ZeRO-1 rank's trainer knows of
    the checkpoint it helps write (mica/train/native.py state_slots)."""
    specs = model.param_specs()
    opt = _unsharded_optimizer(cfg, model)
    layout = zero_layout(cfg, specs, opt, world)
    if layout is None:
        return None
    out = []

    def walk(path, node):
        if isinstance(node, dict):
            for k, v in node.items():
                walk((*path, k), v)
            return
        sharded = len(path) >= 2 and path[-2] in ("exp_avg", "exp_avg_sq") and path[-1] in layout.owner
        out.append(("optimizer." + ".".join(path), node.shape, node.dtype, layout.owner[path[-1]] if sharded else -1))

    walk((), opt.state_specs(specs))
    return out


def zero_report(cfg, model, world):
    """What ZeRO-1 leaves each rank of AdamW's moments, from the compile-time shapes."""
    specs = model.param_specs()
    opt = _unsharded_optimizer(cfg, model)
    layout = zero_layout(cfg, specs, opt, world)
    if layout is None:
        return None
    moments = [sum(2 * math.prod(specs[n].shape) * specs[n].dtype.itemsize for n in names) for names in layout.owned]
    per = ", ".join(f"rank {r}: {len(names)} tensors, {b:,} bytes" for r, (names, b) in
                    enumerate(zip(layout.owned, moments)))
    return (f"ZeRO-1 over {world} ranks: AdamW's moments, {per}, against {sum(moments):,} bytes in one process; rank r "
            f"gets the summed gradients of its tensors (reduce-scatter) and sends their update to every rank "
            f"(all-gather)")


def data_parallel(micro_grad, local, world, rank, layout=None):
    """(gradients, every micro-batch's loss [world * local]) of a data-parallel step, on rank `rank`
    of `world`: its `local` micro-batches' gradients are all-reduced together, so every rank gets one
    process's sum, added in the same order (rank 0's micro-batches first, one by one: the
    collective's order, mica/ops/collective.py), and every rank gets every micro-batch's loss, in
    one process's order (nanoGPT logs the last; the speedrun their sum). Under ZeRO-1 (`layout`) they
    are reduce-scattered instead: the same sums, of this rank's tensors only.
    Dropout's streams are those one process gives these micro-batches: a throwaway trace of one
    micro-batch counts them, and this rank's start after `rank * local` micro-batches' worth."""
    from ..tensor import current

    ctx = current("train")
    start = ctx.random_streams
    micro_grad(0)  # (dead: only counted; the graph drops what nothing reads)
    ctx.random_streams = start + rank * local * (ctx.random_streams - start)
    parts = [micro_grad(m) for m in range(local)]
    mine = zero.scatter_gradients(layout, rank, [g for _, g in parts]) if layout is not None else {}
    grads = {}
    for n in parts[0][1]:  # (in the parameters' order; under ZeRO-1 another rank's AdamW tensors are absent)
        if n in mine or layout is None or n not in layout.owner:
            grads[n] = mine[n] if n in mine else mica.distributed.all_reduce([g[n] for _, g in parts], world=world)
    mine = mica.cat([mica.reshape(loss, (1,)) for loss, _ in parts]) if local > 1 else mica.reshape(parts[0][0], (1,))
    return grads, mica.distributed.all_gather(mine, world=world)


def _scaled_grad(objective, scaler, sc, params, x, y, accum):
    """(the micro-batch's loss / accum, the gradients of its scaled loss): scaler.scale(loss).backward().
    The loss returned is the one scaled, not the scaled one divided back: nothing after the step
    reads the scale, which the step updates in place."""
    def scaled(p):
        loss = objective(p, x, y) / accum
        return scaler.scale(loss, sc), loss

    (_, loss), grads = mica.value_and_grad(scaled, has_aux=True)(params)
    return loss, grads


def _all_position_logits(model, idx):
    """nanoGPT's forward without targets keeps only the last position; sampling one window at a
    time needs every position (the window is padded on the right)."""
    t = idx.size(1)
    tr = model.transformer
    x = tr.drop(tr.wte(idx) + tr.wpe(mica.arange(0, t, dtype=mica.long)))
    for block in tr.h:
        x = block(x)
    return model.lm_head(tr.ln_f(x))


def flops_per_iter(cfg, model):
    """nanoGPT's estimate_mfu numerator: 6N + 12 L H Q T per token, for one iteration."""
    if cfg.get("recipe") == "speedrun":
        N = model.num_parameters() - model.embed.weight.numel()
        L, T = cfg["num_layers"], cfg["seq_len"]
        return (6 * N + 12 * L * cfg["model_dim"] * T) * cfg["batch_size"]
    N = model.get_num_params()
    L, H, Q, T = cfg["n_layer"], cfg["n_head"], cfg["n_embd"] // cfg["n_head"], cfg["block_size"]
    per_token = 6 * N + 12 * L * H * Q * T
    return per_token * T * cfg["batch_size"] * cfg["gradient_accumulation_steps"]


def peak_flops(dtype="float32"):
    """This machine's product ceiling in FLOP/s: the denominator of the mfu nanoGPT's log line
    prints (nanoGPT's is an A100's bf16 peak). float32 (and float16, whose products the CPU widens
    to float32): a 1024^3 numpy product; bfloat16: Mica's own bfloat16 product of that size, on the
    kernel this processor gets (bf16gemm.choose), so a bfloat16 run's mfu is not measured against
    the slower float32 ceiling. Measured at every call (a tenth of a second) and the best rate this
    machine ever gave kept in the cache: one reading taken while the machine was busy would
    otherwise lower the ceiling, and raise every later mfu, for good."""
    import json
    import os

    from ..backends.c import bf16gemm
    from ..backends.c.build import cache_dir, write_whole
    from ..errors import MicaError

    key = f"flops bfloat16 {bf16gemm.choose()}" if dtype == "bfloat16" else "flops"
    path = os.path.join(cache_dir(), "peak_flops.json")
    try:
        with open(path) as f:
            known = json.load(f)
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError, RecursionError):
        known = {}
    measured = _bf16_product_rate() if dtype == "bfloat16" else _f32_product_rate()
    before = known.get(key)
    if isinstance(before, (int, float)) and not isinstance(before, bool) and math.isfinite(before) and before >= measured:
        return before
    known[key] = measured
    try:  # (only the mfu's denominator: a cache that cannot take it does not stop a run)
        write_whole(path, json.dumps(known))
    except MicaError:
        pass
    return measured


def _best_of(run, n=5):
    import time

    run()
    best = math.inf
    for _ in range(n):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return 2 * 1024 ** 3 / best


def _f32_product_rate():
    import numpy as np

    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    return _best_of(lambda: a @ a)


def _bf16_product_rate():
    import os

    import numpy as np

    from ..dtypes import Spec

    spec = Spec((1024, 1024), mica.bfloat16)
    exe = mica.trace(lambda a, b: a @ b, spec, spec).lower("cpu").build()
    a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    exe.load(a, a)
    return _best_of(lambda: exe.run(threads=os.cpu_count() or 1))
