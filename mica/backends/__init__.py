"""Backends turn a Program into results: `reference` interprets it in numpy (the oracle)."""


def __getattr__(name):  # (torch.backends.cuda.matmul.allow_tf32 = ..., torch.backends.cudnn...: torch's switches)
    if name == "cuda":
        import importlib

        return importlib.import_module(".cuda", __name__)
    if name.startswith("_"):
        raise AttributeError(name)
    raise _switch(f"torch.backends.{name}")


def _switch(what):
    from ..errors import MissingVerbError
    from ..tensor import user_location

    return MissingVerbError(f"Mica has no {what.replace('torch.', 'mica.')} ({what}): TF32 products are chosen per "
                            "program (mica.compile(..., target='cuda', tf32=True), mica train --tf32) and the rest "
                            "of torch's switches have no meaning here; drop the line", user_location())
