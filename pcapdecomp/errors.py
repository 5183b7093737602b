"""The one exception hierarchy. Only cli.py turns these into messages and exit codes."""


class PcapdecompError(Exception):
    """Base of every error pcapdecomp raises on purpose. str(err) is the one-line user message."""

    exit_code = 2


class InputError(PcapdecompError):
    """A user mistake about an input file: missing, a directory, empty, not a capture, wrong kind."""


class CaptureFormatError(InputError):
    """The file is not a capture pcapdecomp can read (unknown magic, unknown link type, garbage)."""


class SlowLogError(InputError):
    """The file given as a slow log is not one."""


class UsageError(PcapdecompError):
    """Options that contradict each other or are out of range."""
