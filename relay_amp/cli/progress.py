"""Progress bars that suit where they are written: a live bar on a terminal, a line at a time
(at most one a minute, and the last) in a log that is not one."""

from __future__ import annotations

import io
import sys

#: Seconds between lines in a log that is not a terminal.
LOG_INTERVAL_S = 60.0


class _Lines(io.TextIOBase):
    """A stream for tqdm that writes each refresh as a line of its own: tqdm redraws with
    carriage returns, which a file or a CI log keeps as one garbled line."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable=None, *, disable: bool = False, stream=None, **options):
    """``tqdm(iterable, **options)`` on stderr, as lines where stderr is not a terminal.

    Parameters
    ----------
    iterable : iterable, optional
        What to iterate over, as tqdm takes it.
    disable : bool
        No output at all (``--quiet``).
    stream : file, optional
        Where to write (default: ``sys.stderr``).
    **options
        tqdm's (``total``, ``desc``, ``unit``, ``bar_format``, ...).
    """
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    if not disable and not (hasattr(stream, "isatty") and stream.isatty()):
        options = {"mininterval": LOG_INTERVAL_S, "ascii": True, "ncols": 100, **options}
        stream = _Lines(stream)
    return tqdm(iterable, disable=disable, file=stream, **options)
