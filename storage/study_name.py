"""What a study name may be, checked once for everything it becomes, and the file names the tools derive from it.

A study name becomes: a row in the study storage (Optuna: up to 512 characters), a directory under output_root
(`<root>/<name>/<uid>/trial-<n>`, one path component of at most 255 bytes on Linux and macOS), part of each
job's name (`<name>-<uid8>-<n>`, its W&B run and the launcher's process pattern), part of the SQLite lock file's
name (storage/locks.py), an item of `dashboards.report study=a,b` (a comma separates studies) and the name of
the report's file. `problem` refuses what any of these cannot hold, so a name that passes works everywhere.

Studies created another way (Optuna's CLI or API) may have any name: the tools read them, and derive file names
from them only through `file_stem`, which keeps every file they write inside its directory.
"""

from __future__ import annotations

import hashlib
import re

MAX_BYTES = 100  # UTF-8 bytes: the longest name that still fits every file name it is part of, with room to spare
SEPARATOR = ","  # `study=a,b`: the tools' list separator (dashboards.report compares the studies it names)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UNSAFE_IN_FILE = re.compile(r"[^A-Za-z0-9._-]+")


def problem(name: object) -> str | None:
    """Why `name` cannot be a study name (a sentence saying what is accepted), or None if it can."""
    if not isinstance(name, str):
        return f"expected a string; quote it to keep it one: study.name='{name}'"
    accepted = (
        f"a study name is one directory name of at most {MAX_BYTES} bytes: no '/', no '{SEPARATOR}' (it separates "
        "studies in study=a,b), no control characters, no spaces at either end, not '.' or '..'"
    )
    size = len(name.encode("utf-8"))
    if size > MAX_BYTES:
        return f"it is {size} bytes long; {accepted}"
    if not name.strip() or name in (".", "..") or name != name.strip():
        return f"it names the study's directory under output_root; {accepted}"
    for char, why in (("/", "a path separator"), (SEPARATOR, "the tools' study separator")):
        if char in name:
            return f"it contains {char!r} ({why}); {accepted}"
    if _CONTROL.search(name):
        return f"it contains a control character; {accepted}"
    return None


def file_stem(names: list[str], max_chars: int = 120) -> str:
    """A file name stem for files about the studies `names` (the report's `<stem>.html`): letters, digits, '.',
    '_', '-' only, never starting with '.', at most `max_chars` long (a hash of the names keeps shortened stems
    apart). Whatever the names hold (`../../x`, 300 characters, a comma), the file stays in its directory."""
    joined = "_vs_".join(names)
    stem = _UNSAFE_IN_FILE.sub("_", joined).lstrip(".") or "study"
    if stem != joined or len(stem) > max_chars:
        digest = hashlib.sha256(joined.encode("utf-8")).hexdigest()[:10]
        stem = f"{stem[: max_chars - 11]}-{digest}"
    return stem
