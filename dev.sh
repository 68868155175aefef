#!/usr/bin/env bash
# One entry point for humans and CI: creates/reuses .venv at the repo root,
# installs the project when pyproject.toml changed, then runs what was asked.
#   ./dev.sh demo          set up, then run the demo on an embedded local Ray
#   ./dev.sh test [ARGS]   set up, then lint and run the whole test suite (two workers)
#   ./dev.sh test --quick  set up, then lint and run the quick tier (tests/README.md)
#   ./dev.sh coverage      set up, then run the whole suite measuring line coverage
set -euo pipefail
cd "$(dirname "$0")"

python_bin() {
  for candidate in "${PYTHON:-}" python3.11 python3; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$candidate"; return
    fi
  done
  echo "error: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 1
}

# Redis is what a Ray cluster keeps its metadata in (GCS fault tolerance): the tests
# that restart a head run a real one. The web console is tested in a real headless
# Chromium driven through chromedriver. `test` installs Debian's packages when they
# are missing; the demo needs none (the embedded Ray keeps metadata in RocksDB).
apt_install() {  # COMMAND PACKAGE...: install PACKAGEs unless COMMAND exists
  local command=$1; shift
  command -v "$command" >/dev/null 2>&1 && return
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if command -v apt-get >/dev/null 2>&1 && { [ -z "$sudo" ] || command -v sudo >/dev/null; }; then
    echo "installing $* (apt-get)" >&2
    $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
      { $sudo apt-get update -qq >/dev/null && \
        $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
  fi
  command -v "$command" >/dev/null 2>&1 ||
    { echo "error: $* required (Debian/Ubuntu: apt-get install $*)" >&2; exit 1; }
}

system_packages() {
  apt_install redis-server redis-server
  apt_install chromedriver chromium chromium-driver
}

# One line per step on the terminal; pip's and javac's output go to the log, which a
# failing step prints the end of.
LOG=.venv/setup.log

step() {
  local what=$1; shift
  printf '%s ... ' "$what"
  if "$@" >>"$LOG" 2>&1; then
    echo "done"
  else
    echo "FAILED (the end of $LOG:)"; tail -n 30 "$LOG" >&2; exit 1
  fi
}

# uv installs the same pins as pip in half the time or less (it builds, downloads and
# compiles on every core). It compiles the bytecode as pip would: every Ray worker
# imports Ray, pyarrow and pandas afresh, and with PYTHONDONTWRITEBYTECODE set (as in
# CI) it would otherwise compile them again each time. pip stays the fallback where uv
# cannot be installed or fails.
UV_VERSION=0.13.9

uv_install() {
  .venv/bin/uv pip install --python .venv/bin/python --compile-bytecode "$@" -e '.[ray,test]'
}

# From uv's cache alone first: asked again, a package index may answer that a source
# package changed, and uv then builds its wheel anew (pyspark's, some 13 s). A cache that
# lacks something fails at once, and the index is asked.
install_project() {
  if .venv/bin/python -m pip install --quiet "uv==$UV_VERSION" &&
    { uv_install --offline || uv_install; }; then
    return
  fi
  echo "uv failed: installing with pip instead"
  .venv/bin/python -m pip install --upgrade pip && .venv/bin/python -m pip install -e '.[ray,test]'
}

setup() {
  if [ ! -x .venv/bin/python ]; then
    local python; python=$(python_bin)
    printf 'creating .venv ... '; "$python" -m venv .venv && echo "done"
  fi
  : >"$LOG"
  local stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    step "installing the project and its pinned dependencies (a few minutes the first time)" \
      install_project
    rm -f .venv/.installed-* && touch "$stamp"
  fi
  # The Spark streaming connector (java/): javac against pyspark's own jars; a no-op
  # when the jar is newer than its sources.
  step "building the Spark connector" env PYTHON=.venv/bin/python bash java/build.sh build/raytopics-spark.jar
  # Every Ray worker imports the project afresh; with PYTHONDONTWRITEBYTECODE set (as in
  # CI's environment) none would leave bytecode behind, so each one would compile the
  # project's modules again. A no-op for modules whose bytecode is newer than them.
  step "compiling the project's modules" \
    .venv/bin/python -m compileall -q -j 0 actors clients runtime storage tests examples
  export PYSPARK_PYTHON="$PWD/.venv/bin/python" RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
}

# Coverage runs only: a .pth file in the venv that, in a measured Ray worker, saves
# coverage's data every few seconds (Ray ends most workers without an exit handler).
coverage_hook() {
  local site; site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import os, runpy; os.getenv('COVERAGE_PROCESS_CONFIG') and runpy.run_path('$PWD/tests/coverage_saver.py')" \
    >"$site/zz_raytopics_coverage.pth"
}

# The whole suite runs on two pytest workers by default, each a session with a Ray of
# its own (tests/README.md, "How a parallel run is laid out"): on 2 cores they finish it
# in two thirds to four fifths of one worker's time. RAYTOPICS_TEST_WORKERS=N runs N
# (1: serially). A worker that crashes ends the run: xdist's replacement for it, given
# grouped tests, waited for work with the other worker until CI's time-out.
parallel() {
  local workers=${RAYTOPICS_TEST_WORKERS:-2}
  [ "$workers" -gt 1 ] &&
    echo "-n $workers --dist loadgroup --no-loadscope-reorder --max-worker-restart 0"
  return 0
}

case "${1:-}" in
  demo)
    setup
    exec .venv/bin/python examples/demo.py
    ;;
  test)
    shift
    system_packages
    setup
    .venv/bin/ruff check .
    if [ "${1:-}" = "--quick" ]; then
      shift
      exec .venv/bin/python -m pytest -m "not integration or smoke" --durations=10 "$@"
    fi
    exec .venv/bin/python -m pytest $(parallel) --durations=25 "$@"
    ;;
  coverage)
    shift
    system_packages
    setup
    coverage_hook
    rm -rf build/coverage && mkdir -p build/coverage
    status=0
    # Serially: tracing every process costs CPU, and on two workers the schemathesis
    # runs, the admission fill and Spark's tests then miss their time limits.
    COVERAGE_FILE="$PWD/build/coverage/data" .venv/bin/python -m pytest --cov --cov-report= \
      --durations=25 "$@" || status=$?
    COVERAGE_FILE="$PWD/build/coverage/data" .venv/bin/python -m coverage combine -q || true
    COVERAGE_FILE="$PWD/build/coverage/data" .venv/bin/python -m coverage report \
      | tee build/coverage/report.txt | tail -n 1
    exit "$status"
    ;;
  *)
    echo "usage: ./dev.sh demo | ./dev.sh test [--quick] [pytest args] | ./dev.sh coverage" >&2
    exit 2
    ;;
esac
