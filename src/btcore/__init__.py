"""btcore: native C/C++ and Python frames merged in true call order, for the
running stack and for suspended greenlets.

    bt = btcore.collect()          # raw capture: cheap, no strings
    print(bt)                      # resolved lazily, through a shared cache

Each part is imported on the first use of one of its names (PEP 562): a
tool that only resolves addresses, or only dumps another process, does not
pay for the capture side, the profiler or the web page.
"""
import importlib as _importlib
import os as _os

# Each public name, by the module that defines it: the one table behind
# __all__, dir() and the imports on first use.
_EXPORTS = {
    "capture.backtrace": ("Backtrace", "append", "collect", "foreach"),
    "codec": ("decode",),
    "errors": ("BacktraceError",),
    "capture.frame": ("Frame",),
    "symbols.resolve": ("cache",),
    "capture.introspect": ("GreenletInfo", "snapshot"),
    "views.dump": ("DEFAULT_DUMP_SIGNAL", "dump_all", "register_dump_signal", "unregister_dump_signal"),
    "views.html": ("write_html",),
    "watch.watchdog": ("Watchdog", "gevent_blocking_reports", "start_watchdog"),
    "capture.switchclock": ("disable_switch_timing", "enable_switch_timing"),
    "profile.sampler": ("Profile", "profiling", "start_profiler", "stop_profiler"),
    "capture.spawn": ("SpawnChain", "chain_backtrace", "disable_spawn_tracking", "enable_spawn_tracking",
                      "spawn_backtrace", "spawn_chain", "spawn_tracking_enabled"),
    "capture.spawn_notes": ("spawn_exception_notes_enabled",),
    "watch.crash": ("crash_report_enabled", "disable_crash_report", "enable_crash_report"),
    "remote.process": ("DumpError", "DumpPermissionError", "dump_process"),
    "profile.remote": ("profile_process",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)
__version__ = "0.1.0"


def __getattr__(name):
    module = _MODULE_OF.get(name)
    if module is None:
        if name.startswith("__"):
            raise AttributeError(f"module 'btcore' has no attribute {name!r}")
        # a part as an attribute (btcore.web after `import btcore`), as when every part was imported with btcore
        try:
            return _importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'btcore' has no attribute {name!r}") from None
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value   # found directly from now on
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _load_all() -> None:
    """Import every part now: before a fork, so that the child holds no
    import half done by another thread (whose lock it would wait on for ever)."""
    for name in __all__:
        if name not in globals():
            __getattr__(name)


_os.register_at_fork(before=_load_all)

# BTCORE_CRASH_REPORT=1: crash reports from start-up, as PYTHONFAULTHANDLER
# does for faulthandler (the thread importing btcore is registered).
if _os.environ.get("BTCORE_CRASH_REPORT") == "1":
    __getattr__("enable_crash_report")()
