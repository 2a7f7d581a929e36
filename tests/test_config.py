"""The configuration file and the packaging around it: `packrat config print-default` is a
file a server starts with; a file's settings are used, an environment variable beats the file
and a flag beats both; a wrong key or value is refused with its name; the systemd unit in
deploy/ passes systemd's own check."""

import shutil
import subprocess
import tomllib
import urllib.request

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from conftest import BIN, ROOT, ROOT_AK, ROOT_SK, Server


def client(srv, region):
    return boto3.client("s3", endpoint_url=srv.endpoint, region_name=region,
                        aws_access_key_id=ROOT_AK, aws_secret_access_key=ROOT_SK,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"total_max_attempts": 1, "mode": "standard"}))


def run(*args, env=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60, env=env)


def test_print_default_is_a_file_a_server_starts_with(workdir):
    out = run("config", "print-default")
    assert out.returncode == 0, out.stderr
    doc = tomllib.loads(out.stdout)
    # Every visible flag of serve is there, with serve's defaults.
    assert doc["listen"] == "127.0.0.1:9000" and doc["max-connections"] == 4096
    assert doc["compact-threshold"] == 0.5 and doc["log-format"] == "text"
    assert doc["no-access-log"] is False
    assert "# tls-cert = \"\"" in out.stdout and "# disk = []" in out.stdout
    assert "fault-injection" not in out.stdout, "hidden test-only flags stay out"
    node = tomllib.loads(run("config", "print-default", "node").stdout)
    assert node["tombstone-keep"] == 600 and "etcd" not in node
    cfg = workdir / "default.toml"
    cfg.write_text(out.stdout)
    srv = Server(workdir / "cfg-default", extra_args=["--config", str(cfg)]).start()
    srv.client().create_bucket(Bucket="from-defaults")
    srv.stop()


def test_file_then_environment_then_flag(workdir):
    cfg = workdir / "packrat.toml"
    cfg.write_text(
        'region = "eu-file-1"\n'
        'max_connections = 64\n'
        "no-access-log = true\n"
        "[serve]\n"
        'log-format = "json"\n'
        "[node]\n"
        "tombstone-keep = 5\n"  # another command's setting: not serve's business
    )
    # The file alone: its region is the one requests must be signed for.
    srv = Server(workdir / "cfg-file", extra_args=["--config", str(cfg)]).start()
    client(srv, "eu-file-1").create_bucket(Bucket="bkt")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        client(srv, "us-east-1").list_buckets()
    assert e.value.response["Error"]["Code"] == "AuthorizationHeaderMalformed"
    srv.stop()
    log = open(srv.log_path).read()
    assert '"level":"INFO"' in log and "packrat::access" not in log, log[-2000:]
    # The environment beats the file; PACKRAT_CONFIG names the file.
    srv = Server(workdir / "cfg-env", extra_env={"PACKRAT_CONFIG": str(cfg),
                                                 "PACKRAT_REGION": "eu-env-1"}).start()
    client(srv, "eu-env-1").create_bucket(Bucket="bkt")
    srv.stop()
    # A flag beats both.
    srv = Server(workdir / "cfg-flag", extra_args=["--region", "eu-flag-1"],
                 extra_env={"PACKRAT_CONFIG": str(cfg), "PACKRAT_REGION": "eu-env-1"}).start()
    client(srv, "eu-flag-1").create_bucket(Bucket="bkt")
    srv.stop()


@pytest.mark.parametrize("text,message", [
    ("max-connection = 5\n", "unknown setting `max-connection`"),
    ('max-connections = "many"\n', "invalid value 'many' for '--max-connections"),
    ("disk = 5\nlisten = [1, 2]\n", "`listen` takes one value"),
    ("listen = \n", "not valid TOML"),
    ("serve = 3\n", "[serve] must be a table of settings"),
])
def test_a_wrong_setting_is_refused_by_name(workdir, text, message):
    cfg = workdir / "bad.toml"
    cfg.write_text(text)
    out = run("serve", "--data-dir", str(workdir / "cfg-bad"), "--listen", "127.0.0.1:0",
              "--config", str(cfg))
    assert out.returncode == 2 and message in out.stderr, (out.returncode, out.stderr)


def test_systemd_unit_passes_systemd_analyze(workdir):
    unit = (ROOT / "deploy" / "systemd" / "packrat.service").read_text()
    # The unit names the installed binary; point it at the one under test.
    (workdir / "packrat.service").write_text(unit.replace("/usr/local/bin/packrat", BIN))
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze (Debian's systemd package) is needed; .ci/run installs it"
    out = subprocess.run([analyze, "verify", str(workdir / "packrat.service")],
                         capture_output=True, text=True, timeout=60)
    # `verify` also checks the units the file pulls in, which a container may lack; only
    # complaints about this unit count.
    problems = [l for l in (out.stdout + out.stderr).splitlines() if l.startswith("packrat.service")]
    assert not problems, problems
