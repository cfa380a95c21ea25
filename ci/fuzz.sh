#!/usr/bin/env bash
# ci/fuzz.sh — coverage-guided fuzzing of the parsers of outside bytes
# (.eh_frame, ELF, DWARF, compressed sections, demangling, tokens): atheris
# (libFuzzer) over a core built with clang-14, ASan and libFuzzer's coverage
# counters, in its own venv (.venv-fuzz), so the default build is untouched.
# Each target runs in a child process: a crash, a hang (-timeout) or memory
# past -rss_limit_mb fails the run and leaves the input in the work dir.
#
# Usage: ci/fuzz.sh [--long] [SECONDS_PER_TARGET]
#   default 50 s per target (6 targets, CI); --long: 1800 s per target.
# Environment: BTCORE_FUZZ_VENV, BTCORE_FUZZ_WORK (given: kept, corpus and
# artifacts; else a temporary dir, kept only when the run fails).
# Needs clang-14: installed with apt-get when missing and run as root.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${BTCORE_FUZZ_VENV:-$ROOT/.venv-fuzz}
WORK=${BTCORE_FUZZ_WORK:-$(mktemp -d /tmp/btcore-fuzz.XXXXXX)}
SECONDS_PER_TARGET=50
if [ "${1:-}" = "--long" ]; then SECONDS_PER_TARGET=1800; shift; fi
SECONDS_PER_TARGET=${1:-$SECONDS_PER_TARGET}

if ! command -v clang-14 >/dev/null && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends clang-14 >/dev/null 2>&1 || true
fi
command -v clang-14 >/dev/null || { echo "fuzz NOT RUN: clang-14 is not installed (apt-get install clang-14)" >&2; exit 3; }
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "$ROOT[test]" atheris
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
tar -C "$ROOT" --exclude=./build --exclude='./.venv*' --exclude=.git -cf - . | tar -C "$SRC" -xf -
CC=clang-14 LDSHARED="clang-14 -shared" BTCORE_FUZZ=1 \
    "$VENV/bin/pip" install -q --no-cache-dir --force-reinstall --no-deps "$SRC"
# grep -c reads all of nm's output: grep -q would exit at the first match and, under pipefail,
# nm's SIGPIPE would fail the check (it did once the core grew).
nm -D "$VENV"/lib/python3*/site-packages/btcore/_native*.so | grep -c __sanitizer_cov >/dev/null ||
    { echo "ci/fuzz.sh: the installed core has no coverage counters" >&2; exit 1; }
echo "fuzz: work dir $WORK"
rc=0
"$VENV/bin/python" "$ROOT/ci/fuzz.py" "$SECONDS_PER_TARGET" "$WORK" || rc=$?
# a work dir of our own is removed after a clean run; a failing input stays
[ "$rc" -ne 0 ] || [ -n "${BTCORE_FUZZ_WORK:-}" ] || rm -rf "$WORK"
exit "$rc"
