#!/usr/bin/env bash
# Installs libgpumem to a temporary prefix, then builds and runs external
# consumers against the installation, both ways a user links it:
#   1. CMake: find_package(gpumem CONFIG) -> gpumem::gpumem (shared),
#      gpumem::gpumem_static (static), and a C++ consumer of gpumem.hpp
#   2. pkg-config gpumem: shared, and static (pkg-config --static)
# and checks the installed files (headers, SONAME, package files).
#
# Usage: scripts/test-install.sh [--build-dir DIR] [--work-dir DIR] [--keep]
#   --build-dir DIR  install from this existing build (default: configure and
#                    build a fresh one under the work directory)
#   --work-dir DIR   where the prefix and the consumer builds go (default: a
#                    new temporary directory, removed at the end unless --keep)
# Environment: CMAKE_COMMAND (default cmake), CC, CXX, GPUMEM_CMAKE_ARGS (extra
# arguments for configuring the fresh build, split on spaces).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build="" work="" keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --work-dir) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "test-install: unknown argument $1" >&2; exit 2 ;;
  esac
done
CMAKE=${CMAKE_COMMAND:-cmake}
CC=${CC:-cc}
CXX=${CXX:-c++}
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/gpumem-install.XXXXXX")
  [ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
else
  rm -rf "$work"
  mkdir -p "$work"
fi
work=$(cd "$work" && pwd)
prefix=$work/prefix
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)

fail() { echo "test-install: FAILED: $*" >&2; exit 1; }
step() { printf '\n---- %s\n' "$*"; }

# The consumers must use the installed library, never the environment's settings.
export GPUMEM_BACKEND=sim GPUMEM_LOG=warn GPUMEM_SIM_DEVICES=1x4GiB CUDA_VISIBLE_DEVICES=0
unset LD_LIBRARY_PATH PKG_CONFIG_PATH CMAKE_PREFIX_PATH || true

if [ -z "$build" ]; then
  step "configure and build a fresh tree"
  build=$work/build
  read -r -a extra <<<"${GPUMEM_CMAKE_ARGS:-}"
  "$CMAKE" -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_BUILD_TESTS=OFF \
    -DGPUMEM_BUILD_EXAMPLES=OFF -DGPUMEM_BUILD_TOOLS=OFF "${extra[@]}" >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
  "$CMAKE" --build "$build" -j "$(nproc 2>/dev/null || echo 4)" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
fi

step "install to $prefix"
"$CMAKE" --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }

# libdir is lib, lib64 or lib/<multiarch> depending on GNUInstallDirs
pc=$(find "$prefix" -name gpumem.pc -path '*/pkgconfig/*' | head -n1)
[ -n "$pc" ] || fail "gpumem.pc not installed"
libdir=$(dirname "$(dirname "$pc")")
for f in include/gpumem.h include/gpumem.hpp include/gpumem/backend.h include/gpumem/sim.h \
         share/gpumem/fortran/gpumem.f90; do
  [ -f "$prefix/$f" ] || fail "$f not installed"
done
[ -f "$libdir/libgpumem.a" ] || fail "libgpumem.a not installed"
[ -L "$libdir/libgpumem.so" ] || fail "libgpumem.so (development symlink) not installed"
real=$(readlink -f "$libdir/libgpumem.so")
soname=$(readelf -d "$real" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
if [ -z "$soname" ] || [ ! -e "$libdir/$soname" ]; then fail "SONAME '$soname' missing or not installed"; fi
config=$(find "$prefix" -name gpumemConfig.cmake | head -n1)
[ -n "$config" ] || fail "gpumemConfig.cmake not installed"
for f in gpumemConfigVersion.cmake gpumemTargets.cmake; do
  [ -f "$(dirname "$config")/$f" ] || fail "$f not installed"
done
# internal names (gpumem__*, double underscore) must stay hidden
exported=$(nm -D --defined-only "$real" | awk '{print $3}')
if grep -q '^gpumem__' <<<"$exported"; then
  grep '^gpumem__' <<<"$exported" | head >&2
  fail "libgpumem.so exports internal gpumem__ symbols"
fi
grep -q '^gpumem_create$' <<<"$exported" || fail "libgpumem.so does not export gpumem_create"
others=$(grep -v '^gpumem_' <<<"$exported" | grep -cv '^_' || true)
[ "$others" = 0 ] || echo "note: libgpumem.so also exports $others symbol(s) without the gpumem_ prefix (e.g. a static toolkit runtime)"
echo "ok: headers, $soname, libgpumem.a, CMake package, $(basename "$pc")"

not_needs_shared() { # $1: executable that must not load libgpumem.so
  if readelf -d "$1" | grep -q 'NEEDED.*libgpumem'; then fail "$1 links libgpumem.so, expected static"; fi
}
needs_shared() {
  readelf -d "$1" | grep -q "NEEDED.*$soname" || fail "$1 does not link $soname"
}

step "CMake consumer: find_package(gpumem CONFIG)"
"$CMAKE" -S "$src/tests/consumer" -B "$work/consumer-cmake" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" >"$work/consumer-configure.log" \
  || { cat "$work/consumer-configure.log"; exit 1; }
grep 'found gpumem' "$work/consumer-configure.log"
"$CMAKE" --build "$work/consumer-cmake" || fail "CMake consumer build"
needs_shared "$work/consumer-cmake/consumer_shared"
not_needs_shared "$work/consumer-cmake/consumer_static"
"$work/consumer-cmake/consumer_shared"
"$work/consumer-cmake/consumer_static"
"$work/consumer-cmake/consumer_cpp"

step "pkg-config consumer"
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --variable=prefix gpumem)" = "$prefix" ] || fail "gpumem.pc prefix is $(pkg-config --variable=prefix gpumem), expected $prefix"
pkg-config --exists --print-errors "gpumem >= 0.1" || fail "pkg-config version check"
echo "pkg-config gpumem $(pkg-config --modversion gpumem): $(pkg-config --cflags --libs gpumem)"
mkdir -p "$work/consumer-pc"
# shellcheck disable=SC2046
"$CC" -std=c11 -Wall -Wextra -Werror -o "$work/consumer-pc/consumer_shared" "$src/tests/consumer/consumer.c" \
  $(pkg-config --cflags --libs gpumem) -Wl,-rpath,"$libdir"
needs_shared "$work/consumer-pc/consumer_shared"
"$work/consumer-pc/consumer_shared"
static_libs=$(pkg-config --static --libs gpumem)
static_libs=${static_libs/-lgpumem/-Wl,-Bstatic -lgpumem -Wl,-Bdynamic}
echo "static: $static_libs"
# shellcheck disable=SC2046,SC2086
"$CC" -std=c11 -Wall -Wextra -Werror -o "$work/consumer-pc/consumer_static" "$src/tests/consumer/consumer.c" \
  $(pkg-config --cflags gpumem) $static_libs
not_needs_shared "$work/consumer-pc/consumer_static"
"$work/consumer-pc/consumer_static"
# shellcheck disable=SC2046
"$CXX" -std=c++17 -Wall -Wextra -Werror -o "$work/consumer-pc/consumer_cpp" "$src/tests/consumer/consumer.cpp" \
  $(pkg-config --cflags --libs gpumem) -Wl,-rpath,"$libdir"
"$work/consumer-pc/consumer_cpp"

printf '\ntest-install: all consumers built and ran against %s\n' "$prefix"
