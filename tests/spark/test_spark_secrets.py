"""Spark's UI never shows credentials given as statekit advises; statekit warns where it would.

Spark hides a conf value when ``spark.redaction.regex`` matches its key or the
value itself: ``secret-storage-options`` always matches; ``storage-options``
only if its JSON happens to hold a matching word (``"secret"``, ``"token"``,
``"password"``), so Azure's ``account_key`` shows in clear there.
A driver with its UI on (127.0.0.1, a free port) runs in its own process, as the
shared test session has its UI off and a process holds one SparkContext.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sparkutil import driver_env

HERE = Path(__file__).resolve().parent


def test_the_environment_page_redacts_secret_storage_options_and_statekit_warns_of_the_other() -> None:
    secret, control = "SECRETMARKER-6f1d2a", "CONTROLMARKER-93be07"
    env = driver_env()
    done = subprocess.run(
        [sys.executable, str(HERE / "secrets_driver.py"), secret, control],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    shown = dict(json.loads(result["environment"])["sparkProperties"])
    base = "spark.statekit.checkpoint.storage.filesystem"
    assert shown[f"{base}.secret-storage-options"] == "*********(redacted)"
    assert secret not in result["environment"] + done.stderr
    # The control: the page does show the other key's value, and statekit said so (naming the key only).
    assert control in shown[f"{base}.storage-options"]
    (warning,) = [w for w in result["warnings"] if "holds credentials" in w]
    assert f"{base}.storage-options holds credentials (account_key)" in warning
    assert control not in warning and "secret-storage-options" in warning
