"""The `mica` command. Errors a user can cause are one sentence on stderr and exit status 2."""
import argparse
import sys

from .errors import MicaError


def _config_overrides(pairs):
    out = {}
    for item in pairs:
        if not item.startswith("--") or "=" not in item:
            raise MicaError(f"expected --key=value, got {item!r}")
        key, value = item[2:].split("=", 1)
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                pass
        else:
            if value in ("True", "False"):
                value = value == "True"
        out[key] = value
    return out


def cmd_inspect(args, extra):
    """Build nanoGPT's GPT for a configuration and print its parameters (and, with --ir, the IR of
    one training step: forward, backward, clipping and AdamW)."""
    import mica
    from .models.gpt import GPT, GPTConfig, loss_fn

    known = {f for f in GPTConfig.__dataclass_fields__}
    overrides = _config_overrides(extra)
    unknown = set(overrides) - known - {"batch_size"}
    if unknown:
        import difflib

        key = sorted(unknown)[0]
        near = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"known: {', '.join(sorted(known))}"
        raise MicaError(f"unknown model setting {key!r}; {hint}")
    batch = int(overrides.pop("batch_size", 1))
    cfg = GPTConfig(**overrides)
    model = GPT(cfg)
    print(f"GPT {cfg}")
    print(f"number of parameters: {model.get_num_params() / 1e6:.2f}M")
    if args.ir:
        params = model.param_specs()
        opt = mica.optim.adamw(param_groups=mica.optim.nanogpt_param_groups(params, 0.1))

        def step(p, s, x, y):
            loss, g = mica.value_and_grad(loss_fn(model))(p, x, y)
            norm = mica.optim.clip_grad_norm(g, 1.0)
            p, s = opt.update(p, g, s)
            return p, s, loss, norm

        spec = mica.i64[batch, cfg.block_size]
        prog = mica.trace(step, params, opt.state_specs(params), spec, spec)
        print(prog.ir)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mica", description="Mica: a compiler for training programs.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("inspect", help="parameters (and IR) of nanoGPT's GPT for --key=value settings")
    p.add_argument("--ir", action="store_true", help="print the IR of one training step")
    args, extra = parser.parse_known_args(argv)
    if args.version:
        from . import __version__

        print(f"mica {__version__}")
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return {"inspect": cmd_inspect}[args.command](args, extra)
    except MicaError as e:
        print(f"mica: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
