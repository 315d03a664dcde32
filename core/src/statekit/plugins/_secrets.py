"""Keeping credentials out of what statekit shows: messages, reprs, listings, warnings.

A value is secret when its key looks like one (:data:`SECRET_KEY`: Spark's
default ``spark.redaction.regex`` and a few more names fsspec implementations
use) or names the id of a key (:data:`KEY_ID`: s3fs's ``key``, ``client_id``):
an access key id is half a credential and names the account it opens, so it is
hidden like the secret. Configuration values are often JSON (fsspec storage
options), so :func:`redact` looks inside JSON strings, mappings and lists too.
Credentials inside a URL (``http://user:pass@host``, in ``endpoint_url`` or in
any other value) are hidden wherever they appear: the whole user information
before the ``@``, since a user name there is often a key id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "KEY_ID",
    "REDACTED",
    "SECRET_KEY",
    "SPARK_DEFAULT_REDACTION",
    "URL_CREDENTIALS",
    "is_secret_key",
    "redact",
    "redact_urls",
    "secret_keys_in",
]

#: Spark's default ``spark.redaction.regex``: keys it hides on its UI and in its event logs.
SPARK_DEFAULT_REDACTION = r"(?i)secret|password|token|access[.]?key"
#: Keys whose values statekit never shows (Spark's, plus names of fsspec credentials).
SECRET_KEY = re.compile(
    r"(?i)secret|password|passwd|passphrase|token|access[._-]?key|account[._-]?key|credential|private[._-]?key"
    r"|sas[._-]?token|connection[._-]?string|session[._-]?key|signature"
)
#: Names (the whole name, or a dotted key's last part) of key ids: s3fs's and ossfs's ``key`` and its
#: alias ``username``, Azure's ``client_id``. Matched whole: ``key-cache-size`` is no key id.
KEY_ID = re.compile(r"(?i)key|key[._-]?id|user[._-]?name|client[._-]?id")
#: What is shown instead of a secret (Spark's own text).
REDACTED = "*********(redacted)"
#: A URL's user information (``user:password@`` after ``scheme://``), up to the last ``@`` before its host.
URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s]+)@")


def redact_urls(text: str) -> str:
    """``text`` with the user information of every URL in it (``user:pass@``) replaced by :data:`REDACTED`.

    Example::

        redact_urls("http://minio:s3cr3t@127.0.0.1:9000/b")  # 'http://*********(redacted)@127.0.0.1:9000/b'
    """
    return URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)


def is_secret_key(name: str) -> bool:
    """Whether the value under ``name`` (a configuration key or a key inside a JSON value) is never shown.

    Example::

        is_secret_key("secret"), is_secret_key("key"), is_secret_key("statekit.key-cache-size")
        # (True, True, False)
    """
    return bool(SECRET_KEY.search(name) or KEY_ID.fullmatch(name.rpartition(".")[2]))


def _looks_like_json(value: str) -> bool:
    return value.lstrip()[:1] in ("{", "[")


def redact(value: Any, key: str = "") -> Any:
    """``value`` with every secret replaced by :data:`REDACTED`.

    Secret is the whole value of a key for which :func:`is_secret_key` holds,
    and any entry with such a key inside a mapping, a list or a JSON string. A string
    that looks like JSON but does not parse is hidden whole: what it holds
    cannot be told apart.

    Example::

        redact('{"endpoint_url": "http://h:9000", "secret": "s3cr3t"}')
        # '{"endpoint_url": "http://h:9000", "secret": "*********(redacted)"}'
    """
    if key and is_secret_key(key):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str) and _looks_like_json(value):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return REDACTED
        return json.dumps(redact(parsed))
    if isinstance(value, str):
        return redact_urls(value)
    return value


def secret_keys_in(value: Any, path: str = "") -> list[str]:
    """Where ``value`` (a mapping, list or JSON string) holds secrets or key ids, as paths.

    Example::

        secret_keys_in('{"key": "AKIA", "client_kwargs": {"secret": "s"}}')  # ['key', 'client_kwargs.secret']
        secret_keys_in('{"endpoint_url": "http://u:p@h"}')  # ['endpoint_url (credentials in a URL)']
    """
    found: list[str] = []
    items: Iterable[tuple[str, Any]]
    if isinstance(value, str) and _looks_like_json(value):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return found
    if isinstance(value, str):
        if URL_CREDENTIALS.search(value):
            found.append(f"{path or 'the value'} (credentials in a URL)")
        return found
    if isinstance(value, Mapping):
        items = ((str(k), v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return found
    for k, v in items:
        where = f"{path}.{k}" if path else k
        if is_secret_key(k):
            found.append(where)
        else:
            found.extend(secret_keys_in(v, where))
    return found
