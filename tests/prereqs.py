"""``python -m tests.prereqs [--no-install] CMD...``: give the test suite what it needs from the machine, then run CMD.

``make test`` runs pytest through this, so that the suite passes on a fresh machine and a missing
prerequisite is found in the first second, not as a failure minutes into the run. The suite needs:

- a headless browser: the report test renders the HTML report in Chromium (Debian's ``chromium``);
- a PostgreSQL server: ``TRM_SWEEPS_TEST_PG``, else the machine's server at 127.0.0.1:5432.

One line names everything missing. What can be provided is: Debian's packages with apt-get (as root,
or with ``sudo -n`` where that needs no password), and a private server started with ``storage.up``,
left running for the next run, which CMD gets as ``TRM_SWEEPS_TEST_PG``. When something cannot be
provided, one line says what to run and the exit status is 2: CMD never starts.

An explicit ``TRM_SWEEPS_TEST_PG`` is checked but never replaced: the suite would otherwise pass
against another server than the one asked for.

``--no-install`` (``make check``, the fast lane): install nothing and start no server. What is missing is named
in one line and CMD runs anyway: the fast lane needs no browser, only its storage tests need the server. A
private server an earlier ``make test`` left running is used (finding it starts nothing).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping

import psycopg2

PG_ENV = "TRM_SWEEPS_TEST_PG"
PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
# tests/test_dashboards.py runs the first of these it finds.
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
APT_INSTALL = "apt-get update && apt-get install -y"  # what a person runs (as root)
NO_INSTALL = "--no-install"


class Refused(RuntimeError):
    """A prerequisite is missing and this script cannot provide it; the message says what to run."""


def browser(path: str | None = None) -> str | None:
    """The browser the report test would run (searching ``path``, default $PATH), or None."""
    for name in BROWSERS:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def pg_problem(url: str) -> str | None:
    """Why no session opens at the PostgreSQL ``url`` (one line), or None when one does.

    psycopg2 takes the URL as a libpq URI: SQLAlchemy is not imported, which keeps the check fast.
    """
    try:
        psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://", 1), connect_timeout=3).close()
    except psycopg2.OperationalError as e:
        return " ".join(str(e).split())
    return None


def server_binaries() -> bool:
    """Whether ``storage.up`` finds initdb and pg_ctl (the same search it uses when it starts)."""
    from storage import up

    try:
        up.find_bindir()
    except up.UpError:
        return False
    return True


def apt_prefix(path: str | None = None) -> list[str] | None:
    """How to run apt-get here: ``[]`` as root, ``["sudo", "-n"]`` with password-less sudo, else None."""
    if shutil.which("apt-get", path=path) is None:
        return None
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo", path=path)
    if sudo is None:
        return None
    asked = subprocess.run([sudo, "-n", "true"], check=False, capture_output=True, timeout=10)
    return [sudo, "-n"] if asked.returncode == 0 else None


def apt_install(prefix: list[str], packages: list[str]) -> None:
    """Install Debian ``packages``; apt's output is shown only when it fails."""
    # `env`: sudo drops the caller's environment, DEBIAN_FRONTEND included.
    apt = [*prefix, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]
    for step in ([*apt, "update", "-qq"], [*apt, "install", "-y", "-qq", *packages]):
        done = subprocess.run(step, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise RuntimeError(f"`{shlex.join(step)}` failed (exit {done.returncode}): {tail}")


def start_private_server() -> str:
    """Start (or find running) the ``storage.up`` server; return the URL of its ``postgres`` database."""
    from storage import up

    data_dir = up.default_dir()
    url = up.start(data_dir, up.DEFAULT_PORT).rsplit("/", 1)[0] + "/postgres"
    stop = f"{os.path.relpath(sys.executable)} -m storage.up --stop"
    print(f"prereqs: PostgreSQL for the suite: {url} (private, in {data_dir}; left running, stop it: {stop})")
    return url


def private_server_url() -> str:
    """The URL of the ``postgres`` database of the server ``storage.up`` starts (it may not be running)."""
    from storage import up

    return f"postgresql://postgres@127.0.0.1:{up.DEFAULT_PORT}/postgres"


def report_missing(env: Mapping[str, str]) -> dict[str, str]:
    """``--no-install``: check every prerequisite, provide none; one line names what is missing. The environment
    the suite runs in: the private server of an earlier ``make test`` where it answers and none was named."""
    suite_env = dict(env)
    missing: list[str] = []
    found = browser(env.get("PATH"))
    if found is None:
        missing.append(f"a browser for the report test (none of {', '.join(BROWSERS)} on PATH)")
    explicit = env.get(PG_ENV)
    url = explicit or PG_DEFAULT
    problem = pg_problem(url)
    if problem is not None and not explicit and pg_problem(private_server_url()) is None:
        url, problem = private_server_url(), None
        suite_env[PG_ENV] = url
    if problem is not None:
        from storage.url import redact

        missing.append(f"PostgreSQL, which the fast lane's storage tests need too ({redact(url)}: {problem})")
    if not missing:
        print(f"prereqs: browser {found}; PostgreSQL at {url}")
        return suite_env
    # `make test` installs and starts what is missing, except a server PG_ENV names (prepare never replaces it).
    fix = f"Start the server {PG_ENV} names" if explicit and problem else "`make test` provides them"
    print(f"prereqs: installing nothing ({NO_INSTALL}); missing for the slow lane: {'; '.join(missing)}. {fix}.")
    return suite_env


def prepare(env: Mapping[str, str]) -> dict[str, str]:
    """Check every prerequisite, provide the missing ones; return the environment the suite runs in."""
    suite_env = dict(env)
    path = env.get("PATH")
    missing: list[str] = []  # one phrase each, for the one line
    packages: list[str] = []  # Debian packages that provide them
    fixes: list[str] = []  # what a person must do that no install does

    found = browser(path)
    if found is None:
        missing.append(f"a browser for the report test (none of {', '.join(BROWSERS)} on PATH)")
        packages.append("chromium")
    explicit = env.get(PG_ENV)
    url = explicit or PG_DEFAULT
    problem = pg_problem(url)
    if problem is not None:
        from storage.url import redact

        missing.append(f"PostgreSQL ({redact(url)}: {problem})")
        if explicit:
            fixes.append(f"start the server {PG_ENV} names, or unset {PG_ENV} and `make test` starts a private one")
        elif not server_binaries():
            packages.append("postgresql")

    if not missing:
        print(f"prereqs: browser {found}; PostgreSQL at {url}")
        return suite_env
    prefix = apt_prefix(path) if packages else []
    if prefix is None or fixes:
        if prefix is None:
            apt = f"{APT_INSTALL} {' '.join(packages)}"
            fixes.insert(0, f"install Debian's packages as root: `{apt}`")
        raise Refused(f"prereqs: missing {'; '.join(missing)}. To run the tests: {'; '.join(fixes)}.")

    print(f"prereqs: missing {'; '.join(missing)}. Providing them.", flush=True)
    if packages:
        print(
            f"prereqs: apt-get install {' '.join(packages)} (about a minute)",
            flush=True,
        )
        apt_install(prefix, packages)
        if "chromium" in packages and browser(path) is None:
            raise RuntimeError(f"apt-get installed chromium, but none of {', '.join(BROWSERS)} is on PATH")
    if problem is not None:
        suite_env[PG_ENV] = start_private_server()
    return suite_env


def main(cmd: list[str]) -> int:
    """Prepare (``--no-install``: only check), then replace this process with ``cmd`` (pytest); without ``cmd``,
    print what to export."""
    if cmd[:1] in (["-h"], ["--help"]):
        from contracts.hydra_app import run_app  # `--help | head`: no BrokenPipeError traceback

        run_app(lambda: print((__doc__ or "").strip()))
        return 0
    provide = cmd[:1] != [NO_INSTALL]
    cmd = cmd if provide else cmd[1:]
    try:
        env = prepare(os.environ) if provide else report_missing(os.environ)
    except Refused as e:
        print(e, file=sys.stderr)
        return 2
    # An install or a server start failed: one line, not a traceback.
    except (OSError, RuntimeError, psycopg2.Error) as e:
        print(f"prereqs: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    if not cmd:
        if env.get(PG_ENV) != os.environ.get(PG_ENV):
            print(f"export {PG_ENV}={env[PG_ENV]}")
        return 0
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
