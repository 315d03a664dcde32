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
  (mode 0700, ``$TMPDIR/statekit-<uid>``), and a Unix socket served by a
  daemon thread of that worker. Both are named after the executor's local
  directory, so only workers of the same executor ever find each other.
* A task whose subtask is open in a sibling worker, at exactly the attempt the
  driver's checkpoint recorded, connects to it and sends a header (the task's
  plan); the sibling accepts only if it still holds that attempt's state.
  The task then streams its input rows to the sibling as an Arrow IPC stream
  and yields the output batches the sibling streams back, then a trailer:
  done, or the exception the sibling raised.
* Anything short of an accepted header (no owner, dead owner, stale attempt,
  refused connection) leaves the task to run where it is, restoring as it
  would have. Once accepted, a broken connection fails the task; Spark's
  retry restores from the checkpoint, and the sibling, whose task run did not
  finish, has already dropped the state (as a failed task does).

Peers are checked with ``SO_PEERCRED`` where the platform has it: only a
process of the same user may hand work to a worker. The transport is Arrow
IPC and pickle (the plan is pickled by Spark into every task already).

May import: the standard library, ``pyarrow``, ``pyspark.cloudpickle`` and
:mod:`statekit._errors`; never the task module, which registers its handler here.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import socket
import stat
import struct
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from .._errors import CheckpointError

__all__ = ["Accepts", "Handle", "announce", "forward", "owner_of"]

#: Whether the process holds the state a header asks for (the header is the task's plan and ids).
Accepts = Callable[[dict[str, Any]], bool]
#: Runs the task of a header over its input batches in this process; yields its output batches.
Handle = Callable[[dict[str, Any], Iterator[Any]], Iterator[Any]]

_LOG = logging.getLogger("statekit.spark")
_ACCEPT, _DECLINE, _DONE, _FAILED = b"A", b"N", b"D", b"E"
_HANDSHAKE_TIMEOUT_S = 30.0
_LEN = struct.Struct(">Q")
_lock = threading.Lock()
_server: _Server | None = None
_warned = False


def _directory() -> str | None:
    """This user's private directory for owner files and sockets; None if it is not private."""
    path = os.path.join(tempfile.gettempdir(), f"statekit-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def _tag(local_root: str) -> str:
    """A short name for one executor: its local directory."""
    return hashlib.sha256(os.path.abspath(local_root).encode()).hexdigest()[:12]


def _owner_path(directory: str, local_root: str, job_key: str, index: int) -> str:
    job = hashlib.sha256(job_key.encode()).hexdigest()[:12]
    return os.path.join(directory, f"{_tag(local_root)}-{job}-{index}.owner")


def _socket_path(directory: str, local_root: str, pid: int) -> str:
    return os.path.join(directory, f"{_tag(local_root)}-{pid}.sock")


def owner_of(local_root: str, job_key: str, index: int) -> tuple[int, str] | None:
    """The worker (pid) of this executor that announced subtask ``index`` of ``job_key``, and its attempt."""
    directory = _directory()
    if directory is None:
        return None
    try:
        with open(_owner_path(directory, local_root, job_key, index), encoding="ascii") as f:
            pid, attempt = f.read().split(" ", 1)
        return int(pid), attempt
    except (OSError, ValueError):
        return None


def announce(
    local_root: str, job_key: str, indices: list[int], attempt: str, accepts: Accepts, handle: Handle
) -> bool:
    """Say that this worker holds ``indices`` of ``job_key`` open, made by ``attempt``; serve hand-offs.

    Returns False (and logs once) when this worker cannot serve: no private
    directory, or no Unix socket; sibling workers then restore, as without
    hand-off.
    """
    global _warned
    directory = _directory()
    server = None if directory is None else _serving(directory, local_root, accepts, handle)
    if directory is None or server is None:
        if not _warned:
            _warned = True
            _LOG.warning(
                "statekit: no hand-off between the Python workers of this executor (%s): a subtask "
                "whose task lands on another worker restores from local copies",
                "no private directory under " + tempfile.gettempdir()
                if directory is None
                else "cannot serve a Unix socket",
            )
        return False
    for index in indices:
        path = _owner_path(directory, local_root, job_key, index)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="ascii") as f:
                f.write(f"{os.getpid()} {attempt}")
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
    return True


def forward(
    local_root: str, pid: int, header: dict[str, Any], first: Any, rest: Iterator[Any]
) -> Iterator[Any] | None:
    """Hand this task's input to worker ``pid``; its output batches, or None if it did not accept.

    ``first`` is the task's first input batch (already read), ``rest`` the others.
    """
    directory = _directory()
    if directory is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(_HANDSHAKE_TIMEOUT_S)
        sock.connect(_socket_path(directory, local_root, pid))
        data = _dumps(header)
        sock.sendall(_LEN.pack(len(data)) + data)
        reply = _recv_exactly(sock, 1)
        if reply != _ACCEPT:
            sock.close()
            return None
        sock.settimeout(None)
    except (OSError, EOFError):
        sock.close()
        return None
    return _exchange(sock, pid, header, first, rest)


def _exchange(
    sock: socket.socket, pid: int, header: dict[str, Any], first: Any, rest: Iterator[Any]
) -> Iterator[Any]:
    """The accepted hand-off: input streams out from a thread, output streams back here."""
    failure: list[BaseException] = []
    where = f"Python worker {pid} (it held subtask {header.get('subtask')}'s open state)"

    def send() -> None:
        try:
            with sock.makefile("wb") as f:
                writer = pa.ipc.new_stream(f, first.schema)
                writer.write_batch(first)
                for batch in rest:
                    writer.write_batch(batch)
                writer.close()
        except BaseException as e:  # noqa: BLE001 - handed to the task's thread below
            failure.append(e)
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send, name="statekit-handoff-send", daemon=True)
    sender.start()
    finished = False
    try:
        with sock.makefile("rb") as rf:
            try:
                reader = pa.ipc.open_stream(rf)
                yield from reader
                trailer = rf.read(1)
            except (OSError, pa.ArrowInvalid) as e:
                sender.join()
                if failure:
                    raise failure[0] from None
                raise CheckpointError(
                    f"the hand-off to {where} broke off mid-task ({e}); Spark retries the task, "
                    "which restores the subtask from the checkpoint"
                ) from e
            if trailer == _FAILED:
                error = _loads(_recv_frame(rf))
                sender.join()
                if failure:  # the input broke first: that is the task's error
                    raise failure[0] from None
                if isinstance(error, BaseException):
                    error.add_note(f"raised in {where}, to which this task handed its rows")
                    raise error
                raise CheckpointError(f"{where} failed: {error}")
            if trailer != _DONE:
                sender.join()
                raise CheckpointError(
                    f"the hand-off to {where} ended without a result; Spark retries the task, "
                    "which restores the subtask from the checkpoint"
                )
        sender.join()
        if failure:
            raise failure[0]
        finished = True
    finally:
        if not finished:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        sender.join(timeout=5)


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
                    conn.settimeout(None)
                    with conn.makefile("wb") as wf:
                        self._run(header, rf, wf)
            except (OSError, EOFError, pickle.UnpicklingError):
                return  # the task that asked went away; it fails or runs the task itself

    def _run(self, header: dict[str, Any], rf: Any, wf: Any) -> None:
        writer = None
        try:
            batches = iter(pa.ipc.open_stream(rf))
            for batch in self.handle(header, batches):
                if writer is None:
                    writer = pa.ipc.new_stream(wf, batch.schema)
                writer.write_batch(batch)
            _close_stream(writer, wf)
            wf.write(_DONE)
        except BaseException as e:  # noqa: BLE001 - the task that handed off raises it
            with contextlib.suppress(Exception):
                e.add_note("in the worker holding the state:\n" + traceback.format_exc())
            try:
                _close_stream(writer, wf)
                data = _dumps(e)
            except Exception:  # noqa: BLE001 - an unpicklable error travels as text
                data = _dumps(f"{type(e).__name__}: {e}")
            wf.write(_FAILED + _LEN.pack(len(data)) + data)
        wf.flush()


def _serving(directory: str, local_root: str, accepts: Accepts, handle: Handle) -> _Server | None:
    global _server
    with _lock:
        if _server is not None and _server.pid == os.getpid():
            return _server
        try:
            _server = _Server(_socket_path(directory, local_root, os.getpid()), accepts, handle)
        except OSError:
            _server = None
            return None
        _collect_dead(directory)
        return _server


def _collect_dead(directory: str) -> None:
    """Remove the sockets and owner files of workers that are gone (run when a worker starts serving)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            try:
                if name.endswith(".sock"):
                    pid = int(name[: -len(".sock")].rsplit("-", 1)[1])
                elif name.endswith(".owner"):
                    with open(path, encoding="ascii") as f:
                        pid = int(f.read().split(" ", 1)[0])
                else:
                    continue
                os.kill(pid, 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            except (OSError, ValueError, IndexError):
                continue  # another user's process, a file being replaced, not ours


def _close_stream(writer: Any, wf: Any) -> None:
    if writer is None:
        writer = pa.ipc.new_stream(wf, pa.schema([]))
    writer.close()


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


def _recv_frame(rf: Any) -> bytes:
    head = rf.read(_LEN.size)
    if len(head) != _LEN.size:
        raise EOFError("connection closed")
    (n,) = _LEN.unpack(head)
    data = rf.read(n)
    if len(data) != n:
        raise EOFError("connection closed")
    return bytes(data)
