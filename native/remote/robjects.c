/* Where another process keeps the objects a dump names its greenlets with
 * (btcore/remote_names.py): types' instance dicts, dicts, functions, ints,
 * weak references.  Offsets of the CPython btcore is compiled against
 * (offsetof on its headers, internal ones for dicts): a target of the same
 * version family has the same layout; on another family this reports -1
 * and greenlets keep the names the dump gave them before (type and address).
 */
#include <Python.h>
#include <string.h>

#include "capture/cpython/pyframes.h"

#if BTC_PY_FAMILY == 311

#define Py_BUILD_CORE 1
#include <internal/pycore_dict.h>

int btc_remote_pyobjects(btc_remote_objlayout *o)
{
    memset(o, 0, sizeof *o);
    o->version_hex = PY_VERSION_HEX;
    o->type_dictoffset = offsetof(PyTypeObject, tp_dictoffset);
    o->type_dict = offsetof(PyTypeObject, tp_dict);
    o->type_flags = offsetof(PyTypeObject, tp_flags);
    o->type_base = offsetof(PyTypeObject, tp_base);
    o->heaptype_qualname = offsetof(PyHeapTypeObject, ht_qualname);
    o->heaptype_flag = Py_TPFLAGS_HEAPTYPE;
    o->dict_keys = offsetof(PyDictObject, ma_keys);
    o->dict_values = offsetof(PyDictObject, ma_values);
    o->values_values = offsetof(PyDictValues, values);
    o->keys_log2_index_bytes = offsetof(PyDictKeysObject, dk_log2_index_bytes);
    o->keys_kind = offsetof(PyDictKeysObject, dk_kind);
    o->keys_nentries = offsetof(PyDictKeysObject, dk_nentries);
    o->keys_indices = offsetof(PyDictKeysObject, dk_indices);
    o->kind_general = DICT_KEYS_GENERAL;
    o->entry_size = sizeof(PyDictKeyEntry);
    o->entry_key = offsetof(PyDictKeyEntry, me_key);
    o->entry_value = offsetof(PyDictKeyEntry, me_value);
    o->unicode_entry_size = sizeof(PyDictUnicodeEntry);
    o->unicode_entry_key = offsetof(PyDictUnicodeEntry, me_key);
    o->unicode_entry_value = offsetof(PyDictUnicodeEntry, me_value);
    o->func_name = offsetof(PyFunctionObject, func_name);
    o->method_func = offsetof(PyMethodObject, im_func);
    o->cfunc_def = offsetof(PyCFunctionObject, m_ml);
    o->methoddef_name = offsetof(PyMethodDef, ml_name);
    o->code_name = offsetof(PyCodeObject, co_name);
    o->long_size = offsetof(PyVarObject, ob_size);   /* 3.11: signed count of digits */
    o->long_digits = offsetof(PyLongObject, ob_digit);
    o->long_shift = PyLong_SHIFT;
    o->weakref_object = offsetof(PyWeakReference, wr_object);
    return 0;
}

#else

int btc_remote_pyobjects(btc_remote_objlayout *o)
{
    memset(o, 0, sizeof *o);
    o->version_hex = PY_VERSION_HEX;
    return -1;
}

#endif
