"""btcore's own exception, in a module of its own: the capture (backtrace.py)
raises it, and so do the modules it imports (greenlets.py, spawn.py)."""


class BacktraceError(RuntimeError):
    """A capture that btcore refused (unsupported interpreter or greenlet build,
    or one it cannot make now, as during interpreter shutdown)."""
