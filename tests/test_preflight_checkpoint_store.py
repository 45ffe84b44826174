"""The preflight's checkpoint check does what a save does (issue 56.8): on the gs:// stand-in (tests/fake_gcs.py), a
service account that may write and delete objects but not read them passes a write-and-delete check, then fails
every save at its read-back; the probe (sweeps/launchers/tpu/probe.py) asks the store for each permission a save
needs, and leaves nothing behind."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from sweeps.launchers.tpu.probe import _writable
from tests.fake_gcs import StandInGCS
from trm.checkpoints import checkpoint


@pytest.fixture
def bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gs://bucket on the stand-in store, as fsspec's gs:// in this process for the test."""
    monkeypatch.setenv("FAKE_GCS_ROOT", str(tmp_path / "gcs"))
    for protocol in StandInGCS.protocol:
        monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, protocol, StandInGCS)
    (tmp_path / "gcs" / "bucket").mkdir(parents=True)
    return tmp_path / "gcs" / "bucket"


def objects(where: Path) -> list[str]:
    return sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.is_file())


def test_a_store_that_writes_and_deletes_but_cannot_read_fails_the_preflight_as_it_fails_a_save(bucket: Path) -> None:
    url = "gs://bucket/ckpt/halting"
    assert _writable(url) is None and objects(bucket) == []  # a usable store: checked, nothing left there
    (bucket.parent / "bucket.denied").write_text("get\n")  # no storage.objects.get
    with pytest.raises(checkpoint.CheckpointError, match=r"storage\.objects\.get"):
        checkpoint.save(url, checkpoint.LATEST, {"step": 1})
    found = _writable(url)
    assert found is not None and found.startswith("PermissionError: 403") and "storage.objects.get" in found, found
    # The probe's object is deleted though its read failed (the save's tmp stays: put's cleanup asks isfile, a get).
    assert not [name for name in objects(bucket) if ".preflight-" in name], objects(bucket)
    (bucket.parent / "bucket.denied").write_text("delete\n")  # a move is a copy and a delete
    assert "storage.objects.delete" in str(_writable(url))
    # A save's makedirs creates a missing bucket (gcsfs), where the service account may: so does the check.
    assert _writable("gs://new-bucket/ckpt") is None and (bucket.parent / "new-bucket").is_dir()
    (bucket.parent / "no-bucket.denied").write_text("bucket-create\n")
    assert "storage.buckets.create" in str(_writable("gs://no-bucket/ckpt"))


def test_the_probe_asks_the_store_for_every_permission_a_save_needs(
    bucket: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    allowed = StandInGCS._allowed

    def recording(self: StandInGCS, bucket_name: str, operation: str, path: str) -> None:
        asked.append(operation)
        allowed(self, bucket_name, operation, path)

    monkeypatch.setattr(StandInGCS, "_allowed", recording)
    for step in (1, 2):  # the second save rotates latest.pt to previous.pt: a save's every step
        checkpoint.save("gs://bucket/run", checkpoint.LATEST, {"step": step})
    save = set(asked)
    asked.clear()
    assert _writable("gs://bucket/run") is None
    assert save == {"create", "get", "delete"} and set(asked) >= save, (save, set(asked))


def test_a_local_checkpoint_location_is_checked_the_same_way(tmp_path: Path) -> None:
    assert _writable(str(tmp_path / "runs" / "ckpt")) is None
    assert objects(tmp_path / "runs") == []  # made, written, read, moved, deleted
    (tmp_path / "file").write_text("not a directory")
    assert str(_writable(str(tmp_path / "file" / "ckpt"))).startswith(("FileExistsError", "NotADirectoryError"))
