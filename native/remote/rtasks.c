/* asyncio tasks of another process: what each pending task awaits (its
 * coroutine chain, read as the interpreter resumes it) and who awaits it,
 * read through btc_rmem while the target is stopped; names are read after
 * it runs again (btcore/remote/tasks.py).
 *
 * The objects read here are asyncio's C Task and Future, coroutines and
 * their frames: private structs of _asynciomodule.c and CPython, whose
 * offsets are listed per version family below (measured on each version's
 * own objects and pinned by tests/test_remote_tasks.py).  Every object
 * followed is type-checked against the target's type objects first, every
 * walk is bounded, and a loop in an await chain ends it.
 */
#include <Python.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "capture/cpython/pyframes.h"
#include "remote/rmem.h"

#define MAX_TYPE_DEPTH 32
#define MAX_AWAIT_CHAIN 4096   /* coroutines followed from a task */
#define MAX_CALLBACKS 64       /* done-callbacks of a future looked through */
#define MAX_CLOSURE 16         /* cells of a callback's closure, or a partial's arguments, looked through */
#define MAX_FUTURE_DEPTH 4     /* futures followed from a task to the task awaiting it (gather: 1) */
#define MAX_STACK_INDEX (1 << 20)
#define NEVER INT32_MIN        /* a frame state a version does not have */

/* What every version family from 3.11 shares. */
#define OB_TYPE 8
#define VAR_SIZE 16
#define ITEMS 24               /* PyTupleObject.ob_item; PyListObject.ob_item is a pointer there */
#define CFUNC_SELF 24          /* PyCFunctionObject.m_self: a task's wakeup is bound to the task */
#define FUNC_CLOSURE 72        /* PyFunctionObject.func_closure, after the 7 words before it */
#define CELL_REF 16
#define LLIST_NEXT 0           /* struct llist_node {next, prev} (3.14+) */
#define SET_MASK 32            /* PySetObject: fill, used, mask, table after the head */
#define SET_TABLE 40
#define SET_ENTRY 16           /* setentry {key, hash} */
#define MAX_SET_MASK ((1u << 24) - 1)
#define WEAKREF_OBJECT 16      /* PyWeakReference.wr_object */
#define ENTRIES_AT_ONCE 256

/* Per family, FutureObj's state; TaskObj's coro and name; the
 * coroutine's qualname, gi_frame_state and gi_iframe (its own frame); its
 * frame states; where the frame's stack ends (an int index: stacktop, or a
 * pointer: stackpointer; -1 for the other), localsplus; how deep below
 * that the awaited object lies; 3.11's RESUME opcodes (plain and
 * quickened: a code run 8 times is quickened in place); the thread state's
 * running loop (3.13: in _PyThreadStateImpl; 3.14+: from .AsyncioDebug).
 * FutureObj's loop, callback0 and callbacks lead it in every family. */
#define FAMILY(version, state, coro, name, qualname, frame_state, iframe, created, suspended, yield_from, executing, \
               stacktop, stackpointer, localsplus, depth, resume, quick, running_loop)                             \
    {.version_hex = version, .fut_loop = 16, .fut_callback0 = 24, .fut_callbacks = 40, .fut_state = state,          \
     .task_coro = coro, .task_name = name, .gen_qualname = qualname, .gen_frame_state = frame_state,                \
     .gen_iframe = iframe, .frame_created = created, .frame_suspended = suspended, .frame_yield_from = yield_from,  \
     .frame_executing = executing, .frame_stacktop = stacktop, .frame_stackpointer = stackpointer,                  \
     .frame_localsplus = localsplus, .yield_from_depth = depth, .resume_opcode = resume, .resume_quick = quick,     \
     .thread_running_loop = running_loop, .method_self = 24, .partial_args = 24}
static const btc_remote_tasklayout families[] = {
    FAMILY(0x030B0000, 88, 136, 144, 40, 75, 80, -2, -1, NEVER, 0, 64, -1, 72, 1, 151, 150, 0),
    FAMILY(0x030D0000, 96, 120, 128, 32, 67, 72, -3, -2, -1, 0, 64, -1, 72, 1, 0, 0, 312),
    FAMILY(0x030E0000, 104, 128, 136, 32, 67, 72, -3, -2, -1, 0, -1, 64, 80, 1, 0, 0, 0),
    FAMILY(0x030F0000, 104, 128, 136, 32, 67, 72, 0, 1, 2, 4, -1, 64, 80, 2, 0, 0, 0),
};

int btc_remote_task_layout_of(uint64_t version_hex, btc_remote_tasklayout *out)
{
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
        if (families[i].version_hex >> 16 == version_hex >> 16) {
            *out = families[i];
            out->version_hex = version_hex;
            return 0;
        }
    }
    memset(out, 0, sizeof *out);
    return -1;
}

/* An object's address is aligned; its type, 0 if unreadable. */
static uintptr_t type_of(btc_rmem *m, uintptr_t obj)
{
    uintptr_t type;
    return obj && !(obj & 7) && btc_rmem_word(m, obj + OB_TYPE, &type) ? type : 0;
}

/* Is t one of types (0-ended) or a subtype of one? */
static bool derives(btc_rmem *m, uintptr_t t, const uintptr_t *types)
{
    for (int depth = 0; t && depth < MAX_TYPE_DEPTH; depth++) {
        for (int i = 0; i < BTC_REMOTE_TASK_TYPES && types[i]; i++)
            if (t == types[i])
                return true;
        if (!btc_rmem_word(m, t + offsetof(PyTypeObject, tp_base), &t))
            return false;
    }
    return false;
}

static bool is_coroutine(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t obj)
{
    uintptr_t type = type_of(m, obj);
    return type && (type == T->coro_type || type == T->gen_type);
}

int btc_remote_task_list(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t head, uintptr_t *out, int max)
{
    uintptr_t node;
    int n = 0;
    loop_watch watch = {0, 0, 1};
    if (!btc_rmem_word(m, head + LLIST_NEXT, &node))
        return 0;
    while (node && node != head && !(node & 7) && !loops(&watch, node)) {
        if (n >= max)
            return -1;
        out[n++] = node - T->task_node;
        if (!btc_rmem_word(m, node + LLIST_NEXT, &node))
            break;
    }
    return n;
}

int btc_remote_set_tasks(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t set, uintptr_t *out, int max)
{
    uintptr_t mask, table, entries[2 * ENTRIES_AT_ONCE];
    int n = 0;
    if (!derives(m, type_of(m, set), (uintptr_t[]){T->set_type, 0}) || !btc_rmem_word(m, set + SET_MASK, &mask) ||
        mask > MAX_SET_MASK || !btc_rmem_word(m, set + SET_TABLE, &table) || (table & 7))
        return 0;
    for (uintptr_t at = 0; at <= mask; at += ENTRIES_AT_ONCE) {
        uintptr_t count = mask + 1 - at < ENTRIES_AT_ONCE ? mask + 1 - at : ENTRIES_AT_ONCE;
        if (btc_rmem_read(m, table + at * SET_ENTRY, entries, count * SET_ENTRY) != 0)
            return n;
        for (uintptr_t i = 0; i < count; i++) {
            uintptr_t key = entries[2 * i], type = key ? type_of(m, key) : 0, task = key;
            /* a WeakSet's entries: weak references, or spawn tracking's records (a subclass, spawn.c) */
            bool ref = type && derives(m, type, (uintptr_t[]){T->weakref_type, 0});
            if (!type || (ref && !btc_rmem_word(m, key + WEAKREF_OBJECT, &task)) ||
                !derives(m, type_of(m, task), T->task_types))
                continue;   /* an empty slot, a dummy, a dead reference, not a task */
            if (n >= max)
                return -1;
            out[n++] = task;
        }
    }
    return n;
}

/* ---- who awaits a task ---- */

typedef struct {
    uintptr_t *found;   /* BTC_REMOTE_TASK_AWAITERS of them, 0-ended */
    int n;
    uintptr_t *holder;  /* the task's own callbacks: the first object one is a method of (not a task) */
    const btc_remote_layout *L;
} awaiters;

static void add_awaiter(awaiters *a, uintptr_t task)
{
    for (int i = 0; i < a->n; i++)
        if (a->found[i] == task)
            return;
    if (a->n < BTC_REMOTE_TASK_AWAITERS)
        a->found[a->n++] = task;
}

static void awaiters_of(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t fut, awaiters *a, int depth);

/* A future a done-callback holds leads to the tasks awaiting it. */
static void through_future(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t held, awaiters *a, int depth)
{
    if (depth < MAX_FUTURE_DEPTH && derives(m, type_of(m, held), T->future_types))
        awaiters_of(m, T, held, a, depth + 1);
}

/* The items of a tuple object (at most MAX_CLOSURE), 0s past its end; false if it is no tuple. */
static bool tuple_items(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t tuple, uintptr_t *items)
{
    uintptr_t size;
    memset(items, 0, MAX_CLOSURE * sizeof *items);
    if (type_of(m, tuple) != T->tuple_type || !btc_rmem_word(m, tuple + VAR_SIZE, &size))
        return false;
    size = size < MAX_CLOSURE ? size : MAX_CLOSURE;
    return btc_rmem_read(m, tuple + ITEMS, items, size * sizeof *items) == 0;
}

/* A done-callback's awaiter: the task a wakeup is bound to (`await task`;
 * a pure-Python task's is a bound method), else through the futures it
 * holds: in a function's closure (gather's _done_callback, shield's), in a
 * partial's arguments (3.11's wait_for: partial(_release_waiter, waiter)).
 * A method of another object (a TaskGroup's _on_task_done) is noted as the
 * holder: the task suspended in a method of that object awaits this one
 * (btcore/remote/tasks.py pairs them). */
static void awaiter_of_callback(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t callback, awaiters *a,
                                int depth)
{
    uintptr_t type = type_of(m, callback), held, items[MAX_CLOSURE];
    if (!type)
        return;
    if (type == T->cfunction_type || (T->method_type && type == T->method_type)) {
        uint32_t self_at = type == T->cfunction_type ? CFUNC_SELF : T->method_self;
        if (!btc_rmem_word(m, callback + self_at, &held))
            return;
        if (derives(m, type_of(m, held), T->task_types))
            add_awaiter(a, held);
        else if (type == T->method_type && depth == 0 && a->holder && !*a->holder && held && !(held & 7))
            *a->holder = held;
    } else if (type == T->function_type) {
        if (btc_rmem_word(m, callback + FUNC_CLOSURE, &held) && tuple_items(m, T, held, items))
            for (int i = 0; i < MAX_CLOSURE && items[i]; i++)
                if (type_of(m, items[i]) == T->cell_type && btc_rmem_word(m, items[i] + CELL_REF, &held))
                    through_future(m, T, held, a, depth);
    } else if (btc_remote_type_named(m, a->L, type, "functools.partial")) {
        /* a heap type on every version, without a symbol: known by its name (a callback of a type not
         * known otherwise is rare, so no gc list is searched for it) */
        if (btc_rmem_word(m, callback + T->partial_args, &held) && tuple_items(m, T, held, items))
            for (int i = 0; i < MAX_CLOSURE && items[i]; i++)
                through_future(m, T, items[i], a, depth);
    }
}

/* Through fut's done-callbacks: callback0, then the (callback, context) tuples of its list. */
static void awaiters_of(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t fut, awaiters *a, int depth)
{
    uintptr_t callback, list, size, items;
    if (btc_rmem_word(m, fut + T->fut_callback0, &callback) && callback)
        awaiter_of_callback(m, T, callback, a, depth);
    if (!btc_rmem_word(m, fut + T->fut_callbacks, &list) || type_of(m, list) != T->list_type ||
        !btc_rmem_word(m, list + VAR_SIZE, &size) || !btc_rmem_word(m, list + ITEMS, &items))
        return;
    for (uintptr_t i = 0; i < size && i < MAX_CALLBACKS; i++) {
        uintptr_t entry, first;
        if (btc_rmem_word(m, items + 8 * i, &entry) && type_of(m, entry) == T->tuple_type &&
            btc_rmem_word(m, entry + ITEMS, &first))
            awaiter_of_callback(m, T, first, a, depth);
    }
}

/* ---- what a task awaits ---- */

static bool frame_state(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t coro, int8_t *state)
{
    return btc_rmem_read(m, coro + T->gen_frame_state, state, 1) == 0;
}

/* 3.11 has no yield-from state: a suspended frame is in one when the
 * instruction after the one it stopped at is RESUME with oparg >= 2 (what
 * CPython's _PyGen_yf checks, of the instruction's unquickened form). */
static bool in_yield_from(btc_rmem *m, const btc_remote_layout *L, const btc_remote_tasklayout *T, uintptr_t frame,
                          int8_t state)
{
    if (!T->resume_opcode)
        return state == T->frame_yield_from;
    uintptr_t prev;
    uint8_t next[2];
    return state == T->frame_suspended && btc_rmem_word(m, frame + L->frame_instr_ptr, &prev) &&
           btc_rmem_read(m, prev + 2, next, 2) == 0 && (next[0] == T->resume_opcode || next[0] == T->resume_quick) && next[1] >= 2;
}

/* The object a suspended coroutine awaits (sends into when resumed): near
 * the top of its frame's stack while it is in a yield from; else 0. */
static uintptr_t awaited(btc_rmem *m, const btc_remote_layout *L, const btc_remote_tasklayout *T, uintptr_t coro)
{
    uintptr_t frame = coro + T->gen_iframe, top, value;
    int8_t state;
    if (!frame_state(m, T, coro, &state) || !in_yield_from(m, L, T, frame, state))
        return 0;
    if (T->frame_stackpointer >= 0) {
        if (!btc_rmem_word(m, frame + (uint32_t)T->frame_stackpointer, &top))
            return 0;
    } else {
        int32_t index;
        if (btc_rmem_read(m, frame + (uint32_t)T->frame_stacktop, &index, sizeof index) != 0 || index < 1 ||
            index > MAX_STACK_INDEX)
            return 0;
        top = frame + T->frame_localsplus + 8 * (uintptr_t)index;
    }
    if (top < 8 * T->yield_from_depth || !btc_rmem_word(m, top - 8 * T->yield_from_depth, &value))
        return 0;
    return value & ~(uintptr_t)L->executable_tag_bits;   /* 3.14+: a _PyStackRef, tagged as f_executable is */
}

/* A suspended task's await chain: its coroutine's frame, then the frame of
 * each coroutine (or generator) it awaits, down to the innermost; written
 * innermost first, the innermost `room` of them (ring: scratch of room).
 * *innermost: the innermost coroutine read. */
static int await_chain(btc_rmem *m, const btc_remote_layout *L, const btc_remote_tasklayout *T, uintptr_t coro,
                       btc_remote_pyframe *out, int room, btc_remote_pyframe *ring, int32_t *truncated,
                       uintptr_t *innermost)
{
    uint64_t k = 0;
    bool looped = false;
    loop_watch watch = {0, 0, 1};
    for (uintptr_t c = coro; c && k < MAX_AWAIT_CHAIN;) {
        if (btc_remote_frame_chain(m, L, c + T->gen_iframe, &ring[k % (uint64_t)room], 1) < 1)
            break;
        k++;
        *innermost = c;
        c = awaited(m, L, T, c);
        if (!is_coroutine(m, T, c))
            break;
        if (loops(&watch, c)) {
            looped = true;
            break;
        }
    }
    int n = k < (uint64_t)room ? (int)k : room;
    for (int i = 0; i < n; i++)
        out[i] = ring[(k - 1 - (uint64_t)i) % (uint64_t)room];
    *truncated = k > (uint64_t)room || k >= MAX_AWAIT_CHAIN;
    if (looped) {   /* its outermost record says why the chain ends (as a thread's cut chain does) */
        if (n == room)
            n--;
        out[n++] = (btc_remote_pyframe){0, BTC_REMOTE_CUT_LOOP, 1};
    }
    return n;
}

/* ---- the tasks ---- */

/* The first local of coroutine coro's frame (a method's self), 0 if none or unreadable. */
static uintptr_t first_local(btc_rmem *m, const btc_remote_layout *L, const btc_remote_tasklayout *T, uintptr_t coro)
{
    uintptr_t self;
    if (!coro || !btc_rmem_word(m, coro + T->gen_iframe + T->frame_localsplus, &self))
        return 0;
    return self & ~(uintptr_t)L->executable_tag_bits;   /* 3.14+: a _PyStackRef */
}

/* Fill o for the object at task; false if it is no pending task with a live coroutine. */
static bool read_task(btc_rmem *m, const btc_remote_tasklayout *T, uintptr_t task, btc_remote_task *o)
{
    int32_t fut_state;
    int8_t state;
    memset(o, 0, sizeof *o);
    o->address = task;
    o->type = type_of(m, task);
    if (!derives(m, o->type, T->task_types) || btc_rmem_read(m, task + T->fut_state, &fut_state, 4) != 0 ||
        fut_state != 0 /* PENDING */ || !btc_rmem_word(m, task + T->task_coro, &o->coro) ||
        !btc_rmem_word(m, task + T->fut_loop, &o->loop) || !btc_rmem_word(m, task + T->task_name, &o->name))
        return false;
    if (!is_coroutine(m, T, o->coro)) {   /* an awaitable of another kind: nothing says more */
        o->state = BTC_REMOTE_TASK_SUSPENDED;
        o->coro = 0;
        return true;
    }
    if (!frame_state(m, T, o->coro, &state) || !btc_rmem_word(m, o->coro + T->gen_qualname, &o->qualname))
        return false;
    if (state == T->frame_created)
        o->state = BTC_REMOTE_TASK_NOT_STARTED;
    else if (state == T->frame_suspended || state == T->frame_yield_from)
        o->state = BTC_REMOTE_TASK_SUSPENDED;
    else if (state == T->frame_executing)
        o->state = BTC_REMOTE_TASK_RUNNING;
    return o->state != 0;   /* ended */
}

int btc_remote_tasks(btc_rmem *m, const btc_remote_layout *L, const btc_remote_tasklayout *T,
                     const uintptr_t *tasks, int n, int per_task, btc_remote_task *out, btc_remote_pyframe *frames,
                     int max_frames)
{
    if (per_task < 1)
        return 0;
    btc_remote_pyframe *ring = malloc((size_t)per_task * sizeof *ring);
    if (!ring)
        return 0;
    int kept = 0, used = 0;
    for (int i = 0; i < n; i++) {
        btc_remote_task *o = &out[kept];
        if (!read_task(m, T, tasks[i], o))
            continue;
        awaiters a = {o->awaiters, 0, &o->holder, L};
        awaiters_of(m, T, o->address, &a, 0);
        int room = max_frames - used < per_task ? max_frames - used : per_task;
        o->frames_at = used;
        if (o->coro && room <= 0)
            o->truncated = 1;   /* frames is full */
        else if (o->coro && o->state == BTC_REMOTE_TASK_RUNNING)
            o->nframes = btc_remote_frame_chain(m, L, o->coro + T->gen_iframe, frames + used, room);
        else if (o->coro) {
            uintptr_t innermost = 0;
            o->nframes = await_chain(m, L, T, o->coro, frames + used, room, ring, &o->truncated, &innermost);
            o->self = first_local(m, L, T, innermost);
        }
        used += o->nframes;
        kept++;
    }
    free(ring);
    return kept;
}

/* ---- the thread running a loop (3.11: its thread state does not say) ---- */

/* The innermost frame thread state ts runs, 0 if none or unreadable. */
static uintptr_t current_frame(btc_rmem *m, const btc_remote_layout *L, uintptr_t ts)
{
    uintptr_t holder = ts, frame;
    if (L->tstate_cframe >= 0 && !btc_rmem_word(m, ts + (uint32_t)L->tstate_cframe, &holder))
        return 0;
    return holder && btc_rmem_word(m, holder + L->tstate_current_frame, &frame) ? frame : 0;
}

static int index_of(const uintptr_t *values, int n, uintptr_t value)
{
    for (int i = 0; i < n; i++)
        if (values[i] == value)
            return i;
    return -1;
}

int btc_remote_loop_threads(btc_rmem *m, const btc_remote_layout *L, const btc_remote_tasklayout *T,
                            const uintptr_t *tstates, int nthreads, const btc_remote_task *tasks, int ntasks,
                            uintptr_t *loops_out, int *thread_of, int max_loops)
{
    int nloops = 0;
    for (int i = 0; i < ntasks && nloops < max_loops; i++)
        if (index_of(loops_out, nloops, tasks[i].loop) < 0)
            loops_out[nloops++] = tasks[i].loop;
    for (int i = 0; i < nloops; i++)
        thread_of[i] = -1;
    for (int t = 0; t < nthreads; t++) {
        loop_watch watch = {0, 0, 1};
        uintptr_t f = current_frame(m, L, tstates[t]);
        for (int steps = 0; f && !(f & 7) && steps < BTC_PY_MAX_FRAMES && !loops(&watch, f); steps++) {
            uintptr_t self;
            int at;
            if (btc_rmem_word(m, f + T->frame_localsplus, &self) &&
                (at = index_of(loops_out, nloops, self & ~(uintptr_t)L->executable_tag_bits)) >= 0 &&
                thread_of[at] < 0)
                thread_of[at] = t;
            if (!btc_rmem_word(m, f + L->frame_previous, &f))
                break;
        }
    }
    return nloops;
}
