"""Secrets are never shown: redaction of values, configuration reprs and option errors."""

from __future__ import annotations

import json

import pytest

from statekit import ConfigOption, Configuration, ConfigurationError
from statekit._secrets import REDACTED, redact, secret_keys_in

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"


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
    assert shown["key"] == "AKIAEXAMPLE"  # an access key id is an identifier, not a secret
    assert SECRET not in redact(json.dumps(options))
    assert redact(SECRET, "spark.hadoop.fs.s3a.secret.key") == REDACTED
    assert redact('{"secret": "' + SECRET + '"') == REDACTED  # unparseable JSON: hidden whole
    assert sorted(secret_keys_in(json.dumps(options))) == [
        "account_key",
        "client_kwargs.aws_session_token",
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
