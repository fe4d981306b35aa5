# Sourced by scripts/callgrind-pairs.sh and scripts/callgrind-random.sh: what both need to count the
# instructions of one run of a bench tool under callgrind.
#   cg_prepare NAME TARGET   check valgrind, build TARGET in BUILD (default build-tools),
#                            make a temporary directory; sets cg_bin
#   cg_ir ARGS...            total instructions (Ir) of one run of cg_bin ARGS...
#   cg_build_line            "build: DIR (BUILD_TYPE)"
cg_prepare() {
  cg_name=$1
  BUILD=${BUILD:-build-tools}
  command -v valgrind >/dev/null || { echo "$cg_name: valgrind not found (Debian: apt-get install valgrind)" >&2; exit 1; }
  cg_bin=$BUILD/tools/$2
  # configured here when BUILD has no build yet; built every time (a no-op when up to date), so that a
  # build left from older sources is never counted
  [ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -DGPUMEM_BUILD_TESTS=OFF >/dev/null
  cmake --build "$BUILD" --target "$2" -j "$(nproc)" >/dev/null
  cg_tmp=$(mktemp -d)
  trap 'rm -rf "$cg_tmp"' EXIT
  export GPUMEM_SIM_DEVICES=${GPUMEM_SIM_DEVICES:-1x141GiB}
}
cg_ir() {
  local out=$cg_tmp/cg.$$.$RANDOM
  valgrind --tool=callgrind --callgrind-out-file="$out" "$cg_bin" "$@" >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; exit 1; }
  awk '/^(summary|totals):/ { print $2; exit }' "$out"
}
cg_build_line() {
  echo "build: $BUILD ($(grep -m1 '^CMAKE_BUILD_TYPE' "$BUILD/CMakeCache.txt" 2>/dev/null | cut -d= -f2))"
}
