"""logrotate run *inside* a LogSource's read: the interleavings a busy machine gives.

The real ``logrotate`` tests (test_log_rotation.py) race a rotation against a
reader and meet a bad interleaving only now and then, under load. Here
logrotate's steps (:class:`~logfiles.SteppedLogrotate`: ``copytruncate`` or
``create``, with ``compress`` and ``delaycompress``) run on real files at the
source's own points of contact with the file system
(:func:`~logfiles.at_contact_points`): before each file of a listing is looked
at and before each file is opened. A drawn
number decides at each point whether the rotation takes its next step and
whether lines are written. So a log can be truncated between the listing
that saw it whole and the check that reads it, and a copy can grow past the
length the same listing took of its original.

Every line in the files is read once, and no input is reported lost: nothing
is written between the copy's end and the truncation (lines written there are
lost by logrotate itself). tests/spark/test_spark_log_source.py drives the
Spark source's planning and its tasks the same way.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from logfiles import LogDir, assert_every_line_once, drawn_rotations, rotate_inside_reads
from statekit import LogSource


@drawn_rotations
def test_rotations_inside_the_reads_of_a_log_source_read_every_line_once(
    tmp_path_factory: pytest.TempPathFactory, seed: int, busy: float, mode: str
) -> None:
    logs = LogDir(tmp_path_factory.mktemp("races"))
    src = LogSource(str(logs.path("access.log")), parse=json.loads)
    position: Any = None
    seqs: Counter[int] = Counter()

    def read(_: random.Random) -> None:
        nonlocal position
        for record, position in src.read(position):  # noqa: B007 - the position after the last one
            seqs[record["seq"]] += 1

    rotate_inside_reads(logs, seed, busy, read, mode=mode)
    assert_every_line_once(logs, seqs)
