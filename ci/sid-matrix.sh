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
#   /opt/btcore-venv-3.X   fresh venv per run (pip's wheel cache in /root/.cache/pip
#                          is kept, so wheels built from source are built only once)
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
MARKER=.btcore-sid-complete
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

PHASE=setup                 # setup errors => NOT RUN (3); matrix errors => FAIL
MOUNTED_ROOT=""             # chroot whose /proc,/dev,... we mounted (for the trap)
BUILD_TMP=""                # temp chroot being built (removed on failure)

log()  { printf 'sid-matrix: %s\n' "$*" >&2; }
not_run() { printf 'sid matrix NOT RUN: %s\n' "$*" >&2; exit 3; }
now()  { date +%s; }

# ------------------------------------------------------- mount management --
# All mountpoints at or below $1, deepest first (paths here contain no spaces).
mounts_under() {
    awk -v p="$1" '$2 == p || index($2, p "/") == 1 { print $2 }' /proc/self/mounts |
        awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-
}

# Unmount everything at or below $1 (a chroot); lazy unmount as a last resort.
umount_under() {
    local m
    for m in $(mounts_under "$1"); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
    done
}

# rm -rf a chroot directory, but only once nothing is mounted below it (an
# rm -rf through a bind mount of /dev would be a disaster); --one-file-system
# is a second guard.
safe_rm() {
    [ -e "$1" ] || return 0
    umount_under "$1"
    if [ -n "$(mounts_under "$1")" ]; then
        not_run "refusing to delete $1: still has mounts below it"
    fi
    rm -rf --one-file-system "$1"
}

# Make a chroot usable: fresh /proc, /dev (+ /dev/pts, /dev/shm) and /sys from
# the host, and the host's resolver config (pip needs DNS for PyPI).
mount_chroot() {
    local r=$1
    umount_under "$r"                     # left-overs of a killed run
    MOUNTED_ROOT=$r
    # Explicit "|| return 1": callers use "mount_chroot ... || not_run", and
    # errexit is off inside a function called from a "||" list.
    mount -t proc proc "$r/proc" || return 1
    mount --rbind /dev "$r/dev" || return 1
    mount --make-rslave "$r/dev" || return 1  # our unmounts must not propagate to the host
    mount --rbind /sys "$r/sys" || return 1
    mount --make-rslave "$r/sys" || return 1
    rm -f "$r/etc/resolv.conf"                # may be a dangling symlink
    cp -L /etc/resolv.conf "$r/etc/resolv.conf" || return 1
    sync_local_cas "$r" || return 1
}

# CAs the host trusts locally (/usr/local/share/ca-certificates: e.g. an
# HTTPS-intercepting egress proxy) must be trusted in the chroot too, or pip
# fails with CERTIFICATE_VERIFY_FAILED.  Mirror the directory and rebuild the
# chroot's bundle; run_step points pip/requests/openssl at that bundle.
sync_local_cas() {
    local r=$1 d=/usr/local/share/ca-certificates
    rm -rf "${r:?}$d"
    mkdir -p "$r$d"
    if [ -d "$d" ] && [ -n "$(ls -A "$d")" ]; then
        cp -rL "$d/." "$r$d/" || return 1
    fi
    in_chroot "$r" update-ca-certificates --fresh >/dev/null 2>&1 || return 1
}

umount_chroot() {
    [ -n "$MOUNTED_ROOT" ] || return 0
    umount_under "$MOUNTED_ROOT"
    MOUNTED_ROOT=""
}

# Run a command inside chroot $1 with a clean, predictable environment.
in_chroot() {
    local r=$1; shift
    chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
        DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

on_exit() {
    local rc=$?
    trap - EXIT ERR
    umount_chroot
    if [ -n "$BUILD_TMP" ] && [ -e "$BUILD_TMP" ]; then
        log "removing incomplete chroot $BUILD_TMP"
        umount_under "$BUILD_TMP"
        [ -z "$(mounts_under "$BUILD_TMP")" ] && rm -rf --one-file-system "$BUILD_TMP"
    fi
    exit "$rc"
}
on_err() {
    # Unexpected failure.  Before the matrix starts this means the environment
    # is unusable: report NOT RUN (3), never something that could pass for a result.
    local rc=$? line=$1
    if [ "$PHASE" = setup ]; then
        not_run "unexpected error (exit $rc) at ci/sid-matrix.sh line $line during setup"
    fi
    log "unexpected error (exit $rc) at line $line"
    exit 1
}
trap on_exit EXIT
trap 'on_err $LINENO' ERR
trap 'exit 130' INT TERM

# ------------------------------------------------------------- preflight --
for v in $VERSIONS; do
    [[ $v =~ ^3\.[0-9]+$ ]] || { log "bad version '$v' in BTCORE_SID_VERSIONS"; exit 2; }
done
[ -n "${VERSIONS// /}" ] || { log "BTCORE_SID_VERSIONS is empty"; exit 2; }
[ "$(id -u)" = 0 ] || not_run "must run as root (debootstrap, chroot and mount need it)"
[ -f /etc/debian_version ] || not_run "host is not Debian-based (needs apt + debootstrap)"
[ -f "$SRC_DIR/pyproject.toml" ] || [ -f "$SRC_DIR/setup.py" ] ||
    not_run "run this from the btcore checkout ($SRC_DIR has no pyproject.toml/setup.py)"

# The mirror: the Debian archive the host's apt sources already use (deb822
# *.sources files and one-line *.list files), unless BTCORE_SID_MIRROR is set.
find_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break } }' "$f"
    done
}
MIRROR=${BTCORE_SID_MIRROR:-$(find_mirror | grep -E '/debian/?$' | grep -v -- '-security' | head -n1 || true)}
[ -n "$MIRROR" ] || not_run "no Debian mirror found in /etc/apt/sources* (set BTCORE_SID_MIRROR)"
MIRROR=${MIRROR%/}

mkdir -p "$(dirname "$SID_ROOT")" "$LOGDIR"
# One run at a time per chroot (wait up to an hour for another run to finish).
exec 9>"$SID_ROOT.lock"
flock -w 3600 9 || not_run "another sid-matrix run holds $SID_ROOT.lock"

# ------------------------------------------------------------ the chroot --
ensure_debootstrap() {
    command -v debootstrap >/dev/null && return 0
    log "installing debootstrap on the host (apt-get update + install)"
    apt-get update >"$LOGDIR/host-apt.log" 2>&1 ||
        not_run "host apt-get update failed (network?); see $LOGDIR/host-apt.log"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap \
        >>"$LOGDIR/host-apt.log" 2>&1 ||
        not_run "cannot install debootstrap; see $LOGDIR/host-apt.log"
}

# Does the chroot's apt know an installable version of package $2?  (Output is
# captured first: "apt-cache | grep -q" races into SIGPIPE under pipefail.)
has_candidate() {
    local out
    out=$(in_chroot "$1" apt-cache policy "$2" 2>/dev/null) || return 1
    [[ $out =~ Candidate:\ [^\(] ]]
}

# Build a complete chroot in $SID_ROOT.tmp, then rename it into place.
build_chroot() {
    local t0 t1 v pkgs=() shipped=() p
    t0=$(now)
    ensure_debootstrap
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
    if ! in_chroot "$BUILD_TMP" apt-get update >"$LOGDIR/chroot-apt.log" 2>&1; then
        # A mirror that serves a frozen copy of sid (a snapshot/proxy) has a
        # Release file past its Valid-Until date.  debootstrap does not check
        # that date; apt does.  Accept it (the packages are still verified
        # against the signed Release file), but say so.
        if grep -q 'is expired' "$LOGDIR/chroot-apt.log"; then
            log "warning: $MIRROR serves an expired sid Release file (frozen snapshot?);" \
                "setting Acquire::Check-Valid-Until=false in the chroot"
            echo 'Acquire::Check-Valid-Until "false";' \
                >"$BUILD_TMP/etc/apt/apt.conf.d/99btcore-no-valid-until"
            in_chroot "$BUILD_TMP" apt-get update >>"$LOGDIR/chroot-apt.log" 2>&1 ||
                not_run "apt-get update inside the chroot failed; see $LOGDIR/chroot-apt.log"
        else
            not_run "apt-get update inside the chroot failed; see $LOGDIR/chroot-apt.log"
        fi
    fi
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

    {   echo "built=$(date -u +%FT%TZ)"
        echo "mirror=$MIRROR"
        echo "shipped=${shipped[*]}"
        echo "packages=${pkgs[*]}"
    } >"$BUILD_TMP/$MARKER"
    # Swap into place: the old chroot (if any) is moved aside first.
    if [ -e "$SID_ROOT" ]; then
        safe_rm "$SID_ROOT.old"
        umount_under "$SID_ROOT"
        mv "$SID_ROOT" "$SID_ROOT.old"
    fi
    mv "$BUILD_TMP" "$SID_ROOT"
    BUILD_TMP=""
    safe_rm "$SID_ROOT.old"
    log "chroot ready in $(( $(now) - t0 )) s total: $SID_ROOT"
}

T_CHROOT0=$(now)
if [ "${BTCORE_SID_REBUILD:-0}" = 1 ] || [ ! -f "$SID_ROOT/$MARKER" ]; then
    if [ -e "$SID_ROOT" ] && [ ! -f "$SID_ROOT/$MARKER" ]; then
        log "$SID_ROOT is incomplete (no $MARKER): rebuilding"
    fi
    build_chroot
    CHROOT_NOTE="built in $(( $(now) - T_CHROOT0 )) s"
else
    CHROOT_NOTE="reused ($(grep '^built=' "$SID_ROOT/$MARKER" | cut -d= -f2))"
    log "reusing $SID_ROOT, $CHROOT_NOTE; BTCORE_SID_REBUILD=1 to refresh"
fi
SHIPPED=" $(grep '^shipped=' "$SID_ROOT/$MARKER" | cut -d= -f2-) "

mount_chroot "$SID_ROOT" ||
    not_run "cannot mount /proc,/dev,/sys into $SID_ROOT (missing CAP_SYS_ADMIN?)"
in_chroot "$SID_ROOT" true || not_run "cannot chroot into $SID_ROOT"

install_into_chroot() {   # $1: what for; $2...: packages (missing ones only)
    local why=$1 p; shift
    for p in "$@"; do
        in_chroot "$SID_ROOT" dpkg -s "$p" >/dev/null 2>&1 && continue
        log "installing $p into the chroot ($why)"
        { in_chroot "$SID_ROOT" apt-get install -y --no-install-recommends "$p" ||
          { in_chroot "$SID_ROOT" apt-get update && in_chroot "$SID_ROOT" apt-get install -y --no-install-recommends "$p"; }
        } >>"$LOGDIR/chroot-apt.log" 2>&1 || log "warning: cannot install $p ($why)"
        in_chroot "$SID_ROOT" apt-get clean || true
    done
}
# shellcheck disable=SC2086
install_into_chroot "test oracles" $TEST_PKGS

if [ "$BENCH" = 1 ]; then
    # shellcheck disable=SC2086
    install_into_chroot "benchmark peer; the benchmark runs without it if it cannot" $BENCH_PKGS
fi

# Files to copy: tracked + untracked-but-not-ignored files of the checkout
# (falls back to everything except .git/build outputs outside a git checkout).
list_sources() {
    if git -C "$SRC_DIR" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$SRC_DIR" ls-files -z --cached --others --exclude-standard |
            while IFS= read -r -d '' f; do [ -f "$SRC_DIR/$f" ] && printf '%s\0' "$f"; done
    else
        (cd "$SRC_DIR" && find . -path ./.git -prune -o -path ./build -prune -o \
            -type f ! -name '*.so' ! -name '*.o' ! -path '*/__pycache__/*' -print0)
    fi
}

# Pass the host's proxy settings (if any) through to pip.
PROXY_ENV=()
for n in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    if [ -n "${!n:-}" ]; then PROXY_ENV+=("$n=${!n}"); fi
done

# ------------------------------------------------------------- the matrix --
PHASE=matrix
declare -A RESULT=() BENCH_OUT=()
ANY_FAIL=0
ANY_RUN=0
T_MATRIX0=$(now)

# Run one step for version $1 (name $2, command string $3) in the copied
# checkout, with the venv first on PATH; output goes to the version's log.
run_step() {
    local v=$1 name=$2 cmd=$3 venv=/opt/btcore-venv-$1
    log "python$v: $name: $cmd"
    timeout --kill-after=30 "$STEP_TIMEOUT" \
        chroot "$SID_ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
            PIP_DISABLE_PIP_VERSION_CHECK=1 VIRTUAL_ENV="$venv" \
            PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
            SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
            REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
            "${PROXY_ENV[@]}" \
            PATH="$venv/bin:/usr/local/bin:/usr/bin:/bin" \
            /bin/bash -c 'cd /opt/btcore-src && eval "$1"' bash "$cmd" \
        >>"$LOGDIR/python$v.log" 2>&1
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
    # 1. fresh venv
    if ! in_chroot "$SID_ROOT" sh -c "rm -rf /opt/btcore-venv-$v && python$v -m venv /opt/btcore-venv-$v" \
            >>"$LOGDIR/python$v.log" 2>&1; then
        RESULT[$v]="FAIL ($exact) at venv creation; log: $LOGDIR/python$v.log"; ANY_FAIL=1; continue
    fi
    # 2. fresh copy of the checkout
    rm -rf --one-file-system "$SID_ROOT/opt/btcore-src"
    mkdir -p "$SID_ROOT/opt/btcore-src"
    list_sources | tar -C "$SRC_DIR" --null -T - -cf - | tar -C "$SID_ROOT/opt/btcore-src" -xf -
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
    done
    counts=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)' "$LOGDIR/python$v.log" | tail -n1 |
             sed -e 's/^=* *//' -e 's/ *=*$//' || true)
    [ -n "$counts" ] && timings+="; $counts"
    if [ -z "$failed" ] && [ "$BENCH" = 1 ]; then
        # A report, not a gate: a benchmark failure is shown, never fatal.
        t=$(now)
        run_step "$v" bench "$BENCH_CMD" || true
        timings+=", bench $(( $(now) - t ))s"
        RATIOS=$(awk '/^ratio \(/{on=1} on&&/^$/{exit} on' "$LOGDIR/python$v.log" | tail -n +3)
        BENCH_OUT[$v]="$RATIOS"
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
