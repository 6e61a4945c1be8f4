"""Real parts for the SDK's tests: a versitygw S3 server, `silt` daemons and workers built by
the test command, each stopped (and its directory removed) when its test ends, also on failure.
Readiness is a line the process prints or a port answering, never a sleep."""

import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SILT = os.environ.get("SILT_BIN") or os.path.join(ROOT, "target/debug/silt")
VERSITYGW = os.environ.get("SILT_VERSITYGW") or os.path.join(ROOT, ".deps/bin/versitygw")
ACCESS, SECRET = "silt-py-access", "silt-py-secret-not-for-use"
READY_TIMEOUT = 60


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process whose stderr is read by a thread (so it never blocks on a full pipe)
    and kept for failure messages."""

    def __init__(self, args, env=None):
        self.args = args
        self.p = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True, start_new_session=True
        )
        self.lines = queue.Queue()
        self.log = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.p.stderr:
            self.log.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, prefix, what):
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"{what} exited (rc {self.p.wait()}):\n{''.join(self.log)}")
            if line.startswith(prefix):
                return line
        raise RuntimeError(f"{what} not ready within {READY_TIMEOUT}s:\n{''.join(self.log)}")

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


class S3:
    def __init__(self, root, endpoint):
        self.root = root
        self.endpoint = endpoint
        self.bucket = "bucket"
        os.makedirs(os.path.join(root, self.bucket))

    def path(self, rel):
        """Where versitygw keeps object `rel` of the bucket."""
        return os.path.join(self.root, self.bucket, rel)

    def put(self, rel, data):
        p = self.path(rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    def options(self):
        return {
            "s3_endpoint": self.endpoint,
            "s3_access_key_id": ACCESS,
            "s3_secret_access_key": SECRET,
            "s3_region": "us-east-1",
        }

    def flags(self):
        return [
            "--s3-endpoint", self.endpoint,
            "--s3-access-key-id", ACCESS,
            "--s3-secret-access-key", SECRET,
        ]


def _answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return b"versitygw" in s.recv(4096).lower()
    except OSError:
        return False


@pytest.fixture(scope="session")
def s3_server():
    if not os.path.exists(VERSITYGW):
        pytest.fail(f"versitygw not found at {VERSITYGW}: run scripts/install-deps.sh")
    work = tempfile.mkdtemp(prefix="silt-py-s3-")
    root = os.path.join(work, "root")
    os.makedirs(root)
    port = free_port()
    p = Proc([VERSITYGW, "--access", ACCESS, "--secret", SECRET, "--port", f"127.0.0.1:{port}", "posix", root])
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not _answers(port):
            if p.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("versitygw did not start:\n" + "".join(p.log))
            time.sleep(0.02)  # polling a port for readiness, not synchronising on time
        yield S3(root, f"http://127.0.0.1:{port}")
    finally:
        p.kill()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def s3(s3_server):
    """The session's server with a fresh, empty bucket for this test."""
    b = os.path.join(s3_server.root, s3_server.bucket)
    shutil.rmtree(b, ignore_errors=True)
    os.makedirs(b)
    return s3_server


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="silt-py-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def procs():
    """Processes a test starts; all stopped at its end."""
    started = []
    yield started
    for p in started:
        p.kill()


def run_silt(args, procs):
    if not os.path.exists(SILT):
        pytest.fail(f"{SILT} not built: run `cargo build -p silt` (the test command does)")
    p = Proc([SILT] + args, env=dict(os.environ, SILT_LOG="warn"))
    procs.append(p)
    return p


def cluster_secret(workdir):
    path = os.path.join(workdir, "cluster-secret")
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(secrets.token_urlsafe(32))
    return path
