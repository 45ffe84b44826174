"""A stand-in for Google Cloud Storage in tests: `gs://` as an fsspec filesystem over a local directory.

$FAKE_GCS_ROOT is the store: each directory under it is a bucket (`gs://<bucket>/<key>` is the file
$FAKE_GCS_ROOT/<bucket>/<key>). `register()` makes it fsspec's `gs` (and `gcs`) in this process; the stand-in
gcloud's VMs load it at start-up where $FAKE_GCS_ROOT is set (tests/fake_gcloud/vm-site/sitecustomize.py), as gcsfs
installed on a real VM makes `gs://` Google's. Nothing in the project knows of it: the project's code reaches it
through fsspec only, as it reaches gcsfs.

Where gcsfs and Cloud Storage behave otherwise than a local disk, so does this store (the traits a save meets):
- No directories: a "directory" is a prefix of some object's name. `makedirs`/`mkdir` below a bucket do nothing,
  a prefix with no object under it does not exist, and deleting a prefix's last object makes it vanish.
- A bucket must exist (a directory under the root): an object in a bucket that does not is FileNotFoundError,
  gcsfs's 404. `makedirs` of any path in a missing bucket creates the bucket, as gcsfs's does (its `_mkdir` with
  create_parents), where the caller may (storage.buckets.create).
- An object appears whole when its upload ends (the writer's close), never part-written.
- `mv` is a copy then a delete (fsspec's default, which gcsfs keeps): not atomic, both names exist in between.
- Overwriting an object needs the delete permission, as on Cloud Storage.
- Permissions: $FAKE_GCS_ROOT/<bucket>.denied lists the operations the caller's service account lacks, of
  `get` (read an object or its metadata: storage.objects.get), `create`, `delete` and `list` (objects), and
  `bucket-create` (storage.buckets.create); each is PermissionError, gcsfs's 403, naming the permission.
"""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path

ROOT_ENV = "FAKE_GCS_ROOT"
UPLOADS = ".uploads"  # under the root, in no bucket (a bucket's name never starts with a dot): uploads in flight


def store_root() -> Path:
    root = os.environ.get(ROOT_ENV)
    if not root:
        raise ValueError(f"${ROOT_ENV} is not set: the gs:// stand-in has no store (tests/fake_gcs.py)")
    return Path(root)


class StandInGCS(AbstractFileSystem):
    """gs:// on $FAKE_GCS_ROOT (the module's docstring). The root is read at each call, not kept: fsspec caches
    one instance per process, and tests give each their own store."""

    protocol = ("gs", "gcs")
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        for prefix in ("gs://", "gcs://"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
        return path.lstrip("/").rstrip("/")

    # ------------------------------------------------------------------------------------------- names

    def _split(self, path: str) -> tuple[str, str]:
        bucket, _, key = self._strip_protocol(path).partition("/")
        return bucket, key

    def _bucket(self, bucket: str, what: str) -> Path:
        where = store_root() / bucket
        if not bucket or bucket.startswith(".") or not where.is_dir():
            raise FileNotFoundError(f"404 {what}: the specified bucket does not exist ({bucket!r})")
        return where

    def _allowed(self, bucket: str, operation: str, path: str) -> None:
        denied = store_root() / f"{bucket}.denied"
        if denied.is_file() and operation in denied.read_text().split():
            permission = "storage.buckets.create" if operation == "bucket-create" else f"storage.objects.{operation}"
            raise PermissionError(
                f"403 the caller does not have {permission} access to the Google Cloud Storage object gs://{path}"
            )

    def _object(self, path: str, operation: str) -> Path:
        """The local file of the object `path` (it may not exist), after the bucket and permission checks."""
        path = self._strip_protocol(path)
        bucket, key = self._split(path)
        where = self._bucket(bucket, path)
        if not key:
            raise IsADirectoryError(f"gs://{path} is a bucket, not an object")
        self._allowed(bucket, operation, path)
        return where / key

    @staticmethod
    def _has_objects(local: Path) -> bool:
        return local.is_dir() and any(p.is_file() for p in local.rglob("*"))

    def _entry(self, name: str, local: Path) -> dict[str, Any]:
        if local.is_file():
            stat = local.stat()
            return {"name": name, "size": stat.st_size, "type": "file", "updated": stat.st_mtime}
        return {"name": name, "size": 0, "type": "directory"}

    # ------------------------------------------------------------------------------------------- reading

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        bucket, key = self._split(path)
        if not bucket:
            names = [p.name for p in sorted(store_root().iterdir()) if p.is_dir() and not p.name.startswith(".")]
            entries = [{"name": n, "size": 0, "type": "directory"} for n in names]
        else:
            where = self._bucket(bucket, path)
            self._allowed(bucket, "list", path)
            local = where / key if key else where
            if local.is_file():
                entries = [self._entry(path, local)]
            elif key and not self._has_objects(local):
                raise FileNotFoundError(f"404 no object or prefix gs://{path}")
            else:
                entries = [
                    self._entry(f"{path}/{child.name}", child)
                    for child in sorted(local.iterdir())
                    if child.is_file() or self._has_objects(child)
                ]
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        bucket, key = self._split(path)
        where = self._bucket(bucket, path)
        if not key:
            return {"name": bucket, "size": 0, "type": "directory"}
        local = where / key
        if local.is_file():
            self._allowed(bucket, "get", path)  # an object's metadata is storage.objects.get's
            return self._entry(path, local)
        if self._has_objects(local):
            self._allowed(bucket, "list", path)
            return self._entry(path, local)
        raise FileNotFoundError(f"404 no object or prefix gs://{path}")

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if "r" in mode:
            local = self._object(path, "get")
            if not local.is_file():
                raise FileNotFoundError(f"404 no object gs://{self._strip_protocol(path)}")
            return open(local, "rb")  # the caller closes it
        if "w" not in mode:
            raise ValueError(f"the gs:// stand-in opens objects for reading or writing whole, not {mode!r}")
        return _Upload(self, self._strip_protocol(path))

    # ------------------------------------------------------------------------------------------- writing

    def _publish(self, path: str, data: bytes) -> None:
        """An upload's end: the object appears whole (or replaces the one of that name)."""
        local = self._object(path, "create")
        if local.is_file():
            self._allowed(self._split(path)[0], "delete", path)  # an overwrite deletes the old generation
        if local.is_dir():
            raise FileExistsError(f"gs://{path}: an object name that is a prefix of others is not allowed here")
        staging = store_root() / UPLOADS
        staging.mkdir(exist_ok=True)
        part = staging / uuid.uuid4().hex
        part.write_bytes(data)
        local.parent.mkdir(parents=True, exist_ok=True)  # the store's bookkeeping: not a directory anyone sees
        os.replace(part, local)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Cloud Storage's copy (a rewrite, server side): the source's get, the destination's create."""
        source = self._object(path1, "get")
        if not source.is_file():
            raise FileNotFoundError(f"404 no object gs://{self._strip_protocol(path1)}")
        self._publish(self._strip_protocol(path2), source.read_bytes())

    def _rm(self, path: str) -> None:
        local = self._object(path, "delete")
        if not local.is_file():
            raise FileNotFoundError(f"404 no object gs://{self._strip_protocol(path)}")
        local.unlink()
        bucket = self._bucket(self._split(path)[0], path)
        parent = local.parent
        while parent != bucket and not any(parent.iterdir()):  # the prefix goes with its last object
            parent.rmdir()
            parent = parent.parent

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """gcsfs's: the path's bucket is created if missing; a prefix below it needs nothing."""
        bucket, key = self._split(path)
        where = store_root() / bucket
        if where.is_dir():
            if not key and not exist_ok:
                raise FileExistsError(f"bucket {bucket!r} exists")
            return
        if not bucket or bucket.startswith("."):
            raise ValueError(f"gs://{path}: no bucket name")
        self._allowed(bucket, "bucket-create", bucket)
        where.mkdir(parents=True)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        self.makedirs(path, exist_ok=True)

    def rmdir(self, path: str) -> None:
        bucket, key = self._split(path)
        if not key:
            self._bucket(bucket, path).rmdir()


class _Upload(io.BytesIO):
    """An object being uploaded: its bytes are held until `close`, which publishes them whole."""

    def __init__(self, fs: StandInGCS, path: str) -> None:
        super().__init__()
        self.fs, self.path, self.published = fs, path, False
        fs._bucket(fs._split(path)[0], path)  # a missing bucket fails at open, as gcsfs's first request does

    def close(self) -> None:
        if not self.closed and not self.published:
            self.published = True
            self.fs._publish(self.path, self.getvalue())
        super().close()


def register() -> None:
    """Make the stand-in fsspec's `gs` and `gcs` in this process."""
    for protocol in StandInGCS.protocol:
        fsspec.register_implementation(protocol, StandInGCS, clobber=True)
