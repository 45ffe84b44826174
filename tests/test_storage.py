"""storage/: real PostgreSQL (fixtures in conftest.py), real processes, a real private cluster."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.trial import TrialState

from storage import (
    HeartbeatThread,
    StorageConfigError,
    StorageUnavailableError,
    close_storage,
    fail_stale_trials,
    open_storage,
    redact,
    resolve_url,
    retry_callback,
    schema_version,
    trial_id_of,
)

ROOT = Path(__file__).resolve().parents[1]
SECRET = "Hunter2-s3cret"
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres"  # nothing listens on port 1


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _py(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=timeout
    )


def _head_version() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        s = open_storage(f"sqlite:///{tmp}/v.db")
        try:
            return s.get_head_version()
        finally:
            close_storage(s)


# --- URL handling -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://postgres:{SECRET}@127.0.0.1:5432/db",
        f"postgresql+psycopg2://postgres:{SECRET}@127.0.0.1/db",
        f"postgresql://postgres@127.0.0.1/db?password={SECRET}",
        f"postgresql://postgres:{SECRET}@127.0.0.1:notaport/db",  # malformed *and* a password
    ],
)
def test_password_in_url_is_rejected_without_echoing_it(url, monkeypatch, tmp_path):
    for call in (lambda: resolve_url(url, tmp_path / "x.db"), lambda: open_storage(url)):
        with pytest.raises(StorageConfigError) as info:
            call()
        msg = str(info.value)
        assert SECRET not in msg and "storage.url" in msg
        assert "pgpass" in msg.lower() or "cannot be parsed" in msg
    monkeypatch.setenv("TRM_SWEEPS_STORAGE", url)
    with pytest.raises(StorageConfigError) as info:
        resolve_url(None, tmp_path / "x.db")
    assert SECRET not in str(info.value) and "TRM_SWEEPS_STORAGE" in str(info.value)
    assert SECRET not in redact(url)


def test_password_error_points_to_pgpass_and_password_env():
    with pytest.raises(StorageConfigError) as info:
        resolve_url(f"postgresql://u:{SECRET}@h:5432/db", "unused.db")
    msg = str(info.value)
    assert "~/.pgpass" in msg and "PGPASSFILE" in msg and "storage.password_env" in msg
    assert "postgresql://u:***@h:5432/db" in msg


@pytest.mark.parametrize(
    "url", ["not a url", "mysql://u@h/db", "postgres://u@h/db", "postgresql://u@h:5432", "sqlite://"]
)
def test_bad_url_names_key_value_and_accepted_forms(url):
    with pytest.raises(StorageConfigError) as info:
        resolve_url(url, "unused.db")
    msg = str(info.value)
    assert "storage.url" in msg and repr(url) in msg
    assert "sqlite:///PATH" in msg and "postgresql://USER@HOST:PORT/DB" in msg
    assert "postgresql+psycopg2://" in msg


def test_resolve_url_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("TRM_SWEEPS_STORAGE", raising=False)
    default = tmp_path / "deep" / "dir" / "optuna.db"
    assert resolve_url(None, default) == f"sqlite:///{default}"
    assert default.parent.is_dir()
    monkeypatch.setenv("TRM_SWEEPS_STORAGE", "postgresql://me@db:5432/sweeps")
    assert resolve_url(None, default) == "postgresql://me@db:5432/sweeps"
    monkeypatch.chdir(tmp_path)
    assert resolve_url("sqlite:///x.db", default) == f"sqlite:///{tmp_path}/x.db"  # made absolute: jobs run elsewhere


def test_sqlite_storage(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path}/optuna.db")
    try:
        assert storage.engine_kwargs["connect_args"]["timeout"] > 0
        study = optuna.create_study(storage=storage, study_name="s")
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
        assert len(optuna.load_study(study_name="s", storage=storage).trials) == 2
    finally:
        close_storage(storage)
    with pytest.raises(StorageConfigError, match="does not exist"):
        open_storage(f"sqlite:///{tmp_path}/missing/optuna.db")


# --- PostgreSQL -------------------------------------------------------------------------------


def test_postgres_roundtrip_between_two_storage_objects(pg_url):
    writer = open_storage(pg_url)
    reader = None
    try:
        assert schema_version(writer) == writer.get_head_version()
        # SQLAlchemy 2.1 maps postgresql:// to psycopg 3; we pin the installed psycopg2.
        assert writer.url.startswith("postgresql+psycopg2://")
        assert writer.engine_kwargs["pool_pre_ping"] is True
        assert writer.engine.pool.size() == 2
        with writer.engine.connect() as conn:
            app = conn.execute(sqlalchemy.text("SHOW application_name")).scalar()
        assert app == "trm-sweeps"

        name = f"roundtrip-{uuid.uuid4().hex[:8]}"
        study = optuna.create_study(study_name=name, storage=writer, direction="maximize")
        trial = study.ask()
        x = trial.suggest_float("x", -1.0, 1.0)
        trial.set_user_attr("outcome", "completed")
        study.tell(trial, x * 2)

        reader = open_storage(pg_url)
        loaded = optuna.load_study(study_name=name, storage=reader)
        (frozen,) = loaded.trials
        assert frozen.state == TrialState.COMPLETE
        assert frozen.params == {"x": x} and frozen.value == x * 2
        assert frozen.user_attrs == {"outcome": "completed"}
    finally:
        close_storage(writer)
        if reader is not None:
            close_storage(reader)


_RACER = r"""
import sys
from storage import close_storage, open_storage, schema_version
print("ready", flush=True)
sys.stdin.readline()            # the parent releases all racers at once
s = open_storage(sys.argv[1])
print(schema_version(s), flush=True)
close_storage(s)
"""


@pytest.mark.slow
def test_concurrent_first_open_creates_schema_once(fresh_pg_url):
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, fresh_pg_url],
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for p in racers:  # wait until every racer has paid its import cost
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in racers:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate(timeout=60) for p in racers]
    finally:
        for p in racers:
            if p.poll() is None:
                p.kill()
    for p, (_out, err) in zip(racers, results):
        assert p.returncode == 0, err
    assert len({out.strip() for out, _ in results}) == 1
    engine = sqlalchemy.create_engine(fresh_pg_url.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        with engine.connect() as conn:
            for table in ("alembic_version", "version_info"):
                assert conn.execute(sqlalchemy.text(f"SELECT count(*) FROM {table}")).scalar() == 1
    finally:
        engine.dispose()


def test_password_env_goes_to_connect_args_not_url(pg_url, monkeypatch):
    monkeypatch.setenv("TRM_TEST_PG_PASSWORD", SECRET)
    storage = open_storage(pg_url, password_env="TRM_TEST_PG_PASSWORD")
    try:
        assert storage.engine_kwargs["connect_args"]["password"] == SECRET
        assert SECRET not in storage.url
        assert SECRET not in storage.engine.url.render_as_string(hide_password=False)
        storage.get_all_studies()  # trust auth ignores the password, but it must connect
    finally:
        close_storage(storage)
    monkeypatch.delenv("TRM_TEST_PG_PASSWORD")
    with pytest.raises(StorageConfigError, match="storage.password_env.*TRM_TEST_PG_PASSWORD"):
        open_storage(pg_url, password_env="TRM_TEST_PG_PASSWORD")


def test_unreachable_server_raises_unavailable_with_reason(monkeypatch):
    monkeypatch.setenv("TRM_TEST_PG_PASSWORD", SECRET)
    with pytest.raises(StorageUnavailableError) as info:
        open_storage(UNREACHABLE, password_env="TRM_TEST_PG_PASSWORD", connect_timeout_s=2)
    msg = str(info.value)
    assert UNREACHABLE in msg and "port 1" in msg and SECRET not in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.slow
def test_stale_trial_fails_and_is_requeued_with_same_params(pg_url):
    storage = open_storage(
        pg_url, heartbeat_interval=1, grace_period=2, failed_trial_callback=retry_callback(max_retry=3)
    )
    try:
        study = optuna.create_study(study_name=f"hb-{uuid.uuid4().hex[:8]}", storage=storage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Heartbeat ... supposed to be used with optimize"
            trial = study.ask()
        params = {"lr": trial.suggest_float("lr", 1e-5, 1e-2, log=True), "layers": trial.suggest_int("layers", 1, 4)}

        with HeartbeatThread(storage, trial_id_of(trial), interval_s=0.5) as beat:
            time.sleep(3)  # longer than grace_period: only the heartbeat keeps it alive
            assert fail_stale_trials(study) == []
            assert study.trials[0].state == TrialState.RUNNING
        assert not beat.alive and beat.beats >= 3 and beat.last_error is None

        time.sleep(3)  # the driver "died": no beats for > grace_period
        assert fail_stale_trials(study) == [trial.number]
        trials = study.trials
        assert trials[0].state == TrialState.FAIL
        (retry,) = [t for t in trials if t.state == TrialState.WAITING]
        assert retry.params == params
        assert retry.system_attrs["failed_trial"] == trial.number
        assert fail_stale_trials(study) == []  # idempotent
    finally:
        close_storage(storage)


@pytest.mark.slow
def test_check_cli(pg_url):
    ok = _py("-m", "storage.check", pg_url)
    assert ok.returncode == 0, ok.stderr
    line = ok.stdout.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith(pg_url) and " ok " in line
    assert f"schema={_head_version()}" in line and "studies=" in line

    down = _py("-m", "storage.check", UNREACHABLE, "--timeout", "2")
    assert down.returncode == 1 and "error" in down.stdout and "port 1" in down.stdout

    leaked = _py("-m", "storage.check", f"postgresql://postgres:{SECRET}@127.0.0.1/x")
    assert leaked.returncode == 1 and SECRET not in leaked.stdout + leaked.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_storage_up_starts_and_stops_a_private_cluster():
    # Not pytest's tmp_path: its parents are 0700 root, and as root the server runs as postgres.
    parent = Path(tempfile.mkdtemp(prefix="trm-sweeps-pg-", dir="/tmp"))
    parent.chmod(0o755)  # storage.up creates data/ (0700, owned by the server user) inside
    data_dir = parent / "data"
    port = _free_port()
    try:
        up = _py("-m", "storage.up", "--dir", str(data_dir), "--port", str(port), timeout=120)
        assert up.returncode == 0, up.stderr
        url = f"postgresql://postgres@127.0.0.1:{port}/trm_sweeps"
        assert url in up.stdout and f"export TRM_SWEEPS_STORAGE={url}" in up.stdout

        storage = open_storage(url, connect_timeout_s=5)
        try:
            assert schema_version(storage) == storage.get_head_version()
        finally:
            close_storage(storage)

        again = _py("-m", "storage.up", "--dir", str(data_dir), "--port", str(port))
        assert again.returncode == 0 and url in again.stdout  # idempotent

        down = _py("-m", "storage.up", "--dir", str(data_dir), "--stop", timeout=120)
        assert down.returncode == 0, down.stderr
        with pytest.raises(StorageUnavailableError):
            open_storage(url, connect_timeout_s=2)
    finally:
        _py("-m", "storage.up", "--dir", str(data_dir), "--stop", timeout=120)
        shutil.rmtree(parent, ignore_errors=True)


# --- storage faults -------------------------------------------------------------------------------


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.slow
def test_status_on_a_mistyped_path_says_it_does_not_exist_and_creates_nothing(tmp_path):
    """`python -m sweeps.status` used to create an empty SQLite database (and its lock file, and outputs/) at
    whatever path it was given. The driver starting a study still creates its database."""
    typo = tmp_path / "optnua.db"
    line = _one_error_line(_py("-m", "sweeps.status", f"storage.url=sqlite:///{typo}"))
    assert str(typo) in line and "does not exist" in line
    env = {k: v for k, v in _env().items() if k != "TRM_SWEEPS_STORAGE"}
    proc = subprocess.run(
        [sys.executable, "-m", "sweeps.status"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
    )  # the default, outputs/optuna.db under the working directory
    line = _one_error_line(proc)
    assert str(tmp_path / "outputs" / "optuna.db") in line and "does not exist" in line
    assert list(tmp_path.iterdir()) == []  # no database, no lock file, no outputs/ directory
    # A file that exists but is no study database is said to be one, and not given Optuna's tables.
    other = tmp_path / "other.db"
    sqlite3 = __import__("sqlite3")
    sqlite3.connect(other).close()
    line = _one_error_line(_py("-m", "sweeps.status", f"storage.url=sqlite:///{other}"))
    assert "holds no Optuna studies" in line
    with sqlite3.connect(other) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    # What a sweep does when it starts a study: the database is created, and status then reads it.
    url = f"sqlite:///{tmp_path / 'new.db'}"
    storage = open_storage(url, heartbeat_interval=5, grace_period=30, failed_trial_callback=retry_callback(2))
    try:
        optuna.create_study(study_name="fresh", storage=storage)
    finally:
        close_storage(storage)
    ok = _py("-m", "sweeps.status", f"storage.url={url}", "format=json")
    assert ok.returncode == 0, ok.stderr
    assert [s["study"] for s in __import__("json").loads(ok.stdout)] == ["fresh"]


@pytest.mark.slow
def test_status_on_a_postgres_database_that_does_not_exist_creates_nothing(pg_server_url, fresh_pg_url):
    missing = fresh_pg_url + "_typo"
    line = _one_error_line(_py("-m", "sweeps.status", f"storage.url={missing}"))
    assert "does not exist" in line
    line = _one_error_line(_py("-m", "sweeps.status", f"storage.url={fresh_pg_url}"))  # exists, empty
    assert "holds no Optuna studies" in line
    engine = sqlalchemy.create_engine(fresh_pg_url.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        assert sqlalchemy.inspect(engine).get_table_names() == []  # status created no tables
    finally:
        engine.dispose()


# A location the SQLite file cannot be written to, even by root (the tests run as root, for whom a read-only
# directory is writable): sysfs accepts no new files (EACCES, or EROFS where /sys is mounted read-only).
UNWRITABLE_SQLITE = "/sys/trm-sweeps-test.db"


@pytest.mark.slow
def test_an_unwritable_sqlite_location_is_one_error_line_naming_the_path(tmp_path):
    """A SQLite file on a read-only filesystem was a 20-line traceback (the OSError of its lock file)."""
    for url, named in (
        (f"sqlite:///{UNWRITABLE_SQLITE}", UNWRITABLE_SQLITE),
        (f"sqlite:///{ROOT / 'pyproject.toml'}/db.sqlite", str(ROOT / "pyproject.toml")),
    ):
        with pytest.raises(StorageConfigError) as info:
            open_storage(url)
        assert named in str(info.value) and "storage.url" in str(info.value)
        proc = _py(
            "-m",
            "sweeps.run",
            f"storage.url={url}",
            f"output_root={tmp_path}/out",
            f"hydra.run.dir={tmp_path}/h",
            "wandb.enabled=false",
        )
        line = _one_error_line(proc)
        assert named in line
    assert "not a directory" in line  # the parent is a file: said so, not "does not exist"
    assert not Path(UNWRITABLE_SQLITE).exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "key, value", [("heartbeat.interval_s", "0"), ("heartbeat.grace_s", "0"), ("heartbeat.interval_s", "-5")]
)
def test_a_heartbeat_setting_optuna_refuses_is_named_by_its_key(tmp_path, key, value):
    """`heartbeat.interval_s=0` gave Optuna's "The value of `heartbeat_interval` should be a positive integer"
    in a traceback, without the key."""
    db = tmp_path / "hb.db"
    proc = _py(
        "-m",
        "sweeps.run",
        f"storage.url=sqlite:///{db}",
        f"{key}={value}",
        f"output_root={tmp_path}/out",
        f"hydra.run.dir={tmp_path}/h",
        "wandb.enabled=false",
    )
    line = _one_error_line(proc)
    assert key in line and value in line
    assert not db.exists()  # refused before anything was opened
    arg = {"heartbeat.interval_s": "heartbeat_interval", "heartbeat.grace_s": "grace_period"}[key]
    with pytest.raises(StorageConfigError, match=rf"{key} = {value} \(the storage's {arg}\)"):
        open_storage(f"sqlite:///{db}", **{arg: int(value)})


def _drop_tables(url: str) -> None:
    import psycopg2
    from sqlalchemy.engine import make_url

    conn = psycopg2.connect(**make_url(url).translate_connect_args(username="user", database="dbname"))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        conn.close()


@pytest.mark.parametrize("how", ["drop database", "drop tables"])
def test_a_dropped_database_is_told_apart_from_an_outage(pg_server_url, fresh_pg_url, how):
    """After DROP DATABASE every storage call raised Optuna's "invalid data in the commit", which the driver
    took for an outage and retried forever. `database_gone` tells the driver the database is gone."""
    from storage import StorageGoneError, database_gone
    from storage import StorageUnavailableError as Unavailable
    from tests.conftest import _pg_drop_db

    # An outage is not "gone": a server that does not answer, at open and in use.
    with pytest.raises(StorageUnavailableError) as down:
        open_storage(UNREACHABLE, connect_timeout_s=2)
    assert database_gone(down.value) is None
    engine = sqlalchemy.create_engine(UNREACHABLE.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        with pytest.raises(sqlalchemy.exc.OperationalError) as refused:
            engine.connect()
    finally:
        engine.dispose()
    assert database_gone(refused.value) is None

    storage = open_storage(fresh_pg_url, heartbeat_interval=1, grace_period=4, failed_trial_callback=retry_callback(2))
    try:
        study = optuna.create_study(study_name="doomed", storage=storage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = study.ask()
        database = fresh_pg_url.rsplit("/", 1)[1]
        if how == "drop database":
            _pg_drop_db(pg_server_url, fresh_pg_url)
        else:
            _drop_tables(fresh_pg_url)
        calls = {  # what the driver's loop and its heartbeats do
            "ask": study.ask,
            "get_trials": lambda: study.get_trials(deepcopy=False),
            "record_heartbeat": lambda: storage.record_heartbeat(trial_id_of(trial)),
            "tell": lambda: study.tell(trial, 1.0),
        }
        for name, call in calls.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with pytest.raises(optuna.exceptions.StorageInternalError) as info:
                    call()
            assert "invalid data in the commit" in str(info.value)  # what the driver saw and retried on
            reason = database_gone(info.value)
            assert reason is not None, (name, info.value)
            assert (f'database "{database}" does not exist' if how == "drop database" else 'relation "') in reason, (
                reason
            )
            gone = StorageGoneError(f"the study database is gone: {reason}")
            assert isinstance(gone, Unavailable)
    finally:
        close_storage(storage)
    if how == "drop database":  # and a new open says the same
        with pytest.raises(StorageUnavailableError) as info:
            open_storage(fresh_pg_url)
        assert database_gone(info.value) and "does not exist" in database_gone(info.value)


def test_a_relative_sqlite_url_is_made_absolute_so_every_job_opens_the_same_file(tmp_path, monkeypatch):
    """A trial's job runs in its own directory: `sqlite:///outputs/x.db` passed on unchanged opened an empty file
    there, and every trial failed with 'no such table' after minutes of retries."""
    monkeypatch.chdir(tmp_path)
    assert resolve_url("sqlite:///outputs/x.db", "unused.db") == f"sqlite:///{tmp_path}/outputs/x.db"
    monkeypatch.setenv("TRM_SWEEPS_STORAGE", "sqlite:///rel.db?timeout=30")
    assert resolve_url(None, "unused.db") == f"sqlite:///{tmp_path}/rel.db?timeout=30"
    absolute = f"sqlite:///{tmp_path}/abs.db"
    assert resolve_url(absolute, "unused.db") == absolute
    assert resolve_url("sqlite:///:memory:", "unused.db") == "sqlite:///:memory:"
    postgres = "postgresql://postgres@127.0.0.1:5432/db"
    assert resolve_url(postgres, "unused.db") == postgres
