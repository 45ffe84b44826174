"""One user-error root (storage/errors.py UserError): every package's errors for the user derive from it, and every
app turns one into a single `error:` line and exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.schema_checks import ConfigSchemaError
from dashboards import report, serve
from storage.cli import ArgumentError
from storage.errors import StorageConfigError, StorageError, StorageUnavailableError, UserError, exit_on_user_error
from sweeps import best, preflight, status, utilization
from sweeps.config.config_values import SweepConfigError, UserConfigError
from sweeps.search.definition import StudyDefinitionError


def test_every_users_error_derives_from_the_one_root() -> None:
    for cls in (StorageError, StorageConfigError, StorageUnavailableError, ArgumentError, ConfigSchemaError):
        assert issubclass(cls, UserError), cls
    for cls in (UserConfigError, SweepConfigError, StudyDefinitionError):
        assert issubclass(cls, UserError), cls
    assert issubclass(ArgumentError, ValueError) and issubclass(UserConfigError, ValueError)  # as they were


def test_the_wrapper_gives_one_line_and_exit_2_and_lets_a_bug_through(capsys: pytest.CaptureFixture[str]) -> None:
    def refuses(key: str) -> int:
        raise UserConfigError(f"{key}=3: expected one of [1, 2]")

    assert exit_on_user_error(refuses)("study.seeds") == 2
    assert capsys.readouterr().err == "error: study.seeds=3: expected one of [1, 2]\n"

    def breaks() -> int:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        exit_on_user_error(breaks)()


@pytest.mark.parametrize(
    ("app", "args"),
    [(status.main, ["study=s"]), (best.main, ["study=s"]), (utilization.main, ["study=s"]),
     (report.main, ["study=s"]), (serve.main, ["port=0"])],
)  # fmt: skip
def test_a_storage_that_is_not_there_is_one_line_in_every_reader(
    app: object, args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    assert app([*args, f"storage.url={url}"]) == 2  # type: ignore[operator]
    err = capsys.readouterr().err
    assert err.startswith("error: storage.url = ") and "does not exist (nothing was created)" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "missing.db").exists()


def test_the_preflight_refuses_a_bad_key_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Before the root its UserConfigError escaped main as a traceback."""
    assert preflight.main(["site=pod", "launcher.no_such_key=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "no_such_key" in err and err.count("\n") == 1, err
