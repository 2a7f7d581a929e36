"""The Python client's native reader (`packrat_client._native`, built from
sdk-examples/python/native when the package is installed) against its pure-Python reader: the
same archives `tarfile` writes, sent over a real loopback socket as HTTP answers framed by
length or in chunks of any size and trickled in pieces, give the same entries (names, bytes,
pax records); a cut answer is `EOFError`, a damaged one `tarfile.ReadError`, whichever reads; a
connection is reused only after an answer read to its end. Against the real server, the two
give the same samples (tests/test_loaders.py runs its resumption, retry and early-stop tests
with each)."""

import io
import socket
import tarfile
import threading
import time

import pytest

from packrat_client import PackratClient, Unavailable
from packrat_client import client as pc
from packrat_client import native
from test_client_tar import ENTRIES, archive


def test_the_installed_client_has_its_native_reader():
    # `pip install ./sdk-examples/python` builds it; a client installed without it would read
    # in pure Python everywhere, and the tests below would fail rather than pass unread.
    assert native.built(), "packrat_client was installed without packrat_client._native"
    assert native.available()


class Canned:
    """A loopback HTTP server that answers every request on a connection with the next of
    `answers` (raw bytes, sent in `piece`-byte segments with a pause now and then), counting the
    connections it accepted and the requests it read."""

    def __init__(self, answers, piece=1 << 20, close_after=False, hold=False):
        self.answers, self.piece, self.close_after, self.hold = list(answers), piece, close_after, hold
        self.closed = threading.Event()
        self.connections = 0
        self.requests = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            buf = b""
            while self.answers:
                while b"\r\n\r\n" not in buf:
                    got = conn.recv(65536)
                    if not got:
                        return
                    buf += got
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                self.requests += 1
                answer = self.answers.pop(0)
                for n, i in enumerate(range(0, len(answer), self.piece)):
                    conn.sendall(answer[i:i + self.piece])
                    if n % 499 == 3:
                        time.sleep(0.001)
                if self.close_after:
                    return
            # Keep the connection open, saying nothing more.
            while self.hold and not self.closed.wait(0.05):
                pass

    def close(self):
        self.closed.set()
        self.sock.close()


def by_length(body, status=200, extra=b""):
    return (b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n" % (status, len(body)) + extra + b"\r\n" + body)


def chunked(body, size, trailer=b""):
    out = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nx-packrat-batch-items: 6\r\n\r\n"]
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out.append(b"%x;ext=1\r\n" % len(part) + part + b"\r\n")
    out.append(b"0\r\n" + trailer + b"\r\n")
    return b"".join(out)


def native_entries(url, pool=None):
    pool = pool or native.Pool(5.0, 5.0, 4)
    answer = pool.request("POST", url + "/b?batch", {"Content-Type": "application/json"}, b"{}")
    assert answer.status == 200
    got = list(answer.entries())
    answer.done(True)
    return got, pool


def pure_entries(raw):
    return list(pc._entries(io.BytesIO(raw)))


# Every framing in pieces of 3 bytes, 4 KiB and 1 MiB (chunks of 1 byte are already cut as
# finely as can be: in 3-byte pieces they only take longer).
CUTS = [(f, p) for f in ["length", "chunks of 1", "chunks of 511", "chunks of 70000"]
        for p in [3, 4096, 1 << 20] if (f, p) != ("chunks of 1", 3)]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("framing,piece", CUTS)
def test_the_native_reader_gives_what_the_pure_one_gives(fmt, framing, piece):
    entries = ENTRIES if fmt == tarfile.PAX_FORMAT else [
        (n, d, {}) for n, d, _ in ENTRIES if len(n.encode()) < 100 and n.isascii()]
    raw = archive(entries, fmt)
    answer = by_length(raw) if framing == "length" else chunked(raw, int(framing.split()[-1]), b"x-t: 1\r\n")
    srv = Canned([answer, answer], piece=piece)
    try:
        got, pool = native_entries(srv.url)
        want = pure_entries(raw)
        assert got == want
        assert [type(d) for _, d, _ in got] == [bytes] * len(got)
        # The answer was read to its end: the next request goes on the same connection.
        again, _ = native_entries(srv.url, pool)
        assert again == want
        assert (srv.connections, srv.requests) == (1, 2)
    finally:
        srv.close()


def test_names_that_are_not_utf8_decode_as_the_pure_reader_decodes_them():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT, encoding="latin-1") as tf:
        info = tarfile.TarInfo("caf\u00e9-latin1")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"ok"))
    raw = buf.getvalue()
    srv = Canned([by_length(raw)])
    try:
        got, _ = native_entries(srv.url)
        assert got == pure_entries(raw)
        assert got[0][0] == "caf\udce9-latin1"
    finally:
        srv.close()


@pytest.mark.parametrize("framing", ["length", "chunks"])
def test_a_cut_or_damaged_answer_is_the_error_the_pure_reader_raises(framing):
    raw = archive(ENTRIES, tarfile.PAX_FORMAT)
    frame = (lambda b: by_length(b)) if framing == "length" else (lambda b: chunked(b, 4096))
    # Cut inside an entry: the connection closes with the answer short of its length or
    # before its last chunk.
    cut = frame(raw)[: len(frame(raw[:2000])) - (0 if framing == "length" else 5)]
    srv = Canned([cut], close_after=True)
    try:
        with pytest.raises(EOFError):
            native_entries(srv.url)
        with pytest.raises(EOFError):
            pure_entries(raw[:2000])
    finally:
        srv.close()
    bad = bytearray(raw)
    bad[1024 + 10] ^= 0x01  # a byte of the second entry's header
    srv = Canned([frame(bytes(bad))])
    try:
        pool = native.Pool(5.0, 5.0, 4)
        answer = pool.request("GET", srv.url + "/b", {}, None)
        with pytest.raises(tarfile.ReadError):
            list(answer.entries())
        answer.done(False)
        with pytest.raises(tarfile.ReadError):
            pure_entries(bytes(bad))
    finally:
        srv.close()


def test_a_connection_left_mid_answer_is_closed_not_reused():
    raw = archive(ENTRIES, tarfile.PAX_FORMAT)
    srv = Canned([by_length(raw), by_length(raw)])
    try:
        pool = native.Pool(5.0, 5.0, 4)
        answer = pool.request("GET", srv.url + "/b", {}, None)
        assert next(answer.entries())[0] == "plain.bin"
        answer.done(False)
        got, _ = native_entries(srv.url, pool)
        assert got == pure_entries(raw)
        assert srv.connections == 2, "the half-read connection was closed"
    finally:
        srv.close()


def test_a_server_that_stops_answering_times_out():
    raw = archive([("x", bytes(4000), {})], tarfile.USTAR_FORMAT)
    srv = Canned([by_length(raw)[: -len(raw) + 1024]], hold=True)
    try:
        pool = native.Pool(5.0, 0.5, 4)
        answer = pool.request("GET", srv.url + "/b", {}, None)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            list(answer.entries())
        assert time.monotonic() - start < 3
    finally:
        srv.close()


def test_an_error_answer_raises_the_s3_error():
    body = b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"
    srv = Canned([by_length(body, 503)] * 2)
    try:
        client = PackratClient(endpoint_url=srv.url, region_name="us-east-1", aws_access_key_id="k",
                               aws_secret_access_key="s", native=True)
        with pytest.raises(Unavailable) as e:
            client._open_tar("POST", srv.url + "/b?batch", b"{}")
        assert (e.value.status, e.value.code, e.value.message) == (503, "SlowDown", "slow down")
        with pytest.raises(Unavailable):
            client._open_tar("POST", srv.url + "/b?batch", b"{}")
        assert srv.connections == 1, "an error answer read whole leaves its connection reusable"
    finally:
        srv.close()


def test_native_and_pure_clients_read_the_same_samples(server, bucket):
    s3 = server.client()
    bodies = {f"n/{i:03d}.bin": bytes([i]) * (100 + 997 * i) for i in range(60)}
    for k, v in bodies.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v)
    items = sorted(bodies) + ["n/missing", {"key": "n/005.bin", "range": "bytes=3-9", "tag": "r"}]
    fast = server.packrat(native=True)
    plain = server.packrat(native=False)
    assert fast._native is not None and plain._native is None

    def seen(samples):
        return [(s.name, s.data, s.etag, s.tag, s.error, s.index) for s in samples]

    got = seen(fast.batch_get(bucket, items))
    assert got == seen(plain.batch_get(bucket, items))
    assert [g[1] for g in got[:60]] == [bodies[k] for k in sorted(bodies)]
    assert got[60][4][0] == "NoSuchKey" and got[61][1] == bodies["n/005.bin"][3:10]
    share = dict(seed=3, epoch=1, worker=(1, 2))
    assert seen(fast.stream_epoch(bucket, "n/", **share)) == seen(plain.stream_epoch(bucket, "n/", **share))
