/* Any CPython without a version unit: import works, capture says why not. */
#include "pyframes.h"
#include "common/errors.h"

#if BTC_PY_FAMILY == 0

const char *const btc_py_eval_functions[] = {NULL};

bool btc_py_supported(void)
{
    btc_fail(BTC_E_UNSUPPORTED, "btcore has no frame reader for this CPython version "
             "(supported: 3.11 to 3.15, GIL builds; see docs/platforms.md)");
    return false;
}

void btc_py_cursor_thread(btc_pycursor *c, PyThreadState *ts BTC_UNUSED) { c->frame = NULL; }

bool btc_py_cursor_frame(btc_pycursor *c, PyObject *frame BTC_UNUSED)
{
    c->frame = NULL;
    return false;
}

bool btc_py_cursor_greenlet(btc_pycursor *c, PyObject *frame BTC_UNUSED, const btc_memview *mem BTC_UNUSED)
{
    c->frame = NULL;
    return false;
}

int btc_py_next_records(btc_pycursor *c BTC_UNUSED, btc_frame *out BTC_UNUSED, int max BTC_UNUSED) { return 0; }

#endif
