"""The SDK over Google Cloud Storage, Azure Blob and HDFS side by side (embedded, the same
client as the mount and the gateway), against real emulators on loopback: fake-gcs-server,
Azurite (telemetry off) and a Hadoop mini cluster (WebHDFS), installed by
scripts/install-deps.sh. Each serves what its store holds, takes writes into its own store
only, and a move between two of them does not mix them."""

import base64
import email.utils
import getpass
import hashlib
import hmac
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

import silt
from conftest import READY_TIMEOUT, ROOT, Proc, free_port

DEPS = os.path.join(ROOT, ".deps")
AZ_ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, in Microsoft's documentation).
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _wait_port(proc, port, what):
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.p.poll() is not None:
            raise RuntimeError(f"{what} exited:\n{''.join(proc.log)}")
        if _answers(port):
            return
        time.sleep(0.05)  # polling a port, with a deadline
    raise RuntimeError(f"{what} did not answer within {READY_TIMEOUT}s:\n{''.join(proc.log)}")


def _request(method, url, body=b"", headers=None):
    req = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None, method=method)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


@pytest.fixture
def gcs():
    binary = os.path.join(DEPS, "bin/fake-gcs-server")
    if not os.path.exists(binary):
        pytest.fail(f"{binary} not found: run scripts/install-deps.sh")
    port = free_port()
    p = Proc([binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
              "-public-host", f"127.0.0.1:{port}", "-external-url", f"http://127.0.0.1:{port}"])
    try:
        _wait_port(p, port, "fake-gcs-server")
        url = f"http://127.0.0.1:{port}"
        _request("POST", f"{url}/storage/v1/b", json.dumps({"name": "gbkt"}).encode(),
                 {"Content-Type": "application/json"})
        yield url
    finally:
        p.kill()


def _azure_shared_key(method, path, query, headers, length):
    h = {k.lower(): v for k, v in headers.items()}
    to_sign = "\n".join([method, "", "", str(length) if length else "", "", h.get("content-type", ""),
                         "", "", "", "", "", ""]) + "\n"
    for k in sorted(k for k in h if k.startswith("x-ms-")):
        to_sign += f"{k}:{h[k]}\n"
    to_sign += f"/{AZ_ACCOUNT}{path}"
    for k in sorted(query):
        to_sign += f"\n{k}:{query[k]}"
    sig = hmac.new(base64.b64decode(AZ_KEY), to_sign.encode(), hashlib.sha256).digest()
    return f"SharedKey {AZ_ACCOUNT}:{base64.b64encode(sig).decode()}"


@pytest.fixture
def azure():
    binary = os.path.join(DEPS, "azurite/node_modules/.bin/azurite-blob")
    if not os.path.exists(binary):
        pytest.fail(f"{binary} not found: run scripts/install-deps.sh")
    port = free_port()
    data = tempfile.mkdtemp(prefix="silt-py-azurite-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURITE_")}
    # --disableTelemetry: Azurite otherwise sends usage data to a host on the internet.
    p = Proc([binary, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", data,
              "--disableTelemetry", "--disableProductStyleUrl", "--skipApiVersionCheck", "--loose",
              "--silent"], env=env)
    try:
        _wait_port(p, port, "Azurite")
        endpoint = f"http://127.0.0.1:{port}/{AZ_ACCOUNT}"
        headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06",
                   "Content-Type": "application/octet-stream"}
        # Path-style URLs: the account is also the path's first segment, so it is signed twice.
        headers["Authorization"] = _azure_shared_key("PUT", f"/{AZ_ACCOUNT}/acont", {"restype": "container"},
                                                     headers, 0)
        status, _ = _request("PUT", f"{endpoint}/acont?restype=container", b"", headers)
        assert status == 201, status
        yield endpoint
    finally:
        p.kill()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def hdfs():
    home = os.environ.get("SILT_HDFS_HOME") or os.path.join(DEPS, "hdfs")
    if not os.path.exists(os.path.join(home, "classes/MiniHdfs.class")):
        pytest.fail(f"the HDFS launcher is not in {home}: run scripts/install-deps.sh")
    work = tempfile.mkdtemp(prefix="silt-py-hdfs-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOOP_")}
    p = subprocess.Popen(
        ["java", "-Xmx1g", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
         "-Djava.net.preferIPv4Stack=true", "-cp", f"{home}/classes:{home}/lib/*", "MiniHdfs", work],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(os.path.join(work, "log"), "w"),
        env=env, text=True, cwd=work)
    try:
        # The launcher prints `READY rpc=P http=P` once it serves; it stops when stdin closes.
        line = p.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"mini HDFS did not start: {line!r}\n{open(os.path.join(work, 'log')).read()[-4000:]}")
        http = dict(kv.split("=") for kv in line.split()[1:])["http"]
        user = getpass.getuser()
        _request("PUT", f"http://127.0.0.1:{http}/webhdfs/v1/pyds?op=MKDIRS&user.name={user}")
        yield f"127.0.0.1:{http}", user
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


def test_gcs_azure_and_hdfs_side_by_side_through_the_sdk(gcs, azure, hdfs, workdir, monkeypatch):
    host, user = hdfs
    monkeypatch.setenv("SILT_PY_TEST_AZURE_KEY", AZ_KEY)
    mounts = {
        "/gcs": f"gs://gbkt/ds?endpoint={gcs}&anonymous=true",
        "/azure": f"azblob://acont/ds?account={AZ_ACCOUNT}&endpoint={azure}&account_key_env=SILT_PY_TEST_AZURE_KEY",
        "/hdfs": f"webhdfs://{host}/pyds?user={user}",
    }
    fs = silt.SiltFileSystem(mounts=mounts, cache_dir=os.path.join(workdir, "cache"), skip_instance_cache=True,
                             write_type="through")
    try:
        for m in mounts:
            body = f"written through the SDK into {m}".encode() * 1000
            fs.pipe_file(f"{m}/sub/new.bin", body)
            assert fs.cat_file(f"{m}/sub/new.bin") == body, m
            assert fs.cat_file(f"{m}/sub/new.bin", start=5, end=50) == body[5:50], m
            assert fs.ls(f"{m}/sub", detail=False) == [f"{m}/sub/new.bin"], m
            fs.mv(f"{m}/sub/new.bin", f"{m}/moved.bin")
            assert not fs.exists(f"{m}/sub/new.bin") and fs.cat_file(f"{m}/moved.bin") == body, m
        # Each store holds its own file, no other (a second client, nothing cached, sees it).
        other = silt.SiltFileSystem(mounts=mounts, cache_dir=os.path.join(workdir, "cache2"),
                                    skip_instance_cache=True)
        try:
            for m in mounts:
                assert other.cat_file(f"{m}/moved.bin") == f"written through the SDK into {m}".encode() * 1000
                names = [n for n in other.ls(m, detail=False) if other.isfile(n)]
                assert names == [f"{m}/moved.bin"], (m, names)
        finally:
            other.close()
        # A rename between two stores is refused (EXDEV), nothing changes on either side.
        with pytest.raises(OSError) as e:
            fs.client.rename("/gcs/moved.bin", "/azure/x.bin")
        assert e.value.errno == 18, e.value  # EXDEV
        assert fs.exists("/gcs/moved.bin") and not fs.exists("/azure/x.bin")
    finally:
        fs.close()
