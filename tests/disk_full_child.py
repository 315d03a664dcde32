"""Runs a job whose backend local directory is a small tmpfs until the disk is full (test_disk_full.py).

``python disk_full_child.py BACKEND LOCAL_DIR CHECKPOINTS_DIR RECORDS``; prints one JSON
line: the failed checkpoints' messages and, if the job stopped, its error (type, message, cause).
"""

from __future__ import annotations

import json
import sys
import warnings

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bigstate import BigValues, records  # noqa: E402
from statekit import LocalRunner, RecordSource  # noqa: E402

backend, local_dir, checkpoints, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
runner = LocalRunner(
    BigValues,
    key_selector=lambda r: r,
    key_type=int,
    config={
        "statekit.backend": backend,
        "statekit.local-dir": local_dir,
        "statekit.checkpoints.dir": checkpoints,
        "statekit.parallelism": 1,
        "statekit.checkpoint.interval-records": 50,
    },
)
failed: list[str] = []
error = None
try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = runner.run(RecordSource(records(n)))
    failed = result.failed_checkpoints
except Exception as e:  # noqa: BLE001 - reported to the test
    cause = e.__cause__
    error = {
        "type": f"{type(e).__module__}.{type(e).__name__}",
        "message": str(e),
        "cause": None if cause is None else f"{type(cause).__module__}.{type(cause).__name__}: {cause}",
    }
print(json.dumps({"failed_checkpoints": failed, "error": error}))
