#!/usr/bin/env bash
# Installs what Silt's main job and tests need on a fresh Debian machine: FUSE 3 (fusermount3),
# etcd (Debian's etcd-server, for the membership tests), and a real S3-compatible server
# (versitygw, built from the Go module proxy into .deps/bin).
# Idempotent: skips what is already there.
#
# `install-deps.sh --main` installs only what the main job (scripts/demo.sh) uses: FUSE 3 and
# versitygw (about two minutes on a fresh 2-core machine). Without it, everything the test
# command needs as well (about 12 minutes fresh: Chromium, podman, helm, csi-sanity, the store
# emulators, the Python tools).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
mkdir -p "$deps/bin"
case "${1:-}" in
  --main) main_only=1 ;;
  "") main_only=0 ;;
  *) echo "install-deps: unknown argument ${1} (expected --main or nothing)" >&2; exit 2 ;;
esac

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
new_etcd=0
if [ "$main_only" = 0 ]; then
  # The gateway's TLS test makes a self-signed certificate with it.
  command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
  # The web page's test loads it in a real headless browser (crates/silt/tests/ops.rs).
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  # Tests start their own etcd on free ports (silt_testkit::Etcd); only the binary is needed.
  if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
    need_apt+=(etcd-server)
    new_etcd=1
  fi
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # etcd-server's postinst starts an etcd daemon on 127.0.0.1:2379 (init script or systemd
  # unit). Forbid service starts during the install with a temporary policy-rc.d, unless the
  # machine already has one (containers usually do, denying everything).
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ "$new_etcd" = 1 ] && [ ! -e "$policy" ]; then
    # Ours: removed however the script ends from here on (a failed install, Ctrl-C, kill).
    trap 'rm -f "$policy"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
  if [ "$own_policy" = 1 ]; then
    rm -f "$policy"
    trap - EXIT INT TERM
  fi
  if [ "$new_etcd" = 1 ]; then
    # Keep the packaged service from starting now or at boot, wherever it got started anyway.
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now etcd.service >/dev/null 2>&1 || true
    fi
    if [ -x /etc/init.d/etcd ]; then
      /etc/init.d/etcd stop >/dev/null 2>&1 || true
      command -v update-rc.d >/dev/null 2>&1 && update-rc.d etcd disable >/dev/null 2>&1 || true
    fi
  fi
fi
[ "$main_only" = 1 ] || command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] ||
  { echo "install-deps: etcd is missing after the install" >&2; exit 1; }

install_versitygw() {
  VERSITYGW_VERSION=v1.8.0
  if [ ! -x "$deps/bin/versitygw" ]; then
    command -v go >/dev/null 2>&1 || { echo "install-deps: Go is needed to build versitygw" >&2; exit 1; }
    echo "install-deps: building versitygw $VERSITYGW_VERSION (about two minutes)" >&2
    GOBIN="$deps/bin" GOFLAGS=-mod=mod go install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
  fi
}
if [ "$main_only" = 1 ]; then
  install_versitygw
  [ -e /dev/fuse ] || { echo "install-deps: /dev/fuse is missing; FUSE mounts cannot work here" >&2; exit 1; }
  echo "install-deps: ok for the main job (fusermount3: $(command -v fusermount3), versitygw: $deps/bin/versitygw)" >&2
  exit 0
fi

# The container image test (crates/silt/tests/container.rs) builds deploy/Containerfile and
# runs it with podman. runc, not crun: Debian 12's crun refuses hybrid cgroup hierarchies
# (this VM's). No recommends: the test uses no container network and no other image tools.
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  echo "install-deps: apt-get install --no-install-recommends podman runc" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends podman runc >/dev/null
  # The package enables its API socket and services: nothing of ours uses them.
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now podman.socket podman.service podman-restart.service >/dev/null 2>&1 || true
  fi
fi

# Pillow lets the tests read images through the mount the way torchvision's ImageFolder does.
if ! python3 -c 'import PIL' >/dev/null 2>&1; then
  echo "install-deps: pip install pillow" >&2
  python3 -m pip install -q pillow
fi

# The Python SDK's build and test tools, in a virtual environment of the project's own
# (`scripts/test.sh` builds the `silt` wheel with maturin and installs it there). boto3: the
# S3 gateway's tests (crates/silt/tests/gateway.rs) drive the gateway with it.
pyvenv="$deps/pyvenv"
py_tools=(maturin==1.16.0 fsspec==2026.9.0 pytest==9.2.0 boto3==1.44.5 pyarrow==26.0.1)
if ! "$pyvenv/bin/python" -c 'import fsspec, pytest, boto3, pyarrow' >/dev/null 2>&1 || [ ! -x "$pyvenv/bin/maturin" ]; then
  echo "install-deps: python venv $pyvenv (${py_tools[*]})" >&2
  python3 -m venv "$pyvenv" || { echo "install-deps: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
  "$pyvenv/bin/python" -m pip install -q "${py_tools[@]}"
fi

# The aws CLI and s3fs (fsspec's S3 filesystem) drive the S3 gateway in its tests too. Their
# botocore (pinned by aiobotocore) is older than boto3's, so they live in a venv of their own.
s3venv="$deps/s3venv"
s3_tools=(awscli==1.46.3 s3fs==2026.9.0 aiobotocore==3.10.0 botocore==1.43.117)
if ! "$s3venv/bin/python" -c 'import s3fs, awscli' >/dev/null 2>&1 || [ ! -x "$s3venv/bin/aws" ]; then
  echo "install-deps: python venv $s3venv (${s3_tools[*]})" >&2
  python3 -m venv "$s3venv" || { echo "install-deps: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
  "$s3venv/bin/python" -m pip install -q "${s3_tools[@]}"
fi

install_versitygw

# --- test-only: store emulators ---
# Real GCS, Azure Blob and HDFS servers that silt-testkit starts on loopback (gcs.rs,
# azurite.rs, hdfs.rs). Only the tests need them. Times are cold installs on this 2-core VM.

# fake-gcs-server, from the Go module proxy (about two minutes to build).
FAKE_GCS_VERSION=v1.56.1
if [ ! -x "$deps/bin/fake-gcs-server" ] ||
  ! go version -m "$deps/bin/fake-gcs-server" 2>/dev/null | grep -q "fake-gcs-server[[:space:]]*$FAKE_GCS_VERSION"; then
  command -v go >/dev/null 2>&1 || { echo "install-deps: Go is needed to build fake-gcs-server" >&2; exit 1; }
  echo "install-deps: building fake-gcs-server $FAKE_GCS_VERSION (about two minutes)" >&2
  GOBIN="$deps/bin" GOFLAGS=-mod=mod go install "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION"
fi

# Azurite (Azure Blob emulator), from the npm registry into .deps/azurite (about 15 seconds).
# 3.35.0: the newest release whose declared engines (node >= 10) include Debian 12's node 20;
# 3.36 and later declare node >= 21.
AZURITE_VERSION=3.35.0
azurite="$deps/azurite"
if [ "$(node -p "require('$azurite/node_modules/azurite/package.json').version" 2>/dev/null)" != "$AZURITE_VERSION" ]; then
  { command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; } ||
    { echo "install-deps: node and npm are needed to install Azurite (apt-get install nodejs npm)" >&2; exit 1; }
  echo "install-deps: npm install azurite@$AZURITE_VERSION into $azurite (about 15 seconds)" >&2
  mkdir -p "$azurite"
  npm install --prefix "$azurite" --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >/dev/null
fi

# HDFS: Hadoop's MiniDFSCluster (shaded client jars from Maven Central into .deps/hdfs/lib, about
# a minute for 105 MB) and the launcher scripts/hdfs-launcher/MiniHdfs.java, compiled against
# them into .deps/hdfs/classes (seconds). slf4j-simple: Hadoop logs through slf4j, and without a
# binding a failed start-up would leave an empty log.
HADOOP_VERSION=3.5.0
hdfs="$deps/hdfs"
launcher="$root/scripts/hdfs-launcher/MiniHdfs.java"
if [ "$(cat "$hdfs/lib/VERSION" 2>/dev/null)" != "$HADOOP_VERSION" ]; then
  command -v mvn >/dev/null 2>&1 || { echo "install-deps: Maven is needed to fetch Hadoop's jars (apt-get install maven)" >&2; exit 1; }
  echo "install-deps: fetching hadoop-client-minicluster $HADOOP_VERSION into $hdfs/lib (about a minute)" >&2
  rm -rf "$hdfs/lib" "$hdfs/classes"
  mkdir -p "$hdfs"
  dep() { echo "    <dependency><groupId>$1</groupId><artifactId>$2</artifactId><version>$3</version></dependency>"; }
  {
    echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
    echo '  <groupId>silt</groupId><artifactId>silt-minihdfs-deps</artifactId><version>0</version><packaging>pom</packaging>'
    echo '  <dependencies>'
    dep org.apache.hadoop hadoop-client-minicluster "$HADOOP_VERSION"
    dep org.apache.hadoop hadoop-client-api "$HADOOP_VERSION"
    dep org.apache.hadoop hadoop-client-runtime "$HADOOP_VERSION"
    dep org.slf4j slf4j-simple 1.7.36
    echo '  </dependencies>'
    echo '</project>'
  } >"$hdfs/pom.xml"
  mvn -B -q -Dstyle.color=never -f "$hdfs/pom.xml" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DoutputDirectory="$hdfs/lib"
  echo "$HADOOP_VERSION" >"$hdfs/lib/VERSION"
fi
if [ ! -f "$hdfs/classes/MiniHdfs.class" ] || [ "$launcher" -nt "$hdfs/classes/MiniHdfs.class" ]; then
  { command -v javac >/dev/null 2>&1 && command -v java >/dev/null 2>&1; } ||
    { echo "install-deps: a JDK (java, javac) is needed for the HDFS launcher (apt-get install default-jdk-headless)" >&2; exit 1; }
  echo "install-deps: compiling $launcher" >&2
  rm -rf "$hdfs/classes"
  mkdir -p "$hdfs/classes"
  javac -nowarn -d "$hdfs/classes" -cp "$hdfs/lib/*" "$launcher"
fi
# --- end of test-only: store emulators ---

# The Helm chart's checks (deploy/helm/check.sh): helm from the Go module proxy (about five
# minutes to build here), and kubernetes-validate (PyPI), which ships the Kubernetes API's
# JSON schemas, in a venv of its own.
HELM_VERSION=v3.22.0
if [ ! -x "$deps/bin/helm" ]; then
  command -v go >/dev/null 2>&1 || { echo "install-deps: Go is needed to build helm" >&2; exit 1; }
  echo "install-deps: building helm $HELM_VERSION (about five minutes)" >&2
  GOBIN="$deps/bin" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
# The CSI plugin's check (crates/silt/tests/csi.rs): the Kubernetes CSI sanity suite.
CSI_TEST_VERSION=v5.6.0
if [ ! -x "$deps/bin/csi-sanity" ]; then
  command -v go >/dev/null 2>&1 || { echo "install-deps: Go is needed to build csi-sanity" >&2; exit 1; }
  echo "install-deps: building csi-sanity $CSI_TEST_VERSION (about a minute)" >&2
  GOBIN="$deps/bin" GOFLAGS=-mod=mod go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_TEST_VERSION"
fi
k8svenv="$deps/k8svenv"
if [ ! -x "$k8svenv/bin/kubernetes-validate" ]; then
  echo "install-deps: python venv $k8svenv (kubernetes-validate)" >&2
  python3 -m venv "$k8svenv" || { echo "install-deps: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
  "$k8svenv/bin/python" -m pip install -q kubernetes-validate==1.37.0
fi
[ -e /dev/fuse ] || { echo "install-deps: /dev/fuse is missing; FUSE mounts cannot work here" >&2; exit 1; }
etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
echo "install-deps: ok (fusermount3: $(command -v fusermount3), etcd: $etcd_bin, versitygw: $deps/bin/versitygw, chromium: $(command -v chromium))" >&2
