"""btcore's own exception, in a module of its own: the capture (capture/backtrace.py)
raises it, and so do the modules it imports (capture/greenlets.py, capture/spawn.py)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM to one of btcore's commands that read another process (python
    -m btcore dump, profile PID), raised as Ctrl-C's KeyboardInterrupt is and
    handled as it is: the target runs again first, the dump's temporary files
    are removed, a profile writes what it recorded."""


class BacktraceError(RuntimeError):
    """A capture that btcore refused (unsupported interpreter or greenlet build,
    or one it cannot make now, as during interpreter shutdown)."""
