"""Hand-off between the Python workers of one executor: a task's rows go to the worker whose state is open.

Spark gives a task to whichever Python worker of the executor has been idle
longest (``PythonWorkerFactory`` keeps idle workers in a FIFO queue), before
any statekit code runs, so an executor with several cores sends a subtask's
task to a different worker than the one that kept its state open about as
often as not. Task locality cannot choose the worker, only the executor.

This module moves the work to the state instead of the state to the work, as
Flink never moves state between checkpoints:

* A worker that keeps subtasks open after a task *announces* them: one small
  owner file per subtask (``<pid> <task attempt>``) in a private directory
  (``$TMPDIR/statekit-<uid>``, see below), and a Unix socket served by a
  daemon thread of that worker. Both are named after the executor's local
  directory, so only workers of the same executor ever find each other; a
  worker that ran queries with different local directories
  (``statekit.local-dir``) serves a socket under each of them.
* A task whose subtask is open in a sibling worker, at exactly the attempt the
  driver's checkpoint recorded, connects to it and sends a header (the task's
  plan); the sibling accepts only if it still holds that attempt's state.
  The task then streams its input rows to the sibling as an Arrow IPC stream;
  the sibling sends back frames: output batches, heartbeats while it works,
  then done, or the exception it raised.
* Anything short of an accepted header (no owner, dead owner, a stopped
  owner, stale attempt, refused connection, no answer within 30 s) leaves the
  task to run where it is, restoring as it would have. The handshake's bound
  is its own, not the hand-off timeout: on a busy machine a sibling may take
  seconds to answer, and a requester that gave up on it would leave the
  sibling with a connection whose input never comes. Once accepted, a
  broken connection fails the task, and so does
  a sibling that sends nothing, not even a heartbeat, for
  ``statekit.spark.worker-handoff.timeout`` (a stopped or hung process):
  Spark's retry restores from the checkpoint, and the sibling, whose task run
  did not finish, drops the state (as a failed task does). The sibling waits
  as long at most for the task's input: a task that stops sending it, or
  whose connection ends before its input did, ends the run there too
  (:class:`InputStopped`; the handler drops what it took and says so in its
  log).

The directory is confined to the user (:mod:`statekit._localfs`): created
with mode 0700, and refused if it is someone else's, a symlink, or writable
by others; owner files are written under a fresh exclusive name and renamed,
and read without following symlinks. Peers are checked with ``SO_PEERCRED``
where the platform has it: only a process of the same user may hand work to
a worker. The hand-off only ever saves a restore: where the directory is
refused it is off, and :func:`status` says why (``BatchInfo.handoff``).
The transport is Arrow IPC and pickle (the plan is pickled by Spark into
every task already).

May import: the standard library, ``pyarrow``, ``pyspark.cloudpickle``,
:mod:`statekit._errors` and :mod:`statekit._localfs`; never the task module,
which registers its handler here.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import select
import socket
import struct
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from .._errors import CheckpointError, UnsafeLocalPathError
from .._localfs import private_dir, read_no_follow, write_atomically

__all__ = ["Accepts", "Handle", "InputStopped", "announce", "batch_status", "forward", "owner_of", "status"]

#: Whether the process holds the state a header asks for (the header is the task's plan and ids).
Accepts = Callable[[dict[str, Any]], bool]
#: Runs the task of a header over its input batches in this process; yields its output batches.
Handle = Callable[[dict[str, Any], Iterator[Any]], Iterator[Any]]

_LOG = logging.getLogger("statekit.spark")
# The sibling's answer to a header, then the frames it sends back: an output batch, a heartbeat,
# done, failed.
_ACCEPT, _DECLINE = b"A", b"N"
_BATCH, _HEARTBEAT, _DONE, _FAILED = b"B", b"H", b"D", b"E"
# After the input's Arrow stream, the requester says its input is whole: a stream cut at a batch
# boundary (the requester died there) reads like a shorter stream, and must not pass for one.
_INPUT_END = b"Z"
_HANDSHAKE_TIMEOUT_S = 30.0
_LEN = struct.Struct(">Q")
_lock = threading.Lock()
#: This worker's servers, one per socket path (an executor's local directory under a hand-off
#: directory): a worker that ran tasks of queries with another statekit.local-dir serves them all.
_servers: dict[str, _Server] = {}
_warned = False
#: Why this process cannot serve hand-offs (its Unix socket failed), None while it can.
_serve_failure: str | None = None


def _directory_or_reason() -> tuple[str | None, str | None]:
    """This user's private directory for owner files and sockets, or None and why it is refused."""
    base = tempfile.gettempdir()
    path = os.path.join(base, f"statekit-{os.getuid()}")
    try:
        return private_dir(
            path,
            base=base,
            what="the hand-off directory",
            otherwise=(
                "Or give the executors a temporary directory of their own (TMPDIR, e.g. "
                "spark.executorEnv.TMPDIR). Until then the hand-off between Python workers is off."
            ),
        ), None
    except UnsafeLocalPathError as e:
        return None, str(e)
    except OSError as e:
        return None, (
            f"the hand-off directory {path} cannot be created ({e}), so the hand-off between Python "
            "workers is off. Give the executors a writable temporary directory (TMPDIR)"
        )


def _directory() -> str | None:
    """This user's private directory for owner files and sockets; None if it is refused."""
    return _directory_or_reason()[0]


def status() -> str:
    """``"on"``, or ``"off: <why>"`` when this worker can neither hand off nor serve hand-offs."""
    directory, reason = _directory_or_reason()
    if directory is None:
        return f"off: {reason}"
    if _serve_failure is not None:
        return f"off: {_serve_failure}"
    return "on"


def batch_status(enabled: bool, reported: Sequence[object]) -> str:
    """What ``BatchInfo.handoff`` says of a batch: the first ``off`` its tasks reported, else ``on``."""
    if not enabled:
        return "off: statekit.spark.worker-handoff=false"
    for value in reported:
        if isinstance(value, str) and value != "on":
            return value
    return "on"


def _tag(local_root: str) -> str:
    """A short name for one executor: its local directory."""
    return hashlib.sha256(os.path.abspath(local_root).encode()).hexdigest()[:12]


def _owner_path(directory: str, local_root: str, job_key: str, index: int) -> str:
    job = hashlib.sha256(job_key.encode()).hexdigest()[:12]
    return os.path.join(directory, f"{_tag(local_root)}-{job}-{index}.owner")


def _socket_path(directory: str, local_root: str, pid: int) -> str:
    return os.path.join(directory, f"{_tag(local_root)}-{pid}.sock")


def _read_owner(path: str) -> tuple[int, str]:
    pid, attempt = read_no_follow(path, 4096).decode("ascii").split(" ", 1)
    return int(pid), attempt


def owner_of(local_root: str, job_key: str, index: int) -> tuple[int, str] | None:
    """The worker (pid) of this executor that announced subtask ``index`` of ``job_key``, and its attempt."""
    directory = _directory()
    if directory is None:
        return None
    try:
        return _read_owner(_owner_path(directory, local_root, job_key, index))
    except (OSError, ValueError):
        return None


def announce(
    local_root: str, job_key: str, indices: list[int], attempt: str, accepts: Accepts, handle: Handle
) -> bool:
    """Say that this worker holds ``indices`` of ``job_key`` open, made by ``attempt``; serve hand-offs.

    Returns False (and logs once; :func:`status` says why) when this worker
    cannot serve: its directory is refused, or it has no Unix socket; sibling
    workers then restore, as without hand-off.
    """
    global _warned
    directory, reason = _directory_or_reason()
    server = None if directory is None else _serving(directory, local_root, accepts, handle)
    if directory is None or server is None:
        if not _warned:
            _warned = True
            _LOG.warning(
                "statekit: no hand-off between the Python workers of this executor (%s): a subtask "
                "whose task lands on another worker restores from local copies",
                reason if directory is None else _serve_failure,
            )
        return False
    for index in indices:
        try:
            # A fresh exclusive file renamed over the old one: never written through a planted name.
            write_atomically(
                _owner_path(directory, local_root, job_key, index), f"{os.getpid()} {attempt}".encode("ascii")
            )
        except OSError:
            return False
    return True


def forward(
    local_root: str,
    pid: int,
    header: dict[str, Any],
    first: Any,
    rest: Iterator[Any],
    timeout: float,
) -> Iterator[Any] | None:
    """Hand this task's input to worker ``pid``; its output batches, or None if it did not accept.

    ``first`` is the task's first input batch (already read), ``rest`` the
    others. Once the sibling accepted, every wait for it is bounded by
    ``timeout`` seconds (it sends heartbeats while it works): a sibling that
    sends nothing for that long fails the task with an error naming it.
    """
    directory = _directory()
    if directory is None or _stopped(pid):
        return None  # a stopped worker cannot answer: restore here at once
    path = _socket_path(directory, local_root, pid)
    header = {**header, "heartbeat": _heartbeat_interval(timeout), "timeout": timeout}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # The handshake's own bound (see the module doc), whatever the hand-off timeout.
        sock.settimeout(_HANDSHAKE_TIMEOUT_S)
        sock.connect(path)
        data = _dumps(header)
        sock.sendall(_LEN.pack(len(data)) + data)
        reply = _recv_exactly(sock, 1)
        if reply != _ACCEPT:
            sock.close()
            return None
        # Blocking from here: the input may wait for the sibling as long as it works; the output
        # waits are bounded by polling (see _recv_within).
        sock.settimeout(None)
    except (OSError, EOFError):
        sock.close()
        return None
    return _exchange(sock, pid, path, header, first, rest, timeout)


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``SIGSTOP``) or traced, so it cannot answer (Linux; else False)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")


def _heartbeat_interval(timeout: float) -> float:
    """How often a serving sibling says it is alive: several times within the requester's timeout."""
    return max(0.01, min(timeout / 4, 10.0))


def _exchange(
    sock: socket.socket,
    pid: int,
    path: str,
    header: dict[str, Any],
    first: Any,
    rest: Iterator[Any],
    timeout: float,
) -> Iterator[Any]:
    """The accepted hand-off: input streams out from a thread, output frames come back here."""
    where = f"Python worker {pid} (socket {path}; it held subtask {header.get('subtask')}'s open state)"
    sender = _Sender(sock, first, rest)
    finished = False
    try:
        while True:
            kind = _frame_kind(sock, sender, where, timeout)
            if kind == _HEARTBEAT:
                continue
            if kind == _BATCH:
                yield from pa.ipc.open_stream(pa.py_buffer(_frame_body(sock, sender, where, timeout)))
                continue
            if kind == _FAILED:
                error = _loads(_frame_body(sock, sender, where, timeout))
                sender.raise_failure()  # the input broke first: that is the task's error
                if isinstance(error, BaseException):
                    error.add_note(f"raised in {where}, to which this task handed its rows")
                    raise error
                raise CheckpointError(f"{where} failed: {error}")
            if kind != _DONE:
                sender.join()
                raise CheckpointError(
                    f"the hand-off to {where} sent {kind!r}, not a frame of the hand-off; Spark "
                    "retries the task, which restores the subtask from the checkpoint"
                )
            break
        sender.raise_failure()
        finished = True
    finally:
        if not finished:
            # Also wakes the sender if it is blocked on a sibling that stopped reading.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        sender.join(timeout=5)


class _Sender:
    """Streams a handed-off task's input to the sibling from a thread of its own (an Arrow IPC stream)."""

    def __init__(self, sock: socket.socket, first: Any, rest: Iterator[Any]) -> None:
        self.failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._send, args=(sock, first, rest), name="statekit-handoff-send", daemon=True
        )
        self._thread.start()

    def _send(self, sock: socket.socket, first: Any, rest: Iterator[Any]) -> None:
        try:
            with sock.makefile("wb") as f:
                writer = pa.ipc.new_stream(f, first.schema)
                writer.write_batch(first)
                f.flush()  # each batch as it comes: the sibling works while more input arrives
                for batch in rest:
                    writer.write_batch(batch)
                    f.flush()
                writer.close()
                f.write(_INPUT_END)
        except BaseException as e:  # noqa: BLE001 - handed to the task's thread (raise_failure)
            self.failure.append(e)
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the input to be sent (or to fail)."""
        self._thread.join(timeout)

    def raise_failure(self) -> None:
        """Once the input is sent: raise what broke it, if anything did."""
        self.join()
        if self.failure:
            raise self.failure[0] from None


def _frame_kind(sock: socket.socket, sender: _Sender, where: str, timeout: float) -> bytes:
    """The kind of the sibling's next frame."""
    return _read(sock, 1, sender, where, timeout)


def _frame_body(sock: socket.socket, sender: _Sender, where: str, timeout: float) -> bytes:
    """The length-prefixed body of the sibling's frame."""
    (n,) = _LEN.unpack(_read(sock, _LEN.size, sender, where, timeout))
    return _read(sock, n, sender, where, timeout)


def _read(sock: socket.socket, n: int, sender: _Sender, where: str, timeout: float) -> bytes:
    """``n`` bytes from the sibling, waiting at most ``timeout`` for each read; errors name it."""
    try:
        return _recv_within(sock, n, timeout)
    except TimeoutError:
        raise CheckpointError(
            f"the hand-off to {where} received nothing for {timeout:g} s, not even a heartbeat "
            "(statekit.spark.worker-handoff.timeout): that worker is stopped or hung. Spark "
            "retries the task, which restores the subtask from the checkpoint"
        ) from None
    except (OSError, EOFError) as e:
        sender.raise_failure()
        raise CheckpointError(
            f"the hand-off to {where} broke off mid-task ({e}); Spark retries the task, "
            "which restores the subtask from the checkpoint"
        ) from e


class _Server:
    """A worker's Unix socket; a daemon thread accepts, a thread per connection serves it."""

    def __init__(self, path: str, accepts: Accepts, handle: Handle) -> None:
        self.pid = os.getpid()
        self.path = path
        self.accepts = accepts
        self.handle = handle
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket left by a dead worker that had this pid
        self.sock.bind(path)
        self.sock.listen(16)
        threading.Thread(target=self._accept, name="statekit-handoff", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(conn,), name="statekit-handoff-task", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if not _same_user(conn):
                return
            try:
                conn.settimeout(_HANDSHAKE_TIMEOUT_S)
                with conn.makefile("rb") as rf:
                    header = _loads(_recv_frame(rf))
                    ok = isinstance(header, dict) and self.accepts(header)
                    conn.sendall(_ACCEPT if ok else _DECLINE)
                    if not ok:
                        return
                    # Every wait for the task that handed off is bounded too: its input may stop
                    # (a stopped or hung process), and the subtask it asked for is out of the cache.
                    timeout = header.get("timeout")
                    conn.settimeout(float(timeout) if isinstance(timeout, (int, float)) else None)
                    self._run(header, rf, conn)
            except (OSError, EOFError, pickle.UnpicklingError, _PeerGone):
                return  # the task that asked went away; it fails or runs the task itself

    def _run(self, header: dict[str, Any], rf: Any, conn: socket.socket) -> None:
        """Run the handed-off task; its frames go back on ``conn``, with heartbeats while it works."""
        lock = threading.Lock()
        ended = threading.Event()

        def send(*parts: bytes | memoryview) -> None:
            try:
                with lock:
                    for part in parts:
                        conn.sendall(part)
            except OSError as e:
                raise _PeerGone from e

        def beat() -> None:
            interval = float(header.get("heartbeat") or 10.0)
            while not ended.wait(interval):
                try:
                    send(_HEARTBEAT)
                except _PeerGone:
                    return

        threading.Thread(target=beat, name="statekit-handoff-heartbeat", daemon=True).start()
        outputs: Iterator[Any] | None = None
        try:
            outputs = self.handle(header, _input(rf, header))
            for batch in outputs:
                data = _batch_bytes(batch)
                send(_BATCH + _LEN.pack(data.size), memoryview(data))
            ended.set()
            send(_DONE)
        except _PeerGone:
            return  # the task that handed off is gone: nothing to tell it
        except InputStopped:
            # Its task fails there (Spark retries it). The handler heard of it through its input
            # and said what it did; the run here did not finish: closing it below ends it.
            return
        except BaseException as e:  # noqa: BLE001 - the task that handed off raises it
            ended.set()
            with contextlib.suppress(Exception):
                e.add_note("in the worker holding the state:\n" + traceback.format_exc())
            try:
                data = _dumps(e)
            except Exception:  # noqa: BLE001 - an unpicklable error travels as text
                data = _dumps(f"{type(e).__name__}: {e}")
            send(_FAILED + _LEN.pack(len(data)), data)
        finally:
            ended.set()
            close = getattr(outputs, "close", None)
            if close is not None:
                close()  # a run that did not finish drops the state it touched


class _PeerGone(Exception):
    """The task that handed off closed its connection (it failed, or gave up waiting)."""


class InputStopped(Exception):
    """A handed-off task sent no input for the hand-off's timeout; raised through the handler's input."""


def _input(rf: Any, header: dict[str, Any]) -> Iterator[Any]:
    """The input batches a handed-off task streams here; its silence past the timeout ends them."""
    try:
        yield from pa.ipc.open_stream(rf)
        if rf.read(1) != _INPUT_END:
            raise EOFError("the connection closed after a whole batch, before the end of its rows")
    except TimeoutError as e:
        raise InputStopped(
            f"Python worker {header.get('from')}, which handed its rows here, sent none for "
            f"{header.get('timeout')} s (statekit.spark.worker-handoff.timeout): it is stopped or hung"
        ) from e
    except (OSError, EOFError, pa.ArrowInvalid) as e:
        raise InputStopped(
            f"Python worker {header.get('from')}, which handed its rows here, closed the connection "
            f"before its rows ended ({e}): its task failed or gave up"
        ) from e


def _serving(directory: str, local_root: str, accepts: Accepts, handle: Handle) -> _Server | None:
    """This worker's server for ``local_root`` in ``directory``: the one it has, or a new one.

    A worker keeps serving every path it announced subtasks under: the owner
    files of another query's subtasks (another ``statekit.local-dir``, or
    another temporary directory) still name it there.
    """
    global _serve_failure
    path = _socket_path(directory, local_root, os.getpid())
    with _lock:
        pid = os.getpid()
        for known in [p for p, server in _servers.items() if server.pid != pid]:
            del _servers[known]  # a forked parent's servers: its sockets, not this process's to close
        server = _servers.get(path)
        if server is not None:
            return server
        try:
            server = _servers[path] = _Server(path, accepts, handle)
        except OSError as e:
            _serve_failure = f"this Python worker cannot serve the Unix socket {path}: {e}"
            return None
        _serve_failure = None
        _collect_dead(directory)
        return server


def _collect_dead(directory: str) -> None:
    """Remove the sockets and owner files of workers that are gone (run when a worker starts serving)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            try:
                if name.endswith(".sock"):
                    pid = int(name[: -len(".sock")].rsplit("-", 1)[1])
                elif name.endswith(".owner"):
                    pid = _read_owner(path)[0]
                else:
                    continue
                os.kill(pid, 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            except (OSError, ValueError, IndexError):
                continue  # another user's process, a file being replaced, not ours


def _batch_bytes(batch: Any) -> Any:
    """One output batch as an Arrow IPC stream of its own (schema and batch) in a buffer."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _same_user(conn: socket.socket) -> bool:
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or sys.platform != "linux":
        return True  # the directory's mode 0700 keeps other users out
    creds = conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _dumps(value: Any) -> bytes:
    from pyspark import cloudpickle

    return bytes(cloudpickle.dumps(value))  # type: ignore[no-untyped-call]


def _loads(data: bytes) -> Any:
    return pickle.loads(data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("connection closed")
        data += chunk
    return data


def _recv_within(sock: socket.socket, n: int, timeout: float) -> bytes:
    """``n`` bytes from blocking ``sock``, waiting at most ``timeout`` seconds for each read.

    Raises:
        TimeoutError: If nothing arrived for ``timeout`` seconds.
        EOFError: If the peer closed the connection first.
    """
    buf = bytearray(n)
    view = memoryview(buf)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    got = 0
    while got < n:
        if not poller.poll(timeout * 1000):
            raise TimeoutError(f"nothing received for {timeout:g} s")
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("connection closed")
        got += k
    return bytes(buf)


def _recv_frame(rf: Any) -> bytes:
    head = rf.read(_LEN.size)
    if len(head) != _LEN.size:
        raise EOFError("connection closed")
    (n,) = _LEN.unpack(head)
    data = rf.read(n)
    if len(data) != n:
        raise EOFError("connection closed")
    return bytes(data)
