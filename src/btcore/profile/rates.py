"""The profilers' sample rates, apart from the profilers: the command line
states them in its help without importing either profiler."""
DEFAULT_RATE = 100
OUTSIDE_RATE = 20            # the outside profiler's default (btcore/profile/remote.py): each sample stops the target
MAX_RATE = 1000
