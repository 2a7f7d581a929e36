"""The sdk-examples run against the real server, so the README's examples stay true."""

import subprocess
import sys

import conftest


def env_for(server):
    return conftest.aws_env(PACKRAT_ENDPOINT=server.endpoint)


def test_boto3_quickstart(server):
    out = subprocess.run([sys.executable, str(conftest.ROOT / "sdk-examples" / "boto3_quickstart.py")],
                         env=env_for(server), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "10 samples under train/" in out.stdout and "b'sample'" in out.stdout


def test_awscli_example(server, tmp_path):
    for i in range(5):
        (tmp_path / f"s{i}.txt").write_text(f"sample {i}\n")
    out = subprocess.run(["bash", str(conftest.ROOT / "sdk-examples" / "awscli.sh"), str(tmp_path)],
                         env=env_for(server), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Total Objects: 5" in out.stdout and '"ContentLength"' in out.stdout
