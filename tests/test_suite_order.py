"""The suite's own order (tests/conftest.py `pytest_collection_modifyitems`): `make test` hands files to its
workers in this order, longest first, so that the last ones handed out are short."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import HEAVY_FIRST, TESTS_DIR


def test_every_heavy_file_listed_is_a_test_file_of_the_suite() -> None:
    missing = [name for name in HEAVY_FIRST if not (TESTS_DIR / name).is_file()]
    assert not missing, f"tests/conftest.py HEAVY_FIRST names {missing}: no such file under tests/; drop or rename it"
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)


def test_this_sessions_files_come_heavy_first_then_slow_then_in_process(request: pytest.FixtureRequest) -> None:
    """Over whatever this session collected: the listed files first, in their order; then the files with a `slow`
    test (among those collected) before the files without one; each file's tests in one run."""
    files: list[Path] = []
    slow: set[Path] = set()
    for item in request.session.items:
        if not files or files[-1] != item.path:
            assert item.path not in files, f"{item.path}'s tests are split by another file's"
            files.append(item.path)
        if item.get_closest_marker("slow") is not None:
            slow.add(item.path)
    listed = [TESTS_DIR / name for name in HEAVY_FIRST]
    resolved = [path.resolve() for path in files]
    present = [path for path in listed if path in resolved]
    assert resolved[: len(present)] == present, (resolved[: len(present)], HEAVY_FIRST)
    rest = [path for path, real in zip(files, resolved, strict=True) if real not in listed]
    kinds = [path in slow for path in rest]
    assert kinds == sorted(kinds, reverse=True), [p.name for p, k in zip(rest, kinds, strict=True) if not k][:3]
