#!/usr/bin/env bash
# Sets up the runtimes users would run instead of relay_amp (LiteRT with XNNPACK, ONNX Runtime)
# for the emulated aarch64 CPU of scripts/arm/setup_emulator.sh, from the package registries
# only (Debian's archive through apt, PyPI through pip). Idempotent. Run as root, after
# setup_emulator.sh (it installs qemu-user and the instruction counter).
#
#   1. apt: the arm64 architecture is added (once), then `apt-get download` of Debian's arm64
#      Python 3.11 and the libraries it and the wheels load, unpacked with `dpkg -x` into
#      PEERS_DIR/root (installing python3.11:arm64 would conflict with the x86 one)
#   2. pip: the aarch64 wheels of scripts/arm/peers-requirements.txt (`--platform`, `--target`)
#      into PEERS_DIR/site
#   3. check: the aarch64 Python imports numpy and both peers under qemu-aarch64
#
# Run a peer: PYTHONPATH=PEERS_DIR/site qemu-aarch64 -L PEERS_DIR/root \
#                 PEERS_DIR/root/usr/bin/python3.11 script.py
# Environment: ARM_DIR (default <repo>/.arm), PEERS_DIR (default $ARM_DIR/peers), PYTHON.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
ARM_DIR="${ARM_DIR:-$ROOT/.arm}"
PEERS_DIR="${PEERS_DIR:-$ARM_DIR/peers}"
PYTHON="${PYTHON:-python3}"
REQUIREMENTS="$ROOT/scripts/arm/peers-requirements.txt"
# python3.11-minimal and libpython3.11-stdlib, and what they and the wheels link
DEBS=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 libstdc++6 libgcc-s1
      libgomp1 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libuuid1
      libncursesw6 libtinfo6 libreadline8 libcrypt1 libdb5.3 libgdbm6 libnsl2 libtirpc3)
start=$SECONDS
step() { echo "== $1 ($((SECONDS - start)) s)"; }

command -v qemu-aarch64 >/dev/null || { echo "no qemu-aarch64: run scripts/arm/setup_emulator.sh" >&2; exit 1; }
mkdir -p "$PEERS_DIR/debs" "$PEERS_DIR/root"

step "apt: Debian's arm64 Python 3.11 into $PEERS_DIR/root"
if [[ -x "$PEERS_DIR/root/usr/bin/python3.11" && -f "$PEERS_DIR/root/.complete" ]]; then
    echo "already unpacked"
else
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64
        apt-get update -qq
    fi
    missing=()
    for p in "${DEBS[@]}"; do
        ls "$PEERS_DIR/debs/${p}_"*_arm64.deb >/dev/null 2>&1 || missing+=("$p:arm64")
    done
    if ((${#missing[@]})); then
        download() { (cd "$PEERS_DIR/debs" && apt-get -o APT::Sandbox::User=root download -qq "$@"); }
        # where the arm64 lists are stale, a fresh `apt-get update` first
        download "${missing[@]}" || { apt-get update -qq && download "${missing[@]}"; }
    fi
    for deb in "$PEERS_DIR"/debs/*.deb; do
        dpkg -x "$deb" "$PEERS_DIR/root"
    done
    touch "$PEERS_DIR/root/.complete"
fi

step "pip: the aarch64 wheels of $(basename "$REQUIREMENTS") into $PEERS_DIR/site"
STAMP="$PEERS_DIR/site/.requirements"
if [[ -f "$STAMP" ]] && cmp -s "$STAMP" "$REQUIREMENTS"; then
    echo "already installed"
else
    rm -rf "$PEERS_DIR/site"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps \
        --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
        --platform manylinux_2_28_aarch64 --python-version 3.11 --implementation cp \
        --only-binary=:all: --target "$PEERS_DIR/site" -r "$REQUIREMENTS"
    cp "$REQUIREMENTS" "$STAMP"
fi

step "check: the peers import under qemu-aarch64"
PYTHONPATH="$PEERS_DIR/site" qemu-aarch64 -L "$PEERS_DIR/root" -cpu max,sve=off \
    "$PEERS_DIR/root/usr/bin/python3.11" -c '
import platform, numpy, onnxruntime
from ai_edge_litert import interpreter
from importlib.metadata import version
print(platform.machine(), "numpy", numpy.__version__, "onnxruntime", onnxruntime.__version__,
      "ai-edge-litert", version("ai-edge-litert"))'

step "done"
echo "python: $PEERS_DIR/root/usr/bin/python3.11 (qemu-aarch64 -L $PEERS_DIR/root)"
echo "site:   $PEERS_DIR/site (PYTHONPATH)"
