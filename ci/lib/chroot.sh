# ci/lib/chroot.sh — shell helpers shared by the cached-chroot lanes
# (ci/sid-matrix.sh, ci/arm64.sh).  Sourced, never run.
#
# The sourcing script sets, before calling anything here:
#   LOG_TAG        prefix of log lines ("sid-matrix")
#   NOT_RUN_TAG    prefix of the NOT RUN line (".ci/run" greps for it)
#   LOGDIR         where logs go
#   SRC_DIR        the checkout under test
#   CHROOT_ENV     (array, optional) extra VAR=value for every chroot command
#                  (ci/arm64.sh: QEMU_CPU, read by each emulated program)
# and may read/set PHASE (setup: errors mean NOT RUN), MOUNTED_ROOT and
# BUILD_TMP (cleaned up by on_exit).

PHASE=setup                 # setup errors => NOT RUN (3); later errors => FAIL
MOUNTED_ROOT=""             # chroot whose /proc,/dev,... we mounted (for the trap)
BUILD_TMP=""                # temp chroot being built (removed on failure)
CHROOT_MARKER=.btcore-sid-complete
[ -n "${CHROOT_ENV+x}" ] || CHROOT_ENV=()

log()  { printf '%s: %s\n' "$LOG_TAG" "$*" >&2; }
not_run() { printf '%s NOT RUN: %s\n' "$NOT_RUN_TAG" "$*" >&2; exit 3; }
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
# chroot's bundle; run steps point pip/requests/openssl at that bundle.
# The bundle is rebuilt only when the directory changed: under qemu-user
# update-ca-certificates --fresh takes minutes (a program per certificate).
sync_local_cas() {
    local r=$1 d=/usr/local/share/ca-certificates
    if [ -s "$r/etc/ssl/certs/ca-certificates.crt" ] && [ -d "$r$d" ] &&
        diff -r "$d" "$r$d" >/dev/null 2>&1; then
        return 0
    fi
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
        DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 "${CHROOT_ENV[@]}" \
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
    # Unexpected failure.  Before the lane's real work starts this means the
    # environment is unusable: report NOT RUN (3), never something that could
    # pass for a result.
    local rc=$? line=$1
    if [ "$PHASE" = setup ]; then
        not_run "unexpected error (exit $rc) at $0 line $line during setup"
    fi
    log "unexpected error (exit $rc) at line $line"
    exit 1
}
install_traps() {
    trap on_exit EXIT
    trap 'on_err $LINENO' ERR
    trap 'exit 130' INT TERM
}

# ------------------------------------------------------------- preflight --
# The mirror: the Debian archive the host's apt sources already use (deb822
# *.sources files and one-line *.list files).
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
default_mirror() {
    find_mirror | grep -E '/debian/?$' | grep -v -- '-security' | head -n1 || true
}

# Install host packages ($@) that are missing, through apt; NOT RUN if it cannot.
ensure_host_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    log "installing ${missing[*]} on the host (apt-get update + install)"
    apt-get update >"$LOGDIR/host-apt.log" 2>&1 ||
        not_run "host apt-get update failed (network?); see $LOGDIR/host-apt.log"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" \
        >>"$LOGDIR/host-apt.log" 2>&1 ||
        not_run "cannot install ${missing[*]}; see $LOGDIR/host-apt.log"
}

# ------------------------------------------------------------ the chroot --
# Does the chroot's apt know an installable version of package $2?  (Output is
# captured first: "apt-cache | grep -q" races into SIGPIPE under pipefail.)
has_candidate() {
    local out
    out=$(in_chroot "$1" apt-cache policy "$2" 2>/dev/null) || return 1
    [[ $out =~ Candidate:\ [^\(] ]]
}

# apt-get update inside chroot $1 (log: $2).  A mirror that serves a frozen
# copy of sid (a snapshot/proxy) has a Release file past its Valid-Until
# date.  debootstrap does not check that date; apt does.  Accept it (the
# packages are still verified against the signed Release file), but say so.
chroot_apt_update() {
    local r=$1 logf=$2
    in_chroot "$r" apt-get update >"$logf" 2>&1 && return 0
    grep -q 'is expired' "$logf" ||
        not_run "apt-get update inside the chroot failed; see $logf"
    log "warning: the mirror serves an expired sid Release file (frozen snapshot?);" \
        "setting Acquire::Check-Valid-Until=false in the chroot"
    echo 'Acquire::Check-Valid-Until "false";' >"$r/etc/apt/apt.conf.d/99btcore-no-valid-until"
    in_chroot "$r" apt-get update >>"$logf" 2>&1 ||
        not_run "apt-get update inside the chroot failed; see $logf"
}

# Write the completion marker (lines "key=value" from $2...) into the
# finished temporary chroot $BUILD_TMP and swap it into place as $1; the old
# chroot (if any) is moved aside first, so a half-built one is never used.
swap_into_place() {
    local root=$1; shift
    printf '%s\n' "built=$(date -u +%FT%TZ)" "$@" >"$BUILD_TMP/$CHROOT_MARKER"
    if [ -e "$root" ]; then
        safe_rm "$root.old"
        umount_under "$root"
        mv "$root" "$root.old"
    fi
    mv "$BUILD_TMP" "$root"
    BUILD_TMP=""
    safe_rm "$root.old"
}

# Install packages $3... into the mounted chroot $1 (only the missing ones),
# best effort: a warning naming $2 (what for) if one cannot be installed.
install_into_chroot() {
    local root=$1 why=$2 p; shift 2
    for p in "$@"; do
        in_chroot "$root" dpkg -s "$p" >/dev/null 2>&1 && continue
        log "installing $p into the chroot ($why)"
        { in_chroot "$root" apt-get install -y --no-install-recommends "$p" ||
          { in_chroot "$root" apt-get update && in_chroot "$root" apt-get install -y --no-install-recommends "$p"; }
        } >>"$LOGDIR/chroot-apt.log" 2>&1 || log "warning: cannot install $p ($why)"
        in_chroot "$root" apt-get clean || true
    done
}

# ------------------------------------------------------ copying the checkout --
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

# A fresh copy of the checkout at $1 (a directory inside a chroot).
copy_checkout() {
    rm -rf --one-file-system "$1"
    mkdir -p "$1"
    list_sources | tar -C "$SRC_DIR" --null -T - -cf - | tar -C "$1" -xf -
}

# The host's proxy settings (if any), passed through to pip.
proxy_env() {
    local n
    PROXY_ENV=()
    for n in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
        if [ -n "${!n:-}" ]; then PROXY_ENV+=("$n=${!n}"); fi
    done
}

# Run command string $4 in the checkout copy /opt/btcore-src of chroot $1,
# venv $2 first on PATH, within $STEP_TIMEOUT seconds; output appended to
# log $3.  Returns the command's status (124: timed out).
run_in_venv() {
    local root=$1 venv=$2 logf=$3 cmd=$4
    timeout --kill-after=30 "$STEP_TIMEOUT" \
        chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
            PIP_DISABLE_PIP_VERSION_CHECK=1 VIRTUAL_ENV="$venv" \
            PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
            SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
            REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
            "${PROXY_ENV[@]}" "${CHROOT_ENV[@]}" \
            PATH="$venv/bin:/usr/local/bin:/usr/bin:/bin" \
            /bin/bash -c 'cd /opt/btcore-src && eval "$1"' bash "$cmd" \
        >>"$logf" 2>&1
}

# The pytest summary line ("N passed, M skipped in ...") of log $1, if any.
pytest_counts() {
    grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)' "$1" | tail -n1 |
        sed -e 's/^=* *//' -e 's/ *=*$//' || true
}

# The ratio table benchmarks/bench_capture.py printed into log $1.
bench_ratios() {
    awk '/^ratio \(/{on=1} on&&/^$/{exit} on' "$1" | tail -n +3
}
