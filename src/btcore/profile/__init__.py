"""The greenlet-aware sampling profiler, inside and outside, and its file formats."""
