"""A job that may kill itself with SIGKILL at a chosen point of checkpointing.

Run by test_crash_recovery.py as a subprocess::

    python crash_child.py CKPT_DIR INPUT RESULT [--kill-at N | --kill-after SECONDS] [--backend NAME]
                          [--dead-letters DIR [--kill-at-publish N]]

``--kill-at N`` sends SIGKILL at the N-th checkpoint I/O event: a write into a
snapshot stream, closing a stream, the moment before ``_metadata`` is renamed
into place, the moment after. ``--kill-after`` kills at a random-ish time from
a timer thread. Without either, the job runs to the end and writes the final
state of every key to RESULT as JSON. ``--dead-letters`` skips lines that are
not JSON into dead letters in DIR (else they fail the job); ``--kill-at-publish N``
sends SIGKILL when the N-th completed checkpoint is about to publish its dead
letters: after its ``_metadata``, before the rename.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsspec.implementations.local import LocalFileSystem  # noqa: E402

from jobs import CountUrls, state_of_runner  # noqa: E402
from statekit import FileSource, LocalRunner  # noqa: E402

_events = 0
_kill_at = 0


def _event() -> None:
    global _events
    _events += 1
    if _events == _kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


class _Stream:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, data: bytes) -> int:
        _event()
        return int(self._inner.write(data))

    def tell(self) -> int:
        return int(self._inner.tell())

    def close_and_get_handle(self) -> Any:
        _event()
        return self._inner.close_and_get_handle()

    def discard(self) -> None:
        self._inner.discard()


class _Writer:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def location(self) -> str:
        return str(self._inner.location)

    def create_stream(self, name: str, *, shared: bool = False) -> _Stream:
        return _Stream(self._inner.create_stream(name, shared=shared))

    def complete(self, metadata: bytes) -> str:
        return str(self._inner.complete(metadata))

    def abort(self) -> None:
        self._inner.abort()


def main() -> None:
    global _kill_at
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("input")
    ap.add_argument("result")
    ap.add_argument("--kill-at", type=int, default=0)
    ap.add_argument("--kill-after", type=float, default=0.0)
    ap.add_argument("--backend", default="heap")
    ap.add_argument("--dead-letters", default=None)
    ap.add_argument("--kill-at-publish", type=int, default=0)
    args = ap.parse_args()
    _kill_at = args.kill_at
    if args.kill_after:
        threading.Timer(args.kill_after, os.kill, (os.getpid(), signal.SIGKILL)).start()

    original_mv = LocalFileSystem.mv

    def mv(self: Any, path1: str, path2: str, **kw: Any) -> Any:
        _event()  # before the rename that publishes _metadata
        out = original_mv(self, path1, path2, **kw)
        _event()  # after it: the checkpoint is complete, retention has not run
        return out

    LocalFileSystem.mv = mv  # type: ignore[method-assign]
    if args.kill_at_publish:
        from statekit.sources._deadletters import StagedDeadLetters

        publish = StagedDeadLetters.publish
        published = [0]

        def publish_or_die(self: Any, checkpoint_id: int, names: Any) -> None:
            published[0] += 1
            if published[0] == args.kill_at_publish:
                os.kill(os.getpid(), signal.SIGKILL)
            publish(self, checkpoint_id, names)

        StagedDeadLetters.publish = publish_or_die  # type: ignore[method-assign]

    runner = LocalRunner(
        CountUrls,
        key_selector=lambda r: r["url"],
        config={
            "statekit.checkpoints.dir": args.ckpt,
            "statekit.parallelism": 2,
            "statekit.checkpoint.interval-records": 150,
            "statekit.checkpoints.retained": 2,
            # Small files stay files, so kills can land inside them.
            "statekit.checkpoint.storage.filesystem.inline-threshold": 0,
            "statekit.backend": args.backend,
            **(
                {
                    "statekit.bad-records.policy": "dead-letter",
                    "statekit.bad-records.dead-letter-path": args.dead_letters,
                }
                if args.dead_letters
                else {}
            ),
        },
    )
    begin = runner.storage.begin_checkpoint
    runner.storage.begin_checkpoint = lambda job, cid: _Writer(begin(job, cid))  # type: ignore[method-assign]
    runner.run(FileSource(args.input, parse=json.loads), restore="latest")
    state = state_of_runner(runner)
    with open(args.result, "w") as f:
        json.dump(state, f)


if __name__ == "__main__":
    main()
