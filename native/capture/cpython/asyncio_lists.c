/* asyncio tasks on CPython 3.14+: where the C Task keeps them.
 *
 * 3.14 moved every asyncio.Task (the C type and its subclasses) out of
 * asyncio's Python registries into circular lists of C nodes: one per
 * thread state (_PyThreadStateImpl.asyncio_tasks_head: the thread that
 * created the task), plus the interpreter's (interp->asyncio_tasks_head:
 * tasks whose thread state was cleared while they lived).  Nothing Python
 * lists them all: asyncio.all_tasks(loop) walks the same lists but keeps
 * one loop's tasks, and the running loop of another thread cannot be asked
 * for.  _asyncio_task_lists() walks them the way all_tasks() does, with the
 * GIL held (no thread changes its list without it; free-threaded builds are
 * not supported, pyframes.h), bounded.
 *
 * A node's offset in the Task object is the _asyncio module's own business
 * (TaskObj is defined in _asynciomodule.c): capture/tasks.py reads it from the
 * offsets 3.14 publishes for debuggers (the module's .AsyncioDebug section)
 * and checks them against the thread and interpreter offsets compiled here
 * (_asyncio_layout()) and the Task type's size before any list is walked.
 *
 * The running task and loop of the calling thread are in its thread state
 * on 3.14+ (asyncio.tasks._current_tasks only holds pure-Python tasks
 * there): btc_asyncio_running_task() reads them for spawn tracking. */
#include "pyframes.h"
#include "common/builtins.h"

#if BTC_PY_FAMILY == 314

#define Py_BUILD_CORE 1
#include <internal/pycore_interp_structs.h>   /* PyInterpreterState.asyncio_tasks_head */
#include <internal/pycore_llist.h>
#include <internal/pycore_tstate.h>           /* _PyThreadStateImpl */

/* More tasks than any list may hold: a corrupt (cyclic) list ends here. */
#define MAX_TASKS (1 << 24)

PyObject *btc_asyncio_running_task(PyObject **loop)
{
    PyThreadState *ts = PyThreadState_GetUnchecked();
    *loop = ts ? ((_PyThreadStateImpl *)ts)->asyncio_running_loop : NULL;
    return ts ? ((_PyThreadStateImpl *)ts)->asyncio_running_task : NULL;
}

/* Append the tasks of the list at head to found (each checked to be a
 * task_type); -1 on failure (an exception set). */
static int add_list(PyObject *found, struct llist_node *head, Py_ssize_t node_offset, PyTypeObject *task_type)
{
    Py_ssize_t n = 0;
    for (struct llist_node *node = head->next; node && node != head && n < MAX_TASKS; node = node->next, n++) {
        PyObject *task = (PyObject *)((char *)node - node_offset);
        if (!PyObject_TypeCheck(task, task_type))
            return 0;   /* not the layout we were told: the rest of this list is not read */
        if (PyList_Append(found, task) < 0)   /* allocates no object: no Python code runs */
            return -1;
    }
    return 0;
}

/* _asyncio_task_lists(task_type, node_offset): the tasks of every thread's
 * list and of the interpreter's, in a new list (done ones included). */
static PyObject *task_lists(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    Py_ssize_t offset = nargs == 2 ? PyLong_AsSsize_t(args[1]) : -1;
    if (nargs != 2 || !PyType_Check(args[0]) || offset < (Py_ssize_t)sizeof(PyObject) ||
        offset + (Py_ssize_t)sizeof(struct llist_node) > ((PyTypeObject *)args[0])->tp_basicsize ||
        offset % sizeof(void *)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "_asyncio_task_lists(task_type, node_offset): not a task layout");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
    PyInterpreterState *interp = PyInterpreterState_Get();
    PyObject *found = PyList_New(0);
    for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); found && t; t = PyThreadState_Next(t))
        if (add_list(found, &((_PyThreadStateImpl *)t)->asyncio_tasks_head, offset, type) < 0)
            Py_CLEAR(found);
    if (found && add_list(found, &interp->asyncio_tasks_head, offset, type) < 0)
        Py_CLEAR(found);
    return found;
}

/* _asyncio_layout(): (the thread state's list head, running loop, running
 * task, the interpreter's list head) offsets this module was compiled with. */
static PyObject *layout(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return Py_BuildValue("nnnn", (Py_ssize_t)offsetof(_PyThreadStateImpl, asyncio_tasks_head),
                         (Py_ssize_t)offsetof(_PyThreadStateImpl, asyncio_running_loop),
                         (Py_ssize_t)offsetof(_PyThreadStateImpl, asyncio_running_task),
                         (Py_ssize_t)offsetof(PyInterpreterState, asyncio_tasks_head));
}

static PyMethodDef task_lists_def = {
    "_asyncio_task_lists", (PyCFunction)(void (*)(void))task_lists, METH_FASTCALL,
    "_asyncio_task_lists(task_type, node_offset): every task of every thread's and the interpreter's list."};
static PyMethodDef layout_def = {"_asyncio_layout", layout, METH_NOARGS,
                                 "_asyncio_layout(): compiled offsets of the task lists (3.14+)."};

int btc_asyncio_install(uintptr_t namespace)
{
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *ns = (PyObject *)namespace;
    int rc = btc_put_builtin(ns, &task_lists_def) == 0 && btc_put_builtin(ns, &layout_def) == 0 ? 0 : -1;
    PyGILState_Release(gil);
    return rc;
}

#else

/* 3.11-3.13: every task is in asyncio's Python registries (capture/tasks.py). */
PyObject *btc_asyncio_running_task(PyObject **loop)
{
    *loop = NULL;
    return NULL;
}

int btc_asyncio_install(uintptr_t namespace)
{
    (void)namespace;
    return 0;
}

#endif
