#!/usr/bin/env bash
# Sets up an emulated aarch64 CPU that runs relay_amp's aarch64 builds through TVM's RPC, from
# the package registries only (Debian apt, PyPI), in about half a minute where the registries
# answer fast. Idempotent: what is already there is kept (the wheels are cached in .arm/wheels).
#
#   1. apt: qemu-user-static (qemu-aarch64-static) and g++-aarch64-linux-gnu (the cross
#      compiler; its libc6-arm64-cross and libstdc++ are the sysroot /usr/aarch64-linux-gnu)
#   2. pip download: the aarch64 wheels of apache-tvm and apache-tvm-ffi (the versions installed
#      here), of which only libtvm_runtime.so and libtvm_ffi.so are kept
#   3. aarch64-linux-gnu-g++: scripts/arm/rpc_server.cc against the tvm-ffi headers of the x86
#      wheel installed here and those two libraries, rpath $ORIGIN
#   4. the instruction counter: apt's qemu-user (the dynamically linked qemu-aarch64, which loads
#      TCG plugins; the static one cannot), qemu-plugin.h out of Debian's source package of that
#      QEMU (a deb-src entry is added if apt has none), and gcc builds scripts/arm/insn_count.c
#
# Result: .arm/rpc/ holds rpc_server, libtvm_runtime.so and libtvm_ffi.so, a folder that runs
# as it is on an aarch64 board too (alone or registered with TVM's RPC tracker: --tracker); .arm/insn/libinsn_count.so counts executed instructions.
# Environment: ARM_DIR (default <repo>/.arm), PYTHON.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
ARM_DIR="${ARM_DIR:-$ROOT/.arm}"
PYTHON="${PYTHON:-python3}"
TVM_VERSION="0.27.0.post1"
TVM_FFI_VERSION="0.1.14.post1"
start=$SECONDS
step() { echo "== $1 ($((SECONDS - start)) s)"; }

# the server is compiled against the tvm-ffi headers installed here: they must be the version of
# the aarch64 libtvm_ffi.so it links
HERE_FFI="$("$PYTHON" -c 'import tvm_ffi; print(tvm_ffi.__version__)')"
if [[ "$HERE_FFI" != "$TVM_FFI_VERSION" ]]; then
    echo "apache-tvm-ffi $HERE_FFI is installed here, the server needs $TVM_FFI_VERSION" >&2
    exit 1
fi

step "apt: qemu-user-static, g++-aarch64-linux-gnu"
if command -v qemu-aarch64-static >/dev/null && command -v aarch64-linux-gnu-g++ >/dev/null; then
    echo "already installed"
else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends qemu-user-static g++-aarch64-linux-gnu \
        >/dev/null
fi

step "pip download: the aarch64 wheels of apache-tvm $TVM_VERSION, apache-tvm-ffi $TVM_FFI_VERSION"
mkdir -p "$ARM_DIR/wheels" "$ARM_DIR/rpc"
wheel() { ls "$ARM_DIR/wheels/$1"-*aarch64*.whl 2>/dev/null | head -1; }
if [[ -z "$(wheel "apache_tvm-$TVM_VERSION")" || -z "$(wheel "apache_tvm_ffi-$TVM_FFI_VERSION")" ]]; then
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
        --platform manylinux_2_28_aarch64 --python-version 3.11 --only-binary=:all: \
        "apache-tvm==$TVM_VERSION" "apache-tvm-ffi==$TVM_FFI_VERSION" -d "$ARM_DIR/wheels"
else
    echo "cached in $ARM_DIR/wheels"
fi

step "extract libtvm_runtime.so, libtvm_ffi.so"
# the apache-tvm wheel's tvm/lib/ also holds the 240 MB compiler library: only the runtime comes out
extract() {  # wheel member -> $ARM_DIR/rpc/<its file name>
    "$PYTHON" -c 'import shutil, sys, zipfile, os
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src:
    with open(os.path.join(sys.argv[3], os.path.basename(sys.argv[2])), "wb") as dst:
        shutil.copyfileobj(src, dst)' "$1" "$2" "$ARM_DIR/rpc"
}
extract_once() {  # wheel-name-prefix member
    local library="$ARM_DIR/rpc/$(basename "$2")"
    if [[ "$library" -nt "$(wheel "$1")" ]]; then
        echo "$(basename "$2") already extracted"
    else
        extract "$(wheel "$1")" "$2"
    fi
}
extract_once "apache_tvm-$TVM_VERSION" tvm/lib/libtvm_runtime.so
extract_once "apache_tvm_ffi-$TVM_FFI_VERSION" tvm_ffi/lib/libtvm_ffi.so

step "aarch64-linux-gnu-g++: rpc_server"
SERVER="$ARM_DIR/rpc/rpc_server"
if [[ -x "$SERVER" && "$SERVER" -nt "$ROOT/scripts/arm/rpc_server.cc" \
      && "$SERVER" -nt "$ARM_DIR/rpc/libtvm_runtime.so" ]]; then
    echo "up to date"
else
    FFI_INCLUDE="$("$PYTHON" -c 'import tvm_ffi.libinfo as i; print(i.find_include_path())')"
    DLPACK_INCLUDE="$("$PYTHON" -c 'import tvm_ffi.libinfo as i; print(i.find_dlpack_include_path())')"
    # --no-as-needed: the server calls no libtvm_runtime symbol; loading it registers
    # rpc.ServerLoop and the server-side functions
    aarch64-linux-gnu-g++ -std=c++17 -O2 -Wall -o "$SERVER" "$ROOT/scripts/arm/rpc_server.cc" \
        -I"$FFI_INCLUDE" -I"$DLPACK_INCLUDE" -L"$ARM_DIR/rpc" \
        -Wl,--no-as-needed -ltvm_runtime -ltvm_ffi -Wl,--as-needed -Wl,-rpath,'$ORIGIN'
fi

step "check: the server loads its libraries under qemu-aarch64-static"
qemu-aarch64-static -L /usr/aarch64-linux-gnu "$SERVER" --help >/dev/null

step "instruction counter: qemu-user, qemu-plugin.h, insn_count.c"
INSN="$ARM_DIR/insn"
COUNTER="$INSN/libinsn_count.so"
mkdir -p "$INSN"
if ! command -v qemu-aarch64 >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user \
        >/dev/null
fi
if [[ ! -f "$INSN/include/qemu-plugin.h" ]]; then
    if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        # Debian's own archive, for sources: the suites of the binary entries
        . /etc/os-release
        printf '%s\n' "Types: deb-src" "URIs: http://deb.debian.org/debian" \
            "Suites: $VERSION_CODENAME $VERSION_CODENAME-updates" "Components: main" \
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
            > /etc/apt/sources.list.d/relay-amp-deb-src.sources
        apt-get update -qq
    fi
    SOURCE="$(mktemp -d)"
    (cd "$SOURCE" && apt-get source --download-only -qq qemu >/dev/null 2>&1 \
        && tar -xJf qemu_*.orig.tar.xz --wildcards '*/include/qemu/qemu-plugin.h')
    mkdir -p "$INSN/include"
    cp "$SOURCE"/*/include/qemu/qemu-plugin.h "$INSN/include/"
    rm -rf "$SOURCE"
fi
if [[ -f "$COUNTER" && "$COUNTER" -nt "$ROOT/scripts/arm/insn_count.c" ]]; then
    echo "up to date"
else
    gcc -O2 -Wall -shared -fPIC -I"$INSN/include" -o "$COUNTER" "$ROOT/scripts/arm/insn_count.c"
fi

step "check: the counter counts the server's --help under qemu-aarch64"
rm -f "$INSN"/check.*
qemu-aarch64 -plugin "$COUNTER,out=$INSN/check" -L /usr/aarch64-linux-gnu "$SERVER" --help \
    >/dev/null
[[ -s "$(ls "$INSN"/check.* | head -1)" ]] || { echo "the counter wrote no counts" >&2; exit 1; }
rm -f "$INSN"/check.*

step "done"
echo "qemu:        $(command -v qemu-aarch64-static) ($(qemu-aarch64-static --version | head -1))"
echo "cross g++:   $(command -v aarch64-linux-gnu-g++)"
echo "sysroot:     /usr/aarch64-linux-gnu"
echo "server:      $ARM_DIR/rpc/rpc_server (with libtvm_runtime.so, libtvm_ffi.so beside it)"
echo "run it:      qemu-aarch64-static -L /usr/aarch64-linux-gnu $ARM_DIR/rpc/rpc_server --port 9090"
echo "or pooled:   ... rpc_server --port 9090 --tracker HOST:PORT --key KEY (python -m tvm.exec.rpc_tracker)"
echo "counter:     $COUNTER (qemu-aarch64 -plugin $COUNTER,out=PREFIX ...)"
