"""Credentials in storage options never show: not in messages, CLI output, warnings, metadata or files.

Against a real S3 API (moto's server on 127.0.0.1). moto accepts any
credentials, so the secret here is a marker string: what matters is where it
can be found afterwards.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import boto3
import pytest

from jobs import CountUrls, make_records
from statekit import CheckpointError, ConfigurationError, LocalRunner, RecordSource, StateError
from statekit._cli import main

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSECRETMARKER"
RECORDS = make_records(300, urls=20, seed=5)


@pytest.fixture
def s3(s3_endpoint: dict[str, str]) -> Any:
    pytest.importorskip("s3fs")
    return boto3.client("s3", endpoint_url=s3_endpoint["endpoint_url"], region_name="us-east-1")


def everything_in(s3: Any, bucket: str, prefix: str) -> bytes:
    """Every byte stored under ``prefix``: where a leaked secret would be."""
    out = b""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out += obj["Key"].encode() + s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def make_runner(config: dict[str, Any]) -> LocalRunner:
    return LocalRunner(
        CountUrls, key_selector=lambda rec: rec["url"], config={"statekit.parallelism": 2, **config}
    )


def run_job(config: dict[str, Any]) -> tuple[LocalRunner, str]:
    r = make_runner(config)
    r.run(RecordSource(RECORDS))
    return r, r.checkpoint()


def test_secret_storage_options_and_env_references_work_and_never_show(
    s3: Any, s3_endpoint: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket, endpoint = s3_endpoint["bucket"], s3_endpoint["endpoint_url"]
    monkeypatch.setenv("STATEKIT_TEST_S3_SECRET", SECRET)
    prefix = "secrets-job"
    public = {"client_kwargs": {"endpoint_url": endpoint}, "skip_instance_cache": True}
    # The endpoint rides in the secret options here: the job only works if they are merged in.
    secret = {
        "key": "testing",
        "secret": "${env:STATEKIT_TEST_S3_SECRET}",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    base = "statekit.checkpoint.storage.filesystem"
    config = {
        "statekit.checkpoints.dir": f"s3://{bucket}/{prefix}",
        "statekit.checkpoint.storage.filesystem.inline-threshold": 0,
        f"{base}.storage-options": json.dumps({"skip_instance_cache": True}),
        f"{base}.secret-storage-options": json.dumps({**secret, **public}),
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r, location = run_job(config)
        restored = make_runner(config)
        assert restored.restore("latest") == location
    assert SECRET.encode() not in everything_in(s3, bucket, prefix)
    assert SECRET not in repr(r.storage) + repr(r.config) + "".join(str(w.message) for w in caught)

    # The CLI, with ${env:...} in --storage-options: listing, inspecting, and failing.
    cli_options = json.dumps({**public, "key": "testing", "secret": "${env:STATEKIT_TEST_S3_SECRET}"})
    assert main(["checkpoints", "list", f"s3://{bucket}/{prefix}", "--storage-options", cli_options]) == 0
    assert main(["checkpoints", "inspect", location, "--storage-options", cli_options, "--json"]) == 0
    assert main(["plugins"]) == 0 and main(["plugins", "--json"]) == 0
    literal = json.dumps({**public, "key": "testing", "secret": SECRET})
    assert main(["checkpoints", "inspect", f"s3://{bucket}/nothing-here", "--storage-options", literal]) == 2
    assert main(["checkpoints", "list", f"s3://{bucket}/{prefix}", "--storage-options", literal[:-1]]) == 2
    out = capsys.readouterr()
    assert "chk-1" in out.out and "statekit: error:" in out.err
    assert SECRET not in out.out + out.err


def test_errors_never_show_secrets(
    s3: Any, s3_endpoint: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, endpoint = s3_endpoint["bucket"], s3_endpoint["endpoint_url"]
    base = "statekit.checkpoint.storage.filesystem"
    good = {"client_kwargs": {"endpoint_url": endpoint}, "secret": SECRET, "key": "testing"}
    cases: list[tuple[dict[str, Any], type[StateError]]] = [
        # malformed JSON holding the secret
        ({f"{base}.storage-options": json.dumps(good)[:-2]}, ConfigurationError),
        ({f"{base}.secret-storage-options": '{"secret": "' + SECRET + '", }'}, ConfigurationError),
        # not an object, or an undeclared option
        ({f"{base}.secret-storage-options": json.dumps([SECRET])}, ConfigurationError),
        ({f"{base}.secret-storage-options": {"secret": SECRET, "nope": 1}}, StateError),
        # an unset variable
        (
            {f"{base}.secret-storage-options": json.dumps({"secret": "${env:STATEKIT_UNSET_VAR}"})},
            ConfigurationError,
        ),
    ]
    for extra, error in cases:
        config = {"statekit.checkpoints.dir": f"s3://{bucket}/errors", **extra}
        with pytest.raises(error) as info:
            run_job(config)
        assert SECRET not in str(info.value), str(info.value)
    # A failing checkpoint (its bucket does not exist): the message names the file, not the options.
    config = {
        "statekit.checkpoints.dir": "s3://no-such-bucket-anywhere/x",
        "statekit.checkpoint.storage.filesystem.inline-threshold": 0,
        f"{base}.secret-storage-options": json.dumps({**good, "skip_instance_cache": True}),
    }
    r = make_runner(config)
    r.run(RecordSource(RECORDS))
    with pytest.raises(CheckpointError) as failure:
        r.checkpoint()
    assert "no-such-bucket-anywhere" in str(failure.value)
    assert SECRET not in str(failure.value)
