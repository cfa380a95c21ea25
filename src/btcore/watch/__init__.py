"""Backtraces unasked: the watchdog of stuck loops and the crash report (native/watch/)."""
