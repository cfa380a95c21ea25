"""Files named in tokens (codec.py, native/symbols/elf.c btc_open_regular):
a token is untrusted input, and so is the file system under the paths it
names.  A FIFO or a device is never opened (opening has side effects: a
FIFO's blocked writer wakes up, a device's driver runs, a blocking open of a
FIFO never returns), and a path swapped between a check and a use is never
read as the file that was checked.

Oracles, strace-free: a writer blocked in open(O_WRONLY) on the FIFO must
stay blocked (it would return as soon as anything opened the FIFO for
reading); every decode runs in a child under a timeout (a hang fails, it
never stalls the suite); the wrong file is a build of the same library with
other functions where the right one's are (padding_fn_*), so a name read
from it shows.
"""
import os
import shutil
import subprocess
import sys
import threading

import pytest

import conftest

import btcore
from btcore import codec
from test_codec import PADDING, build_library, symbol_vaddr, token_with_module

TIMEOUT = 60
# openat's number, where /proc/<tid>/wchan is not readable.
OPENAT = {"x86_64": "257", "aarch64": "56"}.get(os.uname().machine)


def decode_in_child(*tokens):
    """`python -m btcore decode` of the tokens (one a line): its output."""
    proc = subprocess.run([sys.executable, "-m", "btcore", "decode"], input="\n".join(tokens) + "\n",
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


class BlockedWriter:
    """A thread blocked in open(fifo, O_WRONLY): it stays blocked until
    something opens the FIFO for reading."""

    def __init__(self, fifo):
        self.fifo = str(fifo)
        self.thread = threading.Thread(target=self._open, daemon=True)
        self.thread.start()
        self._wait_blocked()

    def _open(self):
        os.close(os.open(self.fifo, os.O_WRONLY))

    def _wait_blocked(self):
        """Until the writer is inside open() (a reader that came and went
        before that would go unseen)."""
        task = f"/proc/self/task/{self.thread.native_id}"
        for _ in range(10000):
            with open(f"{task}/wchan") as f, open(f"{task}/syscall") as g:
                if f.read() == "wait_for_partner" or g.read().split(" ")[0] == OPENAT:
                    return
            self.thread.join(0.001)
        pytest.fail("the FIFO writer never blocked")

    def still_blocked(self):
        self.thread.join(0.2)
        blocked = self.thread.is_alive()
        # Release it, which also proves the oracle: a reader's open wakes it.
        os.close(os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK))
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive()
        return blocked


@pytest.fixture
def files(tmp_path):
    """The right library, another build at the same functions' places, a
    FIFO; the build-id prefix of the right one and a pc in codec_leaf."""
    good, wrong, fifo = (str(tmp_path / name) for name in ("libgood.so", "libwrong.so", "fifo"))
    build_library(tmp_path, good, "")
    build_library(tmp_path, wrong, PADDING)
    os.mkfifo(fifo)
    build_id = codec.file_build_id(good)[:codec.BUILD_ID_BYTES]
    assert codec.file_build_id(wrong)[:codec.BUILD_ID_BYTES] != build_id
    return {"good": good, "wrong": wrong, "fifo": fifo, "build_id": build_id,
            "vaddr": symbol_vaddr(good, "codec_leaf") + 4, "dir": str(tmp_path)}


def point(link, target):
    """Make link name target, atomically (rename over it)."""
    fresh = link + ".new"
    os.symlink(target, fresh)
    os.replace(fresh, link)


def test_a_fifo_named_in_a_token_is_never_opened(files):
    """Guards: a FIFO named by a token (directly, through a symlink, found by
    the build-id search) is rejected without being opened: its writer stays
    blocked; the reason names it."""
    link = os.path.join(files["dir"], "link.so")
    os.symlink(files["fifo"], link)
    writer = BlockedWriter(files["fifo"])
    out = decode_in_child(token_with_module(files["fifo"], files["build_id"], files["vaddr"]),
                          token_with_module(link, files["build_id"], files["vaddr"]))
    search = btcore.decode(token_with_module(None, files["build_id"]), search=[files["dir"]])
    assert writer.still_blocked(), "decode opened the FIFO"
    assert out.count("cannot be read here (not a regular file: a FIFO)") == 2, out
    assert [m.path for m in search.modules] == [files["good"]]   # the search passed the FIFO by


def test_a_fifo_as_the_debug_link_target_is_never_opened(files, tmp_path):
    """Guards: the native reader opens the files it finds by itself (a
    .gnu_debuglink target beside the token's file) as regular files only:
    a FIFO there is not opened, the frame is named from the symbol table."""
    stripped, debug = str(tmp_path / "libsplit.so"), str(tmp_path / "libsplit.debug")
    subprocess.run(["objcopy", "--only-keep-debug", files["good"], debug], check=True)
    subprocess.run(["objcopy", "--strip-debug", f"--add-gnu-debuglink={debug}", files["good"], stripped], check=True)
    os.replace(files["fifo"], debug)
    writer = BlockedWriter(debug)
    out = decode_in_child(token_with_module(stripped, files["build_id"], files["vaddr"]))
    assert writer.still_blocked(), "the debug link's FIFO was opened"
    assert "codec_leaf" in out and "codec_lib.c" not in out, out


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/random", "/dev/null", "/dev/tty"])
def test_device_nodes_in_tokens_are_rejected_clearly(device):
    """Guards: a device node in a token is rejected with a clear reason, at
    once (never opened: /dev/tty without a terminal, /dev/zero's endless
    reads, /dev/random's blocking ones)."""
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    out = decode_in_child(token_with_module(device))
    assert f"Module {device} (build-id 01020304): cannot be read here (not a regular file: a character device)" \
        in out, out


@pytest.mark.parametrize("path", ["/proc/self/status", "/proc/kmsg", "empty"])
def test_files_smaller_than_an_elf_header_are_not_read(tmp_path, path):
    """Guards: a regular file smaller than an ELF header is refused before
    it is opened: procfs says size 0 for files whose reads have side effects
    (/proc/kmsg consumes the kernel's messages)."""
    if path == "empty":
        path = str(tmp_path / "empty.so")
        open(path, "w").close()
    elif not os.path.exists(path):
        pytest.skip(f"no {path} here")
    out = decode_in_child(token_with_module(path))
    assert "cannot be read here (not an ELF file: smaller than its header)" in out, out


def test_a_symlink_to_another_build_is_a_mismatch(files):
    """Guards: the build-id is checked on the file the path reaches, not on
    the name: a symlink to another build is reported, its names unused."""
    link = os.path.join(files["dir"], "link.so")
    os.symlink(files["wrong"], link)
    decoded = btcore.decode(token_with_module(link, files["build_id"], files["vaddr"]))
    [module] = decoded.modules
    assert module.status == "mismatch" and "build-id mismatch" in module.detail
    assert "padding_fn_" not in decoded.format()


def test_a_file_swapped_after_decode_is_not_read(files):
    """Guards: the file is checked again on the descriptor its names are
    read through: swapped for another build or a FIFO between decode() and
    the frames' resolution, its frames stay unnamed (not cached so: named
    again once the right file is back)."""
    link = os.path.join(files["dir"], "link.so")
    point(link, files["good"])
    token = token_with_module(link, files["build_id"], files["vaddr"])
    wrong_then_fifo, good = btcore.decode(token), btcore.decode(token)
    assert [m.status for m in wrong_then_fifo.modules] == ["file"]
    point(link, files["wrong"])
    [frame] = wrong_then_fifo.frames()
    assert frame.function is None and frame.file is None
    point(link, files["fifo"])
    writer = BlockedWriter(files["fifo"])
    assert "padding_fn_" not in wrong_then_fifo.format()
    assert writer.still_blocked()
    point(link, files["good"])
    assert [f.function for f in good.frames()] == ["codec_leaf"]


def test_names_are_read_through_the_descriptor_checked(files, monkeypatch):
    """Guards: the frames' names come from the very file whose build-id was
    checked (its descriptor), not from the path opened again: the link is
    swapped to another build right after the check, and the names are still
    the right file's."""
    link = os.path.join(files["dir"], "link.so")
    point(link, files["good"])
    decoded = btcore.decode(token_with_module(link, files["build_id"], files["vaddr"]))
    checked = codec._fd_build_id

    def check_then_swap(fd):
        found = checked(fd)
        point(link, files["wrong"])
        return found

    monkeypatch.setattr(codec, "_fd_build_id", check_then_swap)
    [frame] = decoded.frames()
    assert (frame.function, os.path.basename(frame.file)) == ("codec_leaf", "codec_lib.c")


TARGET = r"""
import ctypes, sys, time
ctypes.CDLL(sys.argv[1])
print("ready", flush=True)
time.sleep(600)
"""


def can_bind_mount():
    """Whether this process may make a mount namespace (root; not in every container)."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


def test_a_dumped_process_whose_library_became_a_fifo(files):
    """Guards the outside dump: a path in the target's maps (a library it
    loaded, which a FIFO now covers, bind-mounted over it in the dumper's
    mount namespace) is not opened: the dump finishes, the FIFO's writer
    stays blocked."""
    if not shutil.which("unshare") or not can_bind_mount():
        pytest.skip("no mount namespace here (unshare -m refused: it needs root, outside a chroot)")
    target = subprocess.Popen([sys.executable, "-c", TARGET, files["good"]], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline() == "ready\n"
        writer = BlockedWriter(files["fifo"])
        dumper = f"mount --bind {files['fifo']} {files['good']} && exec {sys.executable} -c " \
                 f"'import btcore; btcore.dump_process({target.pid})'"
        dump = subprocess.run(["unshare", "-m", "sh", "-c", dumper], capture_output=True, text=True, timeout=TIMEOUT)
        assert writer.still_blocked(), "the dumper opened the FIFO"
        assert dump.returncode == 0 and "sleep" in dump.stdout, dump.stderr[-4000:]
    finally:
        target.kill()
        target.wait()


@pytest.mark.skipif(conftest.UNDER_ASAN, reason="LeakSanitizer needs /proc")
def test_without_proc_regular_files_are_still_read_and_fifos_refused(files):
    """Guards the fallback where /proc is not mounted (no /proc/self/fd to
    reopen through): the library is still named, opened by its path again
    and kept because it is the object checked; a FIFO is still refused
    before any open (its writer stays blocked)."""
    if not shutil.which("unshare") or not can_bind_mount():
        pytest.skip("no mount namespace here (unshare -m refused: it needs root, outside a chroot)")
    writer = BlockedWriter(files["fifo"])
    tokens = [token_with_module(path, files["build_id"], files["vaddr"]) for path in (files["good"], files["fifo"])]
    decoder = f"mount -t tmpfs none /proc && exec {sys.executable} -m btcore decode"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", decoder], input="\n".join(tokens) + "\n",
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert writer.still_blocked(), "the FIFO was opened"
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "codec_leaf" in proc.stdout and "not a regular file: a FIFO" in proc.stdout, proc.stdout


RACE = r"""
import sys
import btcore
from btcore import codec
from btcore.symbols import resolve
from btcore._native import lib
names = set()
for _ in range(int(sys.argv[2])):
    codec._file_ids.clear(); resolve.cache.clear(); lib.btc_symbolize_reset()
    names.update(f.function for f in btcore.decode(sys.argv[1]).frames())
print(sorted(map(str, names)))
"""


def test_a_symlink_flipped_between_the_library_and_a_fifo_never_hangs_decode(files):
    """Guards the time-of-check/time-of-use race: a symlink flipped in a loop
    between the right library, a FIFO and another build, while decode runs
    (caches emptied every round, 300 rounds in one child, 10 CLI runs):
    no run hangs (each under a timeout), no name comes from the other
    build, and the right file is named when the link names it."""
    link = os.path.join(files["dir"], "link.so")
    point(link, files["good"])
    token = token_with_module(link, files["build_id"], files["vaddr"])
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            for target in (files["good"], files["fifo"], files["wrong"]):
                point(link, target)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        loop = subprocess.run([sys.executable, "-c", RACE, token, "300"], capture_output=True, text=True,
                              timeout=TIMEOUT)
        runs = [decode_in_child(token) for _ in range(10)]
    finally:
        stop.set()
        flipper.join()
    assert loop.returncode == 0, loop.stderr[-4000:]
    assert "codec_leaf" in loop.stdout and "padding_fn_" not in loop.stdout, loop.stdout
    assert not any("padding_fn_" in out for out in runs)
