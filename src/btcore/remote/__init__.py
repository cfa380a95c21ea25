"""Another process, live or a core: the stop, its memory, layouts and names read from it, and
dump_process() (native/remote/)."""
