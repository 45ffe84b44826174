"""A warm worker for short trials on one machine: import torch and the trainer once, then fork one child per job.

`python -m trm.warm_worker` is a small fork server (the pattern of multiprocessing's forkserver, which cannot be
used here because a job is a command line, not a picklable function). The local launcher starts it once
(`launcher.warm=true`) and sends it one line per job (contracts/warm_protocol.py: a JobRequest). It forks a child
that becomes that job exactly as `python -m trm.train <argv>` would (its own session, directory, environment, log
file and exit code) but without paying the interpreter start-up and the imports again. It answers Started with
the child's pid, and Exited with its exit code when the child ends.

Isolation: every job is still its own process, forked from a parent that has only imported modules (no torch
op has run in it, so no OpenMP pool or device state is inherited). What a child shares with the next one is
nothing but the parent's imported code. Variables read when a library loads (OMP_*, MKL_*) are the server's,
set when it started; the rest of the job's environment (CUDA_VISIBLE_DEVICES, TRM_DATA_DIR) is set in the child.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import traceback
from typing import NoReturn

import torch
import torch._dynamo  # noqa: F401  (torch imports it when the first optimizer is built; docs/benchmarks.md#sweep-overhead)
import wandb  # noqa: F401  (the tracker imports it in every job that logs to W&B)

from contracts.hydra_app import run_app
from contracts.warm_protocol import Answer, Exited, JobRequest, Ready, Started, encode
from trm import train  # the trainer and everything it imports (Hydra, OmegaConf, Optuna, numpy)

POLL_S = 0.2  # how often the server reaps ended children when no request comes


def run_job(request: JobRequest) -> NoReturn:
    """In the forked child: become `python -m trm.train <argv>` in the job's directory, environment and log."""
    os.setsid()  # its own session, as the launcher's start_worker gives a process: cancel signals its group
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    log = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.argv = ["trm.train", *request.argv]
    code = 0
    try:
        run_app(train.main)
    except SystemExit as err:  # Hydra exits 1 on a failed run, argparse 2 on a bad command line
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except BaseException:  # noqa: BLE001, B036 (the child must end here, whatever happened, and say so in its log)
        traceback.print_exc()
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # never the server's own teardown (nor its atexit handlers) in a child


def reply(message: Answer) -> None:
    sys.stdout.write(encode(message) + "\n")
    sys.stdout.flush()


def reap() -> None:
    """Tell the launcher about every child that ended since the last call."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child at all
        if pid == 0:
            return
        reply(Exited(pid, os.waitstatus_to_exitcode(status)))


def serve() -> None:
    """Fork a job per request line on stdin until stdin closes (the launcher went away), then wait for the jobs
    still running: they finish and record their outcome on their own."""
    pending = b""
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], POLL_S)
        if readable:
            chunk = os.read(stdin, 65536)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = JobRequest.parse(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    run_job(request)
                reply(Started(pid))
        reap()
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


if __name__ == "__main__":
    reply(Ready(os.getpid()))
    serve()
