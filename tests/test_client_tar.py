"""The Python client's own TAR reader (packrat_client reads batch GET and epoch-stream answers
without `tarfile`'s 10 KiB records): against archives `tarfile` writes (pax, ustar, GNU), read
whole and in pieces that cut headers and bodies anywhere; a broken or damaged stream is an
error the client resumes from, never a wrong sample."""

import io
import os
import tarfile

import pytest

from packrat_client import client as pc


def archive(entries, fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data, pax in entries:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if pax:
                info.pax_headers = pax
            tf.addfile(info, io.BytesIO(data))
        d = tarfile.TarInfo("a-directory")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
    return buf.getvalue()


class Trickle(io.RawIOBase):
    """A stream that answers at most `n` bytes a read, as a socket may."""

    def __init__(self, data, n):
        self.data, self.n, self.pos = data, n, 0

    def read(self, size=-1):
        out = self.data[self.pos:self.pos + min(self.n, size if size >= 0 else self.n)]
        self.pos += len(out)
        return out


ENTRIES = [
    ("plain.bin", os.urandom(512), {}),
    ("empty", b"", {}),
    ("odd-size", os.urandom(1000), {"packrat.etag": "abc", "packrat.tag": "t1"}),
    ("dir/" + "long-name-" * 20 + ".jpg", os.urandom(70_000), {}),
    ("__key__/0", b"", {"packrat.key": "../escape", "packrat.error": "NoSuchKey"}),
    ("ünïcode/ключ", os.urandom(3), {"packrat.sample": "7"}),
]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("piece", [1, 511, 700, 1 << 20])
def test_reads_what_tarfile_writes(fmt, piece, monkeypatch):
    entries = ENTRIES if fmt == tarfile.PAX_FORMAT else [
        (n, d, {}) for n, d, _ in ENTRIES if len(n.encode()) < 100 and n.isascii()]
    raw = archive(entries, fmt)
    monkeypatch.setattr(pc, "_READ_BYTES", piece)
    got = list(pc._read_tar(Trickle(raw, piece)))
    want = [(p.get("packrat.key", n), b"" if "packrat.error" in p else d) for n, d, p in entries]
    assert [(s.name, s.data) for s in got] == want
    if fmt == tarfile.PAX_FORMAT:
        assert got[2].etag == "abc" and got[2].tag == "t1"
        assert got[4].error == ("NoSuchKey", "") and not got[4].ok
        assert got[5].index == 7


def test_a_broken_or_damaged_answer_is_an_error():
    raw = archive(ENTRIES, tarfile.PAX_FORMAT)
    # Cut inside an entry: EOFError (resumed by the client); cut at an entry's end: the
    # entries so far, and the caller's count says the answer was short.
    with pytest.raises(EOFError):
        list(pc._read_tar(io.BytesIO(raw[:2000])))
    first = 512 + 512  # the first header and its 512 bytes
    assert [s.name for s in pc._read_tar(io.BytesIO(raw[:first]))] == ["plain.bin"]
    bad = bytearray(raw)
    bad[first + 10] ^= 0x01  # a byte of the second entry's header
    with pytest.raises(tarfile.ReadError):
        list(pc._read_tar(io.BytesIO(bytes(bad))))


class TrickleInto(Trickle):
    """A Trickle read into a caller's buffer, as http.client's response is."""

    def readinto(self, view):
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)


class Answer:
    """What urllib3 hands the client: a response whose `_fp` (http.client's) the client reads
    into its own buffer unless the answer is encoded, when it must go through `read`."""

    def __init__(self, data, encoding=None, piece=700):
        self._fp = TrickleInto(data, piece)
        self.headers = {"content-encoding": encoding} if encoding else {}
        self.reads = 0

    def read(self, n):
        self.reads += 1
        return self._fp.read(n)


@pytest.mark.parametrize("read_bytes", [300, 4096, 1 << 20])
def test_samples_read_into_one_buffer_are_whole_and_their_own(read_bytes, monkeypatch):
    raw = archive(ENTRIES, tarfile.PAX_FORMAT)
    monkeypatch.setattr(pc, "_READ_BYTES", read_bytes)
    answer = Answer(raw)
    got = list(pc._read_tar(answer))
    # Every sample is its own bytes: the buffer they were cut from is reused for the next.
    assert [(s.name, s.data) for s in got] == [
        (p.get("packrat.key", n), b"" if "packrat.error" in p else d) for n, d, p in ENTRIES]
    assert all(type(s.data) is bytes for s in got)
    assert answer.reads == 0, "an unencoded answer is read straight into the client's buffer"
    encoded = Answer(raw, encoding="identity, x-test")
    assert [s.data for s in pc._read_tar(encoded)] == [s.data for s in got]
    assert encoded.reads > 0, "an encoded answer goes through urllib3's read (which decodes)"
