"""The code version every worker of a job must run: a sha256 over the `trm` package's source files.

Found without importing `trm` (importlib's spec of the top-level package), so the driver and a pod VM's
preflight probe compute the same value as a job does without loading torch."""

from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def code_fingerprint(package: str = "trm") -> str:
    """sha256 over the package's source files (their paths and bytes, in sorted order)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no package {package!r} on this interpreter's path")
    root = Path(spec.origin).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
