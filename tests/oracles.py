"""Independent views of a stack that tests compare btcore's output with."""

BIG = 4096   # a capacity large enough for any stack in these tests


def interp_chain(frame):
    """The interpreter's view: [(qualname, filename, f_lineno)] from frame outward."""
    out = []
    while frame is not None:
        out.append((frame.f_code.co_qualname, frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return out


def py_view(frames):
    """btcore's Python frames in the same shape as interp_chain()."""
    return [(f.function, f.file, f.line) for f in frames if f.kind == "python"]


def short(name):
    """The last part of a qualified name."""
    return (name or "").rsplit(".", 1)[-1]
