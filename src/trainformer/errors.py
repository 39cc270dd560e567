"""The one exception type that means "the user gave us something we cannot use"."""


class UserError(Exception):
    """Bad input from the user: the CLI prints the message as one line and exits 2.

    The message must name the problem precisely enough to fix it without a
    traceback: the file, the key or line, and what is wrong.
    """


class TrainingError(Exception):
    """Training cannot go on (e.g. non-finite gradients): the CLI prints one line, exits 1."""


class NotInstalled(UserError):
    """A built-in corpus whose package is missing; `install` is the command that brings it
    (`trainformer data list` shows it instead of the corpus's size)."""

    def __init__(self, message: str, install: str):
        super().__init__(message)
        self.install = install
