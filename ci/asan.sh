#!/usr/bin/env bash
# ci/asan.sh — run btcore's test suite with the native core built under
# AddressSanitizer + UndefinedBehaviorSanitizer.
#
# The core is built with BTCORE_SANITIZE=1 (src/btcore/_build.py adds
# -fsanitize=address,undefined -fno-omit-frame-pointer -fno-wrapv) into its
# own venv, so the default build is untouched.  The run needs:
#   PYTHONMALLOC=malloc   pymalloc's pools would hide heap over-reads;
#   LD_PRELOAD            libasan first in the process (the interpreter is
#                         not instrumented), and libstdc++ (else ASan aborts
#                         in greenlet's __cxa_throw);
#   detect_leaks=0        the interpreter keeps its objects at exit;
#   replace_intrin=0      greenlet memcpy's a stack holding instrumented
#                         frames' poisoned redzones: a false report otherwise
#                         (btcore's own loads and stores stay checked).
# Tests whose oracle is glibc's backtrace() skip themselves: ASan's
# interceptor adds a frame to it (tests/conftest.py UNDER_ASAN).
#
# Usage: ci/asan.sh [pytest arguments]      Environment: BTCORE_ASAN_VENV
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${BTCORE_ASAN_VENV:-$ROOT/.venv-asan}

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "$ROOT[test]"   # the test dependencies (and a plain build, replaced next)
# From a copy without build/: setuptools would reuse the plain build's objects.
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
tar -C "$ROOT" --exclude=./build --exclude='./.venv*' --exclude=.git -cf - . | tar -C "$SRC" -xf -
BTCORE_SANITIZE=1 "$VENV/bin/pip" install -q --no-cache-dir --force-reinstall --no-deps "$SRC"
nm -D "$VENV"/lib/python3*/site-packages/btcore/_native*.so | grep __asan_init >/dev/null ||
    { echo "ci/asan.sh: the installed core is not instrumented" >&2; exit 1; }

export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export PYTHONMALLOC=malloc
export ASAN_OPTIONS=detect_leaks=0:replace_intrin=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd "$ROOT"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
