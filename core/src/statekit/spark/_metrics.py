"""Where a Spark query's statekit numbers show up: the metrics system, the UI's job descriptions, the log.

After each micro-batch the driver hands its :class:`~statekit.spark.BatchInfo`
to :meth:`QueryMetrics.report`, which

- writes one line at INFO on the ``statekit`` logger (see
  :mod:`statekit.runtime._metrics`; the LocalRunner writes the same fields);
- sets the gauges and counters of a metrics source in the driver's Spark
  metrics system: ``StatekitSource`` of the JVM helper (``jvm/``), registered
  once per query run as ``statekit.<job>.<operator>``, so JMX, the Prometheus
  servlet and every configured sink serve it with no user code. The values
  go over in one Py4J call per batch; executors send nothing of their own
  (the numbers come to the driver in the tasks' reports and the checkpoint's
  metadata).

:meth:`QueryMetrics.describe` names the Spark jobs statekit runs for a batch
in the UI (``statekit <job> batch <n>: tasks``, ``…: sink``) and puts the
thread's previous description back after.

What Spark does not let a ``foreachBatch`` sink do (checked on PySpark
4.3): put numbers into ``StreamingQueryProgress.observedMetrics`` (Spark
collects them only from ``observe`` nodes of the micro-batch's own plan; a
DataFrame derived from the batch inside ``foreachBatch`` runs as a query of
its own, and an ``Observation`` there is filled but never reaches the
progress), or set the sink's ``numOutputRows`` (a v1 sink's is always -1).
docs/spark.md says which channel shows what.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql import SparkSession

from ..checkpoints._history import CheckpointAttempt
from ..checkpoints._timing import CheckpointTiming
from ..plugins._config import Configuration
from ..runtime._metrics import LOGGER, checkpoint_fields, log_checkpoint, metric_name
from ._batchinfo import BatchInfo
from ._jvm import LocalityUnavailable, load_helper_class
from ._letter_tally import JOB_ID_PROPERTY
from ._sparkconf import is_connect
from ._ui import QueryPage

__all__ = ["QueryMetrics", "batch_fields", "invoke_static"]

#: Counters: the totals since the query run started, beside the last batch's gauges.
_TOTALS = ("records_in", "records_out", "late_records", "dead_letters", "timers_fired", "bytes_downloaded")
_DESCRIPTION = "spark.job.description"


def batch_fields(info: BatchInfo) -> dict[str, int | float]:
    """A processed micro-batch's metric fields, by the names every channel uses."""
    fields: dict[str, int | float] = {
        "batch": info.batch_id,
        "records_in": info.records,
        "records_out": info.outputs,
        "late_records": info.late_records,
        "dead_letters": info.bad_records,
        "dead_letters_source": info.source_bad_records,
        "timers_fired": info.timers_fired,
        "subtasks_reused": info.reused_subtasks,
        "subtasks_handed_off": info.handed_off,
        "subtasks_restored_locally": info.restored_locally,
        "subtasks_restored_remotely": info.restored_remotely,
        "bytes_downloaded": info.bytes_downloaded,
    }
    if info.checkpoint_stats is not None:
        fields.update(checkpoint_fields(info.checkpoint_stats, info.checkpoint_timing or CheckpointTiming()))
    for phase, secs in info.phases.items():
        fields[f"phase_{metric_name(phase)}_seconds"] = round(secs, 6)
    return fields


class QueryMetrics:
    """statekit's channels in Spark for one query run (see the module doc).

    ``status`` says where the metrics go: ``"on"``, or ``"off: <why>"`` when
    ``statekit.metrics.enabled`` is false, on Spark Connect (no JVM gateway),
    or when the JVM helper does not load (a warning says why; the log line is
    written either way unless the metrics are off).
    """

    def __init__(self, session: SparkSession, config: Configuration, job_id: str, operator_id: str) -> None:
        self.job_id, self.operator_id = job_id, operator_id
        self.enabled = bool(config.get("statekit.metrics.enabled"))
        self._sc: Any = None
        self._source: Any = None
        self.page = QueryPage(job_id, operator_id, None)
        self.ui_status = self.status = "off: statekit.metrics.enabled=false"
        if not self.enabled:
            return
        if is_connect(session):
            self.status = "off: Spark Connect has no JVM gateway (the log line is written)"
            self.ui_status = "off: Spark Connect has no JVM gateway"
            return
        self._sc = session.sparkContext
        self.source_name = f"statekit.{metric_name(job_id)}.{metric_name(operator_id)}"
        try:
            cls = load_helper_class(session, "StatekitSource")
            self._source = invoke_static(self._sc, cls, "register", self.source_name)
            self.status = "on"
            self._attach_page(session)
        except Exception as e:  # noqa: BLE001 - the metrics system is optional, the query is not
            self.status = self.ui_status = f"off: {e}"
            warnings.warn(
                f"statekit.metrics.enabled: statekit's metrics source is not in Spark's metrics system: "
                f"{e}. The log line and BatchInfo carry the numbers; set statekit.metrics.enabled=false "
                "to run without either",
                RuntimeWarning,
                stacklevel=3,
            )

    def _attach_page(self, session: SparkSession) -> None:
        """The Statekit tab of the Spark UI (:mod:`._ui`), attached once per application."""
        sc = self._sc
        tab = load_helper_class(session, "StatekitUiTab")
        if not invoke_static(sc, tab, "attach", sc._jsc.sc()):
            self.ui_status = "off: spark.ui.enabled=false"
            return
        self.page = QueryPage(
            self.job_id, self.operator_id, lambda key, xhtml: invoke_static(sc, tab, "publish", key, xhtml)
        )
        self.ui_status = "on"

    @contextlib.contextmanager
    def describe(self, batch_id: int | None, what: str) -> Iterator[None]:
        """The Spark jobs run inside are described as ``statekit <job> batch <n>: <what>`` in the UI.

        Without a batch (the query's setup): ``statekit <job>: <what>``. Their
        tasks also get the job id as a local property (:data:`JOB_ID_PROPERTY`).
        """
        sc = self._sc
        if sc is None:
            yield
            return
        before = sc.getLocalProperty(_DESCRIPTION)
        job_before = sc.getLocalProperty(JOB_ID_PROPERTY)
        batch = "" if batch_id is None else f" batch {batch_id}"
        sc.setJobDescription(f"statekit {self.job_id}{batch}: {what}")
        sc.setLocalProperty(JOB_ID_PROPERTY, self.job_id)  # read_logs' letters name the job (_letter_tally)
        try:
            yield
        finally:
            sc.setLocalProperty(_DESCRIPTION, before)  # None unsets it
            sc.setLocalProperty(JOB_ID_PROPERTY, job_before)

    def report(self, info: BatchInfo, attempts: Sequence[CheckpointAttempt] = ()) -> None:
        """The batch's log line, metrics and UI page (for a skipped batch, the log line and page).

        ``attempts``: the job's checkpoint history, as the coordinator holds it.
        """
        if not self.enabled:
            return
        self._show(lambda: self.page.batch(info, attempts))
        if info.skipped:
            LOGGER.info(
                "statekit checkpoint job=%s operator=%s batch=%d skipped=1 checkpoint_id=%s",
                metric_name(self.job_id), metric_name(self.operator_id), info.batch_id, info.checkpoint_id,
            )  # fmt: skip
            return
        fields = batch_fields(info)
        log_checkpoint(self.job_id, self.operator_id, fields)
        if self._source is not None:
            lines = [f"{k}={_number(v)}" for k, v in fields.items()]
            lines += [f"{k}_total+={int(fields[k])}" for k in _TOTALS]
            lines.append("batches_total+=1")
            try:  # after the checkpoint completed: a failing metrics system must not fail the batch
                self._source.update("\n".join(lines))
            except Exception as e:  # noqa: BLE001 - said once, then the source is off
                self._source, self.status = None, f"off: {e}"
                warnings.warn(
                    f"statekit job {self.job_id!r}: updating its metrics source failed ({e}); it is off "
                    "for this query run. The log line and BatchInfo still carry the numbers",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def failed(self, batch_id: int, error: BaseException, attempts: Sequence[CheckpointAttempt]) -> None:
        """A micro-batch failed with ``error``: the UI page's last failure."""
        if self.enabled:
            self._show(lambda: self.page.failed(batch_id, error, attempts))

    def _show(self, update: Callable[[], None]) -> None:
        """Update the UI page; a failing page is said once and turned off, never fails the batch."""
        try:
            update()
        except Exception as e:  # noqa: BLE001 - the page only tells about the query
            self.page, self.ui_status = QueryPage(self.job_id, self.operator_id, None), f"off: {e}"
            warnings.warn(
                f"statekit job {self.job_id!r}: updating its page in the Spark UI failed ({e}); it is off "
                "for this query run. The metrics, the log line and BatchInfo still carry the numbers",
                RuntimeWarning,
                stacklevel=3,
            )


def _number(v: float) -> str:
    """A value as the JVM source parses it: integers as such, floats finite."""
    if isinstance(v, int):
        return str(v)
    return repr(float(v)) if math.isfinite(v) else "0"


def invoke_static(sc: Any, cls: Any, name: str, *args: Any) -> Any:
    """Static method ``name`` of a class from the helper's class loader, through reflection."""
    jvm, gateway = sc._jvm, sc._gateway
    for method in cls.getMethods():
        if method.getName() == name:
            params = gateway.new_array(jvm.java.lang.Object, len(args))
            for i, a in enumerate(args):
                params[i] = a
            return method.invoke(None, params)
    raise LocalityUnavailable(f"the JVM helper has no method {cls.getName()}.{name}")
