"""Storage latency: what a study-storage round trip costs the training job and the sweep driver, on a real
PostgreSQL server, with our code path and plain Optuna side by side in the same run.

Two operation pairs, each op timed with time.perf_counter inside a client process:
  report+should_prune  the job's rank 0 at every eval. "ours": trm.links.trial.TrialLink(study, number, url)
                       .report(step, {objective: v}): it reads the trial state first (a trial no longer RUNNING
                       is abandoned), then reports and asks the Hyperband pruner it rebuilt from the study's
                       "pruner" attribute. "optuna-defaults": optuna.load_study(name, storage=<url string>,
                       pruner=HyperbandPruner(100, 500, 3)), optuna.trial.Trial(study, id).report + should_prune.
  ask+tell             the sweep driver. "ours": storage.open_storage(url, heartbeat 5 s, grace 30 s, retry
                       callback), ask through the driver's own sweeps.search.draw.draw_within_budget (the budget advisory
                       lock *and* its count over all trials, with a budget never reached), then tell.
                       "optuna-defaults": optuna.load_study(name, storage=<url string>), ask + tell.
                       Both RandomSampler and no suggest calls: what is timed is storage cost.

Plain Optuna gets the URL as postgresql+psycopg2://...: SQLAlchemy 2.1 maps postgresql:// to psycopg 3, which is
not installed (open_storage spells the driver out the same way).

Method (the machine is shared and noisy): a fresh database per run, dropped WITH (FORCE) at the end even on
error; one study per (operation, clients, setup), pre-populated with 50 COMPLETE trials of 5 intermediate values.
max(--clients) client processes (this file with --client) start once, so imports are paid once; in each phase
the first N of them open a fresh storage, run 3 untimed warm-up ops, wait for a common "go", run --ops timed ops,
then close their connections. Report steps are spread over the pruner's range (up to 500), so rungs are crossed
as in a real trial, and each round reports to fresh RUNNING trials. The two setups alternate within a round, the
order rotated per round; latencies are pooled over rounds. During each timed phase a parent thread polls
pg_stat_activity every 50 ms for the peak number of connections to the bench database; each client also reports
the connections its SQLAlchemy pool holds at the end.

    python -m bench.storage_latency                              # clients 1,8,32; 40 ops; 3 rounds
    python -m bench.storage_latency --quick --out-dir /tmp/sl    # smoke run: clients 1,2; 5 ops; 1 round

Server: --server-url, else $TRM_SWEEPS_TEST_PG, else postgresql://postgres@127.0.0.1:5432/postgres (it needs
CREATE DATABASE). Writes <out-dir>/storage_latency.json and storage_latency.md. The clients' side (what each op
is, and its timing) is bench/storage_latency_client.py; this module is the parent's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import psycopg2
from sqlalchemy.engine import make_url

import storage
from bench._results import RESULTS, cpu_facts, fmt, percentile, write_results
from bench.storage_latency_client import OBJECTIVE, PRUNER_SPEC, WARMUP_OPS, psycopg2_url, run_client
from storage.study_record import StudyAttrs

OPERATIONS = ("report+should_prune", "ask+tell")
SETUPS = ("ours", "optuna-defaults")
HISTORY_TRIALS, HISTORY_STEPS, POLL_S = 50, 5, 0.05
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def pg_connect(url: str) -> Any:
    """psycopg2 connection in autocommit (CREATE/DROP DATABASE cannot run in a transaction)."""
    args = make_url(url).translate_connect_args(username="user", database="dbname")
    conn = psycopg2.connect(**args, connect_timeout=10, application_name="trm-bench-parent")
    conn.autocommit = True
    return conn


def server_query(server_url: str, sql: str) -> Any:
    conn = pg_connect(server_url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchone()[0] if cur.description else None
    finally:
        conn.close()


def create_database(server_url: str) -> str:
    """A fresh database for this run (as tests/conftest.py does), so no earlier study is in the tables."""
    name = f"trm_bench_{os.getpid()}_{secrets.token_hex(4)}"
    server_query(server_url, f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


class ConnectionSampler(threading.Thread):
    """Peak connections to the bench database, polled every 50 ms; its own connection goes to the server's
    maintenance database, so it never counts itself."""

    def __init__(self, server_url: str, db_name: str):
        super().__init__(daemon=True)
        self.conn, self.db_name, self.peak, self.stop = pg_connect(server_url), db_name, 0, threading.Event()

    def start(self) -> None:
        """One poll before the thread starts: the clients are ready and hold their connections, and a phase of a
        few fast ops can end before a thread's first poll on a loaded machine (a peak of 0 was seen)."""
        self.poll()
        super().start()

    def poll(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.db_name,))
            self.peak = max(self.peak, cur.fetchone()[0])

    def run(self) -> None:
        while not self.stop.wait(POLL_S):
            self.poll()

    def finish(self) -> int:
        self.stop.set()
        self.join()
        self.conn.close()
        return self.peak


def prepare_study(parent: Any, name: str) -> None:
    """A study with a realistic history, so each query runs over populated tables."""
    study = optuna.create_study(study_name=name, storage=parent, direction="maximize")
    StudyAttrs(pruner=PRUNER_SPEC, objective=OBJECTIVE).store(study.set_user_attr)
    rng = random.Random(name)
    study.add_trials([
        optuna.trial.create_trial(value=rng.random(), intermediate_values={100 * (s + 1): rng.random() for s in range(HISTORY_STEPS)})
        for _ in range(HISTORY_TRIALS)
    ])  # fmt: skip


class Clients:
    """Client processes started once per run; a phase uses the first N of them."""

    def __init__(self, count: int):
        cmd = [sys.executable, "-m", "bench.storage_latency", "--client"]
        self.procs = [
            subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(count)
        ]

    def send(self, proc: subprocess.Popen, line: str) -> None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()

    def receive(self, proc: subprocess.Popen, what: str) -> str:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"client {proc.pid} exited (code {proc.wait()}) before sending {what}; its stderr is above"
            )
        return line.strip()

    def close(self, abort: bool) -> None:
        """EOF ends a client's loop; after an error, or if one does not exit in time, it is killed."""
        for proc in self.procs:
            if abort:
                proc.kill()
            proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def phase(self, spec: dict[str, Any], clients: int, server_url: str, trial_numbers: list[int]) -> dict[str, Any]:
        """N clients through warm-up, one common go, their timed ops; the peak connection count meanwhile."""
        procs = self.procs[:clients]
        for i, proc in enumerate(procs):
            self.send(
                proc, json.dumps({**spec, "index": i, "trial_number": trial_numbers[i] if trial_numbers else None})
            )
        for proc in procs:
            if (line := self.receive(proc, "ready")) != "ready":
                raise RuntimeError(f"client {proc.pid} said {line!r} instead of ready")
        sampler = ConnectionSampler(server_url, make_url(spec["db_url"]).database)
        sampler.start()
        try:
            for proc in procs:
                self.send(proc, "go")
            results = [json.loads(self.receive(proc, "its result")) for proc in procs]
        finally:
            peak = sampler.finish()
        assert not any(r["torch_imported"] for r in results), "a storage client imported torch"
        return {
            "latencies_s": [x for r in results for x in r["latencies_s"]],
            "span_s": max(r["end"] for r in results) - min(r["start"] for r in results),
            "peak_connections": peak, "pool_open": [r["pool_open"] for r in results], "storage_class": results[0]["storage_class"],
        }  # fmt: skip


def summarize(op: str, clients: int, setup: str, phases: list[dict[str, Any]], expected: int) -> dict[str, Any]:
    """Pool one setup's rounds into a row; a lost measurement fails here, not silently."""
    ms = [x * 1000 for p in phases for x in p["latencies_s"]]
    assert len(ms) == expected, f"{op} x{clients} {setup}: {len(ms)} latencies, expected {expected}"
    return {
        "operation": op, "clients": clients, "setup": setup, "n_ops": len(ms),
        "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "ops_per_s": len(ms) / sum(p["span_s"] for p in phases),
        "peak_connections": max(p["peak_connections"] for p in phases), "client_pool_open_max": max(max(p["pool_open"]) for p in phases),
        "storage_class": phases[0]["storage_class"] + (" + raw RDBStorage for the RUNNING check" if setup == "ours" and op.startswith("report") else ""),
        "rounds_p50_ms": [percentile([x * 1000 for x in p["latencies_s"]], 50) for p in phases],
    }  # fmt: skip


def render(rows: list[dict[str, Any]]) -> str:
    """One line per (operation, clients): the two setups side by side."""
    out = [
        "| operation | clients | ours p50 / p99 ms | defaults p50 / p99 ms | p50 defaults/ours | ours ops/s | defaults ops/s | ours peak conns | defaults peak conns |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {(r["operation"], r["clients"], r["setup"]): r for r in rows}
    for op, clients in dict.fromkeys((r["operation"], r["clients"]) for r in rows):
        a, b = by_key[op, clients, "ours"], by_key[op, clients, "optuna-defaults"]
        out.append(
            f"| {op} | {clients} | {fmt(a['p50_ms'])} / {fmt(a['p99_ms'])} | {fmt(b['p50_ms'])} / {fmt(b['p99_ms'])} "
            f"| {fmt(b['p50_ms'] / a['p50_ms'])} | {fmt(a['ops_per_s'], '.0f')} | {fmt(b['ops_per_s'], '.0f')} "
            f"| {a['peak_connections']} | {b['peak_connections']} |"
        )
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="1,8,32", help="concurrent client processes, comma-separated")
    p.add_argument("--ops", type=int, default=40, help="timed ops per client per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--server-url", default=os.environ.get("TRM_SWEEPS_TEST_PG") or DEFAULT_SERVER)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="clients 1,2; 5 ops; 1 round (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.clients, args.ops, args.rounds = "1,2", 5, 1
    args.clients = [int(c) for c in str(args.clients).split(",")]
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    began = time.monotonic()
    db_url = create_database(args.server_url)
    clients_pool = None
    try:
        parent = optuna.storages.RDBStorage(psycopg2_url(db_url))
        clients_pool = Clients(max(args.clients))
        phases: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
        for op in OPERATIONS:
            for clients in args.clients:
                names = {s: f"{op.split('+')[0]}_{clients}_{s}" for s in SETUPS}
                for name in names.values():
                    prepare_study(parent, name)
                for rnd in range(args.rounds):
                    for setup in SETUPS[rnd % 2 :] + SETUPS[: rnd % 2]:
                        running = (
                            []
                            if op == "ask+tell"
                            else [
                                optuna.load_study(study_name=names[setup], storage=parent).ask().number
                                for _ in range(clients)
                            ]
                        )
                        storage.close_storage(parent)  # the parent holds no connection during a phase
                        spec = {
                            "operation": op,
                            "setup": setup,
                            "study": names[setup],
                            "db_url": db_url,
                            "ops": args.ops,
                        }
                        phases.setdefault((op, clients, setup), []).append(
                            clients_pool.phase(spec, clients, args.server_url, running)
                        )
                        print(f"  {op} x{clients} round {rnd + 1} {setup}: done", file=sys.stderr, flush=True)
        rows = [summarize(op, c, s, ps, c * args.ops * args.rounds) for (op, c, s), ps in phases.items()]
        version = server_query(args.server_url, "SHOW server_version")
    finally:
        if clients_pool is not None:
            clients_pool.close(abort=sys.exc_info()[0] is not None)
        server_query(args.server_url, f'DROP DATABASE IF EXISTS "{make_url(db_url).database}" WITH (FORCE)')
    result = {
        "bench": "storage_latency", "machine": cpu_facts(), "server_version": version, "server_url": storage.redact(args.server_url),
        "config": {"clients": args.clients, "ops": args.ops, "rounds": args.rounds, "warmup_ops": WARMUP_OPS, "history_trials": HISTORY_TRIALS,
                   "history_steps": HISTORY_STEPS, "pruner": PRUNER_SPEC, "optuna": optuna.__version__},
        "wall_s": time.monotonic() - began, "rows": rows,
    }  # fmt: skip
    table = render(rows)
    write_results("storage_latency", result, table, args.out_dir)
    return result


if __name__ == "__main__":
    if sys.argv[1:] == ["--client"]:
        run_client()
    else:
        main()
