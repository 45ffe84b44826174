"""A database role without a privilege the study needs: `sweeps.run` said three chained
tracebacks ending in Optuna's "invalid data in the commit, e.g. exceeding max length"; now one line naming the
privilege, the table and the grant. A real PostgreSQL role, created for the test and dropped after it."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from storage import open_storage
from tests.conftest import _pg_connect
from tests.sweep_helpers import sweep_overrides

pytestmark = pytest.mark.slow  # every test here starts processes or trains


@pytest.fixture
def role(fresh_pg_url: str) -> Iterator[tuple[str, str, Any]]:
    """(a role's name, the study database's URL as that role, the owner's connection): the role may log in and
    nothing more until the test grants it more."""
    open_storage(fresh_pg_url)  # Optuna's tables, as the owner created them
    name = f"reader_{secrets.token_hex(4)}"
    owner = make_url(fresh_pg_url)
    conn = _pg_connect(fresh_pg_url)
    conn.cursor().execute(f"CREATE ROLE {name} LOGIN")
    try:
        yield name, owner.set(username=name).render_as_string(hide_password=False), conn
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP OWNED BY {name}; DROP ROLE {name}")
        conn.close()


TABLES = "ON ALL TABLES IN SCHEMA public TO {role}"
SEQUENCES = "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"


@pytest.mark.parametrize(
    "grants, expected",
    [
        ([f"GRANT SELECT {TABLES}"], "error: the database role lacks INSERT on table studies (permission denied)"),
        (
            [f"GRANT SELECT, INSERT, UPDATE, DELETE {TABLES}"],
            "error: the database role lacks USAGE on sequence studies_study_id_seq",
        ),
        # The study opens and its trial trains; telling its value (in the driver's loop, which retries outages) is denied.
        (
            [f"GRANT SELECT, INSERT, UPDATE, DELETE {TABLES}", SEQUENCES, "REVOKE INSERT ON trial_values FROM {role}"],
            "error: the database role lacks INSERT on table trial_values (permission denied)",
        ),
    ],
    ids=["select-only", "no-sequences", "no-insert-on-trial-values"],
)
def test_a_role_without_a_privilege_is_one_line_naming_it_and_the_table(
    role: tuple[str, str, Any], grants: list[str], expected: str, tmp_path: Path
) -> None:
    name, url, owner = role
    for grant in grants:
        owner.cursor().execute(grant.format(role=name))
    args = sweep_overrides(url, tmp_path / "out", "n_trials=1", f"hydra.run.dir={tmp_path}/h")
    proc = subprocess.run([sys.executable, "-m", "sweeps.run", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "invalid data in the commit" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(expected), proc.stderr[-3000:]
    assert "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES" in errors[0]
