"""``python -m storage.up``: a private PostgreSQL server for development and tests.

Laptops usually have no server; this gives one in a user directory with one command, the
same way the test-suite's fault-injection tests start theirs. Trust auth on 127.0.0.1 only.
PostgreSQL refuses to run as root, so as root initdb/pg_ctl run as the ``postgres`` OS user.
"""

from __future__ import annotations

import argparse
import glob
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Not storage=postgres's 5432 on purpose: this private server runs beside a system one, and the URL it prints
# (TRM_SWEEPS_STORAGE) is what points a sweep at it. Its one home: tests/prereqs.py and tests/conftest.py read it here.
DEFAULT_PORT = 5433
DATABASE = "trm_sweeps"
SERVICE_USER = "postgres"  # OS user that runs the server when we are root; also the DB superuser


class UpError(RuntimeError):
    """Starting or stopping the development server failed; the message says how to fix it."""


def default_dir() -> Path:
    """Data directory default.

    As root, the postgres OS user cannot enter /root, so root gets a directory under /var/lib.
    """
    if os.geteuid() == 0:
        return Path("/var/lib/trm-sweeps/postgres")
    return Path.home() / ".local/share/trm-sweeps/postgres"


def find_bindir() -> Path:
    """Directory with initdb and pg_ctl: ``pg_config --bindir``, Debian's layout, then PATH."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], check=False, capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += [Path(p) for p in sorted(versions, key=_version_key, reverse=True)]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    raise UpError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found. Install them, e.g. "
        "`apt-get install postgresql` (Debian/Ubuntu) or `brew install postgresql` (macOS)."
    )


def _version_key(path: str) -> tuple[int, ...]:
    part = Path(path).parent.name
    return tuple(int(x) for x in part.split(".") if x.isdigit()) or (0,)


def url_for(port: int) -> str:
    return f"postgresql://{SERVICE_USER}@127.0.0.1:{port}/{DATABASE}"


def _as_server_user(cmd: list[str]) -> list[str]:
    """Wrap ``cmd`` to run as the postgres OS user when we are root."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", SERVICE_USER, "--", *cmd]
    return ["su", SERVICE_USER, "-s", "/bin/sh", "-c", shlex.join(cmd)]


def _run(cmd: list[str], what: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # cwd: the postgres user may not be allowed into the caller's working directory.
    proc = subprocess.run(_as_server_user(cmd), check=False, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise UpError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc


def _prepare_dir(data_dir: Path) -> None:
    """Create the data dir (mode 0700, as initdb wants) owned by the server user."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam(SERVICE_USER)
        except KeyError:
            raise UpError(
                f"running as root but there is no {SERVICE_USER!r} OS user to run the server; "
                "install the postgresql package (it creates it) or run as a normal user"
            ) from None
        os.chown(data_dir, user.pw_uid, user.pw_gid)
        check = subprocess.run(
            ["runuser", "-u", SERVICE_USER, "--", "test", "-w", str(data_dir)]
            if shutil.which("runuser")
            else ["su", SERVICE_USER, "-s", "/bin/sh", "-c", f"test -w {shlex.quote(str(data_dir))}"],
            cwd="/",
            check=False,
        )
        if check.returncode != 0:
            raise UpError(
                f"the {SERVICE_USER} OS user cannot reach {data_dir} (a parent directory is not "
                "searchable for it); pass --dir somewhere it can enter, e.g. under /tmp or /var/lib"
            )
    data_dir.chmod(0o700)


def running_port(data_dir: Path) -> int | None:
    """Port of the server running on ``data_dir``, from postmaster.pid (None if not running)."""
    pidfile = data_dir / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by another user
    return port


def _ensure_database(port: int) -> None:
    """Create the ``trm_sweeps`` database unless it exists (idempotent)."""
    import psycopg2  # local: only this command needs the driver at import time

    deadline = time.monotonic() + 30
    while True:
        try:
            conn = psycopg2.connect(
                host="127.0.0.1", port=port, user=SERVICE_USER, dbname="postgres", connect_timeout=5
            )
            break
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)  # pg_ctl -w returned, but be tolerant of a slow first accept
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        conn.close()


def start(data_dir: Path, port: int) -> str:
    """initdb if needed, start the server, create the database; return the URL."""
    data_dir = data_dir.expanduser().resolve()
    bindir = find_bindir()
    already = running_port(data_dir)
    if already is not None:
        _ensure_database(already)
        return url_for(already)
    _prepare_dir(data_dir)
    if not (data_dir / "PG_VERSION").exists():
        if any(data_dir.iterdir()):
            raise UpError(f"{data_dir} is not empty and not a PostgreSQL data directory")
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data_dir),
                "-U",
                SERVICE_USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            "initdb",
            cwd=data_dir,
        )
    options = f"-p {port} -k {shlex.quote(str(data_dir))} -c listen_addresses=127.0.0.1"
    log = data_dir / "log"
    try:
        _run(
            [str(bindir / "pg_ctl"), "-D", str(data_dir), "-o", options, "-l", str(log), "start", "-w"],
            "pg_ctl start",
            cwd=data_dir,
        )
    except UpError as e:
        tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
        raise UpError(f"{e}\nlast lines of {log}:\n" + "\n".join(tail)) from None
    _ensure_database(port)
    return url_for(port)


def stop(data_dir: Path) -> bool:
    """Stop the server on ``data_dir``; False if it was not running."""
    data_dir = data_dir.expanduser().resolve()
    if running_port(data_dir) is None:
        return False
    bindir = find_bindir()
    _run([str(bindir / "pg_ctl"), "-D", str(data_dir), "stop", "-m", "fast", "-w"], "pg_ctl stop", cwd=data_dir)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storage.up", description=__doc__)
    parser.add_argument("--dir", type=Path, default=None, help=f"data directory (default {default_dir()})")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}: beside a system server on 5432)"
    )
    parser.add_argument("--stop", action="store_true", help="stop the server instead")
    args = parser.parse_args(argv)
    data_dir = args.dir or default_dir()
    try:
        if args.stop:
            print(f"stopped PostgreSQL in {data_dir}" if stop(data_dir) else f"no PostgreSQL running in {data_dir}")
            return 0
        url = start(data_dir, args.port)
    except Exception as e:  # noqa: BLE001 - a dev tool: any failure is its one line and exit 1
        print(f"storage.up: {e}", file=sys.stderr)
        return 1
    print(f"PostgreSQL running in {data_dir}")
    print(f"storage URL: {url}")
    print(f"export TRM_SWEEPS_STORAGE={url}")
    print(f"(for the tests: export TRM_SWEEPS_TEST_PG={url.rsplit('/', 1)[0]}/postgres)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
