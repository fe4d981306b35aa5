#!/usr/bin/env bash
# valgrind memcheck over every sim test: each ctest test labelled "sim" (the
# cmocka tests tests/test_*, test_cpp, test_fortran, example_fortran), with the
# environment and working directory ctest gives it, runs under
#   valgrind --error-exitcode=99 --leak-check=full (definite and indirect leaks are errors)
# JOBS at a time, longest first. A test fails on a nonzero exit or on any
# nonzero "ERROR SUMMARY" in its log (forked children's included). Not run:
# the tests labelled python (pytest and a Python example: valgrind would check
# the interpreter) and tools (gpumem-replay/-info/-bench runs, not test binaries;
# the build has no tools). Suppressions: scripts/valgrind.supp (one, a leak in a
# forked child that fork semantics make unavoidable; the file says why).
#
# The sim backend announces every block it hands out to memcheck (client
# requests, src/backends/sim.c), so reads past a block's end or of a freed block
# are reported although the pool sub-allocates from big segments.
#
# Under valgrind the tests scale their heavy loops down (tests/testutil.h,
# tu_scale(): fault sweeps take every 17th fault index plus the first and last 2,
# the threaded and random tests fewer operations, smaller content stamps), so
# that the whole set fits in CI: 2.5 to 3.5 minutes on 2 cores (docs/RELIABILITY.md).
# GPUMEM_TEST_SCALE=1 runs everything at full scale: about 10.5 minutes, most of it
# test_fault_sweep.
#
# Environment: BUILD (default build/valgrind; configured here: sim only, no
# tools or examples), VALGRIND_BUILD_TYPE (Debug), JOBS (nproc), TESTS (ctest
# names, space-separated; default all of the above), GPUMEM_TEST_SCALE (see
# above), VALGRIND_ARGS (extra options, e.g. --track-origins=yes to find where
# an undefined value came from: much slower), VALGRIND_TIMEOUT (s per
# test, 1200), GPUMEM_SOAK_SECONDS (1).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/valgrind}
JOBS=${JOBS:-$(nproc)}
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)"; exit 1; }
# without the header the sim is built without its annotations and memcheck sees only whole segments
echo '#include <valgrind/memcheck.h>' | ${CC:-cc} -E -x c - >/dev/null 2>&1 \
  || { echo "valgrind/memcheck.h not found: the sim backend would not annotate its blocks"; exit 1; }
gen=()
[ -f "$BUILD/CMakeCache.txt" ] || gen=(-G Ninja)
cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE="${VALGRIND_BUILD_TYPE:-Debug}" \
  -DGPUMEM_WITH_CUDA=OFF -DGPUMEM_WITH_HIP=OFF -DGPUMEM_BUILD_EXAMPLES=OFF -DGPUMEM_BUILD_TOOLS=OFF >/dev/null
cmake --build "$BUILD" -j "$JOBS" >/dev/null
export GPUMEM_SOAK_SECONDS=${GPUMEM_SOAK_SECONDS:-1}

BUILD="$BUILD" JOBS="$JOBS" python3 - <<'EOF'
import json, os, re, shlex, signal, subprocess, sys, time

build, jobs = os.environ["BUILD"], max(1, int(os.environ["JOBS"]))
timeout = float(os.environ.get("VALGRIND_TIMEOUT", "1200"))
vg = ["valgrind", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
      "--show-leak-kinds=definite,indirect", "--track-origins=no", "--trace-children=no", "--num-callers=24",
      "--suppressions=" + os.path.abspath("scripts/valgrind.supp")]
vg += shlex.split(os.environ.get("VALGRIND_ARGS", ""))

listing = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1", "-L", "sim", "-LE", "python|tools"],
                         check=True, capture_output=True, text=True).stdout
tests = []
for t in json.loads(listing)["tests"]:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    if "command" not in t or props.get("DISABLED"):
        continue
    env = dict(os.environ)
    for kv in props.get("ENVIRONMENT", []):
        k, _, v = kv.partition("=")
        env[k] = v
    tests.append({"name": t["name"], "cmd": t["command"], "env": env, "cwd": props.get("WORKING_DIRECTORY", build)})
wanted = os.environ.get("TESTS", "").split()
if wanted:
    tests = [t for t in tests if t["name"] in wanted]
    missing = set(wanted) - {t["name"] for t in tests}
    if missing:
        sys.exit("no such sim test: " + " ".join(sorted(missing)))
if not tests:
    sys.exit("no sim tests in " + build)

# longest first (the times of the last run; unknown ones first of all), so that the two slowest don't end up last
times_file = os.path.join(build, "valgrind-times.txt")
last = {}
if os.path.exists(times_file):
    for line in open(times_file):
        name, _, secs = line.partition(" ")
        try:
            last[name] = float(secs)
        except ValueError:
            pass
# a fresh build: the slowest of the measured run of 2026-11-30 (docs/RELIABILITY.md) first
hint = ["test_fault_sweep", "test_expandable_segments", "test_fault_mixed", "test_pool_alloc",
        "test_expandable_fragmentation", "test_options", "test_misuse", "test_stress", "test_trace"]
tests.sort(key=lambda t: -last[t["name"]] if t["name"] in last
           else -1e9 + hint.index(t["name"]) if t["name"] in hint else 0)

scale = os.environ.get("GPUMEM_TEST_SCALE", "")
print(f"valgrind memcheck: {len(tests)} tests, {jobs} at a time, "
      f"{'GPUMEM_TEST_SCALE=' + scale if scale else 'heavy loops scaled down (GPUMEM_TEST_SCALE=1: full scale)'}",
      flush=True)
start = time.monotonic()
pending, running, results = list(tests), [], {}

def finish(t, rc, timed_out):
    secs = time.monotonic() - t["start"]
    t["log"].close()
    text = open(t["logpath"], errors="replace").read()
    errs = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) errors", text)]
    nerr = sum(errs)
    if timed_out:
        verdict = f"TIMED OUT after {timeout:.0f} s"
    elif rc == 99 or nerr:
        verdict = f"MEMCHECK ERRORS ({nerr})"
    elif rc != 0:
        verdict = f"test failed, exit {rc}"
    elif not errs:
        verdict = "no ERROR SUMMARY (did valgrind run?)"
    else:
        verdict = "ok"
    results[t["name"]] = (verdict, secs)
    extra = "" if verdict == "ok" else f"  (see {t['logpath']})"
    print(f"valgrind {t['name']}: {verdict}, {secs:.1f} s, {nerr} errors"
          f"{', ' + str(len(errs) - 1) + ' forked children' if len(errs) > 1 else ''}{extra}", flush=True)
    if verdict != "ok":
        for line in text.splitlines():
            if re.search(r"ERROR SUMMARY: [1-9]|(definitely|indirectly) lost: [1-9]|Invalid|uninitialised|"
                         r"FAILED|\[  ERROR", line):
                print("    " + line)

try:
    while pending or running:
        while pending and len(running) < jobs:
            t = pending.pop(0)
            t["logpath"] = os.path.join(os.path.abspath(build), f"valgrind-{t['name']}.log")
            t["log"] = open(t["logpath"], "w")
            t["start"] = time.monotonic()
            t["proc"] = subprocess.Popen(vg + t["cmd"], cwd=t["cwd"], env=t["env"], stdout=t["log"],
                                         stderr=subprocess.STDOUT, start_new_session=True)
            running.append(t)
        time.sleep(0.2)
        for t in list(running):
            rc = t["proc"].poll()
            timed_out = rc is None and time.monotonic() - t["start"] > timeout
            if timed_out:
                os.killpg(t["proc"].pid, signal.SIGKILL)
                rc = t["proc"].wait()
            if rc is not None:
                running.remove(t)
                finish(t, rc, timed_out)
except KeyboardInterrupt:
    for t in running:
        os.killpg(t["proc"].pid, signal.SIGKILL)
    raise

wall = time.monotonic() - start
bad = sorted(n for n, (v, _) in results.items() if v != "ok")
if not wanted:
    with open(times_file, "w") as f:
        for n, (_, secs) in sorted(results.items()):
            f.write(f"{n} {secs:.1f}\n")
print(f"valgrind memcheck: {len(results) - len(bad)} of {len(results)} tests clean, wall {wall:.0f} s"
      + (f"; FAILED: {' '.join(bad)}" if bad else ""), flush=True)
sys.exit(1 if bad else 0)
EOF
