"""How much repeated random work a test does: IV_TEST_SCALE.

A test that checks the same C paths on many random inputs (selections,
files, rounds) asks scaled(n) for its count.  The release build runs at
the default scale 1, every input; scripts/test.sh's sanitizer phases set
IV_TEST_SCALE below 1, where each input costs several times its release
time, and each test keeps a floor (its `least`) chosen so that every case,
kind and variant it builds still runs under the sanitizer at least once.
"""

import os


def _scale():
    text = os.environ.get("IV_TEST_SCALE", "1")
    try:
        value = float(text)
    except ValueError:
        raise ValueError("IV_TEST_SCALE=%r is not a number" % text) from None
    if not 0 < value <= 1:
        raise ValueError("IV_TEST_SCALE=%r is not in (0, 1]" % text)
    return value


SCALE = _scale()


def scaled(n, least):
    """n at the run's scale, but never below least (nor above n)."""
    return min(n, max(least, int(round(n * SCALE))))
