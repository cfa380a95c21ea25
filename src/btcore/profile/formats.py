"""A Profile's files: pprof (profile.proto, gzipped), collapsed stacks, an HTML flame view.

pprof: the protobuf message of github.com/google/pprof/proto/profile.proto,
encoded here (varints and length-delimited fields: no protobuf dependency).
Two sample types per sample, "cpu" and "wall" (nanoseconds: the time the
samples stand for, see btcore/profile/sampler.py); labels "greenlet" (the group) and "state" (running, parked).
One Location per distinct frame name (Python frames are named with their
line, so a line is a location), one Function per distinct function.

collapsed: one line per stack, "frame;frame;...;frame count", outermost
first, as flamegraph.pl and speedscope read it; the count is microseconds.  The format has no
escapes, so a name's ";", "%", CR and LF are written %3B, %25, %0D, %0A
(read_collapsed() turns them back).
"""
from __future__ import annotations

import gzip
import os
import tempfile
import time

from ..output import open_output

FORMATS = ("pprof", "collapsed", "html")
_BY_SUFFIX = ((".pb.gz", "pprof"), (".pprof", "pprof"), (".pb", "pprof"), (".txt", "collapsed"),
              (".collapsed", "collapsed"), (".folded", "collapsed"), (".html", "html"), (".htm", "html"))
_ESCAPES = (("%", "%25"), (";", "%3B"), ("\n", "%0A"), ("\r", "%0D"))


def format_for(path, format: str | None = None) -> str:
    """The format to write path in: `format` if given, else from the file
    name's ending (.pb.gz/.pprof: pprof; .txt/.collapsed: collapsed; .html)."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        return format
    name = os.fspath(path).lower()
    for suffix, found in _BY_SUFFIX:
        if name.endswith(suffix):
            return found
    raise ValueError(f"cannot tell the format from the name {os.fspath(path)!r}: end it with .pb.gz, .pprof, "
                     f".txt, .collapsed or .html, or give format=")


def write(profile, path, format: str | None = None, mode: str = "wall", group_by: str | None = "name",
          verbose: bool = False) -> str:
    """Profile.write(): mode picks the collapsed view (pprof and HTML hold both)."""
    format = format_for(path, format)
    if format == "pprof":
        data = pprof(profile, group_by, verbose)
    elif format == "collapsed":
        data = collapsed(profile, mode, group_by, verbose).encode("utf-8")
    else:
        data = html(profile, group_by, verbose).encode("utf-8")
    with os.fdopen(open_output(path), "wb") as f:
        f.truncate()
        f.write(data)
    return format


def write_somewhere(profile, path, format: str | None = None, mode: str = "wall", group_by: str | None = "name",
                    verbose: bool = False) -> tuple:
    """(format, the file written, why path was not or None): write() to path,
    else to a new file in the temporary directory, so that a recording is not
    lost to a full disk or a file made unwritable meanwhile; OSError if
    neither could be written."""
    try:
        return write(profile, path, format, mode, group_by, verbose), os.fspath(path), None
    except OSError as e:
        why = f"cannot write {os.fspath(path)}: {e.strerror or e}"
    name = os.path.basename(os.fspath(path)) or "profile"
    fd, other = tempfile.mkstemp(prefix="btcore-profile-", suffix="-" + name)
    os.close(fd)
    return write(profile, other, format_for(path, format), mode, group_by, verbose), other, why


# ---- collapsed ----

def escape(name: str) -> str:
    for char, code in _ESCAPES:
        name = name.replace(char, code)
    return name


def unescape(name: str) -> str:
    for char, code in reversed(_ESCAPES):
        name = name.replace(code, char)
    return name


def collapsed(profile, mode: str = "wall", group_by: str | None = "name", verbose: bool = False) -> str:
    """The profile's stacks as collapsed-stack text (see the module's doc)."""
    stacks = profile.stacks(mode, group_by, verbose)
    return "".join(f"{';'.join(escape(name) for name in stack)} {count}\n"
                   for stack, count in sorted(stacks.items(), key=lambda item: -item[1]))


def read_collapsed(text: str) -> dict:
    """{(name, ...): count} from collapsed-stack text; ValueError on a line
    that is not "stack count"."""
    stacks = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            raise ValueError(f"line {number} is not 'frame;...;frame count': {line[:80]!r}")
        key = tuple(unescape(name) for name in stack.split(";"))
        stacks[key] = stacks.get(key, 0) + int(count)
    return stacks


# ---- pprof ----

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1   # int64 fields: two's complement, as protobuf encodes negatives
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    """A varint field (wire type 0); zero is the default and is left out."""
    return _varint(number << 3) + _varint(value) if value else b""


def _packed(number: int, values) -> bytes:
    return _field(number, b"".join(_varint(v) for v in values)) if values else b""


class _Strings:
    def __init__(self):
        self.table, self.index = [""], {"": 0}

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.table)
            self.table.append(text)
        return found


def pprof(profile, group_by: str | None = "name", verbose: bool = False) -> bytes:
    """The profile as a gzipped pprof profile.proto.  Every sample has the
    values (cpu ns, wall ns); the group and state are labels, not frames."""
    period = 1_000_000_000 // profile.rate   # a nominal tick: the values are the measured times
    strings = _Strings()
    wall = profile.stacks("wall", group_by, verbose)
    locations, functions, body = {}, {}, []
    for stack, count in wall.items():
        group, state, frames = _split(stack, group_by)
        ids = [_location(name, locations, functions, strings) for name in reversed(frames)]
        cpu = count * 1000 if state == "running" else 0
        labels = b"".join(_field(3, _int(1, strings(key)) + _int(2, strings(value)))
                          for key, value in (("greenlet", group), ("state", state)) if value is not None)
        body.append(_field(2, _packed(1, ids) + _packed(2, [cpu, count * 1000]) + labels))
    return gzip.compress(_profile_message(profile, period, strings, locations, functions, body), mtime=0)


def _split(stack: tuple, group_by) -> tuple:
    """(group or None, state or None, frames) of a wall-mode stack."""
    if stack == ("(other)",):
        return None, None, stack
    if group_by is None:
        return None, stack[0], stack[1:]
    return stack[0], stack[1], stack[2:]


def _location(name: str, locations: dict, functions: dict, strings) -> int:
    """The Location id of a frame name (made on first use, with its Function)."""
    found = locations.get(name)
    if found is None:
        function, file, line = _parts_of(name)
        fid = functions.get((function, file))
        if fid is None:
            fid = functions[(function, file)] = len(functions) + 1
        found = locations[name] = (len(locations) + 1, fid, line)
    return found[0]


def _parts_of(name: str) -> tuple:
    """(function, file, line) of a frame name made by profile.frame_name()."""
    if name.endswith(")") and " (" in name:
        function, _, where = name[:-1].rpartition(" (")
        file, _, line = where.rpartition(":")
        if line.isdigit():
            return function, file, int(line)
    if name.endswith("]") and " [" in name:
        function, _, module = name[:-1].rpartition(" [")
        return function, module, 0
    return name, "", 0


def _profile_message(profile, period, strings, locations, functions, body) -> bytes:
    sample_types = b"".join(_field(1, _int(1, strings(kind)) + _int(2, strings("nanoseconds")))
                            for kind in ("cpu", "wall"))
    locs = b"".join(_field(4, _int(1, lid) + _field(4, _int(1, fid) + _int(2, line)))
                    for lid, fid, line in locations.values())
    funcs = b"".join(_field(5, _int(1, fid) + _int(2, strings(function)) + _int(3, strings(function))
                            + _int(4, strings(file)))
                     for (function, file), fid in functions.items())
    notes = [f"btcore: {profile.ticks} ticks at {profile.rate} Hz, {profile.missed} missed, "
             f"{profile.other} us in (other) past max_stacks={profile.max_stacks}"]
    comments = b"".join(_int(13, strings(note)) for note in notes)
    period_type = _field(11, _int(1, strings("wall")) + _int(2, strings("nanoseconds")))
    tail = (_int(9, int(profile.start_time * 1e9)) + _int(10, int(profile.duration * 1e9)) + period_type
            + _int(12, period) + comments + _int(14, strings("wall")))
    table = b"".join(_field(6, text.encode("utf-8")) for text in strings.table)
    return sample_types + b"".join(body) + locs + funcs + table + tail


# ---- HTML flame view ----

def flame_tree(stacks: dict) -> dict:
    """{"n": name, "v": microseconds, "c": [children]} of stacks (outermost first)."""
    root = {"n": "all", "v": 0, "c": {}}
    for stack, count in stacks.items():
        node = root
        node["v"] += count
        for name in stack:
            node = node["c"].setdefault(name, {"n": name, "v": 0, "c": {}})
            node["v"] += count
    return _listed(root)


def _listed(node: dict) -> dict:
    children = sorted(node["c"].values(), key=lambda child: -child["v"])
    return {"n": node["n"], "v": node["v"], "c": [_listed(child) for child in children]}


def html(profile, group_by: str | None = "name", verbose: bool = False) -> str:
    """A self-contained page with two flame graphs (wall, cpu): profile.html,
    with the trees embedded as JSON the way the dump page embeds its data."""
    from ..views.html import embed
    doc = {"title": f"btcore profile: {profile.ticks} samples at {profile.rate} Hz, "
                    f"{profile.duration:.1f} s, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(profile.start_time))}",
           "other": profile.other,
           "views": {m: flame_tree(profile.stacks(m, group_by, verbose)) for m in ("wall", "cpu")}}
    return embed("profile.html", doc)

