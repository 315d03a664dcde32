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
from statekit import LocalRunner, RecordSource
from statekit.cli._cli import main
from statekit.errors import CheckpointError, ConfigurationError, StateError

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
    return r, r.run(RecordSource(RECORDS)).checkpoints[-1]  # the end of the input's checkpoint


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
        # an option the filesystem does not take, beside the credentials (s3fs fails making its client)
        ({f"{base}.secret-storage-options": json.dumps({**good, "nope": 1})}, StateError),
        ({f"{base}.storage-options": json.dumps({**good, "config_kwargs": {"nope": 1}})}, StateError),
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
        assert SECRET not in exception_chain_text(info.value), str(info.value)
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


KEY_ID = "AKIAIOSFODNN7KEYIDMARKER"


def exception_chain_text(exc: BaseException) -> str:
    """All that an exception chain carries for a tool to print: messages, args, attributes.

    Walks ``__cause__`` and ``__context__`` whether or not ``__suppress_context__``
    hides the context from Python's own traceback: error reporters walk it anyway.
    """
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
    ("name", "value"),
    [("storage-options", '{"key": "' + KEY_ID + '", "secret": "' + SECRET + '", }'),
     ("storage-options", '{"secret": "' + SECRET + '"'),
     ("secret-storage-options", '{"key": "' + KEY_ID + '" "secret": "' + SECRET + '"}'),
     ("secret-storage-options", "[" * 100_000 + '"' + SECRET + '"' + "]" * 100_000),
     ("storage-options", json.dumps([KEY_ID, SECRET])),
     ("secret-storage-options", json.dumps({"secret": "${env:STATEKIT_UNSET_VAR_X}", "key": KEY_ID}))],
)  # fmt: skip
def test_storage_option_errors_keep_no_secret_anywhere_in_the_chain(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.delenv("STATEKIT_UNSET_VAR_X", raising=False)
    config = {
        "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
        f"statekit.checkpoint.storage.filesystem.{name}": value,
    }
    with pytest.raises(ConfigurationError) as info:
        make_runner(config)
    assert "statekit.checkpoint.storage.filesystem" in str(info.value)
    text = exception_chain_text(info.value)
    assert SECRET not in text and KEY_ID not in text


def test_the_chain_walk_finds_what_a_suppressed_context_still_holds() -> None:
    """The check above can fail: ``raise ... from None`` in the handler leaves the decoder's error behind."""
    try:
        try:
            json.loads('{"secret": "' + SECRET + '", }')
        except ValueError:
            raise ConfigurationError("malformed") from None
    except ConfigurationError as exc:
        assert SECRET in exception_chain_text(exc)


def test_a_key_id_alone_is_not_shown_by_a_runners_configuration(tmp_path: Any) -> None:
    options = json.dumps({"key": KEY_ID, "client_kwargs": {"region_name": "us-east-1"}})
    config = {
        "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
        "statekit.checkpoint.storage.filesystem.storage-options": options,
    }
    runner = make_runner(config)
    assert KEY_ID not in repr(runner.config) + repr(runner.storage)
    assert "us-east-1" in repr(runner.config)
