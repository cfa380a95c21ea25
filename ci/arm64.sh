#!/usr/bin/env bash
# ci/arm64.sh — btcore's test suite on aarch64 Linux: a cached Debian sid arm64
# chroot, run under qemu-user-static through binfmt_misc.  Must run as root on
# a Debian(-like) x86-64 host.  (docs/platforms.md: what each cell is.)
#
# Steps (times measured here, 2 shared cores):
#   1. host: qemu-user-static and debootstrap (apt), binfmt_misc mounted and
#      the aarch64 handler registered from /usr/lib/binfmt.d/qemu-aarch64.conf
#      (its F flag opens the interpreter now, so it works inside the chroot)
#   2. the chroot, built once (~4 min): debootstrap --arch=arm64 in one pass,
#      every arm64 program of the second stage run through qemu
#   3. a fresh venv and copy of the checkout; pip install '.[test]'   (~3 min)
#   4. the whole suite with QEMU_CPU=neoverse-n1: a fast model, without
#      pointer authentication (Python ~5x slower than native)
#   5. the unwinder tests again with QEMU_CPU=max, which implements pointer
#      authentication, so signed return addresses are really signed (~75x)
#   6. benchmarks/bench_capture.py: its ratios (a report, never a failure;
#      absolute times under emulation mean nothing, ratios to libunwind and
#      glibc in the same process still do)
#
# Usage (from the checkout to test):  sudo ci/arm64.sh
#
# Environment:
#   BTCORE_ARM64_ROOT          chroot location (default /var/cache/btcore/sid-arm64)
#   BTCORE_ARM64_MIRROR        Debian mirror (default: the host's apt sources')
#   BTCORE_ARM64_REBUILD       1 = rebuild the chroot even if a complete one exists
#   BTCORE_ARM64_LOGDIR        logs (default ${BTCORE_ARM64_ROOT}-logs)
#   BTCORE_ARM64_STEP_TIMEOUT  seconds per install/test step (default 2400)
#   BTCORE_ARM64_BENCH         1 (default) = run the benchmark; 0 = skip
#   BTCORE_ARM64_MAX_TESTS     the tests run under QEMU_CPU=max (default below)
#
# Exit codes:
#   0  passed
#   1  a step FAILED
#   3  "arm64 lane NOT RUN: <reason>" — the machine cannot run it (not root, no
#      network or mirror, no qemu-user-static, binfmt_misc not mountable,
#      mounts or chroot not permitted).  Never treat this as a pass.
#
# Caching: as ci/sid-matrix.sh (ci/lib/chroot.sh): built in "$ROOT.tmp",
# renamed once complete (marker file), one run at a time (lock file).

set -euo pipefail
set -E

ROOT=${BTCORE_ARM64_ROOT:-/var/cache/btcore/sid-arm64}
ROOT=${ROOT%/}
LOGDIR=${BTCORE_ARM64_LOGDIR:-${ROOT}-logs}
STEP_TIMEOUT=${BTCORE_ARM64_STEP_TIMEOUT:-2400}
BENCH=${BTCORE_ARM64_BENCH:-1}
# Every kind of context against glibc's backtrace() (current stack, suspended
# greenlets spilled or not, another thread's, a signal frame, the PAC chain):
# what pointer authentication can change.  Python under max runs ~75x slower
# than native, so not the whole suite.
MAX_TESTS=${BTCORE_ARM64_MAX_TESTS:-"tests/test_arch.py \
tests/test_collect.py::test_native_addresses_match_glibc_backtrace \
tests/test_greenlets.py::test_suspended_through_native_chain_shows_only_its_own_stack \
tests/test_greenlets.py::test_unspilled_and_spilled_greenlets \
tests/test_greenlets.py::test_suspended_greenlet_native_frames_equal_glibc_backtrace \
tests/test_greenlets.py::test_suspended_thread_native_frames_equal_glibc_backtrace"}
INSTALL_CMD="pip install '.[test]'"
# tests/test_html.py drives the HTML view in Debian's chromium: under
# qemu-user chromium needs minutes per page and misses the tests' timeouts,
# and the view has no architecture-specific code (the host suite runs it).
TEST_CMD="pytest -q -rfE -p no:cacheprovider"
SUITE_CMD="$TEST_CMD --ignore=tests/test_html.py"
BENCH_CMD="python benchmarks/bench_capture.py --repeat 5 --fresh 3"
# gcc/g++/python3-dev build btcore and the test fixtures; gdb and binutils
# (addr2line) are test oracles; libunwind8 is the benchmark's peer.
BASE_PKGS="ca-certificates,gcc,g++,binutils,libc6-dev,libffi-dev,pkg-config,make,file,python3,python3-dev,python3-venv"
EXTRA_PKGS="gdb libunwind8"
BINFMT=/proc/sys/fs/binfmt_misc
SRC_DIR=$(git rev-parse --show-toplevel 2>/dev/null || pwd -P)
VENV=/opt/btcore-venv
FAST_CPU=neoverse-n1
PAC_CPU=max

LOG_TAG=arm64
NOT_RUN_TAG="arm64 lane"
CHROOT_ENV=("QEMU_CPU=$FAST_CPU")   # every program in the chroot starts its own qemu
# shellcheck source=ci/lib/chroot.sh
. "$(dirname "$0")/lib/chroot.sh"
install_traps

# ------------------------------------------------------------- preflight --
[ "$(id -u)" = 0 ] || not_run "must run as root (debootstrap, chroot, mount and binfmt_misc need it)"
[ -f /etc/debian_version ] || not_run "host is not Debian-based (needs apt + debootstrap)"
[ -f "$SRC_DIR/pyproject.toml" ] || not_run "run this from the btcore checkout ($SRC_DIR has no pyproject.toml)"
MIRROR=${BTCORE_ARM64_MIRROR:-$(default_mirror)}
[ -n "$MIRROR" ] || not_run "no Debian mirror found in /etc/apt/sources* (set BTCORE_ARM64_MIRROR)"
MIRROR=${MIRROR%/}
mkdir -p "$(dirname "$ROOT")" "$LOGDIR"
exec 9>"$ROOT.lock"
flock -w 3600 9 || not_run "another arm64 run holds $ROOT.lock"

# aarch64 programs run through qemu: Debian's package installs the handler's
# description but nothing registers it on these machines.
ensure_binfmt() {
    ensure_host_packages qemu-user-static debootstrap
    [ -e "$BINFMT/register" ] || mount -t binfmt_misc binfmt_misc "$BINFMT" ||
        not_run "cannot mount binfmt_misc on $BINFMT"
    if [ ! -e "$BINFMT/qemu-aarch64" ]; then
        [ -f /usr/lib/binfmt.d/qemu-aarch64.conf ] || not_run "qemu-user-static has no qemu-aarch64.conf"
        cat /usr/lib/binfmt.d/qemu-aarch64.conf >"$BINFMT/register" ||
            not_run "cannot register the qemu-aarch64 binfmt_misc handler"
    fi
    grep -q '^enabled' "$BINFMT/qemu-aarch64" || not_run "the qemu-aarch64 binfmt_misc handler is disabled"
}

build_chroot() {
    local t0
    t0=$(now)
    BUILD_TMP=$ROOT.tmp
    safe_rm "$BUILD_TMP"
    log "debootstrap --arch=arm64 sid from $MIRROR into $BUILD_TMP (log: $LOGDIR/debootstrap.log)"
    if ! QEMU_CPU=$FAST_CPU debootstrap --arch=arm64 --variant=minbase --include="$BASE_PKGS" \
            sid "$BUILD_TMP" "$MIRROR" >"$LOGDIR/debootstrap.log" 2>&1; then
        tail -n 15 "$LOGDIR/debootstrap.log" >&2 || true
        not_run "debootstrap of arm64 sid from $MIRROR failed (network/mirror/binfmt?); see $LOGDIR/debootstrap.log"
    fi
    umount_under "$BUILD_TMP"
    mount_chroot "$BUILD_TMP" || not_run "cannot mount /proc,/dev,/sys into $BUILD_TMP"
    chroot_apt_update "$BUILD_TMP" "$LOGDIR/chroot-apt.log"
    umount_chroot
    swap_into_place "$ROOT" "mirror=$MIRROR" "packages=$BASE_PKGS"
    log "chroot ready in $(( $(now) - t0 )) s: $ROOT"
}

ensure_binfmt
T0=$(now)
if [ "${BTCORE_ARM64_REBUILD:-0}" = 1 ] || [ ! -f "$ROOT/$CHROOT_MARKER" ]; then
    build_chroot
    CHROOT_NOTE="built in $(( $(now) - T0 )) s"
else
    CHROOT_NOTE="reused ($(grep '^built=' "$ROOT/$CHROOT_MARKER" | cut -d= -f2))"
    log "reusing $ROOT, $CHROOT_NOTE; BTCORE_ARM64_REBUILD=1 to refresh"
fi
mount_chroot "$ROOT" || not_run "cannot mount /proc,/dev,/sys into $ROOT (missing CAP_SYS_ADMIN?)"
[ "$(in_chroot "$ROOT" uname -m 2>/dev/null)" = aarch64 ] || not_run "cannot run aarch64 programs in $ROOT"
# shellcheck disable=SC2086
install_into_chroot "$ROOT" "test oracle or benchmark peer; the tests that need it say so" $EXTRA_PKGS
proxy_env

# ------------------------------------------------------------- the steps --
PHASE=run
LOG=$LOGDIR/arm64.log
: >"$LOG"
SUMMARY=()
FAILED=""

# step NAME CPU COMMAND: run COMMAND in the checkout copy under QEMU_CPU=CPU.
step() {
    local name=$1 cpu=$2 cmd=$3 t rc=0
    t=$(now)
    log "$name (QEMU_CPU=$cpu): $cmd"
    echo "=== $name (QEMU_CPU=$cpu): $cmd" >>"$LOG"
    CHROOT_ENV=("QEMU_CPU=$cpu")
    run_in_venv "$ROOT" "$VENV" "$LOG" "$cmd" || rc=$?
    CHROOT_ENV=("QEMU_CPU=$FAST_CPU")
    SUMMARY+=("$(printf '%-22s %4ss  %s' "$name" "$(( $(now) - t ))" \
        "$([ $rc = 0 ] && echo PASS || { [ $rc = 124 ] && echo "TIMED OUT" || echo "FAIL (exit $rc)"; })")")
    return $rc
}

exact=$(in_chroot "$ROOT" python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo '?')
in_chroot "$ROOT" sh -c "rm -rf $VENV && python3 -m venv $VENV" >>"$LOG" 2>&1 || FAILED="venv creation"
copy_checkout "$ROOT/opt/btcore-src"
if [ -z "$FAILED" ]; then
    step install "$FAST_CPU" "$INSTALL_CMD" || FAILED=install
fi
if [ -z "$FAILED" ]; then
    step "suite" "$FAST_CPU" "$SUITE_CMD" || FAILED="the suite under $FAST_CPU"
    SUMMARY+=("  $(pytest_counts "$LOG")")
    step "unwinder tests" "$PAC_CPU" "$TEST_CMD $MAX_TESTS" || FAILED+="${FAILED:+, }the unwinder tests under $PAC_CPU"
    SUMMARY+=("  $(pytest_counts "$LOG")")
fi
RATIOS=""
if [ -z "$FAILED" ] && [ "$BENCH" = 1 ]; then
    step bench "$FAST_CPU" "$BENCH_CMD" || true
    RATIOS=$(bench_ratios "$LOG")
fi

# --------------------------------------------------------------- summary --
echo
echo "== arm64 lane (python $exact under qemu-user; chroot $ROOT: $CHROOT_NOTE; $(( $(now) - T0 )) s; log $LOG) =="
printf '%s\n' "${SUMMARY[@]}"
if [ -n "$RATIOS" ]; then
    echo
    echo "-- benchmarks/bench_capture.py under $FAST_CPU (full table in $LOG) --"
    printf '%s\n' "$RATIOS"
fi
if [ -n "$FAILED" ]; then
    echo "arm64 lane FAILED: $FAILED"
    tail -n 40 "$LOG" >&2 || true
    exit 1
fi
echo "arm64 lane PASSED"
