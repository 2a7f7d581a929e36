"""`/health/live` and `/health/ready`: ready only while the store can take writes, with the
reason in the body otherwise (too few healthy disks for a new segment, no room for one)."""

import shutil
import urllib.error
import urllib.request

from conftest import Server


def health(srv, what="ready"):
    try:
        r = urllib.request.urlopen(f"{srv.endpoint}/health/{what}", timeout=10)
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_ready_follows_the_disks(workdir):
    disks = [workdir / "health-disks" / f"d{i}" for i in range(4)]
    args = ["--ec", "2+1"]
    for d in disks:
        args += ["--disk", str(d)]
    srv = Server(workdir / "health-ec", extra_args=args).start()
    assert health(srv) == (200, "ready\n")
    # Erasure coding 2+1 keeps open segments on 2 disks: with 1 left, writes cannot be taken.
    for d in disks[1:]:
        shutil.rmtree(d)
    status, body = health(srv)
    assert status == 503 and "1 of 4 disks are healthy; a new segment needs 2" in body, body
    assert health(srv, "live") == (200, "ok\n")
    for d in disks[1:]:
        d.mkdir(parents=True)
    assert health(srv) == (200, "ready\n")
    srv.stop()


def test_not_ready_without_room_for_a_segment(workdir):
    # A segment larger than any disk here: a write could not start a new one.
    srv = Server(workdir / "health-full", extra_args=["--segment-size", str(1 << 60)]).start()
    status, body = health(srv)
    assert status == 503 and body.startswith("not ready: disk full:") and "bytes free" in body, body
    srv.stop()
