"""Shared pytest fixtures."""

from __future__ import annotations

import contextlib
import os

# Before anything imports Triton: its interpreter runs the fused kernels on this CPU (tests/test_fused_mix.py).
os.environ["TRITON_INTERPRET"] = "1"
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.up import DEFAULT_PORT
from tests.prereqs import PG_DEFAULT, PG_ENV

# --- PostgreSQL (storage) -------------------------------------------------------------------
# The suite runs against a real server: the machine's, or the one named by TRM_SWEEPS_TEST_PG.
# Each session works in its own fresh database and drops it at the end, so runs never see each
# other's studies. No server is a failure, not a skip: a skipped storage suite proves nothing.

# PG_ENV, PG_DEFAULT: tests/prereqs.py, which `make test` runs first (it starts a server where none answers).
_PG_HOWTO = (
    "`make test` starts one; by hand: `python -m storage.up` (it prints the URL; the tests need its "
    f"`postgres` database), then `export {PG_ENV}=postgresql://postgres@127.0.0.1:{DEFAULT_PORT}/postgres`."
)


def _pg_connect(server_url: str):  # -> psycopg2 connection (autocommit)
    import psycopg2
    from sqlalchemy.engine import make_url

    args = make_url(server_url).translate_connect_args(username="user", database="dbname")
    conn = psycopg2.connect(**args, connect_timeout=5, application_name="trm-sweeps-tests")
    conn.autocommit = True
    return conn


def _pg_create_db(server_url: str) -> str:
    from sqlalchemy.engine import make_url

    name = f"trm_sweeps_test_{os.getpid()}_{secrets.token_hex(4)}"
    conn = _pg_connect(server_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def _pg_drop_db(server_url: str, db_url: str) -> None:
    from sqlalchemy.engine import make_url

    name = make_url(db_url).database
    conn = _pg_connect(server_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """URL of a PostgreSQL maintenance database (the suite creates its databases there)."""
    import psycopg2
    from sqlalchemy.engine import make_url

    url = os.environ.get(PG_ENV) or PG_DEFAULT
    shown = make_url(url).render_as_string(hide_password=True)
    if make_url(url).password is not None:
        pytest.fail(f"{PG_ENV}={shown} carries a password; use ~/.pgpass or PGPASSFILE instead.", pytrace=False)
    reason = None
    try:
        _pg_connect(url).close()
    except psycopg2.OperationalError as e:
        reason = " ".join(str(e).split())
    if reason is not None:  # fail outside `except`: no chained traceback around the message
        pytest.fail(f"No PostgreSQL at {shown} ({reason}). {_PG_HOWTO}", pytrace=False)
    return url


@pytest.fixture(scope="session")
def pg_url(pg_server_url: str) -> Iterator[str]:
    """A fresh database for this test session, dropped (WITH (FORCE)) at the end."""
    url = _pg_create_db(pg_server_url)
    yield url
    _pg_drop_db(pg_server_url, url)


@pytest.fixture
def fresh_pg_url(pg_server_url: str) -> Iterator[str]:
    """A separate empty database for one test (e.g. schema creation), dropped afterwards."""
    url = _pg_create_db(pg_server_url)
    yield url
    _pg_drop_db(pg_server_url, url)


# --- end PostgreSQL (storage) ---------------------------------------------------------------


# --- Data -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory):
    """One directory for generated datasets, shared by the session's training tests (built on first use)."""
    return tmp_path_factory.mktemp("data")


# --- The fast lane (`make check`) ------------------------------------------------------------
# `make check` runs the tests not marked `slow` with FAST_LANE_ENV set. There, starting a process is an error
# that names the test, so the marker stays true: a test (or a fixture it uses) that starts jobs, servers or
# workers must be marked `slow`, and the inner loop never waits on one.
FAST_LANE_ENV = "TRM_SWEEPS_FAST_LANE"


def _refuse_process(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError(
        f"a test in the fast lane ({FAST_LANE_ENV}=1) started a process: mark the test (or its module) "
        "@pytest.mark.slow, or keep it in-process"
    )


@contextlib.contextmanager
def _processes_refused() -> Iterator[None]:
    import multiprocessing.process
    import subprocess

    saved = subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start, os.fork
    subprocess.Popen._execute_child = _refuse_process  # type: ignore[method-assign,assignment]  # every subprocess API
    multiprocessing.process.BaseProcess.start = _refuse_process  # type: ignore[method-assign,assignment]
    os.fork = _refuse_process  # type: ignore[assignment]
    try:
        yield
    finally:
        subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start, os.fork = saved  # type: ignore[method-assign]


# Around each test's setup (its fixtures, module-scoped ones included) and call, not around pytest's own work.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _processes_refused() if os.environ.get(FAST_LANE_ENV) else contextlib.nullcontext():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _processes_refused() if os.environ.get(FAST_LANE_ENV) else contextlib.nullcontext():
        return (yield)


# --- Order (`make test`: pytest-xdist --dist loadfile --no-loadscope-reorder) ------------------
# A file is one unit of work, handed to a worker as it nears the end of its last one, so the suite ends when the
# busier worker does. Longest first: the heaviest files start at once and the last units handed out are short,
# so the two workers end close together. (xdist's own order, most tests first, put the files of one or two long
# tests, stand-in pod studies among them, last: one worker ran them while the other had nothing left.)
# The order: the files of HEAVY_FIRST as listed (longest first: each file's tests' durations summed, from a
# whole run's `--durations=0`; every file over a minute there); then every other file with a `slow` test (it starts
# processes); then the in-process files. Within each, collection order; a file's tests keep theirs. A stale entry
# costs balance, never a test.
TESTS_DIR = Path(__file__).resolve().parent
HEAVY_FIRST = (
    "test_bench.py",
    "test_sweeps.py",
    "test_pod_soak.py",
    "test_pod_packing.py",
    "test_study_record.py",
    "test_tpu_pod.py",
    "test_pod_describe.py",
    "chaos/test_invariants.py",
    "test_checkpoint_upload.py",
    "test_train.py",
    "test_reliability.py",
    "test_rerun.py",
    "test_validation.py",
    "test_distributed.py",
    "test_pod_spot_notice.py",
    "test_study_survives_user.py",
    "test_pod_recovery.py",
    "test_packaging.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    listed = {TESTS_DIR / name: i for i, name in enumerate(HEAVY_FIRST)}
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item: pytest.Item) -> int:
        if (where := listed.get(item.path.resolve())) is not None:
            return where
        return len(listed) + (0 if item.path in slow_files else 1)

    items.sort(key=rank)  # stable


# The SIGINT and SIGTERM handlers this process started with: Python's (KeyboardInterrupt, and the default), or
# SIG_IGN for SIGINT where a shell without job control started the run in the background (`make test &`).
SESSION_SIGNAL_HANDLERS = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """Each test starts, and leaves, with the handlers the process started with: code under test installs its own
    (the driver's interrupt_once, the trainer's preemption flag), which must not reach the next test."""
    for sig, handler in SESSION_SIGNAL_HANDLERS.items():
        if handler is not None:
            signal.signal(sig, handler)
    yield
    for sig, handler in SESSION_SIGNAL_HANDLERS.items():
        if handler is not None:
            signal.signal(sig, handler)


@pytest.fixture(autouse=True, scope="session")
def _no_wandb_login_of_the_developer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test reads the developer's own W&B login (`wandb login`: ~/.netrc, ~/.config/wandb/settings), with which
    `wandb.mode=auto` would resolve online (contracts/wandb_runs.py): tests that need a login write their own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NETRC", os.devnull)
        patch.setenv("WANDB_CONFIG_DIR", str(tmp_path_factory.mktemp("wandb-config")))
        yield
