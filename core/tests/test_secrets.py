"""Secrets are never shown: redaction of values, configuration reprs and option errors."""

from __future__ import annotations

import json
import warnings

import pytest

from statekit import Configuration
from statekit.backend_api import ConfigOption
from statekit.errors import ConfigurationError
from statekit.plugins._secrets import REDACTED, SPARK_DEFAULT_REDACTION, is_secret_key, redact, secret_keys_in

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"
SECRET_DIGITS = "735091628374650192"  # a numeric secret, e.g. a PIN-like token under a secret key


def test_redact_hides_secret_keys_inside_mappings_lists_and_json() -> None:
    options = {
        "key": "AKIAEXAMPLE",
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "aws_session_token": SECRET},
        "list": [{"password": SECRET}],
        "account_key": SECRET,
        "sas_token": SECRET,
    }
    shown = redact(options)
    assert SECRET not in json.dumps(shown)
    assert shown["secret"] == REDACTED and shown["client_kwargs"]["aws_session_token"] == REDACTED
    assert shown["client_kwargs"]["endpoint_url"] == "http://127.0.0.1:9000"
    assert shown["key"] == REDACTED  # an access key id is half a credential
    assert SECRET not in redact(json.dumps(options))
    assert redact(SECRET, "spark.hadoop.fs.s3a.secret.key") == REDACTED
    assert redact('{"secret": "' + SECRET + '"') == REDACTED  # unparseable JSON: hidden whole
    assert sorted(secret_keys_in(json.dumps(options))) == [
        "account_key",
        "client_kwargs.aws_session_token",
        "key",
        "list.0.password",
        "sas_token",
        "secret",
    ]


def test_configuration_repr_and_option_errors_never_show_secrets() -> None:
    opts = json.dumps({"secret": SECRET, "client_kwargs": {"endpoint_url": "http://h"}})
    conf = Configuration.from_mapping(
        {
            "spark.statekit.checkpoint.storage.filesystem.storage-options": opts,
            "statekit.checkpoint.storage.filesystem.secret-storage-options": opts,
        }
    )
    assert SECRET not in repr(conf)
    assert "http://h" in repr(conf)
    with pytest.raises(ConfigurationError) as info:
        ConfigOption("storage-options", int).parse({"secret": SECRET}, "statekit.x.storage-options")
    assert SECRET not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        ConfigOption("statekit.x.password", int).parse(SECRET, "statekit.x.password")
    assert SECRET not in str(info.value)


KEY_ID = "AKIAIOSFODNN7KEYIDMARKER"


@pytest.mark.parametrize(
    "name",
    ["key", "KEY", "key_id", "access_key_id", "aws_access_key_id", "AWS_ACCESS_KEY_ID", "username",
     "client_id", "client-id", "statekit.checkpoint.storage.x.key", "spark.hadoop.fs.s3a.access.key"],
)  # fmt: skip
def test_key_ids_are_secret(name: str) -> None:
    assert is_secret_key(name)
    assert redact(KEY_ID, name) == REDACTED
    assert KEY_ID not in json.dumps(redact(json.dumps({name: KEY_ID})))


@pytest.mark.parametrize(
    "name",
    ["statekit.key-cache-size", "partition_key", "keys", "monkey", "endpoint_url", "region_name", "user"],
)
def test_names_that_only_contain_key_are_not(name: str) -> None:
    assert not is_secret_key(name)
    assert redact({name: "value"}) == {name: "value"}


def test_a_key_id_without_a_secret_is_hidden_in_the_configuration_repr() -> None:
    options = json.dumps({"key": KEY_ID, "client_kwargs": {"endpoint_url": "http://h:9000"}})
    conf = Configuration({"statekit.checkpoint.storage.filesystem.storage-options": options})
    assert KEY_ID not in repr(conf)
    assert "http://h:9000" in repr(conf)
    assert secret_keys_in(options) == ["key"]


def test_spark_is_warned_of_a_key_id_it_would_show() -> None:
    pytest.importorskip("pyspark")
    from statekit.spark._sparkconf import _warn_of_shown_secrets

    key = "spark.statekit.checkpoint.storage.filesystem.storage-options"
    with pytest.warns(RuntimeWarning, match=r"storage-options holds credentials \(key\)") as caught:
        _warn_of_shown_secrets({key: json.dumps({"key": KEY_ID})}, SPARK_DEFAULT_REDACTION)
    assert KEY_ID not in str(caught[0].message)
    # With the secret beside it, Spark's regex matches the value and hides all of it: no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_of_shown_secrets(
            {key: json.dumps({"key": KEY_ID, "secret": "${env:S}"})}, SPARK_DEFAULT_REDACTION
        )


def exception_chain_text(exc: BaseException) -> str:
    """All that an exception chain carries for a tool to print: messages, args, attributes, notes."""
    parts: list[str] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        parts += [str(e), repr(e), repr(e.args), repr(getattr(e, "__dict__", {}))]
        todo += [e.__cause__, e.__context__]
    return "\n".join(parts)


@pytest.mark.parametrize(
    ("option", "raw"),
    [(ConfigOption("statekit.x.storage-options", int), json.dumps({"secret": SECRET})),
     (ConfigOption("statekit.x.storage-options", int), {"key": KEY_ID}),
     (ConfigOption("statekit.x.storage-options", bool), '{"secret": "' + SECRET + '"'),
     (ConfigOption("statekit.x.client-secret", int, minimum=10**30), int(SECRET_DIGITS)),
     (ConfigOption("statekit.x.key", str, choices=("a",)), KEY_ID)],
)  # fmt: skip
def test_option_errors_keep_no_secret_anywhere_in_their_chain(option: ConfigOption, raw: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        option.parse(raw, option.name)
    text = exception_chain_text(info.value)
    assert SECRET not in text and KEY_ID not in text and SECRET_DIGITS not in text
    assert option.name in str(info.value)


PASSWORD = "Pa55-in-the-URL"


def test_credentials_inside_url_valued_options_are_redacted_wherever_options_are_shown() -> None:
    endpoint = f"http://minio:{PASSWORD}@127.0.0.1:9000/bucket"
    opts = json.dumps({"client_kwargs": {"endpoint_url": endpoint}})
    conf = Configuration.from_mapping(
        {
            "statekit.checkpoint.storage.filesystem.storage-options": opts,
            "statekit.checkpoints.dir": f"ftp://ops:{PASSWORD}@files.example/checkpoints",
            "statekit.some.url": endpoint,
        }
    )
    shown = repr(conf)
    assert PASSWORD not in shown and "minio" not in shown
    assert f"http://{REDACTED}@127.0.0.1:9000/bucket" in shown  # where it points stays readable
    assert f"ftp://{REDACTED}@files.example/checkpoints" in shown
    assert redact(f"s3://k:{PASSWORD}@b/p?x=@y") == f"s3://{REDACTED}@b/p?x=@y"
    assert (
        redact("http://127.0.0.1:9000/a@b") == "http://127.0.0.1:9000/a@b"
    )  # an @ in the path: no credentials
    assert secret_keys_in(opts) == ["client_kwargs.endpoint_url (credentials in a URL)"]
    with pytest.raises(ConfigurationError) as info:  # an option error quoting the value
        ConfigOption("statekit.x.url", int).parse(endpoint, "statekit.x.url")
    assert PASSWORD not in exception_chain_text(info.value)


def test_storage_reprs_and_open_errors_hide_url_credentials(tmp_path: object) -> None:
    pytest.importorskip("statekit_storage")
    from statekit_storage import FileSystemCheckpointStorage

    with pytest.raises(ConfigurationError) as info:
        FileSystemCheckpointStorage(f"nosuchproto://u:{PASSWORD}@host/cp")
    assert PASSWORD not in str(info.value) and f"nosuchproto://{REDACTED}@host/cp" in str(info.value)
    assert PASSWORD not in repr(FileSystemCheckpointStorage(f"memory://u:{PASSWORD}@host/cp"))


def test_spark_is_warned_of_credentials_in_a_url_it_would_show() -> None:
    pytest.importorskip("pyspark")
    from statekit.spark._sparkconf import _warn_of_shown_secrets

    key = "spark.statekit.checkpoint.storage.filesystem.storage-options"
    value = json.dumps({"client_kwargs": {"endpoint_url": f"http://minio:{PASSWORD}@h:9000"}})
    with pytest.warns(RuntimeWarning, match=r"credentials in a URL") as caught:
        _warn_of_shown_secrets({key: value}, SPARK_DEFAULT_REDACTION)
    assert PASSWORD not in str(caught[0].message)
