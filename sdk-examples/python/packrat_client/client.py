"""The HTTP side of packrat_client: signing, sending, and reading TAR and multipart answers."""

import io
import json
import os
import re
import tarfile
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import boto3
import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest

ERROR_PREFIX = "__error__/"


class PackratError(Exception):
    """An S3-style error answer: HTTP status, S3 error code and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


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

    @property
    def ok(self) -> bool:
        return self.error is None


def _read_tar(stream) -> Iterator[Sample]:
    """Yields the entries of a TAR read from `stream` front to back (no seeking)."""
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            if not m.isfile():
                continue
            f = tf.extractfile(m)
            data = f.read() if f is not None else b""
            pax = dict(m.pax_headers)
            # The exact key (or key/member): a name that `tar -x` could not create where it
            # stands (`../x`, `/x`) travels under `__key__/` with the key in `packrat.key`.
            name = pax.get("packrat.key", m.name)
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
                )
            else:
                yield Sample(
                    name=name,
                    data=data,
                    etag=pax.get("packrat.etag"),
                    tag=pax.get("packrat.tag"),
                    headers=pax,
                )


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
    raise PackratError(resp.status, code, message)


class PackratClient:
    """packrat's extensions, signed like any boto3 call.

    `endpoint_url` is the packrat server; credentials and region come from `session` (a
    `boto3.Session`, by default the usual environment/profile chain), or from explicit
    `aws_access_key_id` / `aws_secret_access_key`."""

    def __init__(
        self,
        endpoint_url: Optional[str] = None,
        session: Optional[boto3.Session] = None,
        region_name: Optional[str] = None,
        aws_access_key_id: Optional[str] = None,
        aws_secret_access_key: Optional[str] = None,
        timeout: float = 300.0,
        maxsize: int = 16,
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
        self._http = urllib3.PoolManager(
            maxsize=maxsize, timeout=urllib3.Timeout(connect=10.0, read=timeout), retries=False
        )

    # ---- plumbing

    def _url(self, bucket: str, key: Optional[str] = None, query: Sequence[Tuple[str, str]] = ()) -> str:
        path = "/" + urllib.parse.quote(bucket, safe="")
        if key is not None:
            path += "/" + urllib.parse.quote(key, safe="/~")
        url = self.endpoint_url + path
        if query:
            url += "?" + "&".join(
                urllib.parse.quote(k, safe="~") + ("=" + urllib.parse.quote(v, safe="~") if v is not None else "")
                for k, v in query
            )
        return url

    def _send(self, method: str, url: str, body: Union[bytes, None] = None, headers=None, stream=False):
        req = AWSRequest(method=method, url=url, data=body or b"", headers=dict(headers or {}))
        S3SigV4Auth(self._creds.get_frozen_credentials(), "s3", self.region).add_auth(req)
        prepared = req.prepare()
        resp = self._http.request(
            method,
            prepared.url,
            body=body,
            headers=dict(prepared.headers.items()),
            preload_content=not stream,
            decode_content=False,
        )
        if resp.status >= 300:
            _raise_for(resp, (resp.read() if stream else resp.data) or b"")
        return resp

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
        on), unless `on_error="abort"`."""
        items = [{"key": i} if isinstance(i, str) else dict(i) for i in items]
        body = json.dumps({"items": items, "order": order, "on_error": on_error}).encode()
        resp = self._send(
            "POST",
            self._url(bucket, query=[("batch", "")]),
            body=body,
            headers={"Content-Type": "application/json"},
            stream=True,
        )
        try:
            yield from _read_tar(resp)
        finally:
            resp.release_conn()

    def stream_epoch(
        self,
        bucket: str,
        prefix: str = "",
        shard: Tuple[int, int] = (0, 1),
        seed: int = 0,
        window: Optional[int] = None,
    ) -> Iterator[Sample]:
        """Every object under `prefix` in shard `shard[0]` of `shard[1]` (a stable hash of the
        key decides), in a pseudo-random order fixed by `seed`, as one streamed response."""
        i, n = shard
        q = [("stream", ""), ("prefix", prefix), ("shard", f"{i}/{n}"), ("seed", str(seed))]
        if window is not None:
            q.append(("window", str(window)))
        resp = self._send("GET", self._url(bucket, query=q), stream=True)
        try:
            yield from _read_tar(resp)
        finally:
            resp.release_conn()

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
