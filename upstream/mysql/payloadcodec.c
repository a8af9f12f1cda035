/* Reading a stored MySQL row change (upstream/mysql/payload.py's form) in C; payload.py compiles and loads this, and
 * its pure-Python parse() is the reference this must equal.
 *
 * parse(raw, unchanged) -> (kind, relid, new, old, old_kind), or None.
 *
 * raw: kind (1 byte: I, U, D), the relation id (u32 BE), then the new row (I, U) and the old row (U, D), each a u16 BE
 * column count and per column an i32 BE length (-1: NULL -> None; -2: a value the row event did not carry ->
 * `unchanged`) followed by that many bytes of UTF-8 text (-> str). old_kind is "K" when the old row holds an absent
 * value, "O" for a whole old row, None without one.
 *
 * The rule that keeps it equal to Python: C returns a result only for a well-formed change (a known kind, every length
 * within the payload, valid UTF-8, nothing after the last row); for anything else it returns None with no exception
 * set, and the caller parses in Python, which raises the precise error. Once per stored change of the sink path (the
 * mounter's parse of an update or a delete): a Python loop per column there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* One row at *off: a new list, or NULL (malformed; no exception set unless out of memory, which *oom says). */
static PyObject *read_row(const unsigned char *s, Py_ssize_t len, Py_ssize_t *off, PyObject *unchanged, int *absent,
                          int *oom) {
    Py_ssize_t o = *off;
    if (o + 2 > len) return NULL;
    Py_ssize_t n = (Py_ssize_t)s[o] << 8 | (Py_ssize_t)s[o + 1];
    o += 2;
    PyObject *row = PyList_New(n);
    if (row == NULL) {
        *oom = 1;
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (o + 4 > len) goto bad;
        int32_t ln = (int32_t)((uint32_t)s[o] << 24 | (uint32_t)s[o + 1] << 16 | (uint32_t)s[o + 2] << 8 |
                               (uint32_t)s[o + 3]);
        o += 4;
        PyObject *v;
        if (ln == -1) {
            v = Py_None;
            Py_INCREF(v);
        } else if (ln == -2) {
            v = unchanged;
            Py_INCREF(v);
            *absent = 1;
        } else if (ln < 0 || o + ln > len) {
            goto bad;
        } else {
            v = PyUnicode_DecodeUTF8((const char *)s + o, ln, "strict");
            if (v == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) *oom = 1;
                else PyErr_Clear();
                goto bad;
            }
            o += ln;
        }
        PyList_SET_ITEM(row, i, v);
    }
    *off = o;
    return row;
bad:
    Py_DECREF(row);
    return NULL;
}

static PyObject *parse(PyObject *self, PyObject *args) {
    PyObject *raw, *unchanged;
    if (!PyArg_ParseTuple(args, "OO", &raw, &unchanged)) return NULL;
    if (!PyBytes_CheckExact(raw)) Py_RETURN_NONE;
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(raw);
    Py_ssize_t len = PyBytes_GET_SIZE(raw), off = 5;
    if (len < 5) Py_RETURN_NONE;
    unsigned char kind = s[0];
    if (kind != 'I' && kind != 'U' && kind != 'D') Py_RETURN_NONE;
    unsigned long relid = (unsigned long)s[1] << 24 | (unsigned long)s[2] << 16 | (unsigned long)s[3] << 8 |
                          (unsigned long)s[4];
    PyObject *new_row = NULL, *old_row = NULL;
    int absent_new = 0, absent_old = 0, oom = 0;
    if (kind != 'D') {
        new_row = read_row(s, len, &off, unchanged, &absent_new, &oom);
        if (new_row == NULL) goto fail;
    }
    if (kind != 'I') {
        old_row = read_row(s, len, &off, unchanged, &absent_old, &oom);
        if (old_row == NULL) goto fail;
    }
    if (off != len) goto fail;
    const char *old_kind = old_row == NULL ? NULL : absent_old ? "K" : "O";
    PyObject *out = Py_BuildValue("(CkOOz)", (int)kind, relid, new_row ? new_row : Py_None,
                                  old_row ? old_row : Py_None, old_kind);
    Py_XDECREF(new_row);
    Py_XDECREF(old_row);
    return out;
fail:
    Py_XDECREF(new_row);
    Py_XDECREF(old_row);
    if (oom) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"parse", parse, METH_VARARGS,
     "parse(raw, unchanged) -> (kind, relid, new, old, old_kind), or None (parse in Python)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_payloadcodec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__payloadcodec(void) { return PyModule_Create(&moduledef); }
