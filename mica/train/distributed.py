"""Which rank of a data-parallel run this process is, and what every rank must agree on.

`mpirun -np N mica train ...` starts N copies of `mica train` (on the CPU, or on CUDA cards: one card
a rank, by its local rank, its sums over NCCL); each finds its rank in Open MPI's
environment (OMPI_COMM_WORLD_SIZE / _RANK), prepares the same programs (rank `r`'s train program
takes the r-th contiguous share of the micro-batches one process would take) and hands over to
the trainer, which joins MPI, compares every rank's run hash and trains. torchrun's variables
(WORLD_SIZE, RANK) name the ranks where MPI's are absent, but the ranks exchange gradients over
MPI, which only mpirun starts: a torchrun launch of several ranks is refused with a sentence.
"""
import hashlib
import json
import os

from ..errors import MicaError


def _int(name):
    text = os.environ[name]
    try:
        return int(text)
    except ValueError:
        raise MicaError(f"the environment variable {name}={text!r} is not a whole number; it names this "
                        "process's place in a multi-process run") from None


def job():
    """This mpirun job's identity, the same on each of its ranks and different for any other job
    (Open MPI's and PMIx's names for it), or "" outside one."""
    keys = ("PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess_base_jobid", "PMI_KVS_NAME", "PMI_JOBID")
    return " ".join(f"{k}={os.environ[k]}" for k in keys if os.environ.get(k))


def start_timeout():
    """How long a rank waits for the others to start, in seconds: MICA_START_TIMEOUT, as the
    trainer reads it (1 to 86399; default 600)."""
    text = os.environ.get("MICA_START_TIMEOUT", "600")
    t = int(text) if text.isdigit() else 0  # (the trainer's strtol: whole seconds; it warns about the rest)
    return float(t) if 1 <= t < 86400 else 600.0


def ranks(cfg=None):
    """(world size, rank) of this process; checks that cfg can be shared among the ranks."""
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        world, rank = _int("OMPI_COMM_WORLD_SIZE"), _int("OMPI_COMM_WORLD_RANK")
    elif "WORLD_SIZE" in os.environ:
        world, rank = _int("WORLD_SIZE"), _int("RANK") if "RANK" in os.environ else 0
        if world > 1:
            raise MicaError(f"WORLD_SIZE={world} asks for {world} ranks (torchrun's launch), but Mica's ranks sum "
                            f"their gradients over MPI, which only mpirun starts: run mpirun -np {world} mica train "
                            "... instead")
    else:
        return 1, 0
    if world < 1 or not 0 <= rank < world:
        raise MicaError(f"this process is rank {rank} of {world}, which cannot be; start the run with mpirun -np N")
    if cfg is not None and world > 1:
        if cfg.get("recipe") == "speedrun":
            accum = cfg["batch_size"] // (cfg["mbs"] * cfg["seq_len"])
            if accum % world:
                raise MicaError(f"batch_size={cfg['batch_size']} holds {accum} micro-batches of mbs * seq_len tokens, "
                                f"which do not divide among {world} ranks (each takes an equal share); use a "
                                f"batch_size of a multiple of {world} micro-batches")
        elif cfg["gradient_accumulation_steps"] % world:
            accum = cfg["gradient_accumulation_steps"]
            raise MicaError(f"gradient_accumulation_steps={accum} does not divide among {world} ranks (each takes an "
                            f"equal share of the micro-batches); use a multiple of {world}")
        if cfg.get("zero_stage") and cfg.get("dtype") == "float16":
            raise MicaError("zero_stage=1 with dtype=float16 is not supported yet (the loss scaler's overflow check "
                            "reads every gradient, and a ZeRO-1 rank holds its share only); use dtype=bfloat16 or "
                            "float32, or zero_stage=0")
        if cfg["device"] not in ("cpu", "cuda"):
            raise MicaError(f"training on {world} ranks runs on the CPU or on CUDA cards, not device={cfg['device']!r}; "
                            "use --device=cpu or --device=cuda")
        if cfg["device"] == "cuda":
            sharded = "zero_stage=1" if cfg.get("zero_stage") else \
                "the speedrun's sharded Muon" if cfg.get("recipe") == "speedrun" and cfg.get("shard_muon", True) else None
            if sharded:
                fix = "zero_stage=0" if cfg.get("zero_stage") else "shard_muon=False"
                raise MicaError(f"{sharded} on {world} ranks runs on the CPU only for now (its uneven blocks of "
                                f"tensors have no NCCL lowering yet); on cards use {fix}, or --device=cpu")
            if cfg.get("recipe") == "speedrun" and cfg.get("dtype", "bfloat16") != "float32":
                raise MicaError(f"the speedrun's {cfg.get('dtype', 'bfloat16')} weights on {world} ranks train on "
                                "the CPU only for now (the cards' collectives sum float32 and float64); use "
                                "--device=cpu, or dtype=float32")
    return world, rank


def run_hash(cfg, lowered, world):
    """What every rank of a run must share: its configuration, the world size and the programs
    (the train program's own source too where it is the same on every rank). Not `threads`, which
    changes no bit: a rank may take its own share of the cores."""
    from .native import PROGRAMS, _runtime_text

    shared = {k: v for k, v in cfg.items() if k != "threads"}
    h = hashlib.sha256(json.dumps(shared, sort_keys=True, default=str).encode())
    h.update(f"\0{world}\0".encode())
    h.update(_runtime_text().encode())
    for name in PROGRAMS:
        if name != "train" or same_train_on_every_rank(cfg):
            h.update(lowered[name].source.encode())
    return h.hexdigest()


def same_train_on_every_rank(cfg):
    """Whether every rank compiles the same train program: not with dropout (each rank's streams
    start at its own micro-batches), nor with a sharded optimizer (sharded Muon, ZeRO-1: each rank
    updates its own part)."""
    if cfg.get("recipe") == "speedrun":
        return not cfg.get("shard_muon", True) and not cfg.get("zero_stage")
    return not cfg.get("dropout") and not cfg.get("zero_stage")
