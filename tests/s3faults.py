"""A real S3 endpoint (moto's server on 127.0.0.1) that tests stop, start and slow down.

moto keeps its buckets in this process, so objects survive a stop and start,
as they would on a store whose endpoint went away for a while. Stopping closes
the listening socket (new connections are refused) and, while stopped, any
request still arriving on an open keep-alive connection gets a ``503`` with
``Connection: close``: from the client's side, the endpoint is gone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer, make_server

Request = Callable[[str, str], bool]
"""A predicate on ``(method, path)`` of a request."""


class FaultyS3:
    """moto's S3 server that stops at a chosen request, starts again on the same port, or answers slowly."""

    def __init__(self) -> None:
        self.port = 0
        self.delay = 0.0
        self.slow: Request = lambda method, path: True
        self.requests: list[tuple[str, str]] = []
        self._down = threading.Event()
        self._down.set()
        self._stop_at: tuple[Request, int] | None = None
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Serve (again, on the same port)."""
        if self._stopping is not None:
            self._stopping.join()
            self._stopping = None
        app = DomainDispatcherApplication(create_backend_app)
        server = make_server(
            "127.0.0.1", self.port, self._wsgi(app), threaded=True, request_handler=MotoRequestHandler
        )
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        self._down.clear()

    def stop(self) -> None:
        """Stop serving: the port refuses connections until :meth:`start`."""
        self._down.set()
        with self._lock:
            server, self._server = self._server, None
            thread, self._thread = self._thread, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()

    def heal(self) -> None:
        """Disarm every fault (delay, pending stop) and serve, if stopped or stopping."""
        self.delay, self._stop_at = 0.0, None
        if self._down.is_set():  # set as a stop begins: start() waits for it to end
            self.start()

    def stop_at(self, request: Request, nth: int = 1) -> None:
        """Stop when the ``nth`` request matching ``request`` arrives (that one fails too)."""
        self._stop_at = (request, nth)

    def matching(self, request: Request) -> list[tuple[str, str]]:
        return [r for r in self.requests if request(*r)]

    def _wsgi(self, app: Any) -> Any:
        def serve(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
            with self._lock:
                self.requests.append((method, path))
                stop = False
                if self._stop_at is not None and self._stop_at[0](method, path):
                    request, nth = self._stop_at
                    self._stop_at = (request, nth - 1) if nth > 1 else None
                    stop = nth == 1
            if stop:
                self._down.set()
                self._stopping = threading.Thread(target=self.stop, daemon=True)
                self._stopping.start()
            if self._down.is_set():
                start_response("503 Service Unavailable", [("Content-Length", "0"), ("Connection", "close")])
                return [b""]
            if self.delay and self.slow(method, path):
                time.sleep(self.delay)
            result: Iterable[bytes] = app(environ, start_response)
            return result

        return serve


def put_of(part: str) -> Request:
    """PUTs (uploads) of paths containing ``part``."""
    return lambda method, path: method == "PUT" and part in path


def get_of(part: str) -> Request:
    """GETs (downloads) of paths containing ``part``."""
    return lambda method, path: method == "GET" and part in path


@contextlib.contextmanager
def serving(bucket: str) -> Iterator[FaultyS3]:
    """A :class:`FaultyS3` of the caller's own with ``bucket`` created; healed and stopped on exit.

    Needs the dummy credentials the ``s3_endpoint`` fixture sets.
    """
    import boto3

    server = FaultyS3()
    server.start()
    try:
        boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield server
    finally:
        server.heal()
        server.stop()
