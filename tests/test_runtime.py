"""The native trainer's runtime as a user's files reach it: checkpoints with checksums, resumes
against the wrong data, several shards, long prompts, Ctrl-C, leftovers, and fuzzed manifests
and checkpoints (a sentence or a correct run, never a crash or a hang)."""
import json
import os
import random
import signal
import struct
import subprocess

import numpy as np
import pytest

from helpers import mica_cli
from mica.data import tokens as tok
from mica.data.prepare import prepare_char
from mica import files
from mica.errors import MicaError
from mica.train import checkpoint, run

SHAKESPEARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tinyshakespeare.txt")
TINY = ["shakespeare_char", "--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16",
        "--batch_size=2", "--eval_iters=1", "--log_interval=1", "--max_iters=3", "--eval_interval=2",
        "--always_save_checkpoint=True"]
QUIET = dict(log=lambda *a: None)


mica = mica_cli


def one_sentence(stderr):
    errors = [line for line in stderr.splitlines() if line.startswith("mica: error:")]
    return len(errors) == 1 and "Traceback" not in stderr


@pytest.fixture()
def work(tmp_path, monkeypatch):
    d = tmp_path / "data" / "shakespeare_char"
    d.mkdir(parents=True)
    prepare_char(open(SHAKESPEARE).read()[:20000], str(d), **QUIET)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def train(args, check=True):
    """prepare_run in this process (the build is cached), then the trainer itself."""
    exe, manifest, cfg = run.prepare_run(args[0], args[1:], **QUIET)
    r = subprocess.run([exe, manifest], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def resume_outcome(args):
    """(returncode, message) of a resume: 2 and the sentence where mica refuses, else the trainer's."""
    try:
        r = train([*args, "--init_from=resume"], check=False)
    except MicaError as e:
        return 2, str(e)
    return r.returncode, r.stderr


CKPT = "out-shakespeare-char/ckpt.safetensors"


def test_the_trainers_checkpoints_carry_checksums_python_verifies(work):
    train(TINY)
    st = checkpoint.SafeTensors(CKPT)
    assert st.checksummed and set(json.loads(st.metadata["crc32"])) == set(st.names)
    for name in st.names:  # the C CRC-32 equals zlib's for every tensor
        st.read(name)
    opt = [n for n in st.names if n.startswith("optimizer.exp_avg.")]
    assert opt and all(np.abs(st.read(n)).sum() > 0 for n in opt)


def test_every_flipped_byte_in_tensor_data_is_refused(work):
    train(TINY)
    good = open(CKPT, "rb").read()
    start = 8 + struct.unpack("<Q", good[:8])[0]
    rng = random.Random(7)
    for _ in range(20):
        raw = bytearray(good)
        at = rng.randrange(start, len(raw))
        raw[at] ^= 1 << rng.randrange(8)
        open(CKPT, "wb").write(raw)
        rc, message = resume_outcome(TINY)
        assert rc == 2 and "does not match its checksum" in message, (at, message)


def test_a_renamed_or_missing_tensor_is_an_error_never_a_silent_reset(work):
    train(TINY)
    good = open(CKPT, "rb").read()
    renamed = good.replace(b'"optimizer.exp_avg.transformer.wpe.weight":{', b'"optimizer.exp_avh.transformer.wpe.weight":{')
    assert renamed != good
    open(CKPT, "wb").write(renamed)  # a flip in the header: the checksum table no longer names the tensors
    rc, message = resume_outcome(TINY)
    assert rc == 2 and "checksums and its tensors disagree" in message, message
    open(CKPT, "wb").write(good)
    st = checkpoint.SafeTensors(CKPT)
    tensors = {n: st.read(n) for n in st.names}
    for edit, needle in [("rename", "does not have (optimizer.exp_avh"), ("drop", "lacks part of the optimizer")]:
        t = dict(tensors)
        a = t.pop("optimizer.exp_avg.transformer.wpe.weight")
        if edit == "rename":
            t["optimizer.exp_avh.transformer.wpe.weight"] = a
        checkpoint.write(CKPT, t, st.metadata | {})
        rc, message = resume_outcome(TINY)
        assert rc == 2 and needle in message, message


def test_resuming_against_smaller_data_is_a_sentence_not_a_segfault(work):
    train([*TINY, "--max_iters=2"])
    path = "data/shakespeare_char/train.bin"
    tokens = np.fromfile(path, dtype=np.uint16)
    st = checkpoint.SafeTensors(CKPT)
    far = int(st.read("data.next_offsets").max())
    tokens[: max(far // 2, 40)].tofile(path)
    rc, message = resume_outcome(TINY)
    assert rc == 2 and one_sentence(message) and "lies outside the training data" in message, message


def test_out_of_range_data_position_with_a_valid_checksum(work):
    train([*TINY, "--max_iters=2"])
    st = checkpoint.SafeTensors(CKPT)
    t = {n: st.read(n) for n in st.names}
    t["data.next_offsets"] = t["data.next_offsets"] + 10 ** 12
    checkpoint.write(CKPT, t, dict(st.metadata))
    rc, message = resume_outcome(TINY)
    assert rc == 2 and "lies outside the training data" in message, message


def test_init_from_weights_of_another_shape_names_the_tensors(work):
    train([*TINY, "--max_iters=2"])
    with pytest.raises(MicaError, match=r"tensors 6 missing \(transformer\.h\.1\.ln_1\.weight"):
        run.prepare_run(TINY[0], [*TINY[1:], "--n_layer=2", f"--init_from={CKPT}", "--out_dir=other"], **QUIET)
    with pytest.raises(MicaError, match=r"of another shape \(transformer\.wte\.weight is \[58, 16\] where "
                                        r"this model needs \[58, 32\]"):
        run.prepare_run(TINY[0], [*TINY[1:], "--n_embd=32", f"--init_from={CKPT}", "--out_dir=other"], **QUIET)
    train([*TINY, "--max_iters=2", "--n_layer=2", "--out_dir=deeper"])
    with pytest.raises(MicaError, match=r"6 this model does not have \(transformer\.h\.1\."):
        run.prepare_run(TINY[0], [*TINY[1:], "--init_from=deeper/ckpt.safetensors", "--out_dir=other"], **QUIET)


def test_token_ids_changed_after_the_check_are_caught_by_the_trainer(work):
    exe, manifest, _ = run.prepare_run(TINY[0], TINY[1:], **QUIET)
    path = "data/shakespeare_char/train.bin"
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[:] = 60000
    tokens.tofile(path)
    r = subprocess.run([exe, manifest], capture_output=True, text=True)
    assert r.returncode == 2 and one_sentence(r.stderr) and "beyond the vocabulary of 58" in r.stderr, r.stderr


def test_every_shard_is_read_in_sorted_order(work):
    """Rows are windows inside one shard, numbered across the shards in order: a run on shards
    equals a run on the same tokens in one file, with the offsets mapped accordingly."""
    src = np.fromfile("data/shakespeare_char/train.bin", dtype=np.uint16)
    val = np.fromfile("data/shakespeare_char/val.bin", dtype=np.uint16)
    pieces = [src[:3000], src[3000:3010], src[3010:9000]]  # the middle one is too short for a row
    shards = "data/shards"
    for i, p in enumerate(pieces[::-1]):  # written out of order: the names decide
        tok.write_shard(f"{shards}/fineweb_train_{2 - i:06d}.bin", p)
    tok.write_shard(f"{shards}/fineweb_val_000000.bin", val[:500])
    tok.write_shard(f"{shards}/fineweb_val_000001.bin", val[500:])
    import shutil

    shutil.copy("data/shakespeare_char/meta.json", shards)
    _, (train_files, val_files) = run.data_files({"data_dir": shards, "dataset": ""})
    assert [os.path.basename(f) for f in train_files] == [f"fineweb_train_{i:06d}.bin" for i in range(3)]
    assert len(val_files) == 2
    windows0 = 3000 - 16  # block_size 16
    single = "data/single"
    os.makedirs(single)
    tok.write_bin(f"{single}/train.bin", src[:9000])
    tok.write_bin(f"{single}/val.bin", val)
    shutil.copy("data/shakespeare_char/meta.json", single)
    rows = [5, 2900, windows0 + 0, windows0 + 4000, windows0 + 5973, 17, windows0 + 7, 100]  # 4 steps of 2 rows
    mapped = [r if r < windows0 else 3010 + (r - windows0) for r in rows]
    np.savetxt("order_shards.txt", rows, fmt="%d")
    np.savetxt("order_single.txt", mapped, fmt="%d")
    common = [*TINY, "--max_iters=3", "--eval_interval=100", "--dropout=0.0"]
    a = train([*common, f"--data_dir={shards}", "--batch_order=order_shards.txt", "--out_dir=a"]).stdout
    b = train([*common, f"--data_dir={single}", "--batch_order=order_single.txt", "--out_dir=b"]).stdout
    losses = lambda out: [line.split(", time")[0] for line in out.splitlines() if line.startswith("iter ")]
    assert len(losses(a)) == 4 and losses(a) == losses(b)
    np.savetxt("order_bad.txt", [windows0 + 5974] * 8, fmt="%d")  # one past the last window
    with pytest.raises(MicaError, match="order_bad.txt:1 has offset 8958, beyond the training data's 8,958 rows"):
        train([*common, f"--data_dir={shards}", "--batch_order=order_bad.txt", "--out_dir=c"], check=False)


@pytest.mark.slow  # (a variant: sampling from prompts is checked by default; make test-slow runs it)
def test_a_prompt_longer_than_any_line_limit_is_passed_whole(work):
    train([*TINY, "--max_iters=2"])
    text = open(SHAKESPEARE).read()
    prompt = (text * (1 + 70_000 // len(text)))[:70_000]
    chars = set(json.load(open("data/shakespeare_char/meta.json"))["stoi"])
    prompt = "".join(c for c in prompt if c in chars)
    assert len(prompt) > 65_536
    open("prompt.txt", "w").write(prompt)
    r = mica("sample", "--out_dir=out-shakespeare-char", "--start=FILE:prompt.txt", "--num_samples=1",
             "--max_new_tokens=3", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(prompt) and len(r.stdout) == len(prompt) + 3 + len("\n---------------\n")


@pytest.mark.parametrize("sig, said", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "stopped by SIGTERM"),
                                       (signal.SIGHUP, "stopped by SIGHUP")])
def test_ctrl_c_names_the_last_good_checkpoint(work, sig, said):
    """Ctrl-C, SIGTERM or SIGHUP (a closed terminal) in the native trainer: it stops at the next safe
    point with its sentence, the status a shell gives that signal, and its row in metrics.jsonl."""
    exe, manifest, _ = run.prepare_run(TINY[0], [*TINY[1:], "--max_iters=100000000", "--eval_interval=5"], **QUIET)
    p = subprocess.Popen([exe, manifest], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("saving checkpoint"):
            break
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig, err
    import re

    m = re.fullmatch(f"mica: {said} " r"(?:after|while evaluating at) iter (\d+); the last good checkpoint is "
                     r"out-shakespeare-char/ckpt\.safetensors \(iter (\d+)\): resume with --init_from=resume\n", err)
    assert m, err
    saved = checkpoint.SafeTensors(CKPT).metadata["iter_num"]
    assert m.group(2) == saved and int(saved) % 5 == 0 and int(saved) <= int(m.group(1))
    metrics = [json.loads(line) for line in open("out-shakespeare-char/metrics.jsonl")]
    assert metrics[-1] == {"iter": int(m.group(1)), "stopped": "interrupted"}


def test_leftovers_are_removed_and_a_scratch_run_starts_fresh_metrics(work):
    train([*TINY, "--max_iters=2"])
    dead = 2 ** 22 + 12345  # above pid_max's default: no such process
    for name in (f"ckpt.safetensors.tmp{dead}", f"init.safetensors.tmp{dead}", "keep.tmp1"):
        open(f"out-shakespeare-char/{name}", "w").write("partial")
    train([*TINY, "--max_iters=2"])
    left = sorted(os.listdir("out-shakespeare-char"))
    assert not any(".safetensors.tmp" in n for n in left) and "keep.tmp1" in left, left
    steps = [json.loads(line).get("step") for line in open("out-shakespeare-char/metrics.jsonl")]
    assert steps.count(0) == 1  # one run's lines, not two
    train([*TINY, "--max_iters=4", "--init_from=resume"])
    steps = [json.loads(line).get("step") for line in open("out-shakespeare-char/metrics.jsonl")]
    assert steps.count(0) == 1 and 2 in steps and 4 in steps  # a resume appends


def _mutate(raw, rng, protect=0):
    """One seeded mutation of a file's bytes: flips, truncation, an insertion or a deletion."""
    raw = bytearray(raw)
    kind = rng.randrange(5)
    at = rng.randrange(protect, len(raw))
    if kind == 0:
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(protect, len(raw))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        raw = raw[:at]
    elif kind == 2:
        raw[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif kind == 3:
        del raw[at:at + rng.randint(1, 16)]
    else:
        raw[at] = rng.choice(b"0123456789- \n\"{}[],:x")
    return bytes(raw)


def _runs_cleanly(r):
    return r.returncode == 0 or (r.returncode in (2, 3) and one_sentence(r.stderr))


def test_fuzzed_manifests_give_a_sentence_or_a_correct_run(work):
    exe, manifest, _ = run.prepare_run(TINY[0], TINY[1:], **QUIET)
    good = open(manifest, "rb").read()
    rng = random.Random(2024)
    outcomes = {}
    for case in range(200):
        bad = _mutate(good, rng)
        path = f"fuzz{case % 4}.manifest"
        open(path, "wb").write(bad)
        r = subprocess.run([exe, path], capture_output=True, text=True, errors="replace", timeout=30)
        assert _runs_cleanly(r), (case, r.returncode, r.stderr[-500:])
        outcomes[r.returncode] = outcomes.get(r.returncode, 0) + 1
    assert outcomes.get(2, 0) > 50 and outcomes.get(0, 0) > 10, outcomes  # both kinds were reached


@pytest.mark.parametrize("cases,seed", [(50, 99), pytest.param(150, 7, marks=pytest.mark.slow)])
def test_fuzzed_checkpoints_give_a_sentence_or_a_correct_resume(work, cases, seed):
    train(TINY)
    good = open(CKPT, "rb").read()
    rng = random.Random(seed)
    outcomes = {}
    for case in range(cases):
        open(CKPT, "wb").write(_mutate(good, rng))
        try:
            rc, message = resume_outcome(TINY)
        except subprocess.TimeoutExpired:
            pytest.fail(f"case {case} hung")
        assert rc == 0 or (rc == 2 and ("mica: error:" not in message or one_sentence(message))), (case, message)
        outcomes[rc] = outcomes.get(rc, 0) + 1
    assert outcomes.get(2, 0) > cases * 2 // 3, outcomes


def test_a_resume_from_a_damaged_checkpoint_changes_no_byte_of_the_runs_metrics(work):
    """A resume drops metrics.jsonl's rows after its checkpoint (the resume writes them again); a
    checkpoint whose tensor bytes changed is refused first, so no row is lost to a resume that
    never ran."""
    train(TINY)
    before = open("out-shakespeare-char/metrics.jsonl", "rb").read()
    st = checkpoint.SafeTensors(CKPT)
    _, shape, offset = st.info("transformer.wte.weight")
    data = bytearray(open(CKPT, "rb").read())
    data[offset + 5] ^= 0x40
    open(CKPT, "wb").write(bytes(data))
    rc, message = resume_outcome(TINY)
    assert rc == 2 and "is corrupt: tensor transformer.wte.weight does not match its checksum" in message, message
    assert open("out-shakespeare-char/metrics.jsonl", "rb").read() == before


def test_metrics_that_cannot_be_written_are_said_once_and_training_goes_on(work):
    os.makedirs("out-shakespeare-char")
    os.symlink("/dev/full", "out-shakespeare-char/metrics.jsonl")  # every write: No space left on device
    r = train(TINY)
    assert r.stderr.count("mica: warning: cannot write") == 1 and "No space left on device" in r.stderr, r.stderr
    assert "iter 3: loss" in r.stdout
    checkpoint.SafeTensors(CKPT).read("transformer.wte.weight")  # the checkpoint is whole


def test_a_damaged_cached_trainer_is_rebuilt_not_run(work, monkeypatch, tmp_path):
    monkeypatch.setenv("MICA_CACHE", str(tmp_path / "cache"))

    def prepare():  # (one call site: the programs' source names the line that traced them)
        return run.prepare_run(TINY[0], TINY[1:], **QUIET)

    exe, _, _ = prepare()
    whole = os.path.getsize(exe)
    with open(exe, "r+b") as f:
        f.truncate(1000)
    exe2, manifest, _ = prepare()
    assert exe2 == exe and os.path.getsize(exe) == whole
    assert subprocess.run([exe, manifest], capture_output=True).returncode == 0


def test_a_second_run_into_the_same_out_dir_is_refused_while_the_first_trains(work):
    """Also a resume there, before the first run has saved anything: the run is named, not the
    checkpoint it has not written yet."""
    exe, manifest, _ = run.prepare_run(TINY[0], [*TINY[1:], "--max_iters=100000000", "--eval_interval=100000000",
                                                 "--out_dir=busy"], **QUIET)
    p = subprocess.Popen([exe, manifest], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, close_fds=False)
    try:
        p.stdout.readline()  # it runs, holding the lock it inherited
        for fd in files._LOCKS.values():  # the lock is the trainer's alone now
            os.close(fd)
        files._LOCKS.clear()
        r = mica("train", *TINY, "--out_dir=busy", cwd=work)
        assert r.returncode == 2 and "another mica train is running in busy; wait" in r.stderr, r.stderr
        r = mica("train", *TINY, "--out_dir=busy", "--init_from=resume", cwd=work)
        assert r.returncode == 2 and r.stderr.strip() == "mica: error: another mica train is running in busy and has " \
            "saved no checkpoint there yet; wait for it to finish (or stop it), then resume", r.stderr
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=30)
    assert train(TINY).returncode == 0  # free again


def test_resume_takes_the_model_from_the_checkpoint_and_new_batch_settings_start_afresh(work):
    train([*TINY, "--max_iters=2"])
    notes = []
    exe, manifest, cfg = run.prepare_run(TINY[0], [*TINY[1:], "--max_iters=4", "--init_from=resume", "--n_layer=3",
                                                    "--block_size=32", "--batch_size=4"], log=notes.append)
    assert cfg["n_layer"] == 1 and cfg["block_size"] == 16  # as nanoGPT's resume: the checkpoint's model
    assert any("the checkpoint's model settings: n_layer=1 (not 3), block_size=16 (not 32)" in n for n in notes), notes
    assert any("batches start afresh" in n for n in notes), notes  # 4 rows now, 2 in the checkpoint
    r = subprocess.run([exe, manifest], capture_output=True, text=True)
    assert r.returncode == 0 and "iter 4: loss" in r.stdout, r.stderr


@pytest.mark.parametrize("edit", [(b'"iter_num":"2"', b'"iter_num":"9"'), (b'"best_val_loss":"4', b'"best_val_loss":"1')])
def test_a_changed_value_in_the_checkpoints_metadata_is_refused(work, edit):
    train([*TINY, "--max_iters=2"])
    raw = open(CKPT, "rb").read()
    assert edit[0] in raw
    open(CKPT, "wb").write(raw.replace(edit[0], edit[1], 1))
    rc, message = resume_outcome(TINY)
    assert rc == 2 and "its metadata (iteration, best loss, batch generator, config) does not match" in message, message


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.update({"transformer.h.0.ln_3.weight": t.pop("transformer.h.0.ln_2.weight")}),
     "missing transformer.h.0.ln_2.weight; unknown transformer.h.0.ln_3.weight"),
    (lambda t: t.update({"transformer.wpe.weight": t["transformer.wpe.weight"].astype(np.int32)}),
     "transformer.wpe.weight is int32[16, 16] where [16, 16] float32 or float16 or bfloat16 belongs"),
])
def test_export_refuses_a_checkpoint_that_is_not_the_gpt_it_says(work, edit, needle):
    pytest.importorskip("torch")
    train([*TINY, "--max_iters=2"])
    st = checkpoint.SafeTensors(CKPT)
    tensors = {n: st.read(n) for n in st.names}
    edit(tensors)
    checkpoint.write(CKPT, tensors, dict(st.metadata))
    r = mica("export", "out-shakespeare-char", "--to", "x.pt", cwd=work)
    assert r.returncode == 2 and one_sentence(r.stderr) and needle in r.stderr, r.stderr
    assert not os.path.exists("x.pt")
