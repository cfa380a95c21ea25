"""The real-suites lane's hook (ci/real_suites.py): on every greenlet switch,
capture the origin, the target and the current stack with btcore and
resolve every frame.

Active only when BTCORE_SWITCH_HOOK_STATS names a directory; put this
directory on PYTHONPATH so that every Python process a suite starts (gevent's
runner starts one per test module) loads it.  The tracer is installed when
greenlet is first imported, and btcore imported at the first switch, so that
a process that never uses greenlet is left as it was (gevent's tests check
what is imported before monkey-patching).

greenlet.settrace is per thread: switches in threads that did not import
greenlet first are not traced.

Per process, at exit: <dir>/counts-<pid> = "switches captures frames
documented_errors".  An exception btcore does not document is written at
once to <dir>/error-<pid>-<n> (the lane fails on any) and never raised into
the test, also while the interpreter finalizes (collect() then raises
BacktraceError at worst: docs/safety.md).
"""
import os
import sys

STATS = os.environ.get("BTCORE_SWITCH_HOOK_STATS")


class _Hook:
    def __init__(self, stats_dir):
        import _thread
        self.stats_dir = stats_dir
        # held here: report() may run at interpreter shutdown, when builtins
        # and module globals are gone
        self.open, self.getpid, self.argv = open, os.getpid, sys.argv
        self.busy = _thread._local()   # not threading: gevent's tests check its import order
        self.previous = None
        self.collect = None
        self.switches = self.captures = self.frames = self.documented = self.errors = 0

    def install(self, greenlet_module):
        import atexit
        import traceback   # now: report() may run at interpreter shutdown, when imports fail
        self.format_exception = traceback.format_exception
        self.previous = greenlet_module.settrace(self.trace)
        atexit.register(self.write_counts)

    def trace(self, event, args):
        # A switch made by btcore itself (its one-time greenlet layout check)
        # re-enters on the same thread: not captured.
        if not getattr(self.busy, "on", False):
            self.busy.on = True
            try:
                self.capture_switch(args)
            finally:
                self.busy.on = False
        if self.previous is not None:
            self.previous(event, args)

    def capture_switch(self, args):
        if self.collect is None:
            import btcore
            import greenlet
            # held here: at interpreter shutdown module globals become None
            self.collect, self.documented_error = btcore.collect, btcore.BacktraceError
            self.greenlet_type = greenlet.greenlet
        self.switches += 1
        self.capture(None)   # the current stack: the target's, during the switch
        # gevent's tests also call tracers directly with objects of their own
        for g in args:
            if isinstance(g, self.greenlet_type):
                self.capture(g)

    def capture(self, target):
        try:
            self.frames += len(self.collect(target).frames())
            self.captures += 1
        except self.documented_error:
            self.documented += 1
        except RuntimeError as e:   # documented: a greenlet running in another thread
            if "another thread" in str(e):
                self.documented += 1
            else:
                self.report(e, "error")
        except Exception as e:   # noqa: BLE001 - anything else is a finding, reported, never raised into the test
            self.report(e, "error")

    def report(self, error, kind):
        self.errors += 1
        if self.errors > 5:
            return
        try:
            text = "".join(self.format_exception(error))
        except BaseException:   # the traceback module torn down at interpreter shutdown
            text = repr(error)
        with self.open("%s/%s-%d-%d" % (self.stats_dir, kind, self.getpid(), self.errors), "w") as f:
            f.write("%s\n%s" % (" ".join(self.argv), text))

    def write_counts(self):
        with open(os.path.join(self.stats_dir, "counts-%d" % os.getpid()), "w") as f:
            f.write("%d %d %d %d\n" % (self.switches, self.captures, self.frames, self.documented))


class _InstallOnImport:
    """A meta path finder that installs the tracer right after greenlet's
    package has executed."""

    def __init__(self, hook):
        self.hook = hook

    def find_spec(self, name, path=None, target=None):
        if name != "greenlet":
            return None
        sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_then_install(module):
            run_module(module)
            self.hook.install(module)
        spec.loader.exec_module = exec_then_install
        return spec


if STATS:
    sys.meta_path.insert(0, _InstallOnImport(_Hook(STATS)))
