/* Where another process keeps the objects a dump names its greenlets with
 * (btcore/remote/names.py) and its threads (threading's `_active`, found
 * through sys.modules): types' instance dicts, dicts, functions, ints, weak
 * references, modules, the attributes CPython keeps for a class made in
 * Python (a managed dict, or values: before the object on 3.11, inline
 * after it from 3.13).  One table, a column per CPython version family read
 * (3.11, 3.13, 3.14, 3.15: default x86-64 builds), chosen by the target's
 * version, whatever version btcore runs on.  The values were measured with
 * offsetof against each version's headers (internal ones for dicts; 3.13-
 * 3.15 in the sid chroot); where btcore is built for one of these
 * versions, its column is pinned to its headers by static assertions (a
 * wrong value does not compile).  Internal structs keep their layout
 * within a minor version.  _Py_DebugOffsets (3.13+) publishes only a few of
 * these (dict ma_keys/ma_values, the int's tag and digits, co_name,
 * tp_flags): tests/test_pylayout.py checks the table against them.
 */
#include <Python.h>
#include <string.h>

#include "capture/cpython/pyframes.h"

/* field, 3.11, 3.13, 3.14, 3.15, what it is on the headers btcore is built against */
#define OBJECT_LAYOUT(X)                                                                            \
    X(type_dictoffset, 288, 288, 288, 288, offsetof(PyTypeObject, tp_dictoffset))                 \
    X(type_dict, 264, 264, 264, 264, offsetof(PyTypeObject, tp_dict))                             \
    X(type_flags, 168, 168, 168, 168, offsetof(PyTypeObject, tp_flags))                           \
    X(type_base, 256, 256, 256, 256, offsetof(PyTypeObject, tp_base))                             \
    X(heaptype_qualname, 864, 872, 872, 880, offsetof(PyHeapTypeObject, ht_qualname))             \
    X(heaptype_flag, 512, 512, 512, 512, Py_TPFLAGS_HEAPTYPE)                                     \
    X(dict_keys, 32, 32, 32, 32, offsetof(PyDictObject, ma_keys))                                 \
    X(dict_values, 40, 40, 40, 40, offsetof(PyDictObject, ma_values))                             \
    X(values_values, 0, 8, 8, 8, offsetof(PyDictValues, values))                                  \
    X(keys_log2_index_bytes, 9, 9, 9, 9, offsetof(PyDictKeysObject, dk_log2_index_bytes))         \
    X(keys_kind, 10, 10, 10, 10, offsetof(PyDictKeysObject, dk_kind))                             \
    X(keys_nentries, 24, 24, 24, 24, offsetof(PyDictKeysObject, dk_nentries))                     \
    X(keys_indices, 32, 32, 32, 32, offsetof(PyDictKeysObject, dk_indices))                       \
    X(kind_general, 0, 0, 0, 0, DICT_KEYS_GENERAL)                                                \
    X(entry_size, 24, 24, 24, 24, sizeof(PyDictKeyEntry))                                         \
    X(entry_key, 8, 8, 8, 8, offsetof(PyDictKeyEntry, me_key))                                    \
    X(entry_value, 16, 16, 16, 16, offsetof(PyDictKeyEntry, me_value))                            \
    X(unicode_entry_size, 16, 16, 16, 16, sizeof(PyDictUnicodeEntry))                             \
    X(unicode_entry_key, 0, 0, 0, 0, offsetof(PyDictUnicodeEntry, me_key))                        \
    X(unicode_entry_value, 8, 8, 8, 8, offsetof(PyDictUnicodeEntry, me_value))                    \
    X(func_name, 32, 32, 32, 32, offsetof(PyFunctionObject, func_name))                           \
    X(method_func, 16, 16, 16, 16, offsetof(PyMethodObject, im_func))                             \
    X(cfunc_def, 16, 16, 16, 16, offsetof(PyCFunctionObject, m_ml))                               \
    X(methoddef_name, 0, 0, 0, 0, offsetof(PyMethodDef, ml_name))                                 \
    X(code_name, 120, 120, 120, 120, offsetof(PyCodeObject, co_name))                             \
    X(long_size, 16, 16, 16, 16, LONG_SIZE)                                                       \
    X(long_tag_bits, 0, 3, 3, 3, LONG_TAG_BITS)                                                   \
    X(long_digits, 24, 24, 24, 24, LONG_DIGITS)                                                   \
    X(long_shift, 30, 30, 30, 30, PyLong_SHIFT)                                                   \
    X(weakref_object, 16, 16, 16, 16, offsetof(PyWeakReference, wr_object))                     \
    X(interp_modules, 888, 7656, 7688, 7592, INTERP_MODULES)                                      \
    X(module_dict, 16, 16, 16, 16, offsetof(PyModuleObject, md_dict))                             \
    X(type_basicsize, 32, 32, 32, 32, offsetof(PyTypeObject, tp_basicsize))                       \
    X(heaptype_cached_keys, 872, 880, 880, 888, offsetof(PyHeapTypeObject, ht_cached_keys))       \
    X(managed_dict_flag, 16, 16, 16, 16, Py_TPFLAGS_MANAGED_DICT)                                 \
    X(managed_dict_before, 24, 24, 24, 24, MANAGED_DICT_BEFORE)                                   \
    X(values_pointer_before, 32, 0, 0, 0, VALUES_POINTER_BEFORE)                                  \
    X(inline_values_flag, 0, 4, 4, 4, INLINE_VALUES_FLAG)                                         \
    X(values_valid, 0, 3, 3, 3, VALUES_VALID)

#define COLUMN(column)                                                                              \
    {column##_hex, {OBJECT_LAYOUT(column)}}
#define PY311(name, v311, v313, v314, v315, built) .name = v311,
#define PY313(name, v311, v313, v314, v315, built) .name = v313,
#define PY314(name, v311, v313, v314, v315, built) .name = v314,
#define PY315(name, v311, v313, v314, v315, built) .name = v315,
#define PY311_hex 0x030B
#define PY313_hex 0x030D
#define PY314_hex 0x030E
#define PY315_hex 0x030F

static const struct {
    uint32_t family;
    btc_remote_objlayout layout;
} columns[] = {COLUMN(PY311), COLUMN(PY313), COLUMN(PY314), COLUMN(PY315)};

#if BTC_PY_FAMILY == 311 || BTC_PY_FAMILY == 313 || BTC_PY_FAMILY == 314
#define Py_BUILD_CORE 1
#include <internal/pycore_dict.h>
#include <internal/pycore_interp.h>
#include <internal/pycore_moduleobject.h>
#if BTC_PY_FAMILY == 311
/* (3.11's pycore_object.h does not compile after Python.h without Py_BUILD_CORE: its two pointers as it
 * defines them) */
#define MANAGED_DICT_BEFORE (3 * sizeof(PyObject *))           /* _PyObject_ManagedDictPointer: obj - 3 */
#define LONG_SIZE offsetof(PyVarObject, ob_size)   /* a signed count of digits */
#define LONG_TAG_BITS 0
#define LONG_DIGITS offsetof(PyLongObject, ob_digit)
#define INTERP_MODULES offsetof(PyInterpreterState, modules)
#define VALUES_POINTER_BEFORE (4 * sizeof(PyDictValues *))   /* _PyObject_ValuesPointer: obj - 4 */
#define INLINE_VALUES_FLAG 0
#define VALUES_VALID 0
#define BUILT PY311
#else
#define LONG_SIZE offsetof(PyLongObject, long_value.lv_tag)   /* digits << 3 | sign (0 +, 1 zero, 2 -) */
#define LONG_TAG_BITS _PyLong_NON_SIZE_BITS
#define LONG_DIGITS offsetof(PyLongObject, long_value.ob_digit)
#include <internal/pycore_object.h>
#define MANAGED_DICT_BEFORE (-MANAGED_DICT_OFFSET)
#define INTERP_MODULES offsetof(PyInterpreterState, imports.modules)
#define VALUES_POINTER_BEFORE 0   /* the values lie inline, past tp_basicsize */
#define INLINE_VALUES_FLAG Py_TPFLAGS_INLINE_VALUES
#define VALUES_VALID offsetof(PyDictValues, valid)
#if BTC_PY_FAMILY == 313
#define BUILT PY313
#elif PY_VERSION_HEX < 0x030F0000
#define BUILT PY314
#else
#define BUILT PY315
#endif
#endif
#define PIN_PY311(name, v311, v313, v314, v315, built) _Static_assert((v311) == (built), "3.11's " #name);
#define PIN_PY313(name, v311, v313, v314, v315, built) _Static_assert((v313) == (built), "3.13's " #name);
#define PIN_PY314(name, v311, v313, v314, v315, built) _Static_assert((v314) == (built), "3.14's " #name);
#define PIN_PY315(name, v311, v313, v314, v315, built) _Static_assert((v315) == (built), "3.15's " #name);
#define PIN(column) PIN_(column)
#define PIN_(column) OBJECT_LAYOUT(PIN_##column)
PIN(BUILT)
#endif

int btc_remote_pyobjects(uint64_t version_hex, btc_remote_objlayout *out)
{
    for (size_t i = 0; i < sizeof columns / sizeof *columns; i++) {
        if (columns[i].family == version_hex >> 16) {
            *out = columns[i].layout;
            out->version_hex = version_hex;
            return 0;
        }
    }
    memset(out, 0, sizeof *out);
    out->version_hex = version_hex;
    return -1;
}
