"""A clean stop exits 0: SIGTERM to `packrat serve`, idle right after start and after traffic,
many times over. Before the engine joined its commit thread on drop, RocksDB could still be
open while the process exited, and about one stop in six ended in SIGABRT (`pthread lock:
Invalid argument`, exit 134) or SIGSEGV."""

import signal

from conftest import Server

STOPS = 12


def stop_status(srv):
    srv.proc.send_signal(signal.SIGTERM)
    rc = srv.proc.wait(timeout=30)
    srv.proc = None
    return rc


def test_sigterm_right_after_start_exits_0(workdir):
    codes = []
    for i in range(STOPS):
        srv = Server(workdir / f"shutdown-idle-{i}").start()
        codes.append(stop_status(srv))
    assert codes == [0] * STOPS, codes


def test_sigterm_after_traffic_exits_0_and_keeps_the_data(workdir):
    srv = Server(workdir / "shutdown-busy", sticky_port=True).start()
    s3 = srv.client()
    s3.create_bucket(Bucket="stop")
    codes = []
    for round_ in range(4):
        for i in range(50):
            s3.put_object(Bucket="stop", Key=f"r{round_}/{i}", Body=f"{round_}:{i}".encode() * 100)
        assert s3.get_object(Bucket="stop", Key=f"r{round_}/7")["Body"].read() == f"{round_}:7".encode() * 100
        codes.append(stop_status(srv))
        srv.start()
        s3 = srv.client()
    assert codes == [0] * 4, codes
    keys = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket="stop") for o in p["Contents"]]
    assert len(keys) == 200
    srv.stop()
