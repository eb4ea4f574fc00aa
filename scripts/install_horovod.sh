#!/usr/bin/env bash
# Build (once per machine) and install Horovod 0.28.1 with the PyTorch + Gloo CPU backend.
#
# Usage: scripts/install_horovod.sh PYTHON
#
# Horovod 0.28.1 is the only release and does not build against torch >= 2.1 as shipped. We download
# its sdist from the package index, apply the minimal edits listed in docs/runtime.md ("Building
# Horovod"), build a wheel and cache it under ${XDG_CACHE_HOME:-$HOME/.cache}/pace/wheels/, keyed on
# the torch version and the Python tag (the extension links against torch's C++ ABI, so a wheel
# built for one torch cannot be reused with another). Later runs install the cached wheel in seconds.
set -euo pipefail

HOROVOD_VERSION=0.28.1

if [[ $# -ne 1 ]]; then
    echo "usage: $0 PYTHON" >&2
    exit 2
fi
# The script cds into the unpacked sdist to build, so every path it uses must be absolute. A name
# without a slash is looked up on PATH; a path is made absolute without resolving symlinks (a
# venv's bin/python is a symlink to the base interpreter, and resolving it would leave the venv).
if [[ $1 == */* ]]; then
    PYTHON=$(cd "$(dirname "$1")" 2>/dev/null && pwd)/$(basename "$1") \
        || { echo "install_horovod: error: no directory $(dirname "$1")" >&2; exit 2; }
else
    PYTHON=$(command -v "$1") || { echo "install_horovod: error: $1 not found on PATH" >&2; exit 2; }
fi
[[ -x $PYTHON ]] || { echo "install_horovod: error: $PYTHON is not an executable" >&2; exit 2; }

log() { echo "install_horovod: $*" >&2; }
die() { echo "install_horovod: error: $*" >&2; exit 1; }

# Already installed and loadable (the import loads the compiled extension): nothing to do.
if "$PYTHON" -c "import horovod.torch as hvd; assert hvd.gloo_built()" >/dev/null 2>&1; then
    log "horovod.torch already importable with gloo; nothing to do"
    exit 0
fi

"$PYTHON" -c "import torch" 2>/dev/null \
    || die "torch is not importable by $PYTHON; install torch first (make test does this)"

TORCH_VERSION=$("$PYTHON" -c "import torch; print(torch.__version__)")
PY_TAG=$("$PYTHON" -c "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')")
# '+' (local version, e.g. 2.14.1+cu130) is not welcome in directory names used by pip.
TORCH_KEY=$(printf '%s' "$TORCH_VERSION" | tr -c 'A-Za-z0-9.\n' '_')
# PACE_WHEEL_CACHE overrides the cache directory (CI points it at an empty temporary directory so
# that every run builds from the sdist, as on a new machine).
CACHE_ROOT=${PACE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pace/wheels}
CACHE_DIR=$CACHE_ROOT/horovod-$HOROVOD_VERSION-torch$TORCH_KEY-$PY_TAG

install_wheel() {
    # --no-deps + explicit runtime deps: --force-reinstall must never touch the venv's torch.
    "$PYTHON" -m pip install -q cloudpickle psutil pyyaml packaging \
        || die "could not install horovod's runtime dependencies"
    "$PYTHON" -m pip install -q --force-reinstall --no-deps "$1" \
        || die "pip could not install $1"
    "$PYTHON" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'built without gloo'" \
        || die "installed $1 but 'import horovod.torch' fails (see the error above)"
    log "installed $(basename "$1")"
}

shopt -s nullglob
cached=("$CACHE_DIR"/horovod-"$HOROVOD_VERSION"-*.whl)
shopt -u nullglob
if [[ ${#cached[@]} -gt 0 ]]; then
    log "using cached wheel ${cached[0]}"
    install_wheel "${cached[0]}"
    exit 0
fi

# cmake >= 3.13 is needed by Horovod's build; fall back to the pip-packaged cmake in the venv.
if ! command -v cmake >/dev/null 2>&1 && [[ ! -x "$(dirname "$PYTHON")/cmake" ]]; then
    log "cmake not found; installing it into the venv"
    "$PYTHON" -m pip install -q cmake || die "could not install cmake"
fi
export PATH="$(dirname "$PYTHON"):$PATH"
command -v cmake >/dev/null 2>&1 || die "cmake still not on PATH"
# setup.py imports these at build time; with --no-build-isolation they must be in the venv.
"$PYTHON" -m pip install -q packaging wheel setuptools cloudpickle psutil pyyaml \
    || die "could not install build requirements"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/pace-horovod-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
log "no cached wheel in $CACHE_DIR: building horovod $HOROVOD_VERSION from the sdist for torch $TORCH_VERSION ($PY_TAG) in $WORK (~8 min on 2 cores)"

"$PYTHON" -m pip download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$WORK" \
    || die "could not download the horovod $HOROVOD_VERSION sdist"
tar -xzf "$WORK/horovod-$HOROVOD_VERSION.tar.gz" -C "$WORK"
SRC=$WORK/horovod-$HOROVOD_VERSION
[[ -d $SRC ]] || die "unexpected sdist layout (no $SRC)"

# Each edit must match exactly once; a silent no-op would produce a confusing compile error later.
"$PYTHON" - "$SRC" <<'EOF'
import pathlib
import sys

src = pathlib.Path(sys.argv[1])
edits = [
    # torch >= 2.1 headers need C++17 in the core ...
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    # ... and torch 2.14 headers need C++20 in the torch extension.
    ("horovod/torch/CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 20)"),
    # CPU/gloo build against a CUDA-enabled torch wheel: without this the build looks for cudart.
    (
        "cmake/Modules/FindPytorch.cmake",
        "print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)",
        "print(False)",
    ),
]
for rel, old, new in edits:
    path = src / rel
    text = path.read_text()
    count = text.count(old)
    if count != 1:
        sys.exit(f"install_horovod: error: edit of {rel} expected 1 match of {old!r}, found {count}")
    path.write_text(text.replace(old, new))
    print(f"install_horovod: patched {rel}", file=sys.stderr)
EOF

export CMAKE_POLICY_VERSION_MINIMUM=3.5
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo
unset HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_WITH_MPI || true

mkdir -p "$WORK/wheel"
(cd "$SRC" && "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$WORK/wheel" .) \
    || die "horovod build failed (see the compiler output above)"

shopt -s nullglob
built=("$WORK"/wheel/horovod-"$HOROVOD_VERSION"-*.whl)
shopt -u nullglob
[[ ${#built[@]} -eq 1 ]] || die "expected one built wheel in $WORK/wheel"

mkdir -p "$CACHE_DIR"
# Copy then rename so a concurrent reader never sees a half-written wheel.
cp "${built[0]}" "$CACHE_DIR/.partial"
mv "$CACHE_DIR/.partial" "$CACHE_DIR/$(basename "${built[0]}")"
log "cached $CACHE_DIR/$(basename "${built[0]}")"
install_wheel "$CACHE_DIR/$(basename "${built[0]}")"
