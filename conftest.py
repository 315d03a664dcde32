"""Hypothesis profiles for the whole suite (``ci``, the default, and ``nightly``) and shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# ci stays lean: every backend (heap, rocksdb, lmdb, sqlite) runs the kit against every storage.
settings.register_profile("ci", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "nightly", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))  # --hypothesis-profile overrides


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[dict[str, str]]:
    """A real S3 API on 127.0.0.1 for the whole session: moto's server in a thread.

    Sets dummy AWS credentials in the environment, creates a bucket and yields
    ``{"endpoint_url": "http://127.0.0.1:<port>", "bucket": <name>}``. Pass the
    endpoint to s3fs as ``client_kwargs={"endpoint_url": ...}``.
    """
    moto_server = pytest.importorskip("moto.server", reason="needs moto[server]")
    boto3 = pytest.importorskip("boto3")
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in [*env, "NO_PROXY", "no_proxy"]}
    os.environ.update(env)
    for key in ("NO_PROXY", "no_proxy"):  # a configured proxy must not see loopback traffic
        os.environ[key] = ",".join(filter(None, [os.environ.get(key), "127.0.0.1"]))
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        bucket = "statekit-test"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield {"endpoint_url": endpoint, "bucket": bucket}
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
