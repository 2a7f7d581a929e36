"""The native hot path (`packrat_client._native`, Rust, built by maturin when the package is
installed): TAR answers read over plain HTTP/1.1 connections kept here, each sample's bytes
read from the socket straight into its `bytes` object. Used for `http` endpoints when the
extension is there and not turned off (`PACKRAT_CLIENT_NATIVE=0`, or
`PackratClient(native=False)`); the pure-Python reader otherwise (https, or a Python without
the extension). Both yield the same entries and raise the same errors for a cut or malformed
answer, so retries and resumption are the client's, whichever reads."""

import os
import tarfile
import threading
import urllib.parse
from typing import Dict, Iterator, List, Optional, Tuple

try:
    from . import _native
except ImportError:  # a Python the extension was not built for: the pure-Python reader
    _native = None

# Entries taken from the connection per call into the extension: at most so many, and no more
# once they hold so many bytes (see `Connection.entries`: a long list of large samples costs
# page faults).
_ENTRIES_PER_CALL = 64
_BYTES_PER_CALL = 64 * 1024


def built() -> bool:
    """Whether the extension was built for this Python."""
    return _native is not None


def available() -> bool:
    """Whether the extension was built for this Python and is not turned off."""
    return built() and os.environ.get("PACKRAT_CLIENT_NATIVE", "1") != "0"


class Answer:
    """A request's answer on a native connection: its status and headers (names in lower
    case), and its body read as TAR entries or whole. `done(whole)` gives the connection back
    for the next request if the answer was read to the end, else closes it."""

    def __init__(self, pool: "Pool", key, conn, status: int, headers: List[Tuple[str, str]]):
        self._pool, self._key, self._conn = pool, key, conn
        self.status = status
        self.headers: Dict[str, str] = {}
        for name, value in headers:
            self.headers[name] = value if name not in self.headers else self.headers[name] + ", " + value

    def entries(self) -> Iterator[Tuple[str, bytes, Dict[str, str]]]:
        """The answer's TAR entries as the pure-Python `_entries` yields them; a malformed
        answer raises `tarfile.ReadError`, a cut one `EOFError`."""
        while True:
            try:
                got = self._conn.entries(_ENTRIES_PER_CALL, _BYTES_PER_CALL)
            except ValueError as e:
                raise tarfile.ReadError(str(e)) from e
            if not got:
                return
            yield from got

    def read(self) -> bytes:
        return self._conn.read_body()

    def done(self, whole: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if whole and conn.reusable:
            self._pool.give_back(self._key, conn)
        else:
            conn.close()


class Pool:
    """Idle native connections by host and port, made again in a process forked since (a
    connection shared with the parent would mix two processes' answers)."""

    def __init__(self, connect_timeout: float, read_timeout: float, maxsize: int):
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.maxsize = maxsize
        self._idle: Dict[Tuple[str, int], list] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _take(self, key):
        with self._lock:
            if self._pid != os.getpid():
                self._idle, self._pid = {}, os.getpid()
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def give_back(self, key, conn) -> None:
        with self._lock:
            if self._pid == os.getpid():
                idle = self._idle.setdefault(key, [])
                if len(idle) < self.maxsize:
                    idle.append(conn)
                    return
        conn.close()

    def request(self, method: str, url: str, headers: Dict[str, str], body: Optional[bytes]) -> Answer:
        """Sends a signed request; a kept connection the server closed meanwhile is replaced
        by a new one once (packrat_client sends only reads and whole-object writes this way,
        which may be repeated)."""
        u = urllib.parse.urlsplit(url)
        key = (u.hostname, u.port or 80)
        target = (u.path or "/") + ("?" + u.query if u.query else "")
        body = body or b""
        lines = [f"{method} {target} HTTP/1.1"]
        names = {k.lower() for k in headers}
        if "host" not in names:
            lines.append(f"Host: {u.netloc}")
        lines.extend(f"{k}: {v}" for k, v in headers.items() if k.lower() != "content-length")
        lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        conn = self._take(key)
        if conn is not None:
            try:
                status, answer_headers = conn.send(head, body)
                return Answer(self, key, conn, status, answer_headers)
            except (ConnectionError, EOFError):
                conn.close()
        conn = _native.Connection(key[0], key[1], self.connect_timeout, self.read_timeout)
        try:
            status, answer_headers = conn.send(head, body)
        except BaseException:
            conn.close()
            raise
        return Answer(self, key, conn, status, answer_headers)
