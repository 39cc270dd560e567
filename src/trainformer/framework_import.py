"""Import TensorFlow and Keras with Python's cycle collector off, for a command's process.

Each full pass of the collector walks every object it tracks, and TensorFlow with Keras bring a
few hundred thousand of them, which stay until the process exits. The passes while they
import, the later ones that walk them again, and the last ones at exit cost 2-3 s of each
command on a 2-core EPYC (docs/measured.md). So the `trainformer` command imports them with the
collector off and then gc.freeze()s what they made: no later pass walks it. The hook acts on
the import itself, not before the verb runs: a verb that refuses a bad path first must refuse
it before TensorFlow loads.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import sys

FRAMEWORKS = ("tensorflow", "keras")


class FrameworkImport(importlib.abc.MetaPathFinder):
    """On sys.meta_path: finds a framework's top package as the path finder does, and wraps its
    execution (everything that package imports in turn) in collector off, then freeze."""

    def find_spec(self, name, path, target=None):
        if name not in FRAMEWORKS or not gc.isenabled():  # not one, or inside one (keras imports tensorflow)
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_with_collector_off(module):
            gc.disable()
            try:
                exec_module(module)
            finally:
                gc.freeze()
                gc.enable()

        spec.loader.exec_module = exec_with_collector_off  # this module's own loader object
        return spec


def install() -> None:
    """Import the frameworks with the collector off from now on in this process."""
    if not any(isinstance(finder, FrameworkImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, FrameworkImport())
