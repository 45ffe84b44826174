"""Errors raised by the storage package.

Two kinds, because callers react differently: a config mistake is fixed by the user
(exit with a clear message), an unavailable server may be retried or waited for.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class for every error this package raises on purpose."""


class StorageConfigError(StorageError, ValueError):
    """The storage configuration is wrong (bad URL, password in URL, missing env var)."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The storage could not be reached or opened (server down, bad host, no database)."""
