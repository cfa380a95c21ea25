"""Exception notes (issue 27): an exception escaping a tracked greenlet
carries its spawn chain as a PEP 678 note.

Oracles: the interpreter's own line numbers of the creating calls
(sys._getframe at each spawn), the standard library's own renderings
(traceback.format_exception, logging.exception), greenlet's method
descriptors read before and after (restored exactly), and gevent's and
eventlet's own error printing in subprocesses (the runtimes print the note).
"""
import io
import logging
import os
import subprocess
import sys
import textwrap
import traceback

import gevent
import gevent.pool
import greenlet
import pytest

import btcore
from btcore.capture import spawn_notes
from btcore.capture.spawn_notes import NOTE_HEADER, NOTE_LINE_CHARS, NOTE_LINES

ORIGINAL_SWITCH = greenlet.greenlet.__dict__["switch"]
ORIGINAL_THROW = greenlet.greenlet.__dict__["throw"]


@pytest.fixture
def tracking():
    btcore.enable_spawn_tracking(capacity=256)
    try:
        yield
    finally:
        btcore.disable_spawn_tracking()


def here():
    """The caller's line: where its next greenlet is created (the oracle)."""
    return sys._getframe(1).f_lineno


def spawn_lines(note):
    """The lines of `note` naming this file's frames, in order."""
    return [line.strip() for line in note.split("\n") if line.strip().startswith(f'File "{__file__}"')]


def chain_notes(exc):
    return [n for n in getattr(exc, "__notes__", []) if n.startswith(NOTE_HEADER)]


def three_generations():
    """main -> a -> b -> c; c raises.  Returns (exception, the creating
    lines of c, b and a, newest first)."""
    lines = {}

    def c():
        raise ValueError("from c")

    def b():
        lines["c"] = here() + 1
        greenlet.greenlet(c).switch()

    def a():
        lines["b"] = here() + 1
        greenlet.greenlet(b).switch()

    lines["a"] = here() + 1
    g = greenlet.greenlet(a)
    with pytest.raises(ValueError) as info:
        g.switch()
    return info.value, [lines["c"], lines["b"], lines["a"]]


def test_plain_greenlet_three_generations(tracking):
    exc, lines = three_generations()
    notes = chain_notes(exc)
    assert len(notes) == 1, "one note: the greenlet it escaped first, not again for each spawner it escaped"
    found = spawn_lines(notes[0])[:3]   # (the oldest site goes on into this test's frames)
    assert [line.split(", in ")[0] for line in found] == [f'File "{__file__}", line {n}' for n in lines]
    assert [line.split(", in ")[1] for line in found] == ["three_generations.<locals>.b", "three_generations.<locals>.a", "three_generations"]
    assert notes[0].split("\n")[1].strip().startswith("spawned by <greenlet.greenlet object")


def test_traceback_and_logging_show_the_note(tracking):
    exc, lines = three_generations()
    text = "".join(traceback.format_exception(exc))
    assert NOTE_HEADER in text and f"line {lines[0]}, in three_generations.<locals>.b" in text
    stream = io.StringIO()
    log = logging.getLogger("btcore.test_spawn_notes")
    handler = logging.StreamHandler(stream)
    log.addHandler(handler)
    try:
        try:
            raise exc
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    assert NOTE_HEADER in stream.getvalue() and f'line {lines[2]}, in three_generations' in stream.getvalue()


def test_throw_into_a_greenlet_that_dies(tracking):
    line = here() + 1
    g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
    g.switch()
    with pytest.raises(KeyError) as info:
        g.throw(KeyError("thrown"))
    assert g.dead
    assert f"line {line}," in chain_notes(info.value)[0]


def test_no_note_when_the_greenlet_did_not_die(tracking):
    """An exception thrown into the parent by a live child is not one that
    escaped the child."""
    g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.throw(KeyError("to the parent")))
    with pytest.raises(KeyError) as info:
        g.switch()
    assert not g.dead
    assert chain_notes(info.value) == []


def test_untracked_greenlet_gets_no_note(tracking):
    btcore.disable_spawn_tracking()
    g = greenlet.greenlet(lambda: 1 / 0)
    btcore.enable_spawn_tracking()
    with pytest.raises(ZeroDivisionError) as info:
        g.switch()
    assert chain_notes(info.value) == []


def test_off_switch_and_restore():
    btcore.enable_spawn_tracking(exception_notes=False)
    try:
        assert not btcore.spawn_exception_notes_enabled()
        assert greenlet.greenlet.__dict__["switch"] is ORIGINAL_SWITCH
        exc, _ = three_generations()
        assert not hasattr(exc, "__notes__")
        btcore.enable_spawn_tracking()   # on again while tracking
        assert btcore.spawn_exception_notes_enabled()
        exc, _ = three_generations()
        assert len(chain_notes(exc)) == 1
    finally:
        btcore.disable_spawn_tracking()
    assert not btcore.spawn_exception_notes_enabled()
    assert greenlet.greenlet.__dict__["switch"] is ORIGINAL_SWITCH
    assert greenlet.greenlet.__dict__["throw"] is ORIGINAL_THROW
    with pytest.raises(TypeError, match="exception_notes must be a bool"):
        btcore.enable_spawn_tracking(exception_notes=1)


def test_a_failing_note_leaves_the_exception_alone(tracking, monkeypatch):
    def broken(chain):
        raise RuntimeError("note failed")
    monkeypatch.setattr(spawn_notes, "_render", broken)
    g = greenlet.greenlet(lambda: {}["missing"])
    with pytest.raises(KeyError) as info:
        g.switch()
    assert info.value.args == ("missing",) and info.value.__context__ is None
    assert chain_notes(info.value) == []


def test_note_bounded(tracking):
    """A deep spawn site (and a long spawner repr) make a note of at most
    NOTE_LINES lines of at most NOTE_LINE_CHARS characters, its last line
    saying how many were left out."""
    class LongName(greenlet.greenlet):
        def __repr__(self):
            return "<" + "x" * 10_000 + ">"

    def deep(n):
        if n:
            return deep(n - 1)
        greenlet.greenlet(lambda: 1 / 0).switch()

    with pytest.raises(ZeroDivisionError) as info:
        LongName(lambda: deep(100)).switch()
    lines = chain_notes(info.value)[0].split("\n")
    assert len(lines) == NOTE_LINES
    assert max(map(len, lines)) <= NOTE_LINE_CHARS
    assert lines[1].endswith("...") and lines[1].startswith("  spawned by <xxx")
    assert lines[-1].startswith("  ... ") and "more lines" in lines[-1]


def test_gevent_spawn_pool_spawn_later(tracking):
    hub = gevent.get_hub()
    printed = io.StringIO()
    hub.exception_stream = printed
    try:
        pool = gevent.pool.Pool(2)

        def boom():
            raise KeyError("boom")

        line = here() + 1
        made = [gevent.spawn(boom), pool.spawn(boom), gevent.spawn_later(0.001, boom)]
        gevent.joinall(made)
    finally:
        del hub.exception_stream
    for g in made:
        note = chain_notes(g.exception)
        assert len(note) == 1 and f"line {line}, in test_gevent_spawn_pool_spawn_later" in note[0], g
    assert printed.getvalue().count(NOTE_HEADER) == 3   # gevent's own report prints it


def run_python(code):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_gevent_imported_after_enabling():
    """Hub.handle_error is wrapped when gevent.hub is first imported."""
    err = run_python("""
        import btcore
        btcore.enable_spawn_tracking()
        import sys
        assert "gevent" not in sys.modules
        import gevent
        def boom(): raise KeyError("late import")
        g = gevent.spawn(boom)
        g.join()
        print("noted", len(g.exception.__notes__), file=sys.stderr)
    """)
    assert "noted 1" in err and err.count(NOTE_HEADER) == 1, err


def test_eventlet_spawn_and_spawn_n():
    """eventlet's hub resumes a green thread with g.switch: the exception
    leaves it there; the hub prints it, GreenThread.wait() re-raises it."""
    pytest.importorskip("eventlet")
    err = run_python("""
        import sys
        import btcore
        btcore.enable_spawn_tracking()
        import eventlet
        def boom(): raise KeyError("eventlet")
        gt = eventlet.spawn(boom)               # line 7
        try:
            gt.wait()
        except KeyError as e:
            print("waited", len(e.__notes__), file=sys.stderr)
        eventlet.spawn_n(boom)                  # line 12
        eventlet.sleep(0.01)
    """)
    assert "waited 1" in err
    assert err.count(NOTE_HEADER) == 2, err
    assert 'File "<string>", line 7, in <module>' in err and 'File "<string>", line 12, in <module>' in err


def test_each_chain_its_own_note(tracking):
    """Rendered notes are kept per chain: two sites of one spawner, failing
    in turn, each get their own site's line."""
    def fail():
        raise KeyError("fail")

    lines, notes = [], []
    for _ in range(2):   # the second round's notes come from the kept texts
        for make in (lambda: greenlet.greenlet(fail),
                     lambda: greenlet.greenlet(fail)):
            lines.append(make.__code__.co_firstlineno)
            with pytest.raises(KeyError) as info:
                make().switch()
            notes.append(chain_notes(info.value)[0])
    assert lines[0] != lines[1]
    for line, note in zip(lines, notes):
        assert spawn_lines(note)[0].startswith(f'File "{__file__}", line {line}, in ')


def test_pytest_shows_the_note(tmp_path):
    """pytest's own failure report prints the note (an independent printer)."""
    (tmp_path / "test_fails.py").write_text(textwrap.dedent("""
        import btcore, greenlet

        def test_child_fails():
            btcore.enable_spawn_tracking()
            greenlet.greenlet(lambda: 1 / 0).switch()
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 1, out.stdout
    assert "ZeroDivisionError" in out.stdout and NOTE_HEADER in out.stdout, out.stdout
    assert "in test_child_fails" in out.stdout.split(NOTE_HEADER)[1]


def test_a_kept_text_is_added_without_rendering(tracking, monkeypatch):
    """A chain failing again gets its kept text, added by the C switch: the
    render function is not called, and the note is the first one's."""
    notes, renders = [], []
    # One creating line: one site from the second round on (3.15's first
    # run of a call goes through other native frames than its specialised
    # later runs: another site).
    for round in range(3):
        if round == 2:
            monkeypatch.setattr(spawn_notes, "_render", lambda chain: renders.append(chain) or "not kept")
        with pytest.raises(ZeroDivisionError) as info:
            greenlet.greenlet(lambda: 1 / 0).switch()
        notes.append(chain_notes(info.value))
    assert len(notes[1]) == 1 and notes[2] == notes[1]
    assert renders == []


def test_note_if_kept_refuses_what_is_no_tracked_failure(tracking):
    """The C fast path given no exception, an untracked object or the wrong
    arguments adds nothing and raises nothing but a clear TypeError."""
    g = greenlet.greenlet(lambda: None)
    assert spawn_notes._note_if_kept(42, g) is None
    exc = ValueError("x")
    assert spawn_notes._note_if_kept(exc, object()) is None
    assert getattr(exc, "__notes__", None) is None
    with pytest.raises(TypeError):
        spawn_notes._note_if_kept(exc)


def test_kept_texts_bounded(tracking):
    """More failing chains than NOTE_CACHE: the kept texts stay bounded and
    every note still names its own site."""
    def fail():
        raise KeyError("fail")

    sites = [eval(compile("\n" * i + "lambda: greenlet.greenlet(fail)", __file__, "eval"),
                  {"greenlet": greenlet, "fail": fail}) for i in range(spawn_notes.NOTE_CACHE + 8)]
    for i, make in enumerate(sites):
        with pytest.raises(KeyError) as info:
            make().switch()
        assert spawn_lines(chain_notes(info.value)[0])[0].startswith(f'File "{__file__}", line {i + 1}, in ')
        assert len(spawn_notes._rendered) <= spawn_notes.NOTE_CACHE


def test_noting_keeps_no_greenlet_alive(tracking):
    """The kept texts are keyed by sites and spawner reprs: a greenlet whose
    error was noted, and its spawner, are freed with the exception."""
    import gc
    import weakref
    refs = []

    def spawner():
        child = greenlet.greenlet(lambda: 1 / 0)
        refs.append(weakref.ref(child))
        child.switch()

    for _ in range(3):
        parent = greenlet.greenlet(spawner)
        refs.append(weakref.ref(parent))
        with pytest.raises(ZeroDivisionError) as info:
            parent.switch()
        assert len(chain_notes(info.value)) == 1
        del parent, info
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_gevent_spawn_raw(tracking):
    """A raw greenlet's error leaves it through the g.switch its hub callback
    made: noted there, then printed by gevent's callback error report."""
    hub = gevent.get_hub()
    printed = io.StringIO()
    hub.exception_stream = printed

    def boom():
        raise KeyError("raw")

    try:
        line = here() + 1
        gevent.spawn_raw(boom)
        gevent.sleep(0.01)
    finally:
        del hub.exception_stream
    report = printed.getvalue()
    assert "KeyError: 'raw'" in report and report.count(NOTE_HEADER) == 1, report
    assert f"line {line}, in test_gevent_spawn_raw" in report.split(NOTE_HEADER)[1]


# glibc's malloc with a fixed mmap threshold: a block of 64 KiB or more is
# mapped on its own and unmapped when freed, so a read of it after its free
# faults, whatever the process freed before (the dynamic threshold would
# otherwise rise past the blocks these tests free and leave them readable).
UNMAPPED_WHEN_FREED = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")

_REBOUND = {
    "header": '''
        g = greenlet.getcurrent()
        spawn_notes.NOTE_HEADER = "H" * 400_000   # held by the module's dict only

        class E(Exception):
            @property
            def __notes__(self):
                spawn_notes.NOTE_HEADER = "short"   # (nothing large made after: its pages stay unmapped)
                return ["a note"]
    ''',
    "rendered": '''
        btcore.enable_spawn_tracking()
        g = greenlet.greenlet(lambda: None)   # tracked: it has a spawn chain key
        spawn_notes._rendered = {i: i for i in range(100_000)}

        class E(Exception):
            @property
            def __notes__(self):
                spawn_notes._rendered = {}
                return []
    ''',
}


@pytest.mark.parametrize("rebound", sorted(_REBOUND))
def test_a_note_survives_code_that_rebinds_what_it_reads(rebound):
    """Guards note_if_kept() (spawn_notes.c) against Python code run inside it
    (an exception's __notes__ property, a collection's finalizers) that
    rebinds the module globals it reads, NOTE_HEADER and _rendered: it read
    them through borrowed references, which then pointed at freed memory (a
    SIGSEGV).  In a subprocess; the exception is noted or not, never a crash."""
    script = textwrap.dedent('''
        import greenlet
        import btcore
        from btcore.capture import spawn_notes
    ''') + textwrap.dedent(_REBOUND[rebound]) + textwrap.dedent('''
        print("result:", spawn_notes._note_if_kept(E(), g) is not None)
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=UNMAPPED_WHEN_FREED)
    assert done.returncode == 0 and "result: " in done.stdout, (done.returncode, done.stderr[-2000:])
