"""A PostgreSQL cluster of the suite's own (`python -m storage.up` in a temporary directory), which the chaos suite
may stop and start: never the machine's server."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class PrivatePostgres:
    """A context manager; the cluster is stopped and removed on exit."""

    def __init__(self) -> None:
        from sweeps.launchers.torchrun import free_port

        self.parent = Path(tempfile.mkdtemp(prefix="trm-sweeps-soak-pg-", dir="/tmp"))
        self.parent.chmod(0o755)  # as root the server runs as postgres, which must reach data/
        self.data, self.port = self.parent / "data", free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/trm_sweeps"

    def _up(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "storage.up", "--dir", str(self.data), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[1:])} failed: {proc.stderr.strip() or proc.stdout.strip()}")

    def start(self) -> None:
        self._up("--port", str(self.port))

    def stop(self) -> None:
        self._up("--stop")

    def __enter__(self) -> PrivatePostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.parent, ignore_errors=True)
