"""What a dump from outside calls another process's greenlets: the names
dump_all() gives them in-process (btcore/capture/introspect.py: gevent's
"Greenlet-N (function)", a custom name, "<type at 0xADDR main> (function)"),
and their parent, read from the target's objects after it runs again.

Layouts are learned, never guessed:
- CPython's objects (type dicts, dicts, functions, ints): the table of the
  target's version (native/remote/robjects.c: 3.11, 3.13-3.15), whatever
  version btcore runs on;
- gevent's Greenlet keeps its ident (the N of "Greenlet-N") in a private
  Cython field: its offset is learned in this process from Greenlets given
  an ident, when the target loaded the very build of gevent's module that
  this process can import (same build-id);
- greenlet's parent lies in its C++ object: learned the same way from
  greenlets of this process, when the target runs this process's greenlet
  build.
Anything else, and any value that does not check out (a corrupt pointer,
an object of the wrong type, a string past its bound), leaves that part out:
a label is never an error.  Strings are the target's: bounded (MAX_NAME)
and with every unprintable character escaped before they are shown.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import json
import os
import struct
from typing import NamedTuple

import greenlet

from . import bounds

from . import greenlet_offsets
from .._native import ffi, lib
from ..codec import file_build_id
from ..symbols.elf_files import symbol_value
from ..capture.records import LABEL, PYFRAME

MAX_NAME = 200          # characters of a name as shown (an absurd one is cut, with "...")
MAX_DICT_ENTRIES = 256  # entries of an instance dict looked through
MAX_MODULES = 1 << 14   # entries of sys.modules looked through (for threading)
MAX_INTERPRETERS = 64   # interpreter states followed to the main one
MAX_OBJECT = 1 << 16    # bytes: no instance's dict offset or basic size lies further
_EVENTLET_MAIN = os.path.join("eventlet", "greenthread.py")
_GREENLET_WORDS = greenlet.greenlet.__basicsize__ // 8   # PyGreenlet (its pimpl last)


class RemoteLabel(NamedTuple):
    """name      as dump_all() names the greenlet, escaped and bounded
    function  the function it runs, if known
    parent    the address of its parent greenlet (None: a thread's main
              greenlet, or not known)
    spawned_by  the address of the greenlet that spawned it, while that one
              lives (gevent's spawning_greenlet; None: not known)"""
    name: str
    function: str | None = None
    parent: int | None = None
    spawned_by: int | None = None


def shown(text: str) -> str:
    """text as a dump may print it: unprintable characters escaped (a name
    cannot start a line of its own or move the cursor), at most MAX_NAME
    characters."""
    if len(text) <= MAX_NAME and text.isprintable():   # nearly every name: nothing to do
        return text
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:MAX_NAME + 1])
    return out if len(out) <= MAX_NAME else out[:MAX_NAME - 3] + "..."


class Labels:
    """Labels of one snapshot's greenlets (snap: a remote.Snapshot whose
    memory is still open)."""

    def __init__(self, snap):
        self._m, self._snap = snap.memory, snap
        self._names = bounds.Names(snap.memory, snap.layout, snap.types)
        lay = ffi.new("btc_remote_objlayout *")
        known = lib.btc_remote_pyobjects(snap.layout.version_hex, lay) == 0   # the target's version's table
        self._lay = lay if known else None
        self._types, self._runtime = _types(snap) if known else ({}, None)
        self._spec = self._label_spec(snap) if known and snap.greenlets else None   # (may import gevent)
        self._type_names = {}   # type address -> its name as dump_all() shows it
        self._strings = {}      # str object address -> text (interned keys, shared function names)
        self._c_strings = {}    # C string address -> text (builtins' names)
        self._ints = {}         # int object address -> its value (or None: not an int)
        self._greenlet_types = {}   # type address -> is it greenlet's or a subclass
        self._greenlets = {}        # parent or spawner address -> is it a greenlet object
        self._outermost_names = {}  # (outermost code, the one it called) -> the function a greenlet runs

    def _label_spec(self, snap):
        """What btc_remote_greenlet_labels reads of a greenlet object: the target's types, and the words up to
        the last field a label reads (PyGreenlet's own, gevent's learned ones)."""
        gevent, parent_at = _gevent_offsets(snap), _parent_offset(snap)
        spec = ffi.new("btc_remote_label_spec *")
        for kind in ("str", "dict", "int", "function", "method", "builtin", "weakref"):
            setattr(spec, f"{kind}_type", self._types.get(kind) or 0)
        spec.span = max([8] + ([parent_at[0]] if parent_at else []) + list(gevent.values())) // 8 + 1
        spec.short_span = min(_GREENLET_WORDS, spec.span)
        spec.pimpl_at, spec.parent_at = parent_at if parent_at else (-1, -1)
        spec.ident_at, spec.spawner_at = gevent.get("ident", -1), gevent.get("spawner", -1)
        return spec

    def labels(self, greenlets) -> list:
        """The labels of remote.GreenletCopy objects, in one pass over the target's objects: what can be
        read of each, else the dump's plain label (type and address)."""
        out = ffi.new("btc_remote_label[]", max(1, len(greenlets)))
        if self._spec is None or lib.btc_remote_greenlet_labels(
                self._m.handle, self._snap.layout, self._lay, self._spec,
                ffi.new("uintptr_t[]", [g.address for g in greenlets]), len(greenlets), out) < 0:
            return [RemoteLabel(shown(plain_label(g.address, g.main, g.type_name))) for g in greenlets]
        shared, labels = {}, []   # greenlets parked alike have the same record: they share all but the address
        for g, record in zip(greenlets, LABEL.iter_unpack(ffi.buffer(out, LABEL.size * len(greenlets)))):
            key = (record, g.main, g.type_name, None if g.main or record[_GEVENT] else _outer_codes(g.pyframes))
            part = shared.get(key)
            if part is None:
                part = shared[key] = self._shared_part(g.main, g.type_name, key[3], *record)
            labels.append(part if isinstance(part, RemoteLabel) else part(g.address))
        return labels

    def label(self, g) -> RemoteLabel:
        """The label of one remote.GreenletCopy."""
        return self.labels([g])[0]

    def _shared_part(self, main, type_name, codes, tp, parent, spawner, name, function, ident, read, gevent,
                     function_is_cstring):
        """The label of greenlets with this record: a RemoteLabel when it does not name their address, else
        address -> their RemoteLabel.  codes: a plain greenlet's outermost (code, the code it called)."""
        type_name = self._type_name(tp) or "?" if read else type_name
        if main:
            return _plain(type_name, True, "")
        parent = parent if parent and self._is_greenlet(parent) else None
        if not gevent:
            function = self._outermost(*codes)
            return _plain(type_name, False, f" ({function})" if function else "", function, parent)
        function = self._c_string(function) if function_is_cstring else self._string(function)
        suffix = f" ({function})" if function else ""
        spawner = spawner if spawner and self._is_greenlet(spawner) else None
        named = self._string(name) or (f"Greenlet-{ident}" if ident >= 0 else None)
        if named:
            return RemoteLabel(shown(named + suffix), function, parent, spawner)
        return _plain(type_name, False, suffix, function, parent, spawner)

    # ---- the target's objects, each read checked ----

    def _is(self, obj, kind: str) -> bool:
        wanted = self._types.get(kind)
        return bool(obj) and not obj & 7 and wanted is not None and self._m.word(obj + 8) == wanted

    def _object(self, obj, kind: str, n: int) -> tuple | None:
        """The first n words of obj (n >= 2) if its type is the target's `kind`, in one read."""
        raw = self._m.read(obj, 8 * n) if obj and not obj & 7 else None
        words = struct.unpack(f"<{n}Q", raw) if raw else None
        return words if words and self._types.get(kind) is not None and words[1] == self._types[kind] else None

    def _string(self, obj) -> str | None:
        if not obj:
            return None
        if obj not in self._strings:
            self._strings[obj] = self._names.string(obj) if self._is(obj, "str") else None
        return self._strings[obj]

    def _c_string(self, at: int) -> str | None:
        """A builtin's name (a C string of the target), at most MAX_NAME bytes."""
        if at not in self._c_strings:
            raw = self._m.read(at, MAX_NAME)
            self._c_strings[at] = raw.split(b"\0", 1)[0].decode("utf-8", "replace") if raw else None
        return self._c_strings[at]

    def _tp_name(self, tp: int) -> str | None:
        at = self._m.word(tp + self._snap.layout.type_name) if tp else None
        raw = self._m.read(at, bounds.MAX_TYPE_NAME) if at else None
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace") if raw else None

    def _type_name(self, tp: int) -> str | None:
        """module.qualname: a static type's tp_name says both; a class made in
        Python keeps its qualname in its heap type and __module__ in its dict.
        Remembered per type."""
        if tp not in self._type_names:
            self._type_names[tp] = self._read_type_name(tp)
        return self._type_names[tp]

    def _read_type_name(self, tp: int) -> str | None:
        lay = self._lay
        flags = self._m.word(tp + lay.type_flags)
        if flags is None or not flags & lay.heaptype_flag:
            return self._tp_name(tp)
        qualname = self._string(self._m.word(tp + lay.heaptype_qualname))
        module = self._string(self._lookup(self._m.word(tp + lay.type_dict), "__module__"))
        return f"{module}.{qualname}" if module and qualname else self._tp_name(tp)

    def _inherits(self, tp: int, name: str) -> bool:
        return bool(lib.btc_remote_type_inherits(self._m.handle, self._snap.layout, self._lay, tp, name.encode()))

    def _lookup(self, d, key: str):
        return self._entries(d).get(key)

    def _entries(self, d, key_of=None, most: int = MAX_DICT_ENTRIES) -> dict:
        """{key: value address} of a dict object (str keys, or those key_of
        reads; a split dict's values from its values array); {} when it is
        not one, is unreadable or has more than `most` entries."""
        lay = self._lay
        words = self._object(d, "dict", max(lay.dict_keys, lay.dict_values) // 8 + 1)
        if words is None:
            return {}
        return self._keys_entries(words[lay.dict_keys // 8], words[lay.dict_values // 8], key_of or self._string,
                                  most)

    def _keys_entries(self, keys: int, values: int, key_of, most: int) -> dict:
        """The entries of a dict's keys object (values: its values array, 0: in the entries)."""
        got_keys, got_values = ffi.new("uintptr_t[]", most), ffi.new("uintptr_t[]", most)
        n = lib.btc_remote_dict_entries(self._m.handle, self._lay, keys or 0, values or 0, most, got_keys, got_values)
        out = {}
        for key, value in zip(got_keys[0:max(n, 0)], got_values[0:max(n, 0)]):
            key = key_of(key)
            if key is not None and value:
                out[key] = value
        return out

    def _attributes(self, obj) -> dict:
        """{name: value address} of an instance's attributes: its instance
        dict (tp_dictoffset), or what CPython keeps for a class made in
        Python (its managed dict, else its values, keyed by the class's
        shared keys)."""
        lay, m = self._lay, self._m
        tp = m.word(obj + 8) if obj and not obj & 7 else None
        flags = m.word(tp + lay.type_flags) if tp else None
        if flags is None:
            return {}
        if not flags & lay.managed_dict_flag or not flags & lay.heaptype_flag:
            offset = m.word(tp + lay.type_dictoffset)
            return self._entries(m.word(obj + offset)) if offset and 0 < offset < MAX_OBJECT and not offset & 7 \
                else {}
        managed = m.word(obj - lay.managed_dict_before)
        if managed:
            return self._entries(managed)
        values = self._values(obj, tp, flags)
        keys = m.word(tp + lay.heaptype_cached_keys) if values else None
        return self._keys_entries(keys, values, self._string, MAX_DICT_ENTRIES) if keys else {}

    def _values(self, obj: int, tp: int, flags: int) -> int | None:
        """The values array of an instance with no dict: before it (3.11), or inline past its type's
        tp_basicsize while they are valid (3.13+)."""
        lay, m = self._lay, self._m
        if lay.values_pointer_before:
            return m.word(obj - lay.values_pointer_before)
        size = m.word(tp + lay.type_basicsize) if flags & lay.inline_values_flag else None
        valid = m.read(obj + size + lay.values_valid, 1) if size and 0 < size < MAX_OBJECT and not size & 7 else None
        return obj + size if valid and valid[0] else None

    def thread_names(self) -> dict:
        """{native thread id: its name} of the target's threads that
        `threading` named, as btcore/capture/threads.py names them in-process: the
        main thread (the pid's) by threading's _main_thread, the others by
        their ident in `_active` (eventlet's saved original module first);
        a thread whose Thread does not carry its own ident is left out."""
        if self._lay is None:   # a version with no column in the table
            return {}
        try:
            modules = self._entries(self._m.word(self._interpreter() + self._lay.interp_modules), most=MAX_MODULES)
            named = {}
            for name in ("__original_module_threading", "threading"):
                self._named_threads(modules.get(name), named)
        except (struct.error, ValueError, OverflowError):   # a read cut short, a value no field holds
            return {}
        by_ident = {t.thread_id: t.tid for t in self._snap.threads if t.thread_id}
        out = {by_ident[ident]: name for ident, name in named.items() if ident in by_ident}
        out.update({t.tid: named["main"] for t in self._snap.threads if t.tid == self._snap.pid and "main" in named})
        return out

    def _named_threads(self, module, named: dict) -> None:
        """Add {ident: name} of threading module's `_active` to named (those not named yet), and "main":
        the name of its _main_thread."""
        globals_ = self._entries(self._m.word(module + self._lay.module_dict)) if self._is(module, "module") else {}
        main, _ = self._thread(globals_.get("_main_thread"))
        if main is not None:
            named.setdefault("main", main)
        for ident, thread in self._entries(globals_.get("_active"), self._int).items():
            name, carried = self._thread(thread)
            if name is not None and carried == ident:
                named.setdefault(ident, name)

    def _thread(self, thread) -> tuple:
        """(Its name as shown, its ident) of a threading.Thread (None: unreadable, or not there)."""
        attributes = self._attributes(thread) if thread else {}
        name = self._string(attributes.get("_name"))
        return (shown(name) if name is not None else None), self._int(attributes.get("_ident"))

    def _interpreter(self) -> int:
        """The main interpreter's state: the last of the runtime's list (a new one goes first)."""
        lay, m = self._snap.layout, self._m
        interp = m.word(self._runtime + lay.runtime_interp_head) if self._runtime else None
        for _ in range(MAX_INTERPRETERS):
            after = m.word(interp + lay.interp_next) if interp else None
            if not after:
                break
            interp = after
        if not interp:
            raise ValueError("no interpreter state")
        return interp

    def _is_greenlet(self, obj: int) -> bool:
        """Is obj of greenlet's type or a subclass? (Remembered: a few parents and spawners have many greenlets.)"""
        if obj not in self._greenlets:
            tp = self._m.word(obj + 8) if not obj & 7 else None
            if tp not in self._greenlet_types:
                self._greenlet_types[tp] = bool(tp) and self._inherits(tp, "greenlet.greenlet")
            self._greenlets[obj] = self._greenlet_types[tp]
        return self._greenlets[obj]

    def _int(self, obj) -> int | None:
        """A small non-negative int object's value; remembered: a Greenlet nobody named
        holds None there, the same object in every one of them."""
        if obj not in self._ints:
            self._ints[obj] = self._read_int(obj)
        return self._ints[obj]

    def _read_int(self, obj) -> int | None:
        value = lib.btc_remote_small_int(self._m.handle, self._lay, self._types.get("int") or 0, obj or 0)
        return value if value >= 0 else None

    def _outermost(self, outer: int, inner: int) -> str | None:
        """The function a plain greenlet runs: its outermost Python frame's
        (in-process: f_code.co_name of the last f_back); for an eventlet
        GreenThread, the function its main runs (in-process: main's local
        `function`; frames' locals are not read here: the function of the
        frame main called, the same for a Python function or method; for a
        partial or a builtin, the first Python function it called).  outer,
        inner: its outermost frame's code and the one that frame called
        (_outer_codes(); 0: none)."""
        if not outer:   # none, or cut short: its outermost frame is not known
            return None
        if (outer, inner) not in self._outermost_names:
            self._outermost_names[outer, inner] = self._runs(outer, inner)
        return self._outermost_names[outer, inner]

    def _runs(self, outer: int, inner: int) -> str | None:
        """What _outermost() says of a greenlet whose outermost frames run codes outer and inner (0: none)."""
        if self._is_eventlet_main(outer):
            return self._code_name(inner) if inner else None
        return self._code_name(outer)

    def _is_eventlet_main(self, code: int) -> bool:
        read = self._names.code(code)
        return read.qualname == "GreenThread.main" and (read.filename or "").endswith(_EVENTLET_MAIN)

    def _code_name(self, code: int) -> str | None:
        """co_name of a code object (None: not one, or unreadable)."""
        return self._string(self._m.word(code + self._lay.code_name)) if not self._names.code(code).error else None


def plain_label(address: int, main: bool, type_name: str) -> str:
    head, tail = _around_address(main, type_name)
    return f"{head}{address:x}{tail}"


def _around_address(main: bool, type_name: str) -> tuple:
    """The text of plain_label() before the address (in hex) and after it."""
    return f"<{type_name} at 0x", f"{' main' if main else ''}>"


def _plain(type_name: str, main: bool, suffix: str, *rest):
    """address -> the RemoteLabel of the greenlet there, named by plain_label() + suffix, with rest (function,
    parent, spawner): the text around the address is escaped once, not per greenlet, when it needs no cut."""
    head, tail = _around_address(main, type_name)
    head, tail = shown(head), shown(tail + suffix)
    if len(head) + len(tail) + 16 > MAX_NAME:   # (an absurd type name: cut as a whole; escaping is per character)
        return lambda address: RemoteLabel(shown(plain_label(address, main, type_name) + suffix), *rest)
    return lambda address: RemoteLabel(f"{head}{address:x}{tail}", *rest)


def _outer_codes(pyframes) -> tuple:
    """(The outermost frame's code, the code of the frame it called) of btc_remote_pyframe records,
    innermost first; 0: none (a cut chain ends in a record of code 0)."""
    size, end = PYFRAME.size, len(pyframes)
    outer = PYFRAME.unpack_from(pyframes, end - size)[0] if end >= size else 0
    return outer, PYFRAME.unpack_from(pyframes, end - 2 * size)[0] if end >= 2 * size else 0


_GEVENT = 7                          # its field `gevent`


def _types(snap) -> tuple:
    """(The target's type objects a label checks objects against, its _PyRuntime's address or None):
    libpython's symbols."""
    interpreter = snap.modules.at(snap.types.str) if snap.types.str else None   # the module defining str
    if interpreter is None:
        return {}, None
    found = {"str": snap.types.str}
    for kind, symbol in (("dict", "PyDict_Type"), ("int", "PyLong_Type"), ("function", "PyFunction_Type"),
                         ("method", "PyMethod_Type"), ("builtin", "PyCFunction_Type"),
                         ("weakref", "_PyWeakref_RefType"), ("module", "PyModule_Type")):
        value = symbol_value(interpreter.path, symbol)
        found[kind] = interpreter.bias + value if value else None
    runtime = symbol_value(interpreter.path, "_PyRuntime")
    return found, interpreter.bias + runtime if runtime else None


def _same_build(snap, prefix: str, ours: str) -> bool:
    """Does the target run the very file (build-id) this process loaded as ours?"""
    build = _target_build(snap, prefix)
    return build is not None and build == _build_id(ours)


_learned = {}


def _once(key, learn):
    """learn(), once per process (None: not learnable here)."""
    if key not in _learned:
        try:
            _learned[key] = learn()
        except Exception:   # a gevent or greenlet this process cannot drive as expected: no such label part
            _learned[key] = None
    return _learned[key]


def _gevent_offsets(snap) -> dict:
    """{"ident": offset, "spawner": offset} of gevent's Greenlet fields, if
    the target runs the gevent build this process can import: learned in
    this process (importing gevent: ~0.1 s of a cold dump), or remembered
    from an earlier dump of the same build (learned_offsets_file())."""
    ours = _importable_file("gevent", "_gevent_cgreenlet")
    if ours is None or not _same_build(snap, "_gevent_cgreenlet", ours):
        return {}
    build = _build_id(ours)
    remembered = _remembered(build)
    if remembered is not None:
        return remembered
    try:
        from gevent import _gevent_cgreenlet
    except ImportError:
        return {}
    kind = _gevent_cgreenlet.Greenlet
    found = {"ident": _once("gevent ident", lambda: _field_behind(kind, "minimal_ident", 10 ** 30)),
             "spawner": _once("gevent spawner", lambda: _field_behind(kind, "spawning_greenlet", object()))}
    learned = {field: at for field, at in found.items() if at is not None}
    _remember(build, learned)
    return learned


def _target_build(snap, prefix: str) -> str | None:
    """The build-id (hex) of the target's module whose file name starts with prefix, None if none."""
    mod = snap.modules.named(lambda name: name.startswith(prefix))
    return _build_id(mod.path) if mod is not None else None


def _build_id(path: str) -> str | None:
    try:
        found = file_build_id(path)
    except OSError:
        return None
    return found.hex() if found else None


def _importable_file(package: str, module: str) -> str | None:
    """The extension file `import package.module` would load, found without importing package (gevent's
    import alone takes ~0.1 s)."""
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, module + suffix)
            if os.path.exists(path):
                return path
    return None


MAX_REMEMBERED = 64   # builds whose learned offsets the file keeps
_MAX_FIELD = 1 << 12  # bytes: an offset read back from the file past this is not gevent's


def learned_offsets_file() -> str:
    """Where the offsets of gevent's fields learned for a build (its build-id) are kept across dumps:
    $XDG_CACHE_HOME/btcore/, else ~/.cache/btcore/."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "btcore", "gevent-fields.json")


def _read_remembered() -> dict:
    try:
        with open(learned_offsets_file()) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _remembered(build: str) -> dict | None:
    """The offsets learned for build by an earlier dump, if the file holds plausible ones."""
    fields = _read_remembered().get(build)
    if not isinstance(fields, dict) or not set(fields) <= {"ident", "spawner"}:
        return None
    plausible = all(isinstance(at, int) and 0 < at < _MAX_FIELD and not at & 7 for at in fields.values())
    return dict(fields) if plausible else None


def _remember(build: str, fields: dict) -> None:
    """Keep what was learned for build (best effort: a read-only home keeps nothing)."""
    path = learned_offsets_file()
    kept = _read_remembered()
    if len(kept) >= MAX_REMEMBERED:
        kept = {}
    kept[build] = fields
    import tempfile   # here: a dump that learns nothing does without its import (and shutil's, random's)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, written = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".gevent-fields-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(kept, f)
            os.replace(written, path)   # whole or not at all, whoever reads it meanwhile
        finally:
            if os.path.exists(written):
                os.unlink(written)
    except OSError:
        pass


def _field_behind(kind, attribute: str, sentinel) -> int | None:
    """The offset of the object field whose value the getter of `attribute`
    returns (Cython keeps gevent's fields in its own struct, behind getters
    and no descriptor with an offset): in a never-started instance of kind,
    each word holding None in turn is pointed at sentinel and the getter
    asked; exactly one word must give it back.  (minimal_ident returns its
    field when set, else asks the greenlet's parent for a hub: a TypeError.)"""
    g = kind.__new__(kind)   # never started: no hub, no loop
    words = (ctypes.c_uint64 * (kind.__basicsize__ // 8)).from_address(id(g))
    found = []
    for i in range(greenlet.greenlet.__basicsize__ // 8, len(words)):
        if words[i] != id(None):
            continue
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(sentinel))   # the field's reference while it is planted
        words[i] = id(sentinel)
        try:
            got = getattr(g, attribute)
        except Exception:
            got = None
        finally:
            words[i] = id(None)   # the reference to None it held, given back
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(sentinel))
        if got is sentinel:
            found.append(i * 8)
    return found[0] if len(found) == 1 else None


def _parent_offset(snap) -> tuple | None:
    """(PyGreenlet's pimpl, the parent's place in greenlet's C++ object),
    if the target runs this process's greenlet build."""
    if not _same_build(snap, "_greenlet", greenlet._greenlet.__file__):
        return None
    return _once("greenlet parent", _learn_parent)


def _learn_parent() -> tuple | None:
    """The one word of greenlet's C++ object equal to the parent, in greenlets
    of this process under two different parents."""
    pimpl_at = greenlet_offsets.local()[0]
    size = ffi.new("size_t[3]")
    lib.btc_greenlet_layout(size + 0, size + 1, size + 2)   # size[1]: the C++ object's bytes btcore may read
    found = None
    for parent in (greenlet.getcurrent(), greenlet.greenlet()):
        g = greenlet.greenlet(parent=parent)
        pimpl = ctypes.c_void_p.from_address(id(g) + pimpl_at).value
        hits = _words_equal(pimpl, size[1], id(parent))
        found = hits if found is None else found & hits
    return (pimpl_at, found.pop()) if found and len(found) == 1 else None


def _words_equal(address: int, size: int, value: int) -> set:
    """Offsets of the words equal to value in this process's [address, address + size)."""
    words = struct.unpack(f"<{size // 8}Q", ctypes.string_at(address, size // 8 * 8))
    return {i * 8 for i, w in enumerate(words) if w == value}
