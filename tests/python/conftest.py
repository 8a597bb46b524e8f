"""Shared pytest fixtures of the Python tests.

The tests talk to the real binary (env IVSERVE_BIN, set by ctest) and read
the shared fixtures (env IV_FIXTURES, by convention ../shared/fixtures from
the repository root).  A missing binary is a failure (a misconfigured run
must not pass by skipping); a missing fixtures folder skips the tests that
need it with a message, so the suite also runs from a checkout without it.
"""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

REPO = os.path.dirname(os.path.dirname(HERE))


def fixtures_path():
    """The fixtures folder, or None when it does not exist."""
    path = os.environ.get("IV_FIXTURES") or os.path.join(REPO, "..", "shared", "fixtures")
    return path if os.path.isdir(path) else None


class IvServe:
    """Runs the ivserve binary's command-line subcommands."""

    def __init__(self, path):
        self.path = path

    def run(self, *args, timeout=300):
        return subprocess.run([self.path] + [str(a) for a in args], capture_output=True,
                              text=True, timeout=timeout)

    def check(self, path, *args, **kw):
        return self.run("check", path, *args, **kw)

    def export(self, path, out, obs=None, var=None, *args, **kw):
        """`ivserve export path [--obs SEL] [--var SEL] ARGS -o out`; obs/var
        are strings in the command-line syntax or None for all."""
        cmd = ["export", path]
        if obs is not None:
            cmd += ["--obs", obs]
        if var is not None:
            cmd += ["--var", var]
        cmd += list(args) + ["-o", out]
        return self.run(*cmd, **kw)

    def assert_ok(self, proc):
        assert proc.returncode == 0, "exit %d\nstdout: %s\nstderr: %s" % (
            proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])

    def assert_error(self, proc, path, *keywords):
        """A clean refusal: exit status exactly 1 (a signal gives a negative
        status), and an `ivserve: error:` line on stderr naming the file and
        containing every keyword (case-insensitive); a keyword given as a
        tuple is satisfied by any one of its alternatives."""
        assert proc.returncode == 1, "exit %d (want 1)\nstderr: %s" % (
            proc.returncode, proc.stderr[-2000:])
        lines = [l for l in proc.stderr.splitlines() if l.startswith("ivserve: error:")]
        assert lines, "no 'ivserve: error:' line on stderr: %r" % proc.stderr[-2000:]
        text = "\n".join(lines)
        assert os.path.basename(str(path)) in text, "error does not name %s: %r" % (path, text)
        # Keywords are looked for in the message without the file's name,
        # which would otherwise match them (files are named after their lie).
        bare = text.replace(str(path), "").replace(os.path.basename(str(path)), "").lower()
        for kw in keywords:
            alts = (kw,) if isinstance(kw, str) else tuple(kw)
            assert any(a.lower() in bare for a in alts), \
                "error lacks %s: %r" % (" or ".join(map(repr, alts)), text)
        return text


@pytest.fixture(scope="session")
def ivserve():
    path = os.environ.get("IVSERVE_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("IVSERVE_BIN is not set to an executable ivserve binary")
    return IvServe(path)


@pytest.fixture(scope="session")
def fixtures_dir():
    path = fixtures_path()
    if path is None:
        pytest.skip("fixtures folder absent (IV_FIXTURES or ../shared/fixtures): skipping")
    return path


@pytest.fixture
def workdir(tmp_path):
    """A fresh temporary folder for the files one test writes."""
    return str(tmp_path)


def pytest_configure(config):
    # Print the reason of every skip and expected failure in the summary, so
    # a run without the fixtures, the binary or a route says so instead of
    # passing silently.
    chars = getattr(config.option, "reportchars", "") or ""
    if "a" not in chars and "A" not in chars:
        config.option.reportchars = chars + "".join(c for c in "sx" if c not in chars)
