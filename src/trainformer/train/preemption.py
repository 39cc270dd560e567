"""Graceful stop on SIGTERM (preemption, `kill`, a scheduler's time limit) and Ctrl-C.

The first signal asks the loop to finish the step it is in, save a checkpoint and return;
a second Ctrl-C interrupts at once, for when saving itself hangs.
"""

from __future__ import annotations

import signal
import threading


class StopRequest:
    """Context manager that turns SIGTERM/SIGINT into a flag the training loop polls.

    Example:
        with StopRequest() as stop:
            while training:
                step()
                if stop.signal_name:
                    save(); break
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

    def _handle(self, signum, frame):
        self.signal_name = signal.Signals(signum).name
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # signals only reach the main thread
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
