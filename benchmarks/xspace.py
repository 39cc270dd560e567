"""Op time per op type from a TF profiler trace (the XSpace protobuf, no TensorBoard plugin).

Shared by profile_step.py (our step, project venv) and peer_kerashub.py --profile (KerasHub's,
peers' venv): both read their trace the same way, so their tables compare line by line.
"""
import collections
import glob

from tensorflow.tsl.profiler.protobuf import xplane_pb2


def op_times(logdir, steps):
    """(ms per step by op type, ms per step by op name), summed over threads."""
    space = xplane_pb2.XSpace()
    with open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0], "rb") as f:
        space.ParseFromString(f.read())
    by_type, by_name = collections.Counter(), collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and not name.startswith(("Iterator", "EagerLocalExecute", "KernelAndDevice", "ExecutorState")):
                    ms = event.duration_ps / 1e9 / steps  # op events are named "scope/op:OpType"
                    by_type[name.rsplit(":", 1)[1]] += ms
                    by_name[name] += ms
    return by_type, by_name


def print_op_times(logdir, steps, types=25, names=15):
    by_type, by_name = op_times(logdir, steps)
    total = sum(by_type.values())
    print(f"op time per step, all threads: {total:.0f} ms")
    for op, ms in by_type.most_common(types):
        print(f"{ms:8.1f} ms {100 * ms / total:5.1f}%  {op}")
    print("top ops:")
    for op, ms in by_name.most_common(names):
        print(f"{ms:8.1f} ms  {op[-140:]}")
