"""What a dump from outside calls another process's greenlets: the names
dump_all() gives them in-process (btcore/introspect.py: gevent's
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
import os
import struct
from dataclasses import dataclass

import greenlet

from . import bounds, greenlet_offsets
from ._native import ffi, lib
from .codec import file_build_id
from .remote import PYFRAME, symbol_value

MAX_NAME = 200          # characters of a name as shown (an absurd one is cut, with "...")
MAX_DICT_ENTRIES = 256  # entries of an instance dict looked through
MAX_TYPE_DEPTH = 32     # tp_base links followed
MAX_MODULES = 1 << 14   # entries of sys.modules looked through (for threading)
MAX_INTERPRETERS = 64   # interpreter states followed to the main one
MAX_OBJECT = 1 << 16    # bytes: no instance's dict offset or basic size lies further
_GEVENT_GREENLET = "gevent._gevent_cgreenlet.Greenlet"
_EVENTLET_MAIN = os.path.join("eventlet", "greenthread.py")
_GREENLET_WORDS = greenlet.greenlet.__basicsize__ // 8   # PyGreenlet (its pimpl last)
_LONG_DIGITS = 2        # an ident fits in 2 digits of 30 bits


@dataclass(frozen=True)
class RemoteLabel:
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
        self._gevent = _gevent_offsets(snap) if known and snap.greenlets else {}   # (imports gevent)
        self._parent_at = _parent_offset(snap) if snap.greenlets else None
        self._type_info = {}    # type address -> (shown name, is gevent's Greenlet, its dict's offset)
        self._strings = {}      # str object address -> text (interned keys, shared function names)
        self._functions = {}    # callable address -> its name
        self._ints = {}         # int object address -> its value (or None: not an int)
        self._greenlet_types = {}   # type address -> is it greenlet's or a subclass
        self._greenlets = {}        # parent or spawner address -> is it a greenlet object
        lay = self._lay
        # the words of a greenlet object read: up to its last field a label reads (PyGreenlet's own, gevent's)
        fields = [8] + ([self._parent_at[0]] if self._parent_at else []) + list(self._gevent.values())
        self._span = max(fields) // 8 + 1
        self._dict_words = max(lay.dict_keys, lay.dict_values) // 8 + 1 if lay else 0

    def label(self, g) -> RemoteLabel:
        """The label of a remote.GreenletCopy: what can be read of it, else
        the dump's plain label (type and address)."""
        try:
            return self._label(g)
        except (struct.error, ValueError, OverflowError):   # a read cut short, a value no field holds
            return RemoteLabel(shown(f"<{g.type_name} at 0x{g.address:x}{' main' if g.main else ''}>"))

    def _label(self, g) -> RemoteLabel:
        # the object's words up to the last field read, in one read (ob_type first: the type gc listed it by);
        # a plain greenlet is smaller: if its object ends where memory does, its own words
        words = self._words(g.address, self._span) or self._words(g.address, _GREENLET_WORDS)
        type_name, gevent, dictoffset = self._type(words[1]) if words and self._lay else (g.type_name, False, 0)
        gevent = gevent and len(words) == self._span
        parent = self._parent(words)
        plain = f"<{type_name} at 0x{g.address:x}{' main' if g.main else ''}>"
        if g.main:
            return RemoteLabel(shown(plain), None, None)
        if not gevent:
            function = self._outermost(g.pyframes) if self._lay else None
            return RemoteLabel(shown(f"{plain} ({function})" if function else plain), function, parent)
        fields = self._entries(words[dictoffset // 8]) if dictoffset < 8 * self._span else {}
        function = self._function(fields.get("_run"))
        name = self._string(fields.get("name")) or self._ident_name(words)
        spawner = self._spawner(words)
        shown_as = name or plain
        return RemoteLabel(shown(f"{shown_as} ({function})" if function else shown_as), function, parent, spawner)

    def _words(self, address: int, n: int) -> tuple | None:
        """n words of the target at address (None: unreadable or misaligned)."""
        raw = self._m.read(address, 8 * n) if address and not address & 7 else None
        return struct.unpack(f"<{n}Q", raw) if raw else None

    # ---- the target's objects, each read checked ----

    def _is(self, obj, kind: str) -> bool:
        wanted = self._types.get(kind)
        return bool(obj) and not obj & 7 and wanted is not None and self._m.word(obj + 8) == wanted

    def _object(self, obj, kind: str, n: int) -> tuple | None:
        """The first n words of obj (n >= 2) if its type is the target's `kind`, in one read."""
        words = self._words(obj, n)
        return words if words and self._types.get(kind) is not None and words[1] == self._types[kind] else None

    def _string(self, obj) -> str | None:
        if not obj:
            return None
        if obj not in self._strings:
            self._strings[obj] = self._names.string(obj) if self._is(obj, "str") else None
        return self._strings[obj]

    def _type(self, tp: int) -> tuple:
        """(type's name as dump_all() shows it, is it gevent's Greenlet or a subclass, the place of its
        instances' dict: past the words read when none)."""
        found = self._type_info.get(tp)
        if found is None:
            offset = self._m.word(tp + self._lay.type_dictoffset)
            aligned = offset if offset is not None and 0 < offset < self._span * 8 and not offset & 7 else 8 * self._span
            found = self._type_info[tp] = (self._type_name(tp) or "?", self._inherits(tp, _GEVENT_GREENLET), aligned)
        return found

    def _tp_name(self, tp: int) -> str | None:
        at = self._m.word(tp + self._snap.layout.type_name) if tp else None
        raw = self._m.read(at, bounds.MAX_TYPE_NAME) if at else None
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace") if raw else None

    def _type_name(self, tp: int) -> str | None:
        """module.qualname: a static type's tp_name says both; a class made in
        Python keeps its qualname in its heap type and __module__ in its dict."""
        lay = self._lay
        flags = self._m.word(tp + lay.type_flags)
        if flags is None or not flags & lay.heaptype_flag:
            return self._tp_name(tp)
        qualname = self._string(self._m.word(tp + lay.heaptype_qualname))
        module = self._string(self._lookup(self._m.word(tp + lay.type_dict), "__module__"))
        return f"{module}.{qualname}" if module and qualname else self._tp_name(tp)

    def _inherits(self, tp: int, name: str) -> bool:
        for _ in range(MAX_TYPE_DEPTH):
            if not tp:
                return False
            if self._tp_name(tp) == name:
                return True
            tp = self._m.word(tp + self._lay.type_base)
        return False

    def _lookup(self, d, key: str):
        return self._entries(d).get(key)

    def _entries(self, d, key_of=None, most: int = MAX_DICT_ENTRIES) -> dict:
        """{key: value address} of a dict object (str keys, or those key_of
        reads; a split dict's values from its values array); {} when it is
        not one, is unreadable or has more than `most` entries."""
        lay = self._lay
        words = self._object(d, "dict", self._dict_words)
        if words is None:
            return {}
        return self._keys_entries(words[lay.dict_keys // 8], words[lay.dict_values // 8], key_of or self._string,
                                  most)

    def _keys_entries(self, keys: int, values: int, key_of, most: int) -> dict:
        """The entries of a dict's keys object (values: its values array, 0: in the entries)."""
        lay, m = self._lay, self._m
        head = m.read(keys, lay.keys_indices) if keys else None
        if head is None:
            return {}
        log2_index_bytes, kind = head[lay.keys_log2_index_bytes], head[lay.keys_kind]
        n = struct.unpack_from("<q", head, lay.keys_nentries)[0]
        if not 0 <= n <= most or log2_index_bytes > 20:
            return {}
        general = kind == lay.kind_general
        size, key_at, value_at = (lay.entry_size, lay.entry_key, lay.entry_value) if general else \
            (lay.unicode_entry_size, lay.unicode_entry_key, lay.unicode_entry_value)
        raw = m.read(keys + lay.keys_indices + (1 << log2_index_bytes), n * size)
        slots = m.read(values + lay.values_values, n * 8) if values else None
        if raw is None or (values and slots is None):
            return {}
        out = {}
        for i in range(n):
            key = key_of(struct.unpack_from("<Q", raw, i * size + key_at)[0])
            value = struct.unpack_from("<Q", slots, i * 8)[0] if values else \
                struct.unpack_from("<Q", raw, i * size + value_at)[0]
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
        `threading` named, as btcore/threads.py names them in-process: the
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

    def _function(self, obj) -> str | None:
        """__name__ of a function, bound method or builtin (others: None)."""
        if not obj:
            return None
        if obj not in self._functions:
            self._functions[obj] = self._function_name(obj)
        return self._functions[obj]

    def _function_name(self, obj: int) -> str | None:
        lay, m = self._lay, self._m
        if self._is(obj, "method"):
            obj = m.word(obj + lay.method_func)
        if self._is(obj, "function"):
            return self._string(m.word(obj + lay.func_name))
        if self._is(obj, "builtin"):
            ml = m.word(obj + lay.cfunc_def)
            at = m.word(ml + lay.methoddef_name) if ml else None
            raw = m.read(at, MAX_NAME) if at else None
            return raw.split(b"\0", 1)[0].decode("utf-8", "replace") if raw else None
        return None

    def _ident_name(self, g: tuple) -> str | None:
        """"Greenlet-N" once gevent gave g its ident (in-process: the first
        time anything asked for its name; the target's own dump_all() does)."""
        if "ident" not in self._gevent:
            return None
        value = self._int(g[self._gevent["ident"] // 8])
        return f"Greenlet-{value}" if value is not None else None

    def _spawner(self, g: tuple) -> int | None:
        """What gevent's weak reference to g's spawner points at, if it is a
        greenlet object (a dead spawner's reference points at None)."""
        ref = g[self._gevent["spawner"] // 8] if "spawner" in self._gevent else None
        words = self._object(ref, "weakref", self._lay.weakref_object // 8 + 1)
        spawner = words[-1] if words else None
        return spawner if spawner and self._is_greenlet(spawner) else None

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
        lay = self._lay
        words = self._object(obj, "int", (lay.long_digits + 4 * _LONG_DIGITS + 7) // 8)
        size = _digit_count(words[lay.long_size // 8], lay.long_tag_bits) if words else None
        if size is None or not 0 <= size <= _LONG_DIGITS:
            return None
        raw = struct.pack(f"<{len(words)}Q", *words)
        digits = struct.unpack_from(f"<{size}I", raw, lay.long_digits)
        return sum(d << (lay.long_shift * i) for i, d in enumerate(digits))

    def _outermost(self, pyframes) -> str | None:
        """The function a plain greenlet runs: its outermost Python frame's
        (in-process: f_code.co_name of the last f_back); for an eventlet
        GreenThread, the function its main runs (in-process: main's local
        `function`; frames' locals are not read here: the function of the
        frame main called, the same for a Python function or method; for a
        partial or a builtin, the first Python function it called).  pyframes: its
        btc_remote_pyframe records, innermost first (a cut chain ends in a
        record of code 0)."""
        records = list(PYFRAME.iter_unpack(pyframes)) if self._lay else []
        if not records or not records[-1][0]:   # none, or cut short: its outermost frame is not known
            return None
        if self._is_eventlet_main(records[-1][0]):
            return self._code_name(records[-2][0]) if len(records) > 1 and records[-2][0] else None
        return self._code_name(records[-1][0])

    def _is_eventlet_main(self, code: int) -> bool:
        read = self._names.code(code)
        return read.qualname == "GreenThread.main" and (read.filename or "").endswith(_EVENTLET_MAIN)

    def _code_name(self, code: int) -> str | None:
        """co_name of a code object (None: not one, or unreadable)."""
        return self._string(self._m.word(code + self._lay.code_name)) if not self._names.code(code).error else None

    def _parent(self, g: tuple | None) -> int | None:
        if self._parent_at is None or g is None or self._lay is None:   # greenlet types are told by their tp_base
            return None
        pimpl = g[self._parent_at[0] // 8]
        parent = self._m.word(pimpl + self._parent_at[1]) if pimpl and not pimpl & 7 else None
        return parent if parent and self._is_greenlet(parent) else None


def _digit_count(size: int, tag_bits: int) -> int | None:
    """The digits of a non-negative int from its size word (None: negative):
    3.11's ob_size counts them, signed; 3.12+'s lv_tag holds the count above
    tag_bits, the sign below (0 positive, 1 zero, 2 negative)."""
    if not tag_bits:
        return size if size < 1 << 63 else None
    sign = size & 3
    return None if sign == 2 else 0 if sign == 1 else size >> tag_bits


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
    mod = snap.modules.named(lambda name: name.startswith(prefix))
    try:
        mine = file_build_id(ours)
        return mod is not None and mine is not None and file_build_id(mod.path) == mine
    except OSError:
        return False


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
    the target runs the gevent build this process can import."""
    try:
        from gevent import _gevent_cgreenlet
    except ImportError:
        return {}
    if not _same_build(snap, "_gevent_cgreenlet", _gevent_cgreenlet.__file__):
        return {}
    kind = _gevent_cgreenlet.Greenlet
    found = {"ident": _once("gevent ident", lambda: _field_behind(kind, "minimal_ident", 10 ** 30)),
             "spawner": _once("gevent spawner", lambda: _field_behind(kind, "spawning_greenlet", object()))}
    return {field: at for field, at in found.items() if at is not None}


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
