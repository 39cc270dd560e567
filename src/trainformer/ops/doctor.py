"""`trainformer doctor`: is this installation, this machine and its GPUs fit to train?

Three layers, so that a GPU machine's answers can be replayed on a CPU-only one:
  * probing: `probe_*` functions ask one source (package metadata, NVML, TensorFlow, the OS)
    and return plain dicts; NVML and TensorFlow come in as parameters, so a test can pass an
    object that answers from a recording of a GPU machine through the same code;
  * diagnosis: `problems(facts)`, a pure function: one line per problem, saying what is wrong
    and what to do;
  * formatting: `format_report(facts)`, the aligned report `trainformer doctor` prints.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from pathlib import Path

import numpy as np

from trainformer.run_dir import package_versions
from trainformer.train.precision import BF16_CPU_FEATURES, choose_precision, cpu_flags, read_cpuinfo

PACKAGES = ("trainformer", "tensorflow", "keras", "tensorflow-text")  # the stack a report names
MIN_FREE_GIB = 10  # a zh-bert-80m run keeps 3 checkpoints of ~1 GB plus its token cache
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
# Relative (Frobenius) error of a matmul against numpy in float64. fp32 allows for TF32, which
# TensorFlow uses for fp32 matmuls on Ampere and newer GPUs; bf16 inputs alone cost ~0.4%.
MATMUL_TOLERANCE = {"fp32": 5e-3, "bf16": 2e-2}
MATMUL_SIZE = {"CPU": 512, "GPU": 4096}  # big enough to be timed, small enough for well under a second
REINSTALL = "pip install -c constraints.txt -e ."


# ---------------------------------------------------------------- probing


def check(run_dir: Path) -> dict:
    """Every fact doctor reports, and the problems found in them (what `trainformer doctor` prints)."""
    import pynvml
    import tensorflow as tf

    facts = {
        "versions": probe_versions(find_constraints()),
        "environment": probe_environment(os.environ),
        "cpu": probe_cpu(read_cpuinfo()),
        "nvml": probe_nvml(pynvml),
        "tensorflow": probe_tensorflow(tf),  # before the self-tests start the devices: memory growth as set
        "disk": probe_disk(run_dir),
    }
    enable_memory_growth(tf)  # the self-tests take what they need, not a whole (maybe shared) GPU
    facts["xla"] = probe_xla(tf)
    facts["matmul"] = probe_matmul(tf)
    return {**facts, "problems": problems(facts)}


def find_constraints() -> Path | None:
    """The pins to check versions against: the file TRAINFORMER_CONSTRAINTS names (the Docker
    image sets it to its copy, /opt/trainformer/constraints.txt), else the repository's
    constraints.txt when trainformer runs from its source tree (src layout); None when neither
    exists (installed from a wheel, which carries no pins, or the variable names no file)."""
    named = os.environ.get("TRAINFORMER_CONSTRAINTS")
    if named and Path(named).is_file():
        return Path(named)
    source = Path(__file__).resolve().parents[2]  # src/ in a checkout
    root = source.parent
    if source.name == "src" and (root / "pyproject.toml").is_file() and (root / "constraints.txt").is_file():
        return root / "constraints.txt"
    return None


def probe_versions(constraints: Path | None) -> dict:
    """Python and the stack's versions; each installed package pinned in constraints whose
    version differs from its pin."""
    facts = {"python": platform.python_version(), "packages": package_versions(PACKAGES),
             "constraints": str(constraints) if constraints else None, "pinned": 0, "mismatches": {}}
    if constraints is None:
        return facts
    pins = read_pins(constraints)
    for name, version in package_versions(pins).items():
        pin = pins[name]
        if version is None:  # a pin for an extra (e.g. pytest) that is not installed here
            continue
        facts["pinned"] += 1
        if version != pin:
            facts["mismatches"][name] = {"installed": version, "pinned": pin}
    return facts


def read_pins(constraints: Path) -> dict[str, str]:
    """name -> version of each `name==version` line."""
    pins = {}
    for line in constraints.read_text(encoding="utf-8").splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.strip()] = version.strip()
    return pins


def probe_environment(environ) -> dict:
    """The variables that change which GPUs TensorFlow sees and how it takes their memory."""
    return {name: environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH")}


def probe_cpu(cpuinfo: str) -> dict:
    """Model, cores and the instruction-set features that decide CPU speed, from /proc/cpuinfo text."""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    present = cpu_flags(cpuinfo)
    return {"model": model.group(1).strip() if model else platform.processor() or None,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "features": {name: name in present for name in CPU_FEATURES}}


def probe_nvml(nvml) -> dict:
    """The NVIDIA driver and its GPUs as NVML (the library behind nvidia-smi) sees them; `nvml`
    is the pynvml module. No library or no driver: {"available": False, "error": ...}."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        return {"available": False, "error": str(err)}
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append({"index": index, "name": nvml.nvmlDeviceGetName(handle),
                         "memory_bytes": nvml.nvmlDeviceGetMemoryInfo(handle).total,
                         "compute_capability": f"{major}.{minor}"})
        cuda = nvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12080: the newest CUDA the driver runs
        return {"available": True, "driver": nvml.nvmlSystemGetDriverVersion(),
                "driver_cuda": f"{cuda // 1000}.{cuda % 1000 // 10}", "gpus": gpus}
    finally:
        nvml.nvmlShutdown()


def probe_tensorflow(tf) -> dict:
    """What TensorFlow was built for and which GPUs it sees; `tf` is the tensorflow module.
    Call before the devices start: memory growth reads as TensorFlow will apply it."""
    build = tf.sysconfig.get_build_info()
    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        gpus.append({"device": device.name.replace("/physical_device:", ""),
                     "name": details.get("device_name", "GPU"),
                     "compute_capability": "{}.{}".format(*capability) if capability else None,
                     "memory_growth": tf.config.experimental.get_memory_growth(device)})
    return {"version": tf.version.VERSION, "cuda_build": bool(build.get("is_cuda_build")),
            "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version"),
            "compute_capabilities": list(build.get("cuda_compute_capabilities") or []), "gpus": gpus}


def probe_disk(run_dir: Path) -> dict:
    """Free space where runs are written (the nearest existing folder of run_dir)."""
    existing = Path(run_dir).absolute()
    while not existing.exists():
        existing = existing.parent
    return {"path": str(run_dir), "free_bytes": shutil.disk_usage(existing).free}


def enable_memory_growth(tf) -> None:
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:  # devices already started (doctor called twice in one process)
            pass


def probe_xla(tf) -> dict:
    """Whether a tiny jit_compile function compiles and runs right on the default device."""
    try:
        value = tf.function(lambda x: 2.0 * x + 1.0, jit_compile=True, autograph=False)(tf.constant([1.0, 2.0])).numpy()
    except tf.errors.OpError as err:
        return {"ok": False, "error": str(err).strip().splitlines()[0]}
    return {"ok": value.tolist() == [3.0, 5.0], "error": None}


def probe_matmul(tf) -> list[dict]:
    """fp32 and bf16 matmul on every device: GFLOP/s, and the relative error against numpy
    (None where the device has no kernel for the type)."""
    from trainformer.train.peak import matmul_gflops

    results = []
    for device in tf.config.list_logical_devices():
        if device.device_type not in MATMUL_SIZE:
            continue
        for dtype in MATMUL_TOLERANCE:
            with tf.device(device.name):
                gflops = matmul_gflops(dtype, size=MATMUL_SIZE[device.device_type], reps=3)
                error = None if gflops is None else matmul_error(tf, dtype)
            results.append({"device": f"{device.device_type}:{device.name.rsplit(':', 1)[-1]}", "dtype": dtype,
                            "gflops": gflops, "error": error})
    return results


def matmul_error(tf, dtype: str, size: int = 256) -> float:
    """Relative error (Frobenius norm) of a dtype matmul on the current device against float64."""
    from trainformer.train.peak import DTYPES

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
    product = tf.cast(tf.linalg.matmul(tf.cast(a, DTYPES[dtype]), tf.cast(b, DTYPES[dtype])), tf.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64)  # (size, size)
    return float(np.linalg.norm(product.numpy() - expected) / np.linalg.norm(expected))


# ---------------------------------------------------------------- diagnosis


def problems(facts: dict) -> list[str]:
    """One line per problem in facts (as `check` gathers them): what is wrong, then what to do."""
    return [*version_problems(facts["versions"]), *gpu_problems(facts), *xla_problems(facts["xla"]),
            *matmul_problems(facts["matmul"]), *disk_problems(facts["disk"])]


def version_problems(versions: dict) -> list[str]:
    return [f"{name} {found['installed']} is installed but constraints.txt pins {found['pinned']}: "
            f"reinstall with {REINSTALL}" for name, found in versions["mismatches"].items()]


def gpu_problems(facts: dict) -> list[str]:
    nvml, tf = facts["nvml"], facts["tensorflow"]
    nvml_gpus = nvml["gpus"] if nvml["available"] else []
    old_driver = bool(nvml_gpus and tf["cuda_build"] and tf["cuda"]
                      and version_tuple(nvml["driver_cuda"]) < version_tuple(tf["cuda"]))
    found = [f"the NVIDIA driver {nvml['driver']} runs CUDA up to {nvml['driver_cuda']} but TensorFlow "
             f"{tf['version']} was built for CUDA {tf['cuda']}: install a driver for CUDA "
             f"{'.'.join(tf['cuda'].split('.')[:2])} or newer"] if old_driver else []
    found += visibility_problems(nvml_gpus, tf["gpus"], facts["environment"].get("CUDA_VISIBLE_DEVICES"), old_driver)
    return found + capability_problems(tf)


def visibility_problems(nvml_gpus: list, tf_gpus: list, visible: str | None, old_driver: bool) -> list[str]:
    """GPUs the driver shows that TensorFlow does not see."""
    if nvml_gpus and not tf_gpus:
        if visible is not None:
            fix = f"CUDA_VISIBLE_DEVICES={visible!r} hides them: unset it"
        elif old_driver:
            fix = "the driver is too old for TensorFlow's CUDA (above): update it first"
        else:
            fix = "install the CUDA wheels with pip install 'trainformer[gpu]'"
        return [f"TensorFlow sees no GPU but nvidia-smi shows {len(nvml_gpus)} ({nvml_gpus[0]['name']}): {fix}"]
    if len(tf_gpus) < len(nvml_gpus) and visible is None:
        return [f"TensorFlow sees {len(tf_gpus)} of the {len(nvml_gpus)} GPUs nvidia-smi shows: check that no other "
                f"process holds them exclusively (nvidia-smi) and that the driver reports no errors"]
    return []


def capability_problems(tf: dict) -> list[str]:
    """GPUs older than the oldest architecture TensorFlow was compiled for."""
    oldest = min((capability_of(arch) for arch in tf["compute_capabilities"]), default=None)
    return [f"{gpu['device']} ({gpu['name']}) has compute capability {gpu['compute_capability']} but TensorFlow "
            f"{tf['version']} needs {'.'.join(map(str, oldest))} or newer: train on a newer GPU or on the CPU "
            f"(CUDA_VISIBLE_DEVICES=)"
            for gpu in tf["gpus"]
            if oldest and gpu["compute_capability"] and version_tuple(gpu["compute_capability"]) < oldest]


def xla_problems(xla: dict) -> list[str]:
    if xla["ok"]:
        return []
    return [f"XLA does not run here ({xla['error'] or 'wrong result'}): train with --set train.xla=off, "
            f"or reinstall TensorFlow with {REINSTALL}"]


def matmul_problems(matmul: list[dict]) -> list[str]:
    found = []
    for result in matmul:
        error, tolerance = result["error"], MATMUL_TOLERANCE[result["dtype"]]
        if error is not None and not error <= tolerance:  # NaN is wrong too
            avoid = "train.precision=fp32" if result["dtype"] == "bf16" else "another device"
            found.append(f"{result['dtype']} matmul on {result['device']} is wrong (relative error {error:.3g} "
                         f"against numpy, at most {tolerance:g} expected): use {avoid}, and check the driver "
                         f"and the TensorFlow install ({REINSTALL})")
    return found


def disk_problems(disk: dict) -> list[str]:
    free_gib = disk["free_bytes"] / 2**30
    if free_gib >= MIN_FREE_GIB:
        return []
    return [f"only {free_gib:.1f} GiB free where runs are written ({disk['path']}), less than {MIN_FREE_GIB} GiB: "
            f"free some space or pass train --run-dir on a larger disk"]


def version_tuple(text: str) -> tuple[int, ...]:
    """'12.5.1' -> (12, 5): major and minor are what CUDA compatibility depends on."""
    return tuple(int(part) for part in text.split(".")[:2])


def capability_of(arch: str) -> tuple[int, int]:
    """'sm_60' / 'compute_90' (TensorFlow's build targets) -> (6, 0) / (9, 0)."""
    digits = arch.split("_")[-1]
    return int(digits[:-1]), int(digits[-1])


# ---------------------------------------------------------------- formatting


def format_report(facts: dict) -> str:
    """The aligned report: sections of facts, then the problems, then "healthy" or "N problem(s)"."""
    sections = [("versions", version_rows(facts["versions"])),
                ("tensorflow", tensorflow_rows(facts["tensorflow"], facts["xla"], facts["environment"])),
                ("nvidia", nvidia_rows(facts["nvml"])),
                ("cpu", cpu_rows(facts["cpu"], facts["matmul"])),
                ("train", [("precision auto", "{}: {}".format(*auto_precision(facts)))]),
                ("self-test", matmul_rows(facts["matmul"])),
                ("disk", [(facts["disk"]["path"], f"{facts['disk']['free_bytes'] / 2**30:.1f} GiB free")])]
    lines = []
    for title, rows in sections:
        lines.append(title)
        lines += [f"  {label:18s} {value}" for label, value in rows]
    found = facts["problems"]
    lines += ["", "problems:", *(f"  - {line}" for line in found)] if found else []
    lines.append(f"{len(found)} problem(s)" if found else "healthy")
    return "\n".join(lines)


def version_rows(versions: dict) -> list[tuple[str, str]]:
    rows = [("python", versions["python"])]
    rows += [(name, version or "not installed") for name, version in versions["packages"].items()]
    if versions["constraints"] is None:
        rows.append(("constraints.txt", "not found (installed from a wheel): version check skipped"))
    else:
        wrong = len(versions["mismatches"])
        rows.append(("constraints.txt", f"{versions['pinned'] - wrong} of {versions['pinned']} installed pins match "
                                        f"({versions['constraints']})"))
    return rows


def tensorflow_rows(tf: dict, xla: dict, env: dict) -> list[tuple[str, str]]:
    built = f"CUDA {tf['cuda']}, cuDNN {tf['cudnn']}" if tf["cuda_build"] else "CPU only (no CUDA)"
    rows = [("built for", built)]
    rows += [(f"sees {gpu['device']}", f"{gpu['name']} (compute {gpu['compute_capability']})") for gpu in tf["gpus"]]
    if tf["gpus"]:
        growth = "on" if all(gpu["memory_growth"] for gpu in tf["gpus"]) else "off"
        rows.append(("memory growth", f"{growth} in TensorFlow; train applies runtime.memory_growth (default true)"))
    else:
        rows.append(("sees GPUs", "none"))
    rows += [(name, value) for name, value in env.items() if value is not None]
    rows.append(("XLA", "ok (jit_compile ran)" if xla["ok"] else f"failed: {xla['error'] or 'wrong result'}"))
    return rows


def nvidia_rows(nvml: dict) -> list[tuple[str, str]]:
    if not nvml["available"]:
        return [("driver", f"none (NVML: {nvml['error']})")]
    rows = [("driver", f"{nvml['driver']} (CUDA {nvml['driver_cuda']})")]
    rows += [(f"GPU {gpu['index']}", f"{gpu['name']}, {gpu['memory_bytes'] / 2**30:.1f} GiB, "
                                     f"compute {gpu['compute_capability']}") for gpu in nvml["gpus"]]
    return rows or [("GPUs", "none")]


def cpu_rows(cpu: dict, matmul: list[dict]) -> list[tuple[str, str]]:
    present = [name for name, on in cpu["features"].items() if on]
    fast_bf16 = any(cpu["features"][name] for name in BF16_CPU_FEATURES)
    has = "AVX512-BF16/AMX" if fast_bf16 else "no AVX512-BF16/AMX"
    return [("model", f"{cpu['model'] or 'unknown'}, {cpu['cores']} cores"),
            ("features", " ".join(present) or "none of " + " ".join(CPU_FEATURES)),
            ("bf16", f"{has}; {bf16_speed(matmul, 'CPU:0')}")]


def bf16_speed(matmul: list[dict], device: str) -> str:
    """bf16 against fp32 as the self-test measured them on device: machines differ too much
    (and from day to day) for a ratio measured elsewhere to say anything here."""
    measured = measured_gflops(matmul, device)
    fp32, bf16 = measured.get("fp32"), measured.get("bf16")
    if not fp32:
        return "speed not measured"
    if bf16 is None:
        return "no bf16 matmul kernel here"
    return f"measured bf16 {bf16:.1f} vs fp32 {fp32:.1f} GFLOP/s ({bf16 / fp32:.2f}x)"


def auto_precision(facts: dict) -> tuple[str, str]:
    """What `train.precision: auto` chooses on the machine the facts describe, and why: the GPUs
    TensorFlow sees decide before the CPU does; a CPU with bf16 instructions by the bf16/fp32
    ratio of this machine's self-test (train times its own matmul, the same way)."""
    gpus = [(gpu["name"], version_tuple(gpu["compute_capability"]) if gpu["compute_capability"] else None)
            for gpu in facts["tensorflow"]["gpus"]]
    flags = {name for name, on in facts["cpu"]["features"].items() if on}
    choice, why = choose_precision(gpus, False, flags, lambda: measured_bf16_speedup(facts["matmul"], "CPU:0"))
    if gpus or flags & set(BF16_CPU_FEATURES):
        return choice, why
    return choice, f"this CPU has no AVX512-BF16 or AMX ({bf16_speed(facts['matmul'], 'CPU:0')})"


def measured_bf16_speedup(matmul: list[dict], device: str) -> float:
    """bf16 over fp32 GFLOP/s in the self-test on device (0 where either is missing)."""
    measured = measured_gflops(matmul, device)
    return (measured.get("bf16") or 0.0) / measured["fp32"] if measured.get("fp32") else 0.0


def measured_gflops(matmul: list[dict], device: str) -> dict:
    """{dtype: GFLOP/s or None} of the self-test's matmuls on device."""
    return {result["dtype"]: result["gflops"] for result in matmul if result["device"] == device}


def matmul_rows(matmul: list[dict]) -> list[tuple[str, str]]:
    rows = []
    for result in matmul:
        label = f"{result['device']} {result['dtype']}"
        if result["gflops"] is None:
            rows.append((label, "no kernel for this type"))
            continue
        ok = result["error"] <= MATMUL_TOLERANCE[result["dtype"]]
        rows.append((label, f"{result['gflops']:8.1f} GFLOP/s  {'ok' if ok else 'WRONG'} "
                            f"(error {result['error']:.1e} vs numpy)"))
    return rows
