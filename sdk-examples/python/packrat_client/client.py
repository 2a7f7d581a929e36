"""The HTTP side of packrat_client: signing, sending, and reading TAR and multipart answers."""

import http.client
import io
import json
import os
import re
import sys
import random
import tarfile
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import boto3
import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

from . import native as _native_path
from .routes import MAP_EPOCH_HEADER, ROUTES_TTL_SECS, Routes

ERROR_PREFIX = "__error__/"


class PackratError(Exception):
    """An S3-style error answer: HTTP status, S3 error code and message. Subclasses name the
    codes a caller handles differently (see `error_for`)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class NoSuchBucket(PackratError):
    pass


class NoSuchKey(PackratError):
    pass


class AccessDenied(PackratError):
    """Refused: bad credentials (`InvalidAccessKeyId`, `SignatureDoesNotMatch`) or no grant."""


class InvalidRequest(PackratError):
    """The request itself is wrong (a bad parameter, a malformed body): retrying will not help."""


class StreamChanged(PackratError):
    """A stream could not be resumed: the objects under its prefix changed since it began."""


class Unavailable(PackratError):
    """The server could not answer (503 SlowDown, 500, a broken connection or a timeout), even
    after the retries of the client's `RetryPolicy`."""


_ERRORS = {
    "NoSuchBucket": NoSuchBucket,
    "NoSuchKey": NoSuchKey,
    "AccessDenied": AccessDenied,
    "InvalidAccessKeyId": AccessDenied,
    "SignatureDoesNotMatch": AccessDenied,
    "InvalidArgument": InvalidRequest,
    "InvalidRequest": InvalidRequest,
    "MalformedJSON": InvalidRequest,
    "PreconditionFailed": StreamChanged,
    "SlowDown": Unavailable,
    "ServiceUnavailable": Unavailable,
    "InternalError": Unavailable,
}


def error_for(status: int, code: str, message: str) -> PackratError:
    """The typed error for an answer."""
    cls = _ERRORS.get(code)
    if cls is None:
        cls = Unavailable if status >= 500 else PackratError
    return cls(status, code, message)


# What a retry may fix: the server busy or restarting, a connection reset, a timeout. An answer
# read straight from http.client (see `_filler`) breaks with its own errors (IncompleteRead).
_RETRY_STATUS = {500, 502, 503, 504}
_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, http.client.HTTPException, ConnectionError, TimeoutError,
                     tarfile.ReadError, EOFError)


@dataclass
class RetryPolicy:
    """Retries with exponential backoff and full jitter: attempt n (from 1) waits a random
    time up to `min(cap, base * 2**n)` seconds. `attempts` counts every try, the first too."""

    attempts: int = 6
    base: float = 0.1
    cap: float = 10.0

    def sleep(self, attempt: int) -> None:
        time.sleep(random.uniform(0, min(self.cap, self.base * (2 ** attempt))))


class _Broken(Exception):
    """A streamed answer that ended before its last entry."""


@dataclass
class Sample:
    """One TAR entry of a batch GET or epoch stream.

    `name` is the key (or `key/member`); for a failed item `error` holds `(code, message)` and
    `data` is empty. `etag` and `tag` come from the entry's pax headers."""

    name: str
    data: bytes
    etag: Optional[str] = None
    tag: Optional[str] = None
    error: Optional[Tuple[str, str]] = None
    headers: Dict[str, str] = field(default_factory=dict)
    # An epoch stream's sample index (entries of one sample share it).
    index: Optional[int] = None

    @property
    def ok(self) -> bool:
        return self.error is None


# How much of an answer is asked of the connection at a time: a sample's header and bytes are
# then cut from memory rather than read in tarfile's 10 KiB records (14 socket reads and as
# many trips through urllib3 and http.client per 110 KiB sample before; see docs/benchmark-log.md).
_READ_BYTES = 1 << 20
_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)


def _filler(raw):
    """A function that reads the answer into a given memoryview and says how many bytes it
    read (0 at its end). Straight from the connection when urllib3 holds an http.client
    response and decodes nothing (its `read` allocates a fresh object per call, and fresh
    megabyte objects cost the process a page fault per 4 KiB: a 110 KiB sample cost 160-206 µs
    of CPU that way in a fresh process while a build ran, 34-44 µs with one buffer reused)."""
    fp = getattr(raw, "_fp", None)
    headers = getattr(raw, "headers", None) or {}
    if fp is not None and hasattr(fp, "readinto") and not headers.get("content-encoding"):
        return fp.readinto

    def fill(view):
        data = raw.read(len(view))
        view[: len(data)] = data
        return len(data)

    return fill


class _Pieces:
    """A stream read in large pieces into one buffer, handing out exact byte counts."""

    def __init__(self, raw):
        self.fill = _filler(raw)
        self.buf = bytearray(_READ_BYTES)
        self.view = memoryview(self.buf)
        self.pos = 0
        self.end = 0

    def take(self, n: int, at_boundary: bool = False) -> Optional[bytes]:
        """The next `n` bytes. At an entry boundary, `None` if the stream ends there; anywhere
        else an early end raises EOFError (a broken answer, which the callers resume)."""
        while self.end - self.pos < n:
            if n > len(self.buf):
                return self._take_large(n, at_boundary)
            left = self.end - self.pos
            if self.pos:
                # The unread tail moves to the front; the rest of the buffer is read into.
                self.view[:left] = self.view[self.pos:self.end]
                self.pos, self.end = 0, left
            got = self.fill(self.view[self.end:])
            if not got:
                if at_boundary and left == 0:
                    return None
                raise EOFError("the TAR answer ended inside an entry")
            self.end += got
        out = bytes(self.view[self.pos:self.pos + n])
        self.pos += n
        return out

    def _take_large(self, n: int, at_boundary: bool) -> Optional[bytes]:
        """An entry larger than the buffer, read into an object of its own."""
        out = bytearray(n)
        have = self.end - self.pos
        out[:have] = self.view[self.pos:self.end]
        self.pos = self.end = 0
        view = memoryview(out)
        while have < n:
            got = self.fill(view[have:])
            if not got:
                if at_boundary and have == 0:
                    return None
                raise EOFError("the TAR answer ended inside an entry")
            have += got
        return bytes(out)


def _octal(field: bytes) -> int:
    if field[:1] == b"\x80":  # base-256, as tar writes sizes past 8 GiB
        return int.from_bytes(field[1:], "big")
    field = field.rstrip(b"\0 ").strip()
    return int(field, 8) if field else 0


def _pax_records(body: bytes) -> Dict[str, str]:
    """A pax extended header's records (`LEN key=value\n`)."""
    out = {}
    i = 0
    while i < len(body):
        sp = body.index(b" ", i)
        n = int(body[i:sp])
        key, _, value = body[sp + 1:i + n - 1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        i += n
    return out


def _entries(stream) -> Iterator[Tuple[str, bytes, Dict[str, str]]]:
    """The regular files of a pax TAR read front to back, with their pax records: written
    here rather than with `tarfile` because its stream mode reads 10 KiB records one by one,
    which cost more CPU per sample than everything else the client does (the header checksum
    is checked as tarfile does; a bad one is a `tarfile.ReadError`)."""
    r = _Pieces(stream)
    pax: Dict[str, str] = {}
    while True:
        hdr = r.take(_BLOCK, at_boundary=True)
        if hdr is None or hdr == _ZERO_BLOCK:
            return
        want = _octal(hdr[148:156])
        if want != sum(hdr[:148]) + 256 + sum(hdr[156:]):
            raise tarfile.ReadError("a TAR header of the answer has a bad checksum")
        size = _octal(hdr[124:136])
        body = r.take(size) if size else b""
        if size % _BLOCK:
            r.take(_BLOCK - size % _BLOCK)
        kind = hdr[156:157]
        if kind == b"x":
            pax = _pax_records(body)
            continue
        if kind not in (b"0", b"\0", b"7"):
            pax = {}
            continue
        name = pax.get("path")
        if name is None:
            name = hdr[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            prefix = hdr[345:500].split(b"\0", 1)[0]
            if hdr[257:262] == b"ustar" and prefix:
                name = prefix.decode("utf-8", "surrogateescape") + "/" + name
        yield name, body, pax
        pax = {}


def _read_tar(stream) -> Iterator[Sample]:
    """Yields the entries of a TAR read from `stream` front to back (no seeking)."""
    return _samples(_entries(stream))


def _samples(entries: Iterable[Tuple[str, bytes, Dict[str, str]]]) -> Iterator[Sample]:
    """The samples of a TAR answer's entries (`_entries`, or the native reader's)."""
    for path, data, pax in entries:
        # The exact key (or key/member): a name that `tar -x` could not create where it
        # stands (`../x`, `/x`) travels under `__key__/` with the key in `packrat.key`.
        name = pax.get("packrat.key", path)
        index = int(pax["packrat.sample"]) if "packrat.sample" in pax else None
        # An error entry is told by its `packrat.error` record, never by its name alone.
        if "packrat.error" in pax:
            text = data.decode("utf-8", "replace").strip()
            _, _, message = text.partition(": ")
            yield Sample(
                name=name,
                data=b"",
                tag=pax.get("packrat.tag"),
                error=(pax["packrat.error"], message),
                headers=pax,
                index=index,
            )
        else:
            yield Sample(
                name=name,
                data=data,
                etag=pax.get("packrat.etag"),
                tag=pax.get("packrat.tag"),
                headers=pax,
                index=index,
            )


# A routed batch GET: items per window (sent as one part per node side by side), threads
# reading parts, and the error entries another copy (through the gateway) may not have.
_DIRECT_WINDOW = 1024
# Samples of an epoch stream read from the nodes per routed batch GET.
_STREAM_WINDOW = 512
_DIRECT_THREADS = 8
_NOT_THIS_COPY = {"ServiceUnavailable", "InternalError", "SlowDown"}


def _by_sample(entries: Iterable[Sample], state: dict) -> Iterator[List[Sample]]:
    """An epoch stream's entries as samples (the consecutive entries of one index), each
    yielded once whole: the last when `entries` ends, none if it breaks off (the next attempt
    asks again from `state["next"]`, which moves past each sample yielded)."""
    held: List[Sample] = []
    for s in entries:
        if held and s.index != held[0].index:
            state["next"] = held[0].index + 1
            yield held
            held = []
        held.append(s)
    if held:
        state["next"] = held[0].index + 1
        yield held


def _slots_of(items: List[dict]) -> Dict[Tuple[str, Optional[str]], List[int]]:
    """Where each batch item's entry goes, by the entry's name and tag (an item asked twice
    has two places, taken in turn)."""
    slots: Dict[Tuple[str, Optional[str]], List[int]] = {}
    for n, it in enumerate(items):
        name = it["key"] + ("/" + it["member"] if it.get("member") else "")
        slots.setdefault((name, it.get("tag")), []).append(n)
    return slots


def _done_with(resp, whole: bool) -> None:
    """Gives the connection back for the next request if its answer was read to the end, and
    closes it first otherwise (a broken answer, or a caller who stopped early: the unread
    bytes on it would be taken for the next answer's)."""
    if not whole:
        resp.close()
    resp.release_conn()


class _PureAnswer:
    """A TAR answer read by the pure-Python reader (the shape of `native.Answer`)."""

    def __init__(self, resp):
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers

    def entries(self):
        return _entries(self._resp)

    def done(self, whole: bool) -> None:
        _done_with(self._resp, whole)


def _raise_for(resp, body: bytes) -> None:
    if resp.status < 300:
        return
    code, message = f"HTTP{resp.status}", body.decode("utf-8", "replace")[:500]
    try:
        root = ET.fromstring(body)
        code = root.findtext("Code") or code
        message = root.findtext("Message") or message
    except ET.ParseError:
        pass
    raise error_for(resp.status, code, message)


class PackratClient:
    """packrat's extensions, signed like any boto3 call.

    `endpoint_url` is the packrat server; credentials and region come from `session` (a
    `boto3.Session`, by default the usual environment/profile chain), or from explicit
    `aws_access_key_id` / `aws_secret_access_key`.

    With `direct` (the default), batch GETs through a cluster gateway go straight to the
    storage nodes that hold the objects (see `packrat_client.routes`), and to the gateway for
    whatever a node does not answer; against one server, or nodes without an S3 read endpoint,
    everything goes to `endpoint_url`."""

    def __init__(
        self,
        endpoint_url: Optional[str] = None,
        session: Optional[boto3.Session] = None,
        region_name: Optional[str] = None,
        aws_access_key_id: Optional[str] = None,
        aws_secret_access_key: Optional[str] = None,
        timeout: float = 300.0,
        maxsize: int = 16,
        retry: Optional[RetryPolicy] = None,
        ca_bundle: Optional[str] = None,
        direct: bool = True,
        native: Optional[bool] = None,
    ):
        if session is None:
            session = boto3.Session(
                aws_access_key_id=aws_access_key_id,
                aws_secret_access_key=aws_secret_access_key,
                region_name=region_name,
            )
        creds = session.get_credentials()
        if creds is None:
            raise PackratError(0, "NoCredentials", "no AWS credentials found for packrat")
        self._creds = creds
        self.region = region_name or session.region_name or "us-east-1"
        self.endpoint_url = (
            endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        )
        if not self.endpoint_url:
            raise PackratError(0, "NoEndpoint", "pass endpoint_url or set AWS_ENDPOINT_URL")
        self.endpoint_url = self.endpoint_url.rstrip("/")
        self.retry = retry if retry is not None else RetryPolicy()
        # An https endpoint is verified against `ca_bundle` (a PEM file), else AWS_CA_BUNDLE as
        # boto3 reads it, else the system's roots. There is no switch to turn verification off.
        self.ca_bundle = ca_bundle or os.environ.get("AWS_CA_BUNDLE") or None
        self._http = urllib3.PoolManager(
            maxsize=maxsize, timeout=urllib3.Timeout(connect=10.0, read=timeout), retries=False,
            **({"ca_certs": self.ca_bundle} if self.ca_bundle else {}),
        )
        self.direct = direct
        # TAR answers from http endpoints read by the native extension (see
        # `packrat_client.native`): by default when it is there; `native=True` insists on it.
        if native and not _native_path.built():
            raise PackratError(0, "NoNativeExtension", "packrat_client was installed without its native extension")
        use_native = _native_path.available() if native is None else native
        self._native = _native_path.Pool(10.0, timeout, maxsize) if use_native else None
        # Each bucket's routes (None: read through the endpoint), and the threads that read
        # a batch's parts from the nodes side by side.
        self._routes: Dict[str, Optional[Routes]] = {}
        self._routes_lock = threading.Lock()
        self._parts = None
        # What went where: batch GET items read from a node, and those asked of the endpoint
        # after a node did not answer them (tests and curious callers).
        self.direct_items = 0
        self.fallback_items = 0

    # ---- plumbing

    def _url(self, bucket: str, key: Optional[str] = None, query: Sequence[Tuple[str, str]] = (),
             base: Optional[str] = None) -> str:
        path = "/" + urllib.parse.quote(bucket, safe="")
        if key is not None:
            path += "/" + urllib.parse.quote(key, safe="/~")
        url = (base or self.endpoint_url) + path
        if query:
            url += "?" + "&".join(
                urllib.parse.quote(k, safe="~") + ("=" + urllib.parse.quote(v, safe="~") if v is not None else "")
                for k, v in query
            )
        return url

    def _signed(self, method: str, url: str, body=None, headers=None):
        req = AWSRequest(method=method, url=url, data=body or b"", headers=dict(headers or {}))
        S3SigV4Auth(self._creds.get_frozen_credentials(), "s3", self.region).add_auth(req)
        return req.prepare()

    def _open_tar(self, method: str, url: str, body=None, headers=None):
        """A signed request whose answer is a TAR archive (a batch GET's, an epoch stream's),
        read by the native extension for an http endpoint when it is in use, else by the
        pure-Python reader: an answer with `status`, `headers`, `entries()` and `done(whole)`.
        An error status raises, as `_send_once` does."""
        if self._native is None or not url.startswith("http://"):
            return _PureAnswer(self._send_once(method, url, body, headers, stream=True))
        prepared = self._signed(method, url, body, headers)
        answer = self._native.request(method, prepared.url, dict(prepared.headers.items()), body)
        if answer.status >= 300:
            try:
                _raise_for(answer, answer.read())
            finally:
                answer.done(True)
        return answer

    def _send_once(self, method: str, url: str, body=None, headers=None, stream=False):
        prepared = self._signed(method, url, body, headers)
        try:
            resp = self._http.request(
                method,
                prepared.url,
                body=body,
                headers=dict(prepared.headers.items()),
                preload_content=not stream,
                decode_content=False,
            )
        except urllib3.exceptions.SSLError as e:
            # An untrusted certificate is not a hiccup: raised at once, never retried.
            raise PackratError(0, "TLSError", f"{method} {url}: {e}") from e
        if resp.status >= 300:
            _raise_for(resp, (resp.read() if stream else resp.data) or b"")
        return resp

    def _send(self, method: str, url: str, body: Union[bytes, None] = None, headers=None, stream=False):
        """One signed request, retried by the client's `RetryPolicy` on 5xx answers, broken
        connections and timeouts (every call packrat_client makes may be repeated: reads, and
        writes that replace whole objects)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._send_once(method, url, body, headers, stream)
            except Unavailable:
                if attempt >= self.retry.attempts:
                    raise
            except _TRANSPORT_ERRORS as e:
                if attempt >= self.retry.attempts:
                    raise Unavailable(0, "ConnectionError", f"{method} {url}: {e}") from e
            self.retry.sleep(attempt)

    def _resumable(self, open_once, what: str) -> Iterator[Sample]:
        """Runs `open_once()` (which yields samples, raising `_Broken` or a transport error
        when the answer breaks) again and again until it ends, within the retry policy. Each
        call resumes from where the last one stopped: that is `open_once`'s business."""
        attempt = 0
        while True:
            try:
                yield from open_once()
                return
            except Unavailable as e:
                err = e
            except (_Broken, *_TRANSPORT_ERRORS) as e:
                err = Unavailable(0, "ConnectionError", f"{what}: {e}")
            attempt += 1
            if attempt >= self.retry.attempts:
                raise err
            self.retry.sleep(attempt)

    # ---- extensions

    def batch_get(
        self,
        bucket: str,
        items: Iterable[Union[str, dict]],
        order: str = "request",
        on_error: str = "continue",
    ) -> Iterator[Sample]:
        """Many objects (or ranges of them, or members of TAR objects) in one request.

        `items` are keys or dicts `{"key", "range"?, "member"?, "tag"?}`. Yields a `Sample`
        per item, as the server streams them: in request order, or with `order="storage"` in
        the server's read order. Failed items come back with `error` set (and the batch goes
        on), unless `on_error="abort"`.

        A batch whose answer breaks (a reset connection, a server restart) is asked again for
        the items not yet received, within the retry policy: every item is yielded once.

        Through a cluster gateway (and `direct`), each node holding some of the items is asked
        for them itself, side by side; what a node does not answer goes to the gateway. Items
        then come in request order (`order="request"`) or as each node's part is done."""
        pending = [{"key": i} if isinstance(i, str) else dict(i) for i in items]
        routes = self._routes_for(bucket) if self.direct and pending else None
        if routes is not None:
            yield from self._batch_get_direct(bucket, pending, routes, order, on_error)
            return
        yield from self._batch_get_via(bucket, pending, order, on_error)

    def _batch_get_via(self, bucket: str, pending: List[dict], order: str, on_error: str,
                       base: Optional[str] = None, epoch: Optional[int] = None) -> Iterator[Sample]:
        """A batch GET sent to `base` (default: the endpoint), resumed within the retry
        policy; with `epoch` (a node), one attempt, and the map's epoch sent."""
        url = self._url(bucket, query=[("batch", "")], base=base)
        headers = {"Content-Type": "application/json"}
        if epoch is not None:
            headers[MAP_EPOCH_HEADER] = str(epoch)

        def entry_id(item):
            name = item["key"] + ("/" + item["member"] if item.get("member") else "")
            return (name, item.get("tag"))

        def once():
            nonlocal pending
            if not pending:
                return
            body = json.dumps({"items": pending, "order": order, "on_error": on_error}).encode()
            resp = self._open_tar("POST", url, body=body, headers=headers)
            want = int(resp.headers.get("x-packrat-batch-items", len(pending)))
            got = 0
            # Entries are matched to items by name and tag (the storage order is not the
            # request order), so a resumed batch asks only for what is still missing.
            left: Dict[Tuple[str, Optional[str]], List[int]] = {}
            for n, it in enumerate(pending):
                left.setdefault(entry_id(it), []).append(n)
            done = set()
            whole = False
            try:
                for s in _samples(resp.entries()):
                    slots = left.get((s.name, s.tag))
                    if slots:
                        done.add(slots.pop(0))
                    got += 1
                    yield s
                    if s.error is not None and on_error == "abort":
                        pending = []
                        return
                whole = True
            finally:
                pending = [it for n, it in enumerate(pending) if n not in done]
                resp.done(whole)
            if got < want:
                raise _Broken(f"the batch answer ended after {got} of {want} items")

        if epoch is not None:
            yield from once()
            return
        yield from self._resumable(once, f"batch GET of {bucket}")

    # ---- reads straight from the nodes (see `packrat_client.routes`)

    def _routes_for(self, bucket: str, stale: bool = False) -> Optional[Routes]:
        """`bucket`'s routes (asked for at most every `ROUTES_TTL_SECS`, or again when
        `stale`), or `None` when reads go through the endpoint: one server (501), no node
        with a read endpoint, or no answer now (the endpoint then answers the read itself,
        with its retries and its errors)."""
        now = time.monotonic()
        with self._routes_lock:
            known = self._routes.get(bucket)
        if known is not None and not stale and now - known[1] < ROUTES_TTL_SECS:
            return known[0]
        try:
            resp = self._send_once("GET", self._url(bucket, query=[("routes", "")]))
            routes = Routes.parse(resp.data, now)
            if not routes.nodes:
                routes = None
        except (PackratError, ValueError, KeyError, *_TRANSPORT_ERRORS):
            routes = None
        with self._routes_lock:
            self._routes[bucket] = (routes, now)
        return routes

    def _batch_get_direct(self, bucket: str, pending: List[dict], routes: Routes, order: str,
                          on_error: str) -> Iterator[Sample]:
        """A batch GET split by node (see `batch_get`), a window of items at a time."""
        window = _DIRECT_WINDOW
        for at in range(0, len(pending), window):
            got = self._direct_window(bucket, pending[at : at + window], routes, on_error)
            if order == "request":
                got = sorted(got, key=lambda pair: pair[0])
            for _, s in got:
                yield s
                if s.error is not None and on_error == "abort":
                    return
            routes = self._routes_for(bucket) or routes

    def _direct_window(self, bucket: str, items: List[dict], routes: Routes,
                       on_error: str) -> List[Tuple[int, Sample]]:
        """Every item of `items` once, as `(position, sample)`: each node's part read from it
        (side by side), then what the nodes did not answer from the endpoint."""
        parts: Dict[str, List[int]] = {}
        left: List[int] = []
        for n, it in enumerate(items):
            node = routes.node_for(it["key"])
            if node is None:
                left.append(n)
            else:
                parts.setdefault(node, []).append(n)
        # Made on first use, and again in a process forked since (a DataLoader worker given
        # this client: the parent's threads do not exist there, and a pool believing they do
        # would wait forever).
        if self._parts is None or self._parts[0] != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(max_workers=_DIRECT_THREADS, thread_name_prefix="packrat-part")
            self._parts = (os.getpid(), pool)
        futures = [
            self._parts[1].submit(self._node_part, bucket, node, [items[n] for n in ns], routes.epoch)
            for node, ns in parts.items()
        ]
        got: List[Tuple[int, Sample]] = []
        stale = False
        for (node, ns), f in zip(parts.items(), futures):
            answered, not_answered, misdirected = f.result()
            got.extend((ns[i], s) for i, s in answered)
            left.extend(ns[i] for i in not_answered)
            stale |= misdirected
        self.direct_items += len(got)
        if stale:
            self._routes_for(bucket, stale=True)
        if left:
            left.sort()
            self.fallback_items += len(left)
            asked = [items[n] for n in left]
            slots = _slots_of(asked)
            for s in self._batch_get_via(bucket, asked, "request", on_error):
                places = slots.get((s.name, s.tag))
                got.append((left[places.pop(0)] if places else len(items), s))
        return got

    def _node_part(self, bucket: str, node: str, items: List[dict], epoch: int):
        """One node's part of a batch: `(answered, not_answered, misdirected)`, the first as
        `(position in items, sample)`. Whatever the node did not answer (it broke off, it was
        unreachable, its map moved on, an item failed for a reason another copy may not have)
        is left for the endpoint."""
        slots = _slots_of(items)
        answered: List[Tuple[int, Sample]] = []
        misdirected = False
        try:
            for s in self._batch_get_via(bucket, items, "request", "continue", base=node, epoch=epoch):
                if s.error is not None and s.error[0] in _NOT_THIS_COPY:
                    continue
                places = slots.get((s.name, s.tag))
                if places:
                    answered.append((places.pop(0), s))
        except PackratError as e:
            misdirected = e.status == 421
        except (_Broken, *_TRANSPORT_ERRORS):
            pass
        done = {n for n, _ in answered}
        return answered, [n for n in range(len(items)) if n not in done], misdirected

    def stream_epoch(self, bucket: str, prefix: str = "", **options) -> Iterator[Sample]:
        """Like `stream_samples` (same options), one `Sample` per object: the entries of each
        sample in turn. `Sample.index` is the sample's position in the worker's list."""
        for group in self.stream_samples(bucket, prefix, **options):
            yield from group

    def stream_samples(
        self,
        bucket: str,
        prefix: str = "",
        shard: Tuple[int, int] = (0, 1),
        seed: int = 0,
        epoch: int = 0,
        worker: Tuple[int, int] = (0, 1),
        start: int = 0,
        order: str = "shuffle",
        group: str = "basename",
        tail: str = "pad",
        on_error: str = "continue",
    ) -> Iterator[List[Sample]]:
        """One DataLoader worker's share of an epoch of the objects under `prefix`, one list
        of entries per sample: rank `shard[0]` of `shard[1]`, worker `worker[0]` of
        `worker[1]`, in the order of a permutation of the whole prefix fixed by `(seed, epoch)`
        (`order="sorted"`: key order). Ranks get equal counts (`tail="pad"` repeats the first
        samples of the epoch, `"drop"` leaves the last out); objects sharing a basename
        (`000123.jpg`, `000123.cls`) are one sample (`group="key"`: every object is one).

        A broken stream is resumed from the first sample not wholly received (a sample's
        entries are held until the sample is complete), so every sample is yielded once; if
        the prefix changed in between, `StreamChanged` is raised."""
        state = {"next": start, "listing": None, "total": None}
        base = [
            ("stream", ""), ("prefix", prefix), ("shard", f"{shard[0]}/{shard[1]}"),
            ("worker", f"{worker[0]}/{worker[1]}"), ("seed", str(seed)), ("epoch", str(epoch)),
            ("order", order), ("group", group), ("tail", tail), ("on_error", on_error),
        ]

        routes = self._routes_for(bucket) if self.direct else None
        if routes is not None:
            yield from self._resumable(lambda: self._stream_direct(bucket, base, state, on_error),
                                       f"epoch stream of {bucket}/{prefix}")
            return

        def once():
            q = base + [("start", str(state["next"]))]
            if state["listing"] is not None:
                q.append(("listing", state["listing"]))
            resp = self._open_tar("GET", self._url(bucket, query=q))
            state["listing"] = resp.headers.get("x-packrat-listing")
            state["total"] = int(resp.headers.get("x-packrat-samples", "0"))
            aborted: List[Sample] = []

            def entries():
                for s in _samples(resp.entries()):
                    if s.error is not None and on_error == "abort":
                        aborted.append(s)
                    yield s

            whole = False
            try:
                yield from _by_sample(entries(), state)
                whole = True
            finally:
                resp.done(whole)
            if state["next"] < state["total"] and not aborted:
                raise _Broken(f"the stream ended at sample {state['next']} of {state['total']}")

        yield from self._resumable(once, f"epoch stream of {bucket}/{prefix}")

    def _stream_direct(self, bucket: str, base, state, on_error: str) -> Iterator[List[Sample]]:
        """An epoch stream read straight from the nodes: its plan from the gateway
        (`?stream&plan`: the same permutation, shares and listing check as the stream), then
        its samples by routed batch GET, `_STREAM_WINDOW` samples at a time; `state["next"]`
        moves past each sample yielded, so a retry resumes there."""
        q = base + [("start", str(state["next"])), ("plan", "")]
        if state["listing"] is not None:
            q.append(("listing", state["listing"]))
        resp = self._send_once("GET", self._url(bucket, query=q))
        state["listing"] = resp.headers.get("x-packrat-listing")
        state["total"] = int(resp.headers.get("x-packrat-samples", "0"))
        plan = json.loads(resp.data)["samples"]
        for at in range(0, len(plan), _STREAM_WINDOW):
            items = [{"key": k, "tag": str(index)} for index, keys in plan[at : at + _STREAM_WINDOW] for k in keys]
            routes = self._routes_for(bucket)
            got = (self._batch_get_direct(bucket, items, routes, "request", on_error) if routes is not None
                   else self._batch_get_via(bucket, items, "request", on_error))
            aborted: List[Sample] = []

            def entries():
                for s in got:
                    # The sample's index rides as the item's tag.
                    s.index, s.tag = int(s.tag), None
                    yield s
                    if s.error is not None and on_error == "abort":
                        aborted.append(s)
                        return

            yield from _by_sample(entries(), state)
            if aborted:
                state["next"] = state["total"]
                return

    def download(
        self,
        bucket: str,
        keys: Sequence[str],
        dest: Union[str, os.PathLike],
        batch_size: int = 256,
        progress: bool = False,
    ) -> int:
        """Writes the objects `keys` under directory `dest` (as `dest/key`), fetched
        `batch_size` per batch GET; with `progress`, a progress line on stderr (objects, bytes,
        rate). Keys that would leave `dest` (`..`, absolute) are refused. Returns bytes
        written."""
        root = os.path.realpath(dest)
        total, done = len(keys), 0
        written = 0
        bar = _Progress(total) if progress else None
        for at in range(0, total, batch_size):
            for s in self.batch_get(bucket, keys[at : at + batch_size]):
                if not s.ok:
                    raise error_for(404 if s.error[0] == "NoSuchKey" else 500, s.error[0], f"{s.name}: {s.error[1]}")
                path = os.path.realpath(os.path.join(root, s.name))
                if not path.startswith(root + os.sep):
                    raise InvalidRequest(0, "UnsafeKey", f"{s.name!r} would be written outside {root}")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(s.data)
                written += len(s.data)
                done += 1
                if bar:
                    bar.update(done, written)
        if bar:
            bar.close(done, written)
        return written

    def get_ranges(self, bucket: str, key: str, ranges: Sequence[Tuple[int, int]]) -> List[bytes]:
        """Several byte ranges of one object in one request: `ranges` are inclusive
        `(first, last)` pairs; returns their bytes in the same order."""
        if not ranges:
            return []
        spec = "bytes=" + ",".join(f"{a}-{b}" for a, b in ranges)
        resp = self._send("GET", self._url(bucket, key), headers={"Range": spec})
        ctype = resp.headers.get("Content-Type", "")
        if resp.status == 206 and ctype.startswith("multipart/byteranges"):
            return parse_byteranges(resp.data, ctype)
        if resp.status == 206:
            return [resp.data]
        # 200: the server ignored the ranges (e.g. an empty object); cut them locally.
        return [resp.data[a : b + 1] for a, b in ranges]

    def batch_put_tar(
        self,
        bucket: str,
        key: str,
        tar: Union[bytes, str, os.PathLike, Dict[str, bytes]],
        prefix: Optional[str] = None,
    ) -> dict:
        """Uploads a TAR that the server extracts into one object per member, committed
        together. `tar` is the archive's bytes, a path to it, or a `{name: bytes}` dict to pack.
        Members land under `prefix` if given, else under the directory of `key`. Returns the
        server's summary (`objects`, `bytes`, `prefix`, `skipped`)."""
        if isinstance(tar, dict):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
                for name, data in tar.items():
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
            body = buf.getvalue()
        elif isinstance(tar, (str, os.PathLike)):
            with open(tar, "rb") as f:
                body = f.read()
        else:
            body = bytes(tar)
        headers = {"x-amz-meta-snowball-auto-extract": "true", "Content-Type": "application/x-tar"}
        if prefix is not None:
            headers["x-amz-meta-snowball-prefix"] = prefix
        resp = self._send("PUT", self._url(bucket, key), body=body, headers=headers)
        root = ET.fromstring(resp.data)
        ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        return {
            "prefix": root.findtext(ns + "Prefix") or "",
            "objects": int(root.findtext(ns + "Objects") or 0),
            "bytes": int(root.findtext(ns + "Bytes") or 0),
            "skipped": [e.text or "" for e in root.findall(ns + "Skipped")],
        }


def parse_byteranges(body: bytes, content_type: str) -> List[bytes]:
    """The parts of a `multipart/byteranges` body (RFC 9110), in order."""
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        raise PackratError(0, "BadMultipart", "multipart answer without a boundary")
    delim = b"--" + m.group(1).encode()
    out = []
    pos = body.find(delim)
    while pos >= 0:
        pos += len(delim)
        if body[pos : pos + 2] == b"--":
            break
        head_end = body.find(b"\r\n\r\n", pos)
        if head_end < 0:
            raise PackratError(0, "BadMultipart", "truncated part headers")
        headers = body[pos:head_end].decode("latin-1")
        cr = re.search(r"(?im)^content-range:\s*bytes\s+(\d+)-(\d+)/", headers)
        if not cr:
            raise PackratError(0, "BadMultipart", "part without Content-Range")
        n = int(cr.group(2)) - int(cr.group(1)) + 1
        start = head_end + 4
        out.append(body[start : start + n])
        pos = body.find(delim, start + n)
    return out


class _Progress:
    """A one-line progress report on stderr, redrawn at most 10 times a second."""

    def __init__(self, total: int):
        self.total, self.t0, self.last = total, time.monotonic(), 0.0

    def _line(self, done: int, nbytes: int) -> str:
        secs = max(time.monotonic() - self.t0, 1e-9)
        return (f"\rdownloaded {done}/{self.total} objects, {nbytes / 1e6:.1f} MB, "
                f"{nbytes / 1e6 / secs:.1f} MB/s, {done / secs:.0f} objects/s")

    def update(self, done: int, nbytes: int) -> None:
        now = time.monotonic()
        if now - self.last >= 0.1:
            self.last = now
            sys.stderr.write(self._line(done, nbytes))
            sys.stderr.flush()

    def close(self, done: int, nbytes: int) -> None:
        sys.stderr.write(self._line(done, nbytes) + "\n")
        sys.stderr.flush()
