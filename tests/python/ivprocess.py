"""One ivserve server process for the Python tests: a free port, the log in
a file, the wait for /readyz, and a polite stop.  Each test module's own
Server class says what to start (config, arguments) and adds what it needs
to ask; the starting and stopping live here once."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

import requests

BIN = os.environ.get("IVSERVE_BIN")


def free_port():
    """A port nobody listens on now (the kernel's pick, released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def write_config(tmp, cfg):
    """cfg as JSON in a new file of tmp; its path."""
    fd, path = tempfile.mkstemp(prefix="cfg", suffix=".json", dir=tmp)
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f)
    return path


LISTENING = re.compile(r"listening on \S+:(\d+) ")


def listening_port(log_path, proc, timeout=30):
    """The port a server started with --port 0 logged in its "listening on"
    line (of the file at log_path); fails if it exits or never says."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(log_path) as f:
            m = LISTENING.search(f.read())
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(log_path) as f:
        raise RuntimeError("server never said where it listens:\n" + f.read()[-3000:])


class ServerProcess:
    """Starts `ivserve ARGS --port 0` with stdout and stderr in a log file of
    tmp, reads the port the kernel gave from the server's "listening on"
    line (a port picked here and handed over could be taken by a test
    running beside this one before the server binds it), and returns once
    /readyz answers 200 and ready() (if given) is true.  A server that
    exits or stays unready for ready_timeout seconds is stopped and
    reported with its log."""

    def __init__(self, tmp, args, ready_timeout=30, stop_timeout=20, ready=None, binary=None):
        binary = binary or BIN
        if not binary or not os.access(binary, os.X_OK):
            raise RuntimeError("IVSERVE_BIN is not set to an executable ivserve binary")
        self.port = 0
        self.stop_timeout = stop_timeout
        fd, path = tempfile.mkstemp(prefix="log", suffix=".txt", dir=tmp)
        os.close(fd)
        # Appending: the server's writes land at the end whatever offset
        # log_text()'s reads leave in the file description both share.
        self.log = open(path, "a+")
        self.log_path = path
        self.proc = subprocess.Popen([binary, *[str(a) for a in args], "--port", "0"],
                                     stdout=self.log, stderr=self.log)
        self.url = None
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            if not self.port:
                m = LISTENING.search(self.log_text())
                if m:
                    self.port = int(m.group(1))
                    self.url = "http://127.0.0.1:%d" % self.port
            try:
                if self.url and requests.get(self.url + "/readyz", timeout=2).status_code == 200 and \
                        (ready is None or ready(self)):
                    return
            except requests.ConnectionError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("server did not become ready:\n" + self.log_text())

    def log_text(self):
        # Read through a file of its own: the handle the server's output
        # goes to keeps a position and a text decoder whose state once
        # gave an empty read under load.
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_logged(self, text, times=1, timeout=120):
        """Until the log holds text (at least `times` times); fails with
        the log's end after timeout seconds."""
        deadline = time.time() + timeout
        while self.log_text().count(text) < times:
            assert time.time() < deadline, self.log_text()[-3000:]
            time.sleep(0.1)

    def status_kb(self, key):
        """A /proc/PID/status figure in kB (VmRSS, VmHWM, ...)."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise AssertionError("no %s in /proc/PID/status" % key)

    def rss_kb(self):
        return self.status_kb("VmRSS")

    def stop(self):
        """SIGTERM, then SIGKILL after stop_timeout; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
