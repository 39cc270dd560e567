"""`trainformer doctor`: the real probes on this machine (end to end, real TensorFlow and NVML),
and the GPU branches on recorded answers of GPU machines (tests/fixtures/doctor/*.json) fed
through the same probing code, then diagnosed and formatted."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import trainformer

from trainformer.ops.doctor import (
    MATMUL_TOLERANCE, find_constraints, format_report, probe_cpu, probe_nvml, probe_tensorflow, probe_versions,
    problems,
)

RECORDINGS = Path(__file__).parents[1] / "fixtures" / "doctor"
REPO = Path(__file__).parents[2]


class RecordedNvml:
    """Answers like the pynvml module, from a recording (None: no NVIDIA library here)."""

    class NVMLError(Exception):
        pass

    def __init__(self, answers: dict | None):
        self.answers = answers
        self.open = False

    def nvmlInit(self):
        if self.answers is None:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.open = True

    def nvmlShutdown(self):
        self.open = False

    def nvmlSystemGetDriverVersion(self):
        return self.answers["driver_version"]

    def nvmlSystemGetCudaDriverVersion(self):
        return self.answers["cuda_driver_version"]

    def nvmlDeviceGetCount(self):
        return len(self.answers["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.answers["gpus"][index]

    def nvmlDeviceGetName(self, handle):
        return handle["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(**handle["memory"])

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return tuple(handle["cuda_compute_capability"])


def recorded_tensorflow(answers: dict):
    """Answers like the parts of the tensorflow module doctor's probe asks, from a recording."""
    devices = [SimpleNamespace(name=gpu["name"], device_type="GPU") for gpu in answers["gpus"]]
    by_name = {gpu["name"]: gpu for gpu in answers["gpus"]}

    def details(device):  # TensorFlow answers the capability as a tuple; JSON records it as a list
        recorded = by_name[device.name]["details"]
        return {**recorded, "compute_capability": tuple(recorded["compute_capability"])}

    experimental = SimpleNamespace(get_device_details=details,
                                   get_memory_growth=lambda device: by_name[device.name]["memory_growth"])
    return SimpleNamespace(
        version=SimpleNamespace(VERSION=answers["version"]),
        sysconfig=SimpleNamespace(get_build_info=lambda: answers["build_info"]),
        config=SimpleNamespace(list_physical_devices=lambda kind: devices if kind == "GPU" else [],
                               experimental=experimental),
    )


def replay(name: str, **environment) -> dict:
    """The facts of a recorded machine: its NVML and TensorFlow answers through the real probes."""
    recording = json.loads((RECORDINGS / f"{name}.json").read_text())
    nvml = RecordedNvml(recording["nvml"])
    facts = {**recording["facts"], "environment": {**recording["environment"], **environment},
             "nvml": probe_nvml(nvml), "tensorflow": probe_tensorflow(recorded_tensorflow(recording["tensorflow"]))}
    assert not nvml.open  # the probe shuts NVML down again
    return {**facts, "problems": problems(facts)}


def test_doctor_on_this_machine_is_healthy_and_reports_what_it_measured():
    result = trainformer("doctor", "--json", check=False)
    facts = json.loads(result.stdout)
    assert result.returncode == (1 if facts["problems"] else 0)
    # This CPU machine with the pinned packages: no GPU on either side is not a problem.
    # (Disk is left out: a CI runner's disk is not this project's to decide.)
    assert [line for line in facts["problems"] if "GiB free" not in line] == []
    assert facts["versions"]["packages"]["tensorflow"].startswith("2.21.")
    assert facts["versions"]["constraints"] == str(REPO / "constraints.txt") and facts["versions"]["pinned"] > 10
    assert facts["tensorflow"]["version"].startswith("2.21.") and facts["xla"] == {"ok": True, "error": None}
    assert facts["nvml"]["available"] or facts["nvml"]["error"]  # real NVML answered, or said why not
    matmul = {(m["device"], m["dtype"]): m for m in facts["matmul"]}
    assert {("CPU:0", "fp32"), ("CPU:0", "bf16")} <= set(matmul)
    for (device, dtype), measured in matmul.items():
        assert measured["gflops"] > 0.1 and 0 <= measured["error"] <= MATMUL_TOLERANCE[dtype], measured
    assert matmul["CPU:0", "fp32"]["error"] < 1e-5 < matmul["CPU:0", "bf16"]["error"]  # bf16 really ran in bf16
    assert facts["disk"]["free_bytes"] > 0

    report = format_report(facts).splitlines()
    assert report[0] == "versions" and report[-1] == ("healthy" if not facts["problems"] else
                                                      f"{len(facts['problems'])} problem(s)")
    assert {"tensorflow", "nvidia", "cpu", "self-test", "disk"} <= set(report)
    assert any(line.split()[:2] == ["CPU:0", "bf16"] and "GFLOP/s  ok" in line for line in report)


def test_recorded_h200_is_healthy():
    facts = replay("h200")
    assert facts["problems"] == []
    assert facts["nvml"] == {"available": True, "driver": "570.124.06", "driver_cuda": "12.8", "gpus": [
        {"index": 0, "name": "NVIDIA H200", "memory_bytes": 150754820096, "compute_capability": "9.0"}]}
    assert facts["tensorflow"]["gpus"] == [
        {"device": "GPU:0", "name": "NVIDIA H200", "compute_capability": "9.0", "memory_growth": False}]
    report = format_report(facts).splitlines()
    assert "  built for          CUDA 12.5.1, cuDNN 9" in report
    assert "  sees GPU:0         NVIDIA H200 (compute 9.0)" in report
    assert "  memory growth      off in TensorFlow; train applies runtime.memory_growth (default true)" in report
    assert "  driver             570.124.06 (CUDA 12.8)" in report
    assert "  GPU 0              NVIDIA H200, 140.4 GiB, compute 9.0" in report
    assert "  bf16               AVX512-BF16/AMX; measured bf16 3980.7 vs fp32 1450.2 GFLOP/s (2.74x)" in report
    assert "  precision auto     bf16: NVIDIA H200 has bf16 tensor cores" in report  # the GPU decides
    assert report[-1] == "healthy"


def test_gpu_that_tensorflow_does_not_see_is_a_problem_with_its_fix():
    facts = replay("h200-tf-sees-no-gpu")
    assert facts["problems"] == ["TensorFlow sees no GPU but nvidia-smi shows 1 (NVIDIA H200): install the CUDA "
                                 "wheels with pip install 'trainformer[gpu]'"]
    hidden = replay("h200-tf-sees-no-gpu", CUDA_VISIBLE_DEVICES="")
    assert hidden["problems"] == ["TensorFlow sees no GPU but nvidia-smi shows 1 (NVIDIA H200): "
                                  "CUDA_VISIBLE_DEVICES='' hides them: unset it"]
    report = format_report(facts).splitlines()
    assert report[-3:] == ["problems:", f"  - {facts['problems'][0]}", "1 problem(s)"]
    partly = replay("h200")
    partly["nvml"]["gpus"].append({**partly["nvml"]["gpus"][0], "index": 1})
    assert problems(partly) == ["TensorFlow sees 1 of the 2 GPUs nvidia-smi shows: check that no other process "
                                "holds them exclusively (nvidia-smi) and that the driver reports no errors"]


def test_driver_older_than_the_cuda_tensorflow_was_built_for():
    facts = replay("a100-old-driver")
    assert facts["nvml"]["driver_cuda"] == "12.0"
    assert facts["problems"] == [
        "the NVIDIA driver 525.147.05 runs CUDA up to 12.0 but TensorFlow 2.21.0 was built for CUDA 12.5.1: "
        "install a driver for CUDA 12.5 or newer",
        "TensorFlow sees no GPU but nvidia-smi shows 2 (NVIDIA A100-SXM4-80GB): the driver is too old for "
        "TensorFlow's CUDA (above): update it first",
    ]
    report = format_report(facts).splitlines()
    assert "  constraints.txt    not found (installed from a wheel): version check skipped" in report
    assert "  bf16               no AVX512-BF16/AMX; measured bf16 402.9 vs fp32 1210.4 GFLOP/s (0.33x)" in report
    assert ("  precision auto     fp32: this CPU has no AVX512-BF16 or AMX (measured bf16 402.9 vs fp32 1210.4 "
            "GFLOP/s (0.33x))" in report)  # TensorFlow sees no GPU here: the CPU decides
    assert report[-1] == "2 problem(s)"


def test_wrong_matmul_old_gpu_broken_xla_and_full_disk_are_problems():
    facts = replay("h200")
    facts["matmul"][3]["error"] = 0.41  # GPU:0 bf16
    facts["matmul"][2]["error"] = float("nan")  # GPU:0 fp32
    facts["tensorflow"]["gpus"][0]["compute_capability"] = "5.2"
    facts["xla"] = {"ok": False, "error": "UNIMPLEMENTED: no registered XLA backend"}
    facts["disk"]["free_bytes"] = 3 * 2**30
    found = problems(facts)
    assert len(found) == 5
    assert found[0].startswith("GPU:0 (NVIDIA H200) has compute capability 5.2 but TensorFlow 2.21.0 needs 6.0 "
                               "or newer")
    assert found[1].startswith("XLA does not run here (UNIMPLEMENTED: no registered XLA backend): "
                               "train with --set train.xla=off")
    assert found[2].startswith("fp32 matmul on GPU:0 is wrong (relative error nan against numpy")
    assert found[3].startswith("bf16 matmul on GPU:0 is wrong (relative error 0.41 against numpy, at most 0.02 "
                               "expected): use train.precision=fp32")
    assert found[4] == ("only 3.0 GiB free where runs are written (runs), less than 10 GiB: free some space or "
                        "pass train --run-dir on a larger disk")
    report = format_report({**facts, "problems": found})
    assert "GPU:0 bf16" in report and "WRONG (error 4.1e-01 vs numpy)" in report


def test_no_nvidia_library_is_no_gpu_not_a_problem():
    assert probe_nvml(RecordedNvml(None)) == {"available": False, "error": "NVML Shared Library Not Found"}
    facts = replay("h200")
    facts["nvml"] = probe_nvml(RecordedNvml(None))
    facts["tensorflow"]["gpus"] = []
    assert problems(facts) == []
    assert "  driver             none (NVML: NVML Shared Library Not Found)" in format_report(facts).splitlines()


def test_versions_against_constraints(tmp_path):
    assert find_constraints() == REPO / "constraints.txt"  # this source checkout
    pins = tmp_path / "constraints.txt"
    pins.write_text("# pins\ntensorflow==2.20.0\nkeras==3.15.1  # the same\nno-such-package-here==1.0\n\n")
    versions = probe_versions(pins)
    assert versions["pinned"] == 2  # the package that is not installed is not compared
    assert versions["mismatches"] == {"tensorflow": {"installed": versions["packages"]["tensorflow"],
                                                     "pinned": "2.20.0"}}
    facts = {**replay("h200"), "versions": versions}
    assert problems(facts) == [f"tensorflow {versions['packages']['tensorflow']} is installed but constraints.txt "
                               f"pins 2.20.0: reinstall with pip install -c constraints.txt -e ."]
    assert "1 of 2 installed pins match" in format_report(facts)
    assert probe_versions(None)["constraints"] is None


@pytest.mark.parametrize("flags, fast", [
    ("fpu sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", True),
    ("fpu sse2 avx avx2", False),
])
def test_cpu_features_from_cpuinfo(flags, fast):
    cpuinfo = (f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: {flags}\n\n"
               f"processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: {flags}\n")
    cpu = probe_cpu(cpuinfo)
    assert cpu["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert cpu["features"] == {"avx2": True, "avx512f": fast, "avx512_bf16": fast, "amx_tile": fast, "amx_bf16": fast}
    assert probe_cpu("")["features"]["avx2"] is False  # no /proc/cpuinfo (not Linux)


def test_bf16_speed_is_what_the_self_test_measured_not_a_canned_ratio():
    """A machine without AVX512-BF16 where bf16 measured about as fast as fp32 (42.2 vs 44.0
    GFLOP/s): the report quotes those figures, never "2-3x slower"."""
    facts = replay("a100-old-driver")
    cpu = {m["dtype"]: m for m in facts["matmul"] if m["device"] == "CPU:0"}
    cpu["fp32"]["gflops"], cpu["bf16"]["gflops"] = 44.0, 42.2
    report = format_report(facts)
    assert "2-3x" not in report and "slow here" not in report
    assert "  bf16               no AVX512-BF16/AMX; measured bf16 42.2 vs fp32 44.0 GFLOP/s (0.96x)" in report
    cpu["bf16"]["gflops"] = None  # no bf16 kernel on this device
    assert "  bf16               no AVX512-BF16/AMX; no bf16 matmul kernel here" in format_report(facts)


def test_constraints_named_by_the_environment_win(tmp_path, monkeypatch):
    """The Docker image is no source checkout: it names its copy of constraints.txt in
    TRAINFORMER_CONSTRAINTS, and doctor checks the versions against it."""
    pins = tmp_path / "constraints.txt"
    pins.write_text("tensorflow==2.20.0\n")
    monkeypatch.setenv("TRAINFORMER_CONSTRAINTS", str(pins))
    assert find_constraints() == pins
    versions = probe_versions(find_constraints())
    assert versions["constraints"] == str(pins) and versions["pinned"] == 1
    assert versions["mismatches"]["tensorflow"]["pinned"] == "2.20.0"
    monkeypatch.setenv("TRAINFORMER_CONSTRAINTS", str(tmp_path / "missing.txt"))  # no such file: the checkout's
    assert find_constraints() == REPO / "constraints.txt"
    monkeypatch.setenv("TRAINFORMER_CONSTRAINTS", "")
    assert find_constraints() == REPO / "constraints.txt"
