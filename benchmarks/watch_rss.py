"""Run one command under a memory watchdog: poll the process tree's RSS every 0.2 s, kill the tree at
LIMIT MiB (or if the machine's MemAvailable falls under FLOOR MiB); record the main process's VmHWM
(the last image's, as mica bench reads it), the tree's peak RSS, wait4's ru_maxrss, and every
output line stamped with seconds since the start. Before starting it waits until MemAvailable is
NEED_MIB + 3 GiB (a shared machine: never swap, never OOM).

    python benchmarks/watch_rss.py NAME NEED_MIB -- CMD ...   (WATCH_LIMIT_MIB, WATCH_TIMEOUT_S, WATCH_OUT)
"""
import json, os, signal, subprocess, sys, threading, time

LIMIT_MIB = int(os.environ.get("WATCH_LIMIT_MIB", 19 * 1024))
TIMEOUT_S = float(os.environ.get("WATCH_TIMEOUT_S", 10 ** 9))
FLOOR_MIB = 1024
name, need = sys.argv[1], int(sys.argv[2])
cmd = sys.argv[sys.argv.index("--") + 1:]
outdir = os.environ.get("WATCH_OUT", "benchmarks/results/watch")
os.makedirs(outdir, exist_ok=True)


def avail():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024


waited = 0
while avail() < need + 3072:
    if waited == 0:
        print(f"[watch] waiting: {avail()} MiB available, need {need + 3072}", flush=True)
    time.sleep(10)
    waited += 10
    if waited > 1800:
        print("[watch] gave up waiting for memory", flush=True)
        sys.exit(5)


def tree(pid):
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += kids.get(q, [])
    return out


def status(pid, key):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(key):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return 0


t0 = time.time()
log = open(f"{outdir}/{name}.log", "w")
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                        start_new_session=True)
state = dict(tree_peak=0, hwm=0, exe=None, killed=None, min_avail=avail())


done = threading.Event()


def poll():
    while not done.is_set():
        pids = tree(proc.pid)
        rss = sum(status(p, "VmRSS:") or 0 for p in pids) // 1024
        state["tree_peak"] = max(state["tree_peak"], rss)
        try:
            exe = os.readlink(f"/proc/{proc.pid}/exe")
            if exe != state["exe"]:
                state["exe"], state["hwm"] = exe, 0
            h = status(proc.pid, "VmHWM:")
            if h:
                state["hwm"] = max(state["hwm"], h)
        except OSError:
            pass
        a = avail()
        state["min_avail"] = min(state["min_avail"], a)
        late = time.time() - t0 > TIMEOUT_S
        if rss >= LIMIT_MIB or a < FLOOR_MIB or late:
            why = f"tree RSS {rss} MiB" if rss >= LIMIT_MIB else f"MemAvailable {a} MiB" if a < FLOOR_MIB else \
                f"over {TIMEOUT_S:.0f} s"
            state["killed"] = f"killed at {rss} MiB after {time.time() - t0:.0f} s ({why})"
            os.killpg(proc.pid, signal.SIGKILL)
            return
        time.sleep(0.2)


th = threading.Thread(target=poll, daemon=True)
th.start()
for line in proc.stdout:
    s = f"{time.time() - t0:8.1f} {line}"
    log.write(s)
    log.flush()
    sys.stdout.write(s)
    sys.stdout.flush()
_, rc, ru = os.wait4(proc.pid, 0)
done.set()
th.join()
res = dict(name=name, cmd=cmd, rc=os.waitstatus_to_exitcode(rc), wall_s=time.time() - t0,
           vmhwm_mib=state["hwm"] / 1024, tree_peak_rss_mib=state["tree_peak"], ru_maxrss_mib=ru.ru_maxrss / 1024,
           killed=state["killed"], min_available_mib=state["min_avail"], program=state["exe"])
json.dump(res, open(f"{outdir}/{name}.json", "w"), indent=1)
print("[watch]", json.dumps(res), flush=True)
