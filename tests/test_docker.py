"""The container image of deploy/Dockerfile, run as an operator would: a long mode, because
building the image needs a Docker daemon and a release build of RocksDB inside it (about half
an hour on 2 cores), and CI has no daemon. Build the image, then name it:

    docker build -f deploy/Dockerfile -t packrat:dev .
    PACKRAT_DOCKER_IMAGE=packrat:dev .venv/bin/python -m pytest -q tests/test_docker.py

The container shares the host's network (`--network host`) and listens on loopback only."""

import json
import os
import subprocess
import time
import uuid

import boto3
import pytest
from botocore.config import Config

from cluster import free_port
from conftest import REGION, ROOT_AK, ROOT_SK

IMAGE = os.environ.get("PACKRAT_DOCKER_IMAGE")

pytestmark = pytest.mark.skipif(
    not IMAGE, reason="long mode: set PACKRAT_DOCKER_IMAGE to an image built from deploy/Dockerfile")


def docker(*args, timeout=120):
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"docker {' '.join(args)}: {r.stderr}"
    return r.stdout.strip()


def wait_listening(name, since=None, timeout=60):
    """Waits for the server's "listening on" line (logged after `since`, a Unix time)."""
    deadline = time.time() + timeout
    window = ["--since", since] if since else []
    while time.time() < deadline:
        logs = subprocess.run(["docker", "logs", *window, name], capture_output=True,
                              text=True, timeout=30)
        if "listening on http://" in logs.stdout + logs.stderr:
            return
        time.sleep(0.3)
    raise AssertionError(f"the container did not start listening: {logs.stdout}{logs.stderr}")


def test_the_image_serves_as_an_unprivileged_user_keeps_its_volume_and_stops_cleanly():
    config = json.loads(docker("image", "inspect", IMAGE))[0]["Config"]
    assert config["User"] == "packrat"
    assert "/var/lib/packrat" in config["Volumes"]
    name, volume = f"packrat-test-{uuid.uuid4().hex[:8]}", f"packrat-test-data-{uuid.uuid4().hex[:8]}"
    port = free_port()
    docker("volume", "create", volume)
    try:
        started = docker("run", "-d", "--name", name, "--network", "host",
                         "-e", f"PACKRAT_LISTEN=127.0.0.1:{port}",
                         "-e", f"PACKRAT_ROOT_ACCESS_KEY={ROOT_AK}", "-e", f"PACKRAT_ROOT_SECRET_KEY={ROOT_SK}",
                         "-v", f"{volume}:/var/lib/packrat", IMAGE)
        assert started
        wait_listening(name)
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name=REGION,
                          aws_access_key_id=ROOT_AK, aws_secret_access_key=ROOT_SK,
                          config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket="images")
        body = os.urandom(1 << 20)
        s3.put_object(Bucket="images", Key="a/sample.bin", Body=body)
        assert s3.get_object(Bucket="images", Key="a/sample.bin")["Body"].read() == body
        # The server runs as the image's own user, not root, and owns only its data directory.
        assert docker("exec", name, "id", "-un") == "packrat"
        assert docker("exec", name, "stat", "-c", "%U", "/var/lib/packrat/index") == "packrat"
        # docker stop sends SIGTERM: the server drains and exits 0.
        docker("stop", "-t", "40", name, timeout=60)
        assert docker("inspect", "-f", "{{.State.ExitCode}}", name) == "0"
        # The same volume in a new start: the object is still there.
        since = str(int(time.time()))
        docker("start", name)
        wait_listening(name, since)
        assert s3.get_object(Bucket="images", Key="a/sample.bin")["Body"].read() == body
        docker("stop", "-t", "40", name, timeout=60)
        assert docker("inspect", "-f", "{{.State.ExitCode}}", name) == "0"
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True, timeout=60)
