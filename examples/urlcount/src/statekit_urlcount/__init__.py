"""The nginx access-log URL count: statekit's example job on Spark.

Records are nginx access-log lines as JSON, e.g.
``{"@timestamp": "18/Apr/2019:00:00:00", "remote_addr": "127.0.0.1", "request": "GET", "url": "/api/a"}``;
the job keeps, per URL, the number of requests so far in statekit keyed state,
checkpointed at the end of each Spark micro-batch, and sends malformed lines to
a dead-letter output. The windowed job counts requests per URL per minute of
the lines' ``@timestamp``, each window emitted once when the watermark passes
its end, late lines counted and written to a side output; it runs on the
LocalRunner and on Spark. The ``statekit-urlcount`` command generates logs,
runs either job and demonstrates a resume (see docs/urlcount.md).
"""

from __future__ import annotations

from ._function import (
    COUNT_STATE,
    JOB_OUTPUT_SCHEMA,
    OUTPUT_SCHEMA,
    WINDOWED_OUTPUT_SCHEMA,
    CountPerUrl,
    CountPerUrlColumns,
    CountPerUrlVectorized,
    CountPerUrlWithDeadLetters,
    CountPerUrlWithDeadLettersVectorized,
    RequestsPerUrlPerWindow,
)
from ._generate import (
    JITTER_SECONDS,
    LATE_SECONDS,
    MALFORMED_KINDS,
    GenerateResult,
    file_name,
    generate_logs,
    url_names,
)
from ._job import (
    PARSED_SCHEMA,
    BatchStats,
    JobSettings,
    RunReport,
    StateSummary,
    parse_batches,
    read_state,
    run_job,
    statekit_conf,
)
from ._parse import (
    MALFORMED_KEY,
    REASONS,
    TIMESTAMP_REASONS,
    AccessRecord,
    Malformed,
    MalformedLine,
    parse_line,
    parse_request,
    parse_timestamp,
)
from ._session import local_spark_session
from ._windowed import (
    WINDOWED_PARSED_SCHEMA,
    PendingWindows,
    WindowedSettings,
    build_windowed_stream,
    format_time_ms,
    parse_timed_batches,
    parse_timed_line,
    pending_windows,
    read_output,
    read_timed_lines,
    run_windowed_job,
    windowed_local_runner,
)

__all__ = [
    "COUNT_STATE",
    "JITTER_SECONDS",
    "JOB_OUTPUT_SCHEMA",
    "LATE_SECONDS",
    "MALFORMED_KEY",
    "MALFORMED_KINDS",
    "OUTPUT_SCHEMA",
    "PARSED_SCHEMA",
    "REASONS",
    "TIMESTAMP_REASONS",
    "WINDOWED_OUTPUT_SCHEMA",
    "WINDOWED_PARSED_SCHEMA",
    "AccessRecord",
    "BatchStats",
    "CountPerUrl",
    "CountPerUrlColumns",
    "CountPerUrlVectorized",
    "CountPerUrlWithDeadLetters",
    "CountPerUrlWithDeadLettersVectorized",
    "GenerateResult",
    "JobSettings",
    "Malformed",
    "MalformedLine",
    "PendingWindows",
    "RequestsPerUrlPerWindow",
    "RunReport",
    "StateSummary",
    "WindowedSettings",
    "build_windowed_stream",
    "file_name",
    "format_time_ms",
    "generate_logs",
    "local_spark_session",
    "parse_batches",
    "parse_line",
    "parse_request",
    "parse_timed_batches",
    "parse_timed_line",
    "parse_timestamp",
    "pending_windows",
    "read_output",
    "read_state",
    "read_timed_lines",
    "run_job",
    "run_windowed_job",
    "statekit_conf",
    "url_names",
    "windowed_local_runner",
]
