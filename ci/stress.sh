#!/usr/bin/env bash
# ci/stress.sh — tests/test_stress.py at full size, printing the figures:
# 8 threads capturing and resolving for a minute, a 1 kHz timer handler
# capturing for a minute while the main thread loads/unloads a library,
# allocates and switches greenlets (a Python handler, then btcore's
# signal-safe capture in a C handler), a 1 kHz handler's snapshots while
# tracked gevent greenlets spawn, 1 000 000 collect + resolve cycles and
# 100 000 spawn-tracked greenlets with RSS before/after.  ~5 minutes.
# Run it in a venv with btcore installed ('.[test]').
set -euo pipefail
cd "$(dirname "$0")/.."
export BTCORE_STRESS_SECONDS=${BTCORE_STRESS_SECONDS:-60}
export BTCORE_STRESS_SIGNAL_SECONDS=${BTCORE_STRESS_SIGNAL_SECONDS:-60}
export BTCORE_STRESS_SIGNAL_SAFE_SECONDS=${BTCORE_STRESS_SIGNAL_SAFE_SECONDS:-60}
export BTCORE_STRESS_CYCLES=${BTCORE_STRESS_CYCLES:-1000000}
export BTCORE_STRESS_GREENLETS=${BTCORE_STRESS_GREENLETS:-100000}
python -m pytest -q -s -p no:cacheprovider tests/test_stress.py
