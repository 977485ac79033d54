"""Files the user names: a folder Mica will write into, a text file it will read. Every problem
is one sentence (MicaError) saying which path and what to do."""
import contextlib
import os
import tempfile

from .errors import MicaError


def writable_folder(path, what="output folder"):
    """Create `path` if needed and prove it can be written (a probe file is created and removed),
    so a run fails here, before any work, rather than at its first checkpoint."""
    if not path:
        raise MicaError(f"the {what} is empty; give the path of a folder")
    if os.path.exists(path) and not os.path.isdir(path):
        if not os.path.isfile(path):  # (a device such as /dev/null, a pipe or a socket: never to be removed)
            raise MicaError(f"{what} {path} is not a folder (a device or other special file); choose a folder's path")
        raise MicaError(f"{what} {path} exists and is a file, not a folder; remove it or choose another path")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise MicaError(f"cannot create the {what} {path} ({e.strerror}); choose a folder you can write to") from None
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".mica-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise MicaError(f"cannot write into the {what} {path} ({e.strerror}); choose a folder you can write "
                        "to") from None
    return path


_LOCKS = {}  # folder -> the descriptor holding its lock (inherited by the trainer across exec)


def _take_lock(fd):
    """Take the run lock on the open `fd` at once, or say False: another open of the file holds it."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def lock_run_folder(out_dir, doing="train into", owner=None):
    """One command at a time writes a run's folder: a second `mica train` (or a `mica import`) would
    overwrite the first's checkpoints. The lock is held until this process ends; a trainer holds it
    itself (the descriptor survives exec), so it lasts as long as the run."""
    key = os.path.realpath(out_dir)
    if key in _LOCKS:  # this process prepares again (tests, mica check): its own earlier lock goes
        os.close(_LOCKS.pop(key))
    fd = os.open(os.path.join(out_dir, ".mica.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    if not _take_lock(fd):
        os.close(fd)
        raise MicaError(f"another mica train is running in {out_dir}; wait for it to finish or {doing} another "
                        "folder")
    os.set_inheritable(fd, True)
    _LOCKS[key] = fd
    # who holds it, for the other ranks of an mpirun job (wait_for_run_lock); never an earlier job's name
    os.ftruncate(fd, 0)
    if owner is not None:
        os.pwrite(fd, owner.encode(), 0)


def wait_for_run_lock(out_dir, owner, timeout, alone_after=60.0):
    """A rank other than 0 of an mpirun job writes into `out_dir` only once its own rank 0 holds the
    folder's run lock (lock_run_folder with the same `owner`, the job's identity, written in the lock
    file): never into a folder another run holds, and it never creates or removes the folder itself.
    Waits at most `timeout` seconds (rank 0 checks the same data first, and takes the lock before
    compiling); the lock is only read here, never taken, so rank 0's attempt cannot meet this one.
    Returns True, or False when no lock file has appeared in `alone_after` seconds: this rank's
    out_dir is not rank 0's (another machine's own disk), and no run holds it."""
    import time

    path = os.path.join(out_dir, ".mica.lock")
    start = time.monotonic()
    deadline, seen = start + timeout, False
    while True:
        try:
            with open(path, "rb") as f:
                seen = True
                if f.read(4096) == owner.encode():
                    return True
        except OSError:
            pass
        if not seen and time.monotonic() > start + min(alone_after, timeout):
            return False
        if time.monotonic() > deadline:
            raise MicaError(f"rank 0 of this mpirun job did not take the out_dir {out_dir} within {timeout:g} s (it "
                            "failed, or another run holds that folder); see rank 0's message")
        time.sleep(0.05)


def run_folder_in_use(out_dir):
    """Whether another command holds `out_dir`'s run lock now (a run training there)."""
    try:
        fd = os.open(os.path.join(out_dir, ".mica.lock"), os.O_RDONLY)
    except OSError:
        return False
    try:
        return not _take_lock(fd) and os.path.realpath(out_dir) not in _LOCKS  # (another process's, not ours)
    finally:
        os.close(fd)


@contextlib.contextmanager
def no_empty_folders_left(*paths):
    """Folders among `paths` (and their parents) that this command creates are removed again if it
    fails while they are still empty (or hold only the run lock this command took in them): a
    failed command leaves no trace behind."""
    made = []  # (folder, the nearest ancestor that already existed)
    for p in paths:
        if p and not os.path.exists(p):
            top = os.path.abspath(p)
            while not os.path.exists(os.path.dirname(top)):
                top = os.path.dirname(top)
            made.append((os.path.abspath(p), os.path.dirname(top)))
    try:
        yield
    except BaseException:
        for path, stop in made:
            if os.path.realpath(path) in _LOCKS and os.path.isdir(path) and os.listdir(path) == [".mica.lock"]:
                os.unlink(os.path.join(path, ".mica.lock"))  # (the folder is this command's, and so is its lock)
            while path != stop and os.path.isdir(path):
                try:
                    os.rmdir(path)  # (only an empty folder goes)
                except OSError:
                    break
                path = os.path.dirname(path)
        raise


def missing(path):
    """Why os.path.exists(path) is False, as the end of a clause: "does not exist", or for a link
    whose target is missing (or a loop of links) that link's target."""
    if os.path.islink(path):
        try:
            return f"is a link to {os.readlink(path)}, which does not exist (or is a loop of links)"
        except OSError:
            pass
    return "does not exist"


def read_text(path, what="file"):
    """The UTF-8 text of `path`, or a sentence: missing, a folder, a device (/dev/zero would fill the
    memory) or a socket, unreadable, or not UTF-8 (with the line of the first bad byte). A pipe is
    read (`<(...)` in a shell gives one)."""
    import stat

    if not os.path.exists(path):
        where = "" if os.path.isabs(path) else f" (a relative path starts in {os.getcwd()})"
        raise MicaError(f"{what} {path} {missing(path)}; check the path{where}")
    if os.path.isdir(path):
        raise MicaError(f"{what} {path} is a folder, not a file; give the path of the file in it")
    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise MicaError(f"{what} {path} is a device or a socket, not a file; give the path of a text file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise MicaError(f"cannot read {what} {path} ({e.strerror})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise MicaError(f"{what} {path} is not UTF-8 text: byte 0x{raw[e.start]:02x} at {path}:{line} "
                        f"(offset {e.start:,}); save it as UTF-8") from None


def atomic_write(path, data, sync=False):
    """`data` (bytes, or a function writing into the open file) into `path` through a temporary
    file renamed over it: a reader sees the old file or the new one, and a failure (a full disk, a
    read-only folder) leaves no partial file behind; `sync`: on the disk before the rename."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "wb") as f:
            data(f) if callable(data) else f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise MicaError(f"cannot write {path} ({e.strerror or e}); check that its folder is writable and the disk "
                        "has room (nothing was replaced)") from None
