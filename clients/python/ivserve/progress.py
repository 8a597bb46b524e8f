"""A progress bar for long results, when tqdm is installed.

tqdm stays optional: without it, for a result small enough to arrive
before a bar would be worth drawing, or when stderr is not a terminal (a
script's log, a pipe, a notebook's captured stream), the bar is a no-op
unless asked for with progress=True.  The total is
the row count the stream's header announces, so the bar is exact.
"""
import importlib
import sys

# Results of at least this many rows get a bar when progress is left to
# the client (progress=None); a few hundred milliseconds at typical rates.
AUTO_ROWS = 100_000


class _Null:
    def update(self, n):
        pass

    def close(self):
        pass


def bar(total, progress, desc):
    """A bar object with update(n) and close(): tqdm's when progress is
    True, or None with total >= AUTO_ROWS and stderr a terminal, and tqdm
    imports; else a no-op."""
    if progress is False or (progress is None and (total < AUTO_ROWS or not _terminal())):
        return _Null()
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        return _Null()
    return tqdm(total=total, unit="cells", desc=desc, unit_scale=True)


def _terminal():
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
