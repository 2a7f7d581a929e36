"""The README's setup, as a newcomer types it on a bare Debian 12: the apt line names every
package CI installs, Rust is installed at the workspace's version, and the Python lines (a
virtual environment, never the system pip) are the ones `.ci/run` runs on every CI machine
before the tests (so every CI run executes them as written). Running them again in a scratch
directory (about 90 s of installs) is the long mode: PACKRAT_README_SCRATCH=1."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


def setup_lines():
    """The commands of the README's setup block, continuation lines joined, comments cut."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Setup", 1)[1]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    block = block.replace("\\\n", " ")
    lines = []
    for line in block.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line:
            lines.append(line)
    return lines


def test_the_apt_line_and_the_rust_line_match_what_ci_does():
    lines = setup_lines()
    apt = next(l for l in lines if "apt-get install" in l)
    readme_packages = set(apt.split("apt-get install", 1)[1].split()) - {"-y"}
    ci = (ROOT / ".ci" / "run").read_text()
    ci_packages = set(re.findall(r"need\+=\(([\w.+-]+)\)", ci))
    assert ci_packages, "the CI script's package list was found"
    missing = ci_packages - readme_packages
    assert not missing, f"CI installs packages the README's setup does not name: {missing}"
    rust = next(l for l in lines if "rustup" in l)
    version = re.search(r'rust-version\s*=\s*"([\d.]+)"', (ROOT / "Cargo.toml").read_text()).group(1)
    assert f"--default-toolchain {version}" in rust or f"--default-toolchain {version}.0" in rust, rust
    assert any(l.startswith("python3 -m venv .venv") for l in lines)
    assert not any(re.match(r"^(sudo )?pip3? install", l) for l in lines), "never the system pip"


def test_ci_runs_the_python_lines_as_written():
    lines = [l for l in setup_lines() if l.startswith(("python3 -m venv", ".venv/bin/pip"))]
    assert len(lines) == 2, lines
    ci = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()]
    # .ci/run may only quiet pip down; the words of each line are the README's, in order.
    quiet = {"-q", "--disable-pip-version-check"}
    ci_lines = [" ".join(w for w in l.split() if w not in quiet) for l in ci]
    for line in lines:
        assert line in ci_lines, f"the README's line {line!r} is not what .ci/run runs: {ci_lines}"
    assert ci_lines.index(lines[0]) < ci_lines.index(lines[1])


@pytest.mark.skipif(not os.environ.get("PACKRAT_README_SCRATCH"),
                    reason="long mode (PACKRAT_README_SCRATCH=1): CI runs these lines itself, see test_ci_runs_the_python_lines_as_written")
def test_the_python_lines_work_as_written_in_a_scratch_directory(tmp_path):
    lines = [l for l in setup_lines() if l.startswith(("python3 -m venv", ".venv/bin/pip"))]
    assert len(lines) == 2, lines
    # What the pip line reads, in the same places relative to the scratch directory.
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "requirements.txt", tmp_path / "tests" / "requirements.txt")
    shutil.copytree(ROOT / "sdk-examples" / "python", tmp_path / "sdk-examples" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    # A newcomer's shell: no virtual environment active, the machine's own python3 on PATH.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if os.path.realpath(p) != os.path.realpath(venv_bin))
    for line in lines:
        out = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=900)
        assert out.returncode == 0, f"{line}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
    py = tmp_path / ".venv" / "bin" / "python"
    out = subprocess.run([str(py), "-c", "import boto3, awscli, pytest, selenium, prometheus_client, packrat_client;"
                          "print(packrat_client.__file__)"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / ".venv") in out.stdout, "the client is installed into the new environment"
    check = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
