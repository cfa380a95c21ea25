#!/usr/bin/env bash
# ci/sid-matrix.sh — run btcore's test suite under the CPython versions that
# Debian sid ships (3.13 / 3.14 / 3.15 when available), inside a cached
# Debian sid chroot.  Must run as root on a Debian(-like) host.
#
# Why a chroot: btcore reads CPython's *internal* frame structures, which change
# between minor versions.  Debian sid packages the newest interpreters (built the
# Debian way: interpreter statically linked into python3.X and stripped), so a
# sid chroot is a cheap way to exercise those layouts without building CPython.
#
# Usage (from the repository checkout to test):
#     sudo ci/sid-matrix.sh
#
# Environment:
#   BTCORE_SID_VERSIONS   versions to test            (default "3.13 3.14 3.15")
#   BTCORE_SID_ROOT       chroot location             (default /var/cache/btcore/sid)
#   BTCORE_SID_MIRROR     Debian mirror               (default: first Debian archive
#                         URI named by the host's apt sources)
#   BTCORE_SID_REBUILD    1 = rebuild the chroot even if a complete one exists
#   BTCORE_SID_LOGDIR     per-run logs                (default ${BTCORE_SID_ROOT}-logs)
#   BTCORE_INSTALL_CMD    install command, run in the copied checkout with the
#                         version's venv first on PATH
#                                                     (default: pip install '.[test]')
#   BTCORE_TEST_CMD       test command                (default: pytest -q)
#                         Both as in the README: a plain (non-editable) install,
#                         and "pytest", not "python -m pytest", which would put
#                         the checkout (no compiled btcore._native) first on
#                         sys.path.
#   BTCORE_SID_BENCH      1 (default) = after the tests pass, run
#                         benchmarks/bench_capture.py and show its ratios in
#                         the summary (a report: it never fails the run); 0 = skip
#   BTCORE_SID_STEP_TIMEOUT  seconds allowed for each install / test step (default 2400)
#
# Exit codes:
#   0  every selected version that sid ships passed (SKIPPED versions are listed)
#   1  at least one version FAILED
#   2  usage error (bad BTCORE_SID_VERSIONS, ...)
#   3  "sid matrix NOT RUN: <reason>" — the chroot could not be built or entered
#      (not root, no debootstrap, no network, mounts not permitted, ...), or no
#      selected version exists in sid.  Never treat this as a pass.
#
# Layout inside the chroot:
#   /opt/btcore-venv-3.X   a link to this run's fresh venv /opt/btcore-venv-3.X.<ns>,
#                          switched once it is installed (pip's wheel cache in
#                          /root/.cache/pip is kept, so wheels built from source
#                          are built only once)
#   /opt/btcore-src        fresh copy of the checkout per version
#
# Caching: the chroot is built in "$BTCORE_SID_ROOT.tmp" and renamed to
# $BTCORE_SID_ROOT only once it is complete (marker file .btcore-sid-complete),
# so a half-built chroot is never reused.  A lock file serialises concurrent runs.

set -euo pipefail
set -E                      # let the ERR trap fire inside functions too

# ---------------------------------------------------------------- settings --
ALL_VERSIONS="3.13 3.14 3.15"           # what the cached chroot is provisioned with
VERSIONS=${BTCORE_SID_VERSIONS:-$ALL_VERSIONS}
SID_ROOT=${BTCORE_SID_ROOT:-/var/cache/btcore/sid}
SID_ROOT=${SID_ROOT%/}
LOGDIR=${BTCORE_SID_LOGDIR:-${SID_ROOT}-logs}
INSTALL_CMD=${BTCORE_INSTALL_CMD:-"pip install '.[test]'"}
TEST_CMD=${BTCORE_TEST_CMD:-"pytest -q"}
BENCH=${BTCORE_SID_BENCH:-1}
BENCH_CMD="python benchmarks/bench_capture.py --repeat 5 --fresh 3"
STEP_TIMEOUT=${BTCORE_SID_STEP_TIMEOUT:-2400}
# Base packages for debootstrap --include.  The python3.X packages are added
# afterwards with apt inside the (still temporary) chroot: debootstrap aborts on
# any --include name the suite does not have, and which of 3.13/3.14/3.15 sid
# carries changes over time.  libffi-dev/pkg-config/make let pip build cffi and
# gevent from source when PyPI has no wheel for a brand-new Python.
BASE_PKGS="ca-certificates,gcc,g++,binutils,libc6-dev,libffi-dev,pkg-config,make,file"
# The capture benchmark's peer (libunwind's unw_backtrace); added to a cached
# chroot that lacks it, best effort (the benchmark says when it is missing).
BENCH_PKGS="libunwind8"
# Oracles some tests use (gdb reads greenlet's DWARF; valgrind checks the layout scan):
# installed into a cached chroot too, so those tests run there rather than skip.
TEST_PKGS="gdb valgrind"
# The checkout under test: the directory we run from (its git top level when
# run from a subdirectory of a git checkout).
SRC_DIR=$(git rev-parse --show-toplevel 2>/dev/null || pwd -P)

LOG_TAG=sid-matrix
NOT_RUN_TAG="sid matrix"
# shellcheck source=ci/lib/chroot.sh
. "$(dirname "$0")/lib/chroot.sh"
install_traps

# ------------------------------------------------------------- preflight --
for v in $VERSIONS; do
    [[ $v =~ ^3\.[0-9]+$ ]] || { log "bad version '$v' in BTCORE_SID_VERSIONS"; exit 2; }
done
[ -n "${VERSIONS// /}" ] || { log "BTCORE_SID_VERSIONS is empty"; exit 2; }
[ "$(id -u)" = 0 ] || not_run "must run as root (debootstrap, chroot and mount need it)"
[ -f /etc/debian_version ] || not_run "host is not Debian-based (needs apt + debootstrap)"
[ -f "$SRC_DIR/pyproject.toml" ] || [ -f "$SRC_DIR/setup.py" ] ||
    not_run "run this from the btcore checkout ($SRC_DIR has no pyproject.toml/setup.py)"

# The mirror: the Debian archive the host's apt sources already use, unless
# BTCORE_SID_MIRROR is set.
MIRROR=${BTCORE_SID_MIRROR:-$(default_mirror)}
[ -n "$MIRROR" ] || not_run "no Debian mirror found in /etc/apt/sources* (set BTCORE_SID_MIRROR)"
MIRROR=${MIRROR%/}

mkdir -p "$(dirname "$SID_ROOT")" "$LOGDIR"
# One run at a time per chroot (wait up to an hour for another run to finish).
exec 9>"$SID_ROOT.lock"
flock -w 3600 9 || not_run "another sid-matrix run holds $SID_ROOT.lock"

# ------------------------------------------------------------ the chroot --
# Build a complete chroot in $SID_ROOT.tmp, then rename it into place.
build_chroot() {
    local t0 t1 v pkgs=() shipped=() p
    t0=$(now)
    ensure_host_packages debootstrap
    BUILD_TMP=$SID_ROOT.tmp
    safe_rm "$BUILD_TMP"                  # half-built chroot of an interrupted run
    log "debootstrap sid from $MIRROR into $BUILD_TMP (log: $LOGDIR/debootstrap.log)"
    if ! debootstrap --variant=minbase --include="$BASE_PKGS" sid "$BUILD_TMP" "$MIRROR" \
            >"$LOGDIR/debootstrap.log" 2>&1; then
        tail -n 15 "$LOGDIR/debootstrap.log" >&2 || true
        not_run "debootstrap of sid from $MIRROR failed (network/mirror/keyring?); see $LOGDIR/debootstrap.log"
    fi
    umount_under "$BUILD_TMP"             # debootstrap normally cleans up; be sure
    t1=$(now); log "debootstrap took $((t1 - t0)) s"

    # Interpreters: install every one of $ALL_VERSIONS that sid has, so the
    # cache serves any BTCORE_SID_VERSIONS selection later.
    mount_chroot "$BUILD_TMP"
    chroot_apt_update "$BUILD_TMP" "$LOGDIR/chroot-apt.log"
    for v in $ALL_VERSIONS; do
        if has_candidate "$BUILD_TMP" "python$v"; then
            shipped+=("$v")
            for p in "python$v" "python$v-dev" "python$v-venv"; do
                # -venv (ensurepip) is a separate package in Debian; only add
                # the ones that exist.
                if has_candidate "$BUILD_TMP" "$p"; then pkgs+=("$p"); fi
            done
        fi
    done
    [ ${#shipped[@]} -gt 0 ] || not_run "sid ships none of python$ALL_VERSIONS"
    log "sid ships python ${shipped[*]}; installing ${pkgs[*]}"
    in_chroot "$BUILD_TMP" apt-get install -y --no-install-recommends "${pkgs[@]}" \
        >>"$LOGDIR/chroot-apt.log" 2>&1 ||
        not_run "apt-get install ${pkgs[*]} inside the chroot failed; see $LOGDIR/chroot-apt.log"
    in_chroot "$BUILD_TMP" apt-get clean
    umount_chroot

    swap_into_place "$SID_ROOT" "mirror=$MIRROR" "shipped=${shipped[*]}" "packages=${pkgs[*]}"
    log "chroot ready in $(( $(now) - t0 )) s total: $SID_ROOT"
}

T_CHROOT0=$(now)
if [ "${BTCORE_SID_REBUILD:-0}" = 1 ] || [ ! -f "$SID_ROOT/$CHROOT_MARKER" ]; then
    if [ -e "$SID_ROOT" ] && [ ! -f "$SID_ROOT/$CHROOT_MARKER" ]; then
        log "$SID_ROOT is incomplete (no $CHROOT_MARKER): rebuilding"
    fi
    build_chroot
    CHROOT_NOTE="built in $(( $(now) - T_CHROOT0 )) s"
else
    CHROOT_NOTE="reused ($(grep '^built=' "$SID_ROOT/$CHROOT_MARKER" | cut -d= -f2))"
    log "reusing $SID_ROOT, $CHROOT_NOTE; BTCORE_SID_REBUILD=1 to refresh"
fi
SHIPPED=" $(grep '^shipped=' "$SID_ROOT/$CHROOT_MARKER" | cut -d= -f2-) "

mount_chroot "$SID_ROOT" ||
    not_run "cannot mount /proc,/dev,/sys into $SID_ROOT (missing CAP_SYS_ADMIN?)"
in_chroot "$SID_ROOT" true || not_run "cannot chroot into $SID_ROOT"

# shellcheck disable=SC2086
install_into_chroot "$SID_ROOT" "test oracles" $TEST_PKGS

if [ "$BENCH" = 1 ]; then
    # shellcheck disable=SC2086
    install_into_chroot "$SID_ROOT" "benchmark peer; the benchmark runs without it if it cannot" $BENCH_PKGS
fi

proxy_env

# ------------------------------------------------------------- the matrix --
PHASE=matrix
declare -A RESULT=() BENCH_OUT=()
ANY_FAIL=0
ANY_RUN=0
T_MATRIX0=$(now)

# Run one step for version $1 (name $2, command string $3) in the copied
# checkout, with the venv first on PATH; output goes to the version's log.
run_step() {
    log "python$1: $2: $3"
    run_in_venv "$SID_ROOT" "$VENV" "$LOGDIR/python$1.log" "$3"
}

# Put venv $2 (installed) in place as /opt/btcore-venv-$1, atomically: the
# host's lanes that run meanwhile (.ci/run: README suite, ASan) start gevent
# targets from that path and must never see a venv being rebuilt (stop 34:
# the ASan lane's 3.15 targets found it emptied, without gevent).  The venv
# it replaces stays, for a target started from it just now; older ones go.
publish_venv() {
    in_chroot "$SID_ROOT" sh -c '
        link=/opt/btcore-venv-$1; new=$2
        old=$(readlink -f "$link" || true)
        if [ -d "$link" ] && [ ! -L "$link" ]; then     # a real directory (before venvs were published)
            old=$link.$(date +%s%N); mv -T "$link" "$old"
        fi
        ln -sfn "${new#/opt/}" "$link.next" && mv -T "$link.next" "$link"   # relative: the host reads it too
        for d in "$link".*; do
            [ "$d" = "$new" ] || [ "$d" = "$old" ] || rm -rf "$d"
        done' sh "$1" "$2"
}

for v in $VERSIONS; do
    if [[ $SHIPPED != *" $v "* ]]; then
        if in_chroot "$SID_ROOT" sh -c "command -v python$v" >/dev/null 2>&1; then
            :   # installed by hand after the build: use it
        else
            RESULT[$v]="SKIPPED: Debian sid (as cached in $SID_ROOT) does not ship python$v"
            continue
        fi
    fi
    ANY_RUN=1
    : >"$LOGDIR/python$v.log"
    exact=$(in_chroot "$SID_ROOT" "python$v" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo '?')
    timings=""
    t=$(now)
    # 1. fresh venv, beside the one in use (publish_venv puts it in place once installed)
    VENV=/opt/btcore-venv-$v.$(date +%s%N)
    if ! in_chroot "$SID_ROOT" "python$v" -m venv "$VENV" >>"$LOGDIR/python$v.log" 2>&1; then
        RESULT[$v]="FAIL ($exact) at venv creation; log: $LOGDIR/python$v.log"; ANY_FAIL=1; continue
    fi
    # 2. fresh copy of the checkout
    copy_checkout "$SID_ROOT/opt/btcore-src"
    timings+="venv+copy $(( $(now) - t ))s"
    # 3. install, 4. test
    failed=""
    for step in install test; do
        t=$(now)
        if [ $step = install ]; then cmd=$INSTALL_CMD; else cmd=$TEST_CMD; fi
        rc=0; run_step "$v" "$step" "$cmd" || rc=$?
        timings+=", $step $(( $(now) - t ))s"
        if [ $rc -ne 0 ]; then
            [ $rc -eq 124 ] && failed="$step timed out after ${STEP_TIMEOUT}s" || failed="$step (exit $rc)"
            break
        fi
        if [ $step = install ] && ! publish_venv "$v" "$VENV" >>"$LOGDIR/python$v.log" 2>&1; then
            failed="putting $VENV in place"; break
        fi
    done
    counts=$(pytest_counts "$LOGDIR/python$v.log")
    [ -n "$counts" ] && timings+="; $counts"
    if [ -z "$failed" ] && [ "$BENCH" = 1 ]; then
        # A report, not a gate: a benchmark failure is shown, never fatal.
        t=$(now)
        run_step "$v" bench "$BENCH_CMD" || true
        timings+=", bench $(( $(now) - t ))s"
        BENCH_OUT[$v]=$(bench_ratios "$LOGDIR/python$v.log")
    fi
    if [ -n "$failed" ]; then
        RESULT[$v]="FAIL ($exact) at $failed [$timings]; log: $LOGDIR/python$v.log"
        ANY_FAIL=1
        log "python$v failed; last lines of its log:"
        tail -n 25 "$LOGDIR/python$v.log" >&2 || true
    else
        RESULT[$v]="PASS ($exact) [$timings]"
    fi
done

# --------------------------------------------------------------- summary --
echo
echo "== sid matrix summary (chroot $SID_ROOT: $CHROOT_NOTE; matrix $(( $(now) - T_MATRIX0 )) s) =="
for v in $VERSIONS; do
    printf 'python%-5s %s\n' "$v" "${RESULT[$v]}"
done
for v in $VERSIONS; do
    [ -n "${BENCH_OUT[$v]:-}" ] || continue
    echo
    echo "-- python$v: benchmarks/bench_capture.py targets (full table in $LOGDIR/python$v.log) --"
    printf '%s\n' "${BENCH_OUT[$v]}"
done
if [ $ANY_RUN = 0 ]; then
    echo "sid matrix NOT RUN: none of the selected versions ($VERSIONS) is available in sid"
    exit 3
fi
[ $ANY_FAIL = 0 ] || exit 1
exit 0
