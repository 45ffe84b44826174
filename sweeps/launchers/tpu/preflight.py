"""The pod's preflight: what sweeps/launchers/tpu/probe.py is asked on every worker VM (probe_args), the problems its
answers show, one line each naming the worker and the fix (problems), and the table of what each VM has (table):
the interpreter and its version, torch/torch_xla/libtpu as `preflight.expect` says and the same on every VM, the
code version (this checkout's), the chips visible and not held open, the control-plane port free on worker 0 and
reachable from every other, the dataset on every VM with one fingerprint (or buildable: generated data), free disk,
and on every VM where a trial's rank 0 runs: the checkpoint location writable, the study storage opened as the job
opens it, and W&B logging where this machine does. TpuPodLauncher.preflight runs it; `python -m sweeps.preflight`
and the driver ask the launcher."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contracts.wandb_runs import resolve_mode
from storage import resolve_url
from storage.url import is_postgres
from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import PreflightReport
from sweeps.launchers.slots import LIBTPU_PORTS
from sweeps.launchers.tpu.ask import Answer, Pod, ask_workers, go_after
from sweeps.launchers.tpu.shell import VENV_FIX, min_python

PACKAGES = ("torch", "torch_xla", "libtpu", "trm-sweeps")


def rank0_workers(launcher: Pod) -> list[int]:
    """The VMs where a trial's rank 0 runs: the first worker of each slot (slots=pod: worker 0; vm, chips:N: every
    VM). Rank 0 writes the checkpoints, reports to the study and opens the W&B run."""
    return sorted({(slot.workers or tuple(launcher.worker_ids()))[0] for slot in launcher.slots()})


def chips_glob(sweep: SweepConfig, launcher: Pod) -> str:
    """Where a VM's chips are: preflight.chips_glob, else its family's device files (v4 and v5+ differ)."""
    return sweep.preflight.chips_glob or launcher.shape().chip_family.device_glob


def probe_args(sweep: SweepConfig, launcher: Pod, train: Mapping[str, Any]) -> dict[str, Any]:
    """What the probe checks on each VM. `train` is the trials' training config as composed (conf/train.yaml):
    its data block depends on the dataset chosen, which no one schema types (contracts.hydra_app.train_values)."""
    data, settings, trial = train["data"], sweep.preflight, sweep.trial
    url = resolve_url(sweep.storage.url, create_dir=False)
    return {
        "packages": list(PACKAGES),
        "chips_glob": chips_glob(sweep, launcher),
        "data_path": None if data.get("source") == "generate" else str(data.get("path")),  # generated: built on the VM
        "splits": ["train", "test"],
        "checkpoint_url": trial.checkpoint_root or trial.run_root or "runs",
        "port": int(train["runtime"]["port"]),
        "reach_s": settings.reach_s,
        "ready_wait_s": go_after(settings.timeout_s, settings.reach_s),
        "peers": len(launcher.worker_ids()) - 1,
        "rank0_workers": rank0_workers(launcher),
        # A SQLite file is refused before this (sweeps.validation.validate): only a server is asked for, as the job opens it.
        "storage": {
            "url": url,
            "password_env": sweep.storage.password_env or None,
            "timeout_s": int(settings.reach_s) + 1,
        }
        if is_postgres(url)
        else None,
        "wandb_mode": sweep.wandb.mode if sweep.wandb.enabled else None,
        "env": {str(k): str(v) for k, v in launcher.env.items()},  # the job's exports (the slot's: topology only)
    }


def problems(  # noqa: C901, PLR0915 (a check per problem it names, in the table's order)
    answers: list[Answer], sweep: SweepConfig, launcher: Pod, train: Mapping[str, Any]
) -> list[str]:
    """One line per problem: `worker N: what is wrong: the fix`. `train` as in probe_args."""
    from contracts.code_version import code_fingerprint

    settings, trial = sweep.preflight, sweep.trial
    shape = launcher.shape()
    here = resolve_mode(sweep.wandb.mode) if sweep.wandb.enabled else None  # this machine's W&B mode
    out = []
    if shape.state != "READY":
        out.append(
            f"slice {shape.label()}: state {shape.state}, not READY (gcloud compute tpus tpu-vm describe): wait for "
            "READY, or start or recreate it"
        )
    expect = {k: v for k, v in (settings.expect or {}).items() if v is not None}
    ours = code_fingerprint()
    port = int(train["runtime"]["port"])
    first = next((a.facts for a in answers if a.facts), None)
    # The others whose connection to "worker 0" succeeded: worker 0 should have seen each of them.
    reached_zero = sum(
        1 for a in answers if a.worker != 0 and a.facts and a.facts.get("port", {}).get("reach", 0) is None
    )
    for answer in answers:
        w, f = answer.worker, answer.facts
        if f is None:
            out.append(f"worker {w}: {answer.error}: check that it answers `gcloud compute tpus tpu-vm ssh`")
            continue
        if tuple(map(int, f["python"].split(".")[:2])) < tuple(map(int, min_python().split("."))):
            out.append(
                f"worker {w}: launcher.python={launcher.python!r} is Python {f['python']}, older than "
                f"{min_python()}: " + VENV_FIX.format(v=min_python())
            )
            continue  # nothing of the project can run there: the rest would only repeat it
        for name, want in expect.items():
            if str(f["versions"].get(name)).split("+")[0] != str(want).split("+")[0]:  # 2.9.0+cpu is release 2.9.0
                out.append(
                    f"worker {w}: {name} {f['versions'].get(name)}, expected {want} (preflight.expect.{name}): "
                    "install trm-sweeps[tpu] in launcher.python's environment"
                )
        for name in ("torch_xla", "libtpu"):
            if first and f["versions"].get(name) != first["versions"].get(name):
                out.append(f"worker {w}: {name} {f['versions'].get(name)}, worker 0 has {first['versions'].get(name)}")
        if f["code"] != ours:
            out.append(
                f"worker {w}: its trm code differs from this checkout's ({str(f['code'])[:40]}): "
                "launcher.deploy=true installs this version"
            )
        chips, holders = f["chips"]
        if chips != shape.chips_per_vm:
            out.append(
                f"worker {w}: {chips} TPU chip(s) at {chips_glob(sweep, launcher)}, but slice {shape.label()} has "
                f"{shape.chips_per_vm} per VM"
            )
        hosts = f.get("hosts") or []
        if hosts and len(hosts) != shape.workers:
            out.append(
                f"worker {w}: its TPU metadata names {len(hosts)} worker(s) ({', '.join(hosts)}), but slice "
                f"{shape.label()} has {shape.workers}: the VM belongs to another slice, or a stale "
                "TPU_WORKER_HOSTNAMES is in its environment"
            )
        if holders:
            out.append(f"worker {w}: its chips are open in pid(s) {holders} (a job left running?): stop them first")
        if f["worker"] is None:
            out.append(
                f"worker {w}: cannot tell which worker of the TPU it is (no TPU_WORKER_ID, and torch_xla could not "
                "read the TPU's metadata), so neither can the job: install trm-sweeps[tpu] in launcher.python's "
                "environment; the control-plane port was not checked"
            )
        elif f["worker"] != w:
            out.append(
                f"worker {w}: calls itself worker {f['worker']} (TPU_WORKER_ID or the TPU's metadata): the job would "
                "take that rank; unset a stale TPU_WORKER_ID in the VM's environment"
            )
        reach = f.get("port", {})  # none when the worker could not tell which it is
        if reach.get("bind"):
            out.append(
                f"worker {w}: runtime.port={port} cannot be bound ({reach['bind']}): pick a free runtime.port "
                f"(not libtpu's {', '.join(map(str, LIBTPU_PORTS))})"
            )
        if w == 0 and "peers" in reach and reach["peers"] < reached_zero:
            out.append(
                f"worker 0: {reach['peers']} connection(s) on runtime.port={port}, but {reached_zero} worker(s) "
                "say they reached worker 0 there: they reached another host (the first of TPU_WORKER_HOSTNAMES or "
                "of the TPU's metadata is not this VM)"
            )
        if reach.get("reach"):
            out.append(
                f"worker {w}: cannot reach worker 0 on runtime.port ({reach['reach']}): the VPC must allow TCP "
                "between the TPU's VMs on runtime.port and ephemeral ports (gloo's)"
            )
        if f["data"] is not None:
            missing = [s for s, fp in f["data"].items() if fp is None]
            if missing:
                out.append(
                    f"worker {w}: no dataset at {train['data']['path']} ({', '.join(missing)}) under launcher.remote_dir: "
                    f"build it on every VM (python -m trm.data.build ... --out {train['data']['path']}, same arguments on each)"
                )
            elif first and first["data"] and f["data"] != first["data"]:
                out.append(
                    f"worker {w}: the dataset at {train['data']['path']} differs from worker 0's: build it again"
                )
        if f.get("checkpoint"):
            out.append(
                f"worker {w}: cannot write the checkpoint location {trial.checkpoint_root!r} "
                f"({f['checkpoint']}); for gs:// install gcsfs (trm-sweeps[tpu]) and grant the VM's service account"
            )
        out += _rank0_problems(w, f, sweep, here)
        if f["free_gb"] < settings.min_free_gb:
            out.append(f"worker {w}: {f['free_gb']} GB free under launcher.remote_dir (preflight.min_free_gb)")
    return out


# An ssh session carries none of the driver's environment but LANG and LC_*: what rank 0 needs there is the VM's own.
VM_CREDENTIALS = "gcloud's ssh carries none of this machine's credentials"


def _rank0_problems(w: int, f: dict[str, Any], sweep: SweepConfig, here: str | None) -> list[str]:
    """What keeps a trial's rank 0 on worker `w` from reporting to the study or logging where this machine does."""
    out = []
    if f.get("storage"):
        out.append(
            f"worker {w}: rank 0 cannot open the study storage there ({f['storage']}); {VM_CREDENTIALS}: give each "
            "VM the password in its own ~/.pgpass (mode 0600; then unset storage.password_env) and a storage.url "
            "host it reaches (not this machine's localhost)"
        )
    wandb = f.get("wandb")
    if wandb and wandb["mode"] == "online" and not wandb["key"]:
        out.append(
            f"worker {w}: W&B finds no API key there, so rank 0's wandb.init fails in mode online; {VM_CREDENTIALS}: "
            "run `wandb login` on every VM"
        )
    elif wandb and here == "online" and wandb["mode"] != "online":
        why = f"its WANDB_MODE says {wandb['mode']}" if wandb["key"] else "no WANDB_API_KEY, no `wandb login`"
        out.append(
            f"worker {w}: W&B would log {wandb['mode']} there ({why}) while this machine logs online, so the "
            f"trials' runs would not reach W&B; {VM_CREDENTIALS}: run `wandb login` on every VM, or set "
            f"wandb.mode={wandb['mode']}"
        )
    return out


def table(answers: list[Answer], described: Sequence[str]) -> str:
    """A row per worker; its last column the slice's workers as that VM sees them (TPU_WORKER_HOSTNAMES or
    torch_xla's get_worker_ips()), else as `tpu-vm describe` lists them (`described`, marked so)."""
    rows = [("worker", "python", "torch", "torch_xla", "libtpu", "trm-sweeps", "chips", "free GB", "worker IPs")]
    fallback = ",".join(described) + " (describe)"
    for a in answers:
        f = a.facts
        if f is None:
            rows.append((str(a.worker), "-", "-", "-", "-", "-", "-", "-", fallback))
            continue
        v = f["versions"]
        chips = f"{f['chips'][0]}" + (" busy" if f["chips"][1] else "")
        hosts = ",".join(f.get("hosts") or []) or fallback
        rows.append((str(a.worker), f["python"], *(str(v.get(p)) for p in PACKAGES), chips, str(f["free_gb"]), hosts))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(n) for c, n in zip(r, widths)).rstrip() for r in rows)


def preflight(sweep: SweepConfig, launcher: Pod, train: Mapping[str, Any] | None = None) -> PreflightReport:
    """The table and the problems of the pod `sweep` names (its launcher already validated); `train` the trials'
    training config, composed here when not given."""
    from contracts.hydra_app import train_values

    train = train_values(list(sweep.trial.overrides)) if train is None else train
    answers = ask_workers(launcher, probe_args(sweep, launcher, train), sweep.preflight.timeout_s)
    shape = launcher.shape()
    return PreflightReport(
        shape.line() + "\n" + table(answers, shape.worker_ips), problems(answers, sweep, launcher, train)
    )
