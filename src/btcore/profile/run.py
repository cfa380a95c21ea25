"""python -m btcore profile -- COMMAND: run a Python program with the profiler started inside it.

The command runs as a child process with a bootstrap directory first on
PYTHONPATH: its sitecustomize.py (which then imports the program's own
sitecustomize, if there is one) calls boot() with the settings passed in
the BTCORE_PROFILE environment variable.  boot() starts the profiler
before the program's first line and writes the profile when the duration
ends, or at exit (Ctrl-C included) if it ends first.  A process forked by
the program (a gunicorn worker) profiles itself into FILE with its pid
added before the extension.  Each written profile adds a line to a status
file, which the parent prints: a program that exits without writing one
(killed, os._exit(), python -S or -I) gets a clear message instead.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile

from .formats import write_somewhere

ENV = "BTCORE_PROFILE"
UNWRITTEN = "no profile written"   # in a status line: the command exits non-zero
_SITECUSTOMIZE = '''\
# btcore profile's bootstrap (btcore/profile/run.py); then the program's own sitecustomize.
import os as _os, sys as _sys
_here = _os.path.dirname(_os.path.abspath(__file__))
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_ours = _sys.modules.pop("sitecustomize")
try:
    import sitecustomize
except ImportError:
    pass
_sys.modules.setdefault("sitecustomize", _ours)   # the import machinery reads it back when this file ends
try:
    from btcore.profile.run import boot
except ImportError as e:
    _sys.stderr.write(f"btcore profile: btcore cannot be imported by {_sys.executable}: {e}\\n")
else:
    boot()
'''


def with_pid(path: str, pid: int) -> str:
    """path with the pid before its format's extension: out.pb.gz -> out.1234.pb.gz."""
    base = os.path.basename(path)
    for suffix in (".pb.gz", ".collapsed", ".folded", ".pprof", ".html", ".txt", ".pb", ".htm"):
        if base.lower().endswith(suffix):
            return f"{path[:-len(suffix)]}.{pid}{path[-len(suffix):]}"
    return f"{path}.{pid}"


class _Run:
    """The profiler of this process, per the settings: started, and written once."""

    def __init__(self, settings: dict, output: str):
        from .sampler import start_profiler
        self.settings, self.output, self.written = settings, output, False
        self.profiler = start_profiler(settings["rate"], duration=settings["duration"])
        self.profiler.on_duration_end = self.write
        self.profiler.on_progress = self.progress

    def write(self, profile) -> None:
        if self.written:
            return
        self.written = True
        s = self.settings
        try:
            fmt, output, unwritten = write_somewhere(profile, self.output, s["format"], s["mode"], s["group_by"])
        except OSError as e:
            self.status(f"{UNWRITTEN}: {e}")
            raise
        line = (f"wrote {output} ({fmt}): {profile.ticks} samples over {profile.duration:.1f} s, "
                f"{len(profile)} stacks" + (f", {profile.other / 1e6:.3f} s past max_stacks in (other)"
                                             if profile.other else ""))
        self.status(f"{unwritten}; {UNWRITTEN} there, {line}" if unwritten else line)

    def status(self, line: str) -> None:
        """A line for the command to print (run() reads them once the program has ended)."""
        with open(self.settings["status"], "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def progress(self, profile) -> None:
        sys.stderr.write(f"btcore profile: recording, {profile.ticks} samples, {len(profile)} stacks "
                         f"(Ctrl-C writes {self.output})\n")

    def at_exit(self) -> None:
        from .sampler import running_profiler, stop_profiler
        if running_profiler() is not self.profiler:
            return
        try:
            self.write(stop_profiler())   # stop_profiler() waits for a write the duration's end began
        except Exception as e:
            sys.stderr.write(f"btcore profile: {UNWRITTEN}: {e}\n")


_run = None


def boot() -> None:
    """Start the profiler as BTCORE_PROFILE says (called by the bootstrap's sitecustomize);
    grouping by spawn site turns spawn tracking on first."""
    settings = json.loads(os.environ[ENV])
    if settings["group_by"] == "spawn":
        from ..capture.spawn import enable_spawn_tracking
        enable_spawn_tracking()
    _start(settings, settings["output"])
    os.register_at_fork(after_in_child=lambda: _start(settings, with_pid(settings["output"], os.getpid())))


def _start(settings: dict, output: str) -> None:
    global _run
    try:
        _run = _Run(settings, output)
    except Exception as e:   # the program runs anyway
        sys.stderr.write(f"btcore profile: the profiler did not start: {e}\n")
        return
    atexit.register(_run.at_exit)


def run(command: list, settings: dict) -> int:
    """Run command under the profiler; print the status lines; return its exit status."""
    with tempfile.TemporaryDirectory(prefix="btcore-profile-") as boot_dir:
        with open(os.path.join(boot_dir, "sitecustomize.py"), "w", encoding="utf-8") as f:
            f.write(_SITECUSTOMIZE)
        status = os.path.join(boot_dir, "status")
        env = dict(os.environ)
        env[ENV] = json.dumps({**settings, "status": status})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (boot_dir, env.get("PYTHONPATH")) if p)
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as e:
            print(f"btcore profile: cannot run {command[0]!r}: {e.strerror or e}", file=sys.stderr)
            return 127
        # Ctrl-C reaches the program (same process group): it writes what was recorded and exits.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            code = child.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
        lines = _read(status)
    for line in lines:
        print(f"btcore profile: {line}", file=sys.stderr)
    if any(UNWRITTEN in line for line in lines):
        return code if code > 0 else 128 - code if code < 0 else 1
    if not lines:
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        print(f"btcore profile: the program ended ({how}) without writing a profile: was it a Python program, "
              f"started without -S or -I, and did it end through a normal exit?", file=sys.stderr)
    return code if code >= 0 else 128 - code


def _read(path: str) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []
