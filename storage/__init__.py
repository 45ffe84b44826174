"""Where studies live: URL resolution, engine settings, heartbeats, a local dev server.

Public API (``python -m storage.up`` and ``python -m storage.check`` are the CLIs).
"""

from storage.engine import close_storage, open_storage, schema_version
from storage.engine_config import EngineSettings, engine_settings
from storage.errors import StorageConfigError, StorageError, StorageGoneError, StorageUnavailableError, database_gone
from storage.heartbeat import HeartbeatThread, fail_stale_trials, orphaned_trials, retry_callback, trial_id_of
from storage.locks import exclusive
from storage.url import ENV_VAR, redact, resolve_url, validate_url

__all__ = [
    "ENV_VAR",
    "EngineSettings",
    "HeartbeatThread",
    "StorageConfigError",
    "StorageError",
    "StorageGoneError",
    "StorageUnavailableError",
    "close_storage",
    "database_gone",
    "engine_settings",
    "exclusive",
    "fail_stale_trials",
    "open_storage",
    "orphaned_trials",
    "redact",
    "resolve_url",
    "retry_callback",
    "schema_version",
    "trial_id_of",
    "validate_url",
]
