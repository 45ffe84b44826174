"""What counts as a secret in a config or on a command line, how to hide it, and how to refuse it.

The one home of this project's secret detection. Three shapes are recognised:

* a URL with credentials: ``scheme://user:PASSWORD@host/...`` or a query parameter whose name is a
  secret's (``?password=``, ``&token=``, ``X-Amz-Signature=``, ...);
* a value under a key whose name says it is a secret (``api_key``, ``token``, ``password``, ``secret``,
  ``credential``), e.g. ``+wandb.api_key=...``; names ending in ``_env`` are exempt: they name the
  environment variable that holds the secret (``storage.password_env``), which is the way to pass one;
* both of the above inside a Hydra override string (``key=value``), as in ``trial.overrides`` lists.

:func:`find_secret` returns a one-line refusal for the first secret found (never echoing it), or None.
``storage.url`` uses :func:`password_in_url_message` for its own check, so a database password is refused
with the same words wherever it is found. The Hydra apps call :func:`find_secret` from a callback before
Hydra writes anything (``storage/hydra_secrets.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

# Lower-case fragments of a key name that mark its value as a secret.
SECRET_NAME_PARTS = (
    "password",
    "passwd",
    "secret",
    "token",
    "key",
    "credential",
    "signature",
)
# Key names that contain such a fragment but hold no secret (Hydra's own `exclude_keys` list).
NOT_SECRET_NAMES = frozenset({"exclude_keys"})
# A name ending so names the environment variable that holds the secret: the recommended way.
ENV_NAME_SUFFIX = "_env"

# Characters that end a URL inside an override string or a Hydra list (`['a=x://u:p@h', 'b=...']`).
_STOP = r"\s'\",\[\]"
# scheme://user:PASSWORD@ - RFC 3986 userinfo: the password cannot hold '/', '?' or '#' unencoded.
_USERINFO = re.compile(rf"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^/?#@:{_STOP}]*:)(?P<secret>[^/?#@{_STOP}]*)@")
# Database URLs as SQLAlchemy parses them: its password may hold '/' (anything but '@').
_DB_USERINFO = re.compile(
    rf"(?P<head>\b(?:postgres(?:ql)?|sqlite|mysql|mariadb)(?:\+\w+)?://[^/@:{_STOP}]*:)(?P<secret>[^@{_STOP}]*)@",
    re.IGNORECASE,
)
# ?name=value / &name=value where name is a secret's name (checked with is_secret_name).
_QUERY = re.compile(rf"(?P<head>[?&](?P<name>[^=&#{_STOP}]+)=)(?P<secret>[^&#{_STOP}]+)")
# The last resort for a URL that does not parse: anything between "://user:" and the last "@".
_LOOSE_USERINFO = re.compile(r"(://[^/@:]*:).*@")
# `key=value` as a Hydra override spells it (`+key`, `++key`, `~key`, `key@package`).
_OVERRIDE = re.compile(r"^(?P<key>[~+]{0,2}[\w.\-/@]+)=(?P<value>.*)$", re.DOTALL)
_DB_SCHEME = re.compile(r"^(?:postgres(?:ql)?|sqlite|mysql|mariadb)(?:\+\w+)?://", re.IGNORECASE)

WHY = (
    "Secrets must not be passed on the command line or in the config: Hydra saves both in the run "
    "directory (.hydra/*.yaml) and command lines are visible to every user of the machine"
)


def is_secret_name(name: str) -> bool:
    """True when a key named ``name`` (last dotted part, any prefix) holds a secret by its name."""
    last = name.lstrip("~+").split("@", 1)[0].rsplit(".", 1)[-1].lower()
    if last in NOT_SECRET_NAMES or last.endswith(ENV_NAME_SUFFIX):
        return False
    return any(part in last for part in SECRET_NAME_PARTS)


def _query_secrets(text: str) -> Iterator[re.Match[str]]:
    return (m for m in _QUERY.finditer(text) if is_secret_name(m.group("name")))


def has_url_credentials(text: str) -> bool:
    """True when ``text`` holds a URL with a password in its userinfo or a secret query parameter."""
    return bool(_USERINFO.search(text) or _DB_USERINFO.search(text) or next(_query_secrets(text), None))


def redact_credentials(text: str, unparsed: bool = False) -> str:
    """``text`` with every URL password and secret query value replaced by ``***``.

    ``unparsed``: ``text`` is a URL that did not even parse; also hide everything from ``://user:`` to
    the last ``@``, whatever it holds (spaces, quotes)."""
    if unparsed:
        text = _LOOSE_USERINFO.sub(r"\1***@", text)

    def hide_userinfo(match: re.Match[str]) -> str:
        return match.group("head") + "***@"

    def hide_query(match: re.Match[str]) -> str:
        return match.group("head") + "***" if is_secret_name(match.group("name")) else match.group(0)

    text = _USERINFO.sub(hide_userinfo, _DB_USERINFO.sub(hide_userinfo, text))
    return _QUERY.sub(hide_query, text)


def password_in_url_message(key: str, shown_url: str, password_env_key: str = "storage.password_env") -> str:
    """The refusal of a database URL carrying a password (``shown_url`` must already be redacted)."""
    return (
        f"{key} = {shown_url!r} contains a password. Passwords must not appear in the URL "
        "(it ends up on command lines and in logs): put it in ~/.pgpass (or the file named "
        "by PGPASSFILE), or put it in an environment variable and name that variable in "
        f"{password_env_key}."
    )


def _password_env_key(key: str) -> str:
    """The key that names the password's env var for the app owning ``key`` (trm.train: sweep.*)."""
    return "sweep.password_env" if key.lstrip("~+").startswith("sweep.") else "storage.password_env"


def url_refusal(key: str, value: str) -> str | None:
    """One-line refusal if ``value`` (the value of ``key``) holds a URL with credentials, else None."""
    if not has_url_credentials(value):
        return None
    shown = redact_credentials(value)
    if _DB_SCHEME.match(value):
        return password_in_url_message(key, shown, _password_env_key(key))
    return (
        f"{key} = {shown!r} carries credentials in a URL. {WHY}: remove them from the URL and let the "
        "client find them (gcloud auth / GOOGLE_APPLICATION_CREDENTIALS for gs://, AWS_* variables or "
        "~/.aws for s3://, ~/.netrc for http(s)://)."
    )


def name_refusal(key: str) -> str:
    """One-line refusal of a value under a secret's key name (the value itself is never shown)."""
    return (
        f"{key} = *** looks like a secret (by its name). {WHY}: put it in the environment variable the "
        "tool reads (WANDB_API_KEY for W&B) or in its credentials file (~/.netrc), not in a key."
    )


def _is_set(value: Any) -> bool:
    """A value Hydra would write: not null/empty/missing, and not a boolean flag."""
    if value is None or isinstance(value, bool):
        return False
    text = str(value).strip()
    return text not in ("", "null", "None", "???", "''", '""')


def override_refusal(override: str, where: str | None = None) -> str | None:
    """Refusal for one ``key=value`` override string (or any string, checked for URL credentials)."""
    match = _OVERRIDE.match(override)
    if match is None:
        return url_refusal(where or "a value", override) if has_url_credentials(override) else None
    key, value = match.group("key"), match.group("value")
    shown_key = key if where is None else f"{key} (in {where})"
    if is_secret_name(key) and _is_set(value):
        return name_refusal(shown_key)
    return url_refusal(shown_key, value)


def _walk(node: Any, path: str) -> Iterator[str]:
    """Refusals for every secret under ``node`` (plain dicts/lists/scalars), ``path`` its dotted key."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            child = f"{path}.{k}" if path else str(k)
            if not isinstance(v, (Mapping, list, tuple)) and is_secret_name(str(k)) and _is_set(v):
                yield name_refusal(child)
            else:
                yield from _walk(v, child)
    elif isinstance(node, (list, tuple)):
        for item in node:
            if isinstance(item, str):
                # Items of a list are often overrides themselves (trial.overrides, hydra.overrides.task).
                refusal = override_refusal(item, path)
                if refusal:
                    yield refusal
            else:
                yield from _walk(item, path)
    elif isinstance(node, str):
        refusal = url_refusal(path, node)
        if refusal:
            yield refusal


def find_secret(config: Mapping[str, Any] | list[Any]) -> str | None:
    """The one-line refusal for the first secret in ``config``, else None.

    ``config`` is plain Python (``OmegaConf.to_container(cfg, resolve=False)``): unresolved
    interpolations such as ``${oc.env:NAME}`` are what Hydra writes to disk, so they are what is checked
    (a value read from the environment at run time is checked where it is used, e.g. ``validate_url``).
    """
    return next(_walk(config, ""), None)
