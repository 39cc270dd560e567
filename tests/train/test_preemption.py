"""Graceful stop: the first SIGTERM or Ctrl-C only asks the loop to stop after its step; a
second Ctrl-C stops at once (README: "a second Ctrl-C stops at once"). Real signals, sent to
this process."""

import os
import signal

import pytest

from trainformer.train.preemption import StopRequest


class Unhandled(Exception):
    """A signal StopRequest did not catch (instead of killing or interrupting pytest)."""


@pytest.fixture
def outer_handlers():
    """Handlers in place before StopRequest: raise Unhandled, so a failure stays a test failure."""
    def unhandled(signum, frame):
        raise Unhandled(signal.Signals(signum).name)

    saved = {signum: signal.signal(signum, unhandled) for signum in StopRequest.SIGNALS}
    yield unhandled
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def send(signum: int) -> None:
    os.kill(os.getpid(), signum)  # Python runs the handler before the next bytecode of this thread


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_first_signal_asks_to_stop_and_a_second_ctrl_c_stops_at_once(outer_handlers, first):
    with StopRequest() as stop:
        assert stop.signal_name is None
        send(first)  # no exception: the loop finishes its step and saves
        assert stop.signal_name == signal.Signals(first).name
        with pytest.raises(KeyboardInterrupt):
            send(signal.SIGINT)
    for signum in StopRequest.SIGNALS:
        assert signal.getsignal(signum) is outer_handlers  # the handlers from before are back


def test_a_second_sigterm_still_only_asks(outer_handlers):
    """Only a second Ctrl-C is the impatient one: a repeated SIGTERM does not interrupt the
    checkpoint being saved."""
    with StopRequest() as stop:
        send(signal.SIGTERM)
        send(signal.SIGTERM)
        assert stop.signal_name == "SIGTERM"
