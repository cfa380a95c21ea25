/* Which of a list of objects are greenlets: the filter of capture/introspect.py's
 * gc scans (live_greenlets(): the whole heap, for a snapshot; the profiler:
 * the gc's young generation, at every tick).  And the state of each greenlet
 * the profiler knows, read at every tick (_known_states()).
 *
 * In C because the profiler runs it at every tick: a busy gunicorn worker's
 * young generation holds ~1,000 objects, and Python's filter
 * (issubclass(type(obj), greenlet.greenlet) per object) took ~240 us of its
 * ~430 us tick; here an object costs a few ns.  PyObject_TypeCheck reads the
 * type's MRO only: no code of the object runs (isinstance() would ask a
 * proxy object for its __class__, which may run and raise anything). */
#include <Python.h>

#include "capture/capture.h"           /* btc_greenlet_stamp_held() */
#include "capture/greenlet_context.h"   /* (and btcore_api.h) */
#include "common/builtins.h"
#include "common/referent.h"

static PyTypeObject *greenlet_type;

/* _greenlets_among(objects): the greenlets of the list objects, in order;
 * one still being made (a dump run inside greenlet's tp_new) is not one yet. */
static PyObject *greenlets_among(PyObject *self, PyObject *objects)
{
    (void)self;
    if (!PyList_Check(objects))
        return PyErr_Format(PyExc_TypeError, "_greenlets_among() takes a list, not %s", Py_TYPE(objects)->tp_name);
    PyObject *found = PyList_New(0);
    for (Py_ssize_t i = 0; found && i < PyList_GET_SIZE(objects); i++) {
        PyObject *o = PyList_GET_ITEM(objects, i);
        bool made_greenlet = PyObject_TypeCheck(o, greenlet_type) && btc_greenlet_made(greenlet_type, o);
        if (made_greenlet && PyList_Append(found, o) < 0)
            Py_CLEAR(found);
    }
    return found;
}

static PyMethodDef greenlets_among_def = {"_greenlets_among", greenlets_among, METH_O,
                                          "_greenlets_among(objects): the greenlets of the list, in order."};

/* ---- greenlet states: the one copy of the rule ----
 *
 * RUNNING, SUSPENDED, NOT_STARTED or DEAD, from greenlet's own state only:
 * introspect.state_of is _state_of below, and the profiler reads every
 * known greenlet's state at every tick through _known_states (~0.5-1 us a
 * greenlet through Python: ~1 ms a tick at 1,000 greenlets).
 *
 * Subclasses may override __bool__ and `dead` (gevent does), so the base
 * type's own accessors are called, as C functions.  greenlet 3.x: active =
 * has a stack; dead = started and no longer active; greenlet's own rule
 * calls a greenlet "running in some thread" when it is active without a
 * saved Python frame.  That rule is wrong for a greenlet suspended in code
 * that has no Python frames (gevent.spawn(event.wait) parks in Cython), so:
 * in the calling thread only the current greenlet runs; in another thread,
 * the one greenlet's thread state names current (btc_greenlet_thread_current).
 * Until greenlet's layout is learned (or where it cannot be), one greenlet
 * runs at a time, and a thread started from Python always has frames in
 * its main greenlet, so a frameless main greenlet is the one running there
 * (two frameless greenlets in one such thread cannot then be told apart: g
 * is taken as the one running).  A greenlet still being made (a dump run
 * inside greenlet's tp_new) is not started. */

static getter base_dead, base_frame, base_parent;
static inquiry base_bool;

enum state { GONE, RUNNING, SUSPENDED, NOT_STARTED, DEAD, ERROR };

/* A greenlet attribute through the base type's getter: 1 true / not None, 0, -1 error. */
static int truth_of(getter get, PyObject *g)
{
    PyObject *v = get(g, NULL);
    int truth = v == NULL ? -1 : v != Py_None && v != Py_False;
    Py_XDECREF(v);
    return truth;
}

/* The root of g's parent chain (a borrowed reference: the chain holds it while g does), or NULL. */
static PyObject *root_of(PyObject *g)
{
    for (int guard = 0; guard < 1 << 16; guard++) {
        PyObject *parent = base_parent(g, NULL);
        if (parent == NULL)
            return NULL;
        Py_DECREF(parent);   /* g holds its parent */
        if (parent == Py_None)
            return g;
        g = parent;
    }
    PyErr_SetString(PyExc_RuntimeError, "a greenlet's parent chain does not end");
    return NULL;
}

/* Which greenlet each thread runs, read once per call for the first
 * RUNNERS_KEPT threads (roots) met: a tick of the profiler asks it of
 * every frameless greenlet, most of them of one or two threads. */
#define RUNNERS_KEPT 8
typedef struct {
    PyObject *root;   /* a reference: its address is not another's while kept */
    int known;        /* btc_greenlet_thread_current's answer */
    uintptr_t current;
} runner;

typedef struct {
    int n;
    runner of[RUNNERS_KEPT];
} runners;

static void runners_clear(runners *seen)
{
    for (int i = 0; i < seen->n; i++)
        Py_DECREF(seen->of[i].root);
    seen->n = 0;
}

/* Is g what its thread (its root's) runs: 1, 0, or -1 if unknown. */
static int runs_in_thread(PyObject *g, PyObject *root, runners *seen)
{
    for (int i = 0; i < seen->n; i++)
        if (seen->of[i].root == root)
            return seen->of[i].known < 0 ? -1 : seen->of[i].current == (uintptr_t)g;
    uintptr_t current = 0;
    int known = btc_greenlet_thread_current(root, &current);
    if (seen->n < RUNNERS_KEPT)
        seen->of[seen->n++] = (runner){Py_NewRef(root), known, current};
    return known < 0 ? -1 : current == (uintptr_t)g;
}

static enum state state_of(PyObject *g, PyObject *current, PyObject *current_root, runners *seen)
{
    if (g == current)
        return RUNNING;
    if (!btc_greenlet_made(greenlet_type, g))
        return NOT_STARTED;   /* being made: greenlet's accessors would read its missing C++ object */
    int dead = truth_of(base_dead, g), active = dead ? 0 : base_bool(g), framed = active > 0 ? truth_of(base_frame, g) : 0;
    if (dead < 0 || active < 0 || framed < 0)
        return ERROR;
    if (dead)
        return DEAD;
    if (!active)
        return NOT_STARTED;
    if (framed)
        return SUSPENDED;
    PyObject *root = root_of(g);
    if (root == NULL)
        return ERROR;
    if (root == current_root)
        return SUSPENDED;
    int runs = runs_in_thread(g, root, seen);
    if (runs >= 0)
        return runs ? RUNNING : SUSPENDED;
    if (g == root)
        return RUNNING;
    int root_framed = truth_of(base_frame, root);   /* its thread's main greenlet runs (no frame): g is suspended */
    return root_framed < 0 ? ERROR : root_framed ? RUNNING : SUSPENDED;
}

/* Append (key, g) to list: 0, or -1 (an error set). */
static int append_pair(PyObject *list, PyObject *key, PyObject *g)
{
    PyObject *pair = PyTuple_Pack(2, key, g);
    int rc = pair ? PyList_Append(list, pair) : -1;
    Py_XDECREF(pair);
    return rc;
}

/* Sort one entry of known (key -> (weakref, ...)) into turn, running or gone. */
static int sort_entry(PyObject *key, PyObject *entry, PyObject *current, PyObject *current_root, runners *seen,
                      long phases, long phase, PyObject **lists)
{
    PyObject *ref = PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) ? PyTuple_GET_ITEM(entry, 0) : NULL;
    if (ref == NULL || !PyWeakref_CheckRef(ref) || !PyLong_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "_known_states(): known maps an int to (weakref, ...)");
        return -1;
    }
    PyObject *g = btc_referent(ref);
    if (g == NULL)
        return PyList_Append(lists[2], key);
    if (!PyObject_TypeCheck(g, greenlet_type))
        return PyErr_Format(PyExc_TypeError, "_known_states(): not a greenlet: %s", Py_TYPE(g)->tp_name), -1;
    Py_INCREF(g);   /* its getters may run code that drops the last other reference */
    enum state state = state_of(g, current, current_root, seen);
    int rc = 0;
    if (state == ERROR)
        rc = -1;
    else if (state == SUSPENDED && ((uintptr_t)g >> 4) % (uintptr_t)phases == (uintptr_t)phase)   /* 16-byte aligned */
        rc = append_pair(lists[0], key, g);
    else if (state == RUNNING)
        rc = append_pair(lists[1], key, g);
    else if (state == DEAD)
        rc = PyList_Append(lists[2], key);
    Py_DECREF(g);
    return rc;
}

/* _known_states(known, current, phases, phase): (turn, running, gone) of the
 * profiler's known greenlets (a dict: key -> (weakref, ...)), read from
 * current, the calling thread's greenlet: turn, [(key, g)] of the suspended
 * ones whose address puts them in phase (id >> 4 modulo phases); running,
 * [(key, g)] of those running (in some thread); gone, the keys of the dead
 * and of those no longer alive.  Not started: in none. */
static PyObject *known_states(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    long phases = nargs == 4 ? PyLong_AsLong(args[2]) : 0, phase = nargs == 4 ? PyLong_AsLong(args[3]) : 0;
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyObject_TypeCheck(args[1], greenlet_type) || phases < 1 ||
        phase < 0 || phase >= phases) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "_known_states(known: dict, current: greenlet, phases >= 1, 0 <= phase < phases)");
        return NULL;
    }
    PyObject *known = PyDict_Copy(args[0]);   /* a getter may run code that changes the dict */
    PyObject *current_root = known ? root_of(args[1]) : NULL;
    PyObject *lists[3] = {PyList_New(0), PyList_New(0), PyList_New(0)};
    PyObject *key, *entry, *out = NULL;
    Py_ssize_t at = 0;
    runners seen = {0};
    int ok = current_root && lists[0] && lists[1] && lists[2];
    while (ok && PyDict_Next(known, &at, &key, &entry))
        ok = sort_entry(key, entry, args[1], current_root, &seen, phases, phase, lists) == 0;
    runners_clear(&seen);
    if (ok)
        out = PyTuple_Pack(3, lists[0], lists[1], lists[2]);
    Py_XDECREF(known);
    for (int i = 0; i < 3; i++)
        Py_XDECREF(lists[i]);
    return out;
}

static PyMethodDef known_states_def = {"_known_states", (PyCFunction)(void (*)(void))known_states, METH_FASTCALL,
                                       "_known_states(known, current, phases, phase): (turn, running, gone)."};

/* ---- parked greenlets that have not moved: counted without Python ----
 *
 * At 1,000 parked greenlets a tick looks at 200 (a fifth at 100 Hz), and
 * most have not moved since their last look: the look found the same
 * stamp, took the stack it kept, and added the weight under the same
 * Profile key, ~6.5 us of Python each (a tick of ~1.3 ms).  Here that case
 * costs the stamp and three dict operations; the profiler keeps, with a
 * greenlet's stack, the Profile entry its key has (sampler.py), once the
 * greenlet's labels are complete.  A greenlet parked with no Python frames
 * (spawned on a C or Cython function) has nothing to stamp: its capture
 * is compared with the one kept instead (~1 us in C, where its Python look
 * captured it again every time). */

/* Add weight (us) to entry, a Profile entry [count, refs]. */
static int add_to_entry(PyObject *entry, long long weight)
{
    long long count = PyLong_AsLongLong(PyList_GET_ITEM(entry, 0));
    PyObject *sum = count == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(count + weight);
    return sum ? PyList_SetItem(entry, 0, sum) : -1;
}

/* What introspect.collect_suspended() captures of a parked greenlet. */
#define WANT_SUSPENDED (BTC_WANT_PYTHON | BTC_WANT_NATIVE | BTC_WANT_OWN_THREAD)

/* Has g not moved since its stamp was taken: the same stamp (an int), or,
 * stamped None (no Python frames to stamp), a capture now the same as the
 * one kept, bt?  A main greenlet's stamp (a tuple) is never answered here. */
static bool unmoved(PyObject *g, PyObject *stamp, PyObject *bt)
{
    if (stamp == Py_None)
        return btc_greenlet_stack_is(g, WANT_SUSPENDED, bt);
    unsigned long long kept = PyLong_Check(stamp) ? PyLong_AsUnsignedLongLong(stamp) : 0;
    PyErr_Clear();
    return kept != 0 && kept == btc_greenlet_stamp_held(g);
}

/* The kept Profile entry of greenlet key if it has not moved since
 * (stacks: key -> (stamp, Backtrace, entry or None)), else NULL (no error
 * set). */
static PyObject *unmoved_entry(PyObject *stacks, PyObject *key, PyObject *g)
{
    PyObject *kept = PyDict_GetItemWithError(stacks, key);
    if (!kept || !PyTuple_Check(kept) || PyTuple_GET_SIZE(kept) != 3)
        return NULL;
    PyObject *entry = PyTuple_GET_ITEM(kept, 2);
    if (!PyList_Check(entry) || PyList_GET_SIZE(entry) < 1 || !PyLong_Check(PyList_GET_ITEM(entry, 0)))
        return NULL;
    return unmoved(g, PyTuple_GET_ITEM(kept, 0), PyTuple_GET_ITEM(kept, 1)) ? entry : NULL;
}

/* A dict's int value under key, or `otherwise`; -1 with an error set if it is no int. */
static long long int_value(PyObject *dict, PyObject *key, long long otherwise)
{
    PyObject *value = PyDict_GetItemWithError(dict, key);
    return value ? PyLong_AsLongLong(value) : PyErr_Occurred() ? -1 : otherwise;
}

/* Look at one parked greenlet (pair: (key, g)): counted here (0), left to
 * the caller (1), or an error (-1).  As sampler.Profiler._parked(): its
 * weight is the time not counted yet (now - counted, plus unplaced); none,
 * nothing to do. */
static int look_unmoved(PyObject *pair, PyObject *stacks, PyObject *counted, PyObject *unplaced, PyObject *now_obj,
                        long long now)
{
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyObject_TypeCheck(PyTuple_GET_ITEM(pair, 1), greenlet_type)) {
        PyErr_SetString(PyExc_TypeError, "_parked_unmoved(): parked holds (key, greenlet) pairs");
        return -1;
    }
    PyObject *key = PyTuple_GET_ITEM(pair, 0), *g = PyTuple_GET_ITEM(pair, 1);
    long long since = int_value(counted, key, now), more = since == -1 && PyErr_Occurred() ? 0 : int_value(unplaced, key, 0);
    if (PyErr_Occurred())
        return -1;
    long long weight = now - since + more;
    if (weight <= 0)
        return 0;
    PyObject *entry = unmoved_entry(stacks, key, g);
    if (!entry)
        return PyErr_Occurred() ? -1 : 1;
    if (add_to_entry(entry, weight) < 0 || PyDict_SetItem(counted, key, now_obj) < 0)
        return -1;
    if (more && PyDict_DelItem(unplaced, key) < 0)
        return -1;
    return 0;
}

/* _parked_unmoved(parked, stacks, counted, unplaced, now): count the
 * parked greenlets of a tick's turn ([(key, g)]) that have not moved since
 * their last look, as the profiler's look would (see above); the others,
 * [(key, g)] in order, are returned for that look.  GIL held throughout:
 * no greenlet switches meanwhile, and nothing here runs Python code (int
 * keys and values; a greenlet held by its pair for the call). */
static PyObject *parked_unmoved(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    long long now = nargs == 5 && PyLong_Check(args[4]) ? PyLong_AsLongLong(args[4]) : -1;
    if (nargs != 5 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyDict_Check(args[3]) || now < 0) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError, "_parked_unmoved(parked: list, stacks: dict, counted: dict, unplaced: dict, now: int >= 0)");
    }
    PyObject *rest = PyList_New(0);
    for (Py_ssize_t i = 0; rest && i < PyList_GET_SIZE(args[0]); i++) {
        PyObject *pair = Py_NewRef(PyList_GET_ITEM(args[0], i));
        int looked = look_unmoved(pair, args[1], args[2], args[3], args[4], now);
        if (looked < 0 || (looked == 1 && PyList_Append(rest, pair) < 0))
            Py_CLEAR(rest);
        Py_DECREF(pair);
    }
    return rest;
}

static PyMethodDef parked_unmoved_def = {"_parked_unmoved", (PyCFunction)(void (*)(void))parked_unmoved, METH_FASTCALL,
                                         "_parked_unmoved(parked, stacks, counted, unplaced, now): those left to look at."};

/* introspect's state names (RUNNING, SUSPENDED, NOT_STARTED, DEAD), indexed by enum state. */
static PyObject *state_names[ERROR];

/* _state_of(g, current): g's state name, read from current, the calling thread's greenlet. */
static PyObject *state_of_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyObject_TypeCheck(args[0], greenlet_type) || !PyObject_TypeCheck(args[1], greenlet_type))
        return PyErr_Format(PyExc_TypeError, "_state_of(g: greenlet, current: greenlet)");
    PyObject *current_root = root_of(args[1]);   /* (the caller holds g for the call: no getter frees it) */
    runners seen = {0};
    enum state state = current_root ? state_of(args[0], args[1], current_root, &seen) : ERROR;
    runners_clear(&seen);
    return state == ERROR ? NULL : Py_NewRef(state_names[state]);
}

static PyMethodDef state_of_def = {"_state_of", (PyCFunction)(void (*)(void))state_of_one, METH_FASTCALL,
                                   "_state_of(g, current): RUNNING, SUSPENDED, NOT_STARTED or DEAD."};

/* The base type's getter of attribute name, or NULL. */
static getter getter_of(PyTypeObject *type, const char *name)
{
    for (PyGetSetDef *def = type->tp_getset; def && def->name; def++)
        if (strcmp(def->name, name) == 0)
            return def->get;
    return NULL;
}

/* The state names, from namespace's constants: capture/introspect.py is their one source. */
static int learn_state_names(PyObject *ns)
{
    static const char *const names[ERROR] = {[RUNNING] = "RUNNING", [SUSPENDED] = "SUSPENDED",
                                             [NOT_STARTED] = "NOT_STARTED", [DEAD] = "DEAD"};
    for (int i = RUNNING; i < ERROR; i++) {
        PyObject *name = PyDict_GetItemString(ns, names[i]);
        if (name == NULL || !PyUnicode_Check(name))
            return -1;
        Py_XSETREF(state_names[i], Py_NewRef(name));
    }
    return 0;
}

static int learn_accessors(PyTypeObject *type)
{
    base_dead = getter_of(type, "dead");
    base_frame = getter_of(type, "gr_frame");
    base_parent = getter_of(type, "parent");
    base_bool = type->tp_as_number ? type->tp_as_number->nb_bool : NULL;
    return base_dead && base_frame && base_parent && base_bool ? 0 : -1;
}

int btc_install_greenlet_objects(uintptr_t namespace, uintptr_t greenlet)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *ns = (PyObject *)namespace;
    int rc = PyDict_Check(ns) && PyType_Check((PyObject *)greenlet) && learn_accessors((PyTypeObject *)greenlet) == 0 &&
                     learn_state_names(ns) == 0 && btc_put_builtin(ns, &greenlets_among_def) == 0 &&
                     btc_put_builtin(ns, &known_states_def) == 0 && btc_put_builtin(ns, &state_of_def) == 0 &&
                     btc_put_builtin(ns, &parked_unmoved_def) == 0
                 ? 0 : -1;
    if (rc == 0)
        Py_XSETREF(greenlet_type, (PyTypeObject *)Py_NewRef((PyObject *)greenlet));
    PyGILState_Release(gil);
    return rc;
}
