"""What sweeps.preflight runs on each worker VM: the facts first contact needs, printed as one JSON line.

Sent as source text (`python -c`), so it runs before the project is installed there and on an interpreter too
old for it: the standard library (the project and torch_xla only in guarded imports: what fails is a fact to
report), no syntax newer than Python 3.8. It reports; sweeps/preflight.py judges.
Identity: TPU_WORKER_ID where the environment has it (GKE, the tests' stand-in pod), else the TPU's metadata
through torch_xla, as the job finds its rank (trm/runtime/base.py): a TPU VM's ssh session has no such variable.
Reachability: worker 0 listens on the control-plane port while the others connect to it, all within `reach_s`,
counted from the driver's `go`: each probe prints READY once its other facts are in and waits for `go` on its stdin
(the driver sends it once every worker is ready, sweeps/launchers/tpu/ask.py), so VMs whose gcloud started seconds apart
still meet. Without a `go` (stdin at its end, or `ready_wait_s` passed) the window counts from its own start.
Where a trial's rank 0 will run (`rank0`): the checkpoint location written, the study storage opened and the W&B
mode resolved as the job does it there, with this VM's own environment (an ssh session carries none of the
driver's: its credentials must be the VM's).
"""

import contextlib
import glob
import json
import os
import shutil
import socket
import sys
import time
import uuid

MARK = "PREFLIGHT "  # the line sweeps/preflight.py reads back (a login banner may print before it)
READY = "PREFLIGHT-READY"  # this VM's facts are in: it waits for the driver's `go` to check the port


def _version(name):
    try:
        from importlib import metadata

        return metadata.version(name)
    except Exception:
        return None


def _code():
    try:
        from contracts.code_version import code_fingerprint

        return code_fingerprint()
    except Exception as err:
        return "unimportable: " + str(err).splitlines()[0][:120] if str(err) else "unimportable"


def _chips(pattern):
    """The chips' device files, and the pids holding any of them open (a job that still runs, another user's)."""
    chips = sorted(glob.glob(os.path.expanduser(pattern)))
    real = {os.path.realpath(c) for c in chips}
    holders = set()
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        try:
            for fd in os.listdir(fd_dir):
                if os.path.realpath(os.path.join(fd_dir, fd)) in real:
                    holders.add(int(fd_dir.split("/")[2]))
        except OSError:
            continue
    holders.discard(os.getpid())
    return len(chips), sorted(holders)


def _dataset(path, splits):
    found = {}
    for split in splits:
        meta = os.path.join(os.path.expanduser(path), split, "dataset.json")
        try:
            with open(meta) as f:
                found[split] = json.load(f).get("fingerprint")
        except (OSError, ValueError):
            found[split] = None
    return found


def _writable(url):
    """Why a checkpoint save to `url` would fail here, or None. The steps of a save (trm/checkpoints/checkpoint.py
    `put`), on a name of the probe's own beside the run's files: make the directory, write `<name>.tmp`, read it
    back, move it over `<name>`, then delete it. On an object store each is a permission of its own (gs://:
    storage.objects.create, get, delete: a move is a copy and a delete; makedirs creates a missing bucket), so a
    write and a delete alone pass where a save fails at its read-back, and fail where a save creates the bucket."""
    name = ".preflight-" + uuid.uuid4().hex[:8]
    data = ("preflight " + name).encode()
    fs = target = None
    try:
        if "://" in url:
            import fsspec

            fs, root = fsspec.core.url_to_fs(url)
            target = root.rstrip("/") + "/" + name
            fs.makedirs(root, exist_ok=True)
            with fs.open(target + ".tmp", "wb") as f:
                f.write(data)
            with fs.open(target + ".tmp", "rb") as f:
                _same(f.read(), data)
            fs.mv(target + ".tmp", target)
            fs.rm(target)
        else:
            root = os.path.expanduser(url)
            target = os.path.join(root, name)
            os.makedirs(root, exist_ok=True)
            with open(target + ".tmp", "wb") as f:
                f.write(data)
            with open(target + ".tmp", "rb") as f:
                _same(f.read(), data)
            os.replace(target + ".tmp", target)
            os.remove(target)
        return None
    except Exception as err:
        for left in (target + ".tmp", target) if target else ():  # what the failed step left: not the run's
            with contextlib.suppress(Exception):
                if fs is not None:
                    fs.rm(left)
                else:
                    os.remove(left)
        return type(err).__name__ + ": " + (str(err).splitlines() or [""])[0][:200]


def _same(back, written):
    if back != written:
        raise OSError(f"read back {len(back)} bytes that differ from the {len(written)} written")


def _study_storage(spec):
    """Why rank 0 could not reach the study's database from here as the job does (storage.check_reachable: this
    VM's password variable or ~/.pgpass, a server it reaches), or None."""
    try:
        from storage.engine import check_reachable
    except Exception:
        return None  # the project does not import here: the code check reports that
    try:
        check_reachable(spec["url"], password_env=spec["password_env"], connect_timeout_s=spec["timeout_s"])
        return None
    except Exception as err:  # a StorageError line is redacted (storage.engine); an import error holds no URL
        return (str(err).splitlines() or [type(err).__name__])[0][:400]


def _wandb(mode):
    """The W&B mode the job resolves here and whether W&B finds an API key here (None: the project does not
    import, which the code check reports)."""
    try:
        from contracts.wandb_runs import api_key_found, resolve_mode
    except Exception:
        return None
    return {"mode": resolve_mode(mode), "key": api_key_found()}


def _worker():
    """This VM's worker id, or None when neither the environment nor the TPU's metadata tells."""
    value = os.environ.get("TPU_WORKER_ID", "").strip()
    if value:
        return int(value)
    try:
        from torch_xla._internal import tpu

        return int(tpu.worker_id())
    except Exception:
        return None


def _hosts():
    hosts = [h.strip() for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if hosts:
        return hosts
    try:  # a TPU VM without the variables: torch_xla reads the pod's metadata
        from torch_xla._internal import tpu

        return tpu.get_worker_ips()
    except Exception:
        return []


def _port(worker, port, reach_s, peers):
    """Worker 0: whether the port binds and how many peers connected; others: whether worker 0 answered."""
    hosts = _hosts()
    if worker == 0:
        server = socket.socket()
        # As c10d's TCPStore binds: a port whose last connections linger in TIME_WAIT (a job just stopped) binds.
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("0.0.0.0", port))
        except OSError as err:
            server.close()
            return {"bind": str(err)}
        server.listen(max(peers, 1))
        server.settimeout(0.2)
        seen, deadline = 0, time.monotonic() + reach_s
        while seen < peers and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                conn.recv(1)  # the peer closes first: its side keeps TIME_WAIT, so the job can bind the port next
                conn.close()
                seen += 1
            except OSError:
                pass
        server.close()
        return {"bind": None, "peers": seen}
    if not hosts:
        return {"reach": "no worker hostnames (TPU_WORKER_HOSTNAMES or the TPU metadata)"}
    deadline, last = time.monotonic() + reach_s, "timed out"
    while time.monotonic() < deadline:
        try:
            socket.create_connection((hosts[0], port), timeout=1).close()  # closed first (see above)
            return {"reach": None}
        except OSError as err:
            last = str(err)
            time.sleep(0.2)
    return {"reach": f"{hosts[0]}:{port}: {last}"}


def _wait_for_go(wait_s):
    """Until the driver's `go` line, the end of stdin, or `wait_s` seconds: whichever comes first."""
    import select

    print(READY, flush=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sys.stdin], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return
        line = sys.stdin.readline()
        if not line or line.strip() == "go":
            return


def main(args):
    worker = _worker()
    facts = {
        "worker": worker,
        "python": ".".join(str(n) for n in sys.version_info[:3]),
        "versions": {name: _version(name) for name in args["packages"]},
        "code": _code(),
        "chips": _chips(args["chips_glob"]),
        "data": _dataset(args["data_path"], args["splits"]) if args["data_path"] else None,
        "free_gb": round(shutil.disk_usage(".").free / 1e9, 1),
        "hosts": _hosts(),  # this VM's own list of the slice's workers (TPU_WORKER_HOSTNAMES or get_worker_ips())
    }
    if worker is not None:  # a VM that cannot tell which it is would take worker 0's part: checked by none
        _wait_for_go(float(args.get("ready_wait_s", 0)))
        facts["port"] = _port(worker, int(args["port"]), float(args["reach_s"]), int(args["peers"]))
    # After the port: worker 0 listens at once while its peers try it for reach_s, and these may take that long.
    rank0 = worker in args["rank0_workers"]
    os.environ.update(args["env"])  # what the launcher exports in front of the job (launcher.env)
    facts["checkpoint"] = _writable(args["checkpoint_url"]) if rank0 else None
    facts["storage"] = _study_storage(args["storage"]) if rank0 and args["storage"] else None
    facts["wandb"] = _wandb(args["wandb_mode"]) if rank0 and args["wandb_mode"] else None
    print(MARK + json.dumps(facts), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
