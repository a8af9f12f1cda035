/* The SQL sink's per-row text rendering in C (sinks/sql/dialect/rowtext.py compiles and loads this).
 *
 * A CPython extension module with the same functions as the pure-Python reference in rowtext.py:
 *   copy_text(texts)                                   rows of upstream text as COPY text-format data (PostgreSQL)
 *   mysql_statements(params, head, tail, limit, literal, plain_str)
 *                                                      multi-row INSERT statements of literal rows (MySQL/MariaDB)
 *   RowConverter(fallback, with_text, specs)         sinks.sql.target.binding.row_function's generated function
 * The rule that keeps the results the Python ones: C renders only the values it recognises exactly (exact types:
 * None, bool, int, str, float, Decimal, naive datetime/date/time); every other value goes to the Python ``literal``
 * function, and any input of a shape C does not expect (a row that is not a tuple or list, a text that is not a str,
 * a str that is not encodable as UTF-8, a literal that is not a str) makes the whole call run the Python reference
 * (handed over by configure()), which returns the same result or raises the precise error.
 *
 * Text is assembled as UTF-8 and decoded once at the end: every character either function adds or escapes is ASCII,
 * and no byte of a multi-byte UTF-8 sequence is ASCII, so escaping byte by byte is escaping character by character.
 * MySQL statement sizes are counted in characters, as the reference counts them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static PyObject *py_copy_text = NULL;        /* rowtext.copy_text_py */
static PyObject *py_mysql_statements = NULL; /* rowtext.mysql_statements_py */
static PyObject *DecimalType = NULL;         /* decimal.Decimal */

/* ---- a growing UTF-8 buffer ---------------------------------------------------------------------------------- */
typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t need) {
    if (b->n + need <= b->cap) return 1;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return 0;
        }
        cap *= 2;
    }
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

static inline int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (!buf_grow(b, n)) return 0;
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return 1;
}

static inline int buf_byte(Buf *b, char c) {
    if (b->n >= b->cap && !buf_grow(b, 1)) return 0;
    b->p[b->n++] = c;
    return 1;
}

/* The UTF-8 bytes of str v: its own data when ASCII, else a temporary encoding in *tmp (the caller releases it; no
 * UTF-8 copy is cached on the row's str, which lives as long as the batch). NULL with no error set: not encodable
 * (a lone surrogate). */
static const char *utf8_of(PyObject *v, Py_ssize_t *n, PyObject **tmp) {
    *tmp = NULL;
    if (PyUnicode_IS_ASCII(v)) {
        *n = PyUnicode_GET_LENGTH(v);
        return (const char *)PyUnicode_DATA(v);
    }
    *tmp = PyUnicode_AsUTF8String(v);
    if (*tmp == NULL) {
        PyErr_Clear();
        return NULL;
    }
    *n = PyBytes_GET_SIZE(*tmp);
    return PyBytes_AS_STRING(*tmp);
}

/* ---- COPY text ------------------------------------------------------------------------------------------------ */
/* One value in COPY's text format (NULL as \N; backslash, tab, newline and CR escaped). 1 done; 0 error set;
 * -1 not recognised (not a str, or not encodable). */
static int copy_value(Buf *b, PyObject *v) {
    if (v == Py_None) return buf_put(b, "\\N", 2);
    if (!PyUnicode_CheckExact(v)) return -1;
    Py_ssize_t n;
    PyObject *tmp;
    const char *s = utf8_of(v, &n, &tmp);
    if (s == NULL) return -1;
    if (!buf_grow(b, 2 * n)) {
        Py_XDECREF(tmp);
        return 0;
    }
    char *o = b->p + b->n;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        switch (c) {
        case '\\': *o++ = '\\'; *o++ = '\\'; break;
        case '\t': *o++ = '\\'; *o++ = 't'; break;
        case '\n': *o++ = '\\'; *o++ = 'n'; break;
        case '\r': *o++ = '\\'; *o++ = 'r'; break;
        default: *o++ = c;
        }
    }
    b->n = o - b->p;
    Py_XDECREF(tmp);
    return 1;
}

/* 1 done; 0 error set; -1 not recognised */
static int copy_rows(Buf *b, PyObject *texts) {
    if (!PyList_CheckExact(texts) && !PyTuple_CheckExact(texts)) return -1;  /* (an iterator would be consumed) */
    PyObject *seq = Py_NewRef(texts);
    Py_ssize_t nrows = PySequence_Fast_GET_SIZE(seq);
    PyObject **rows = PySequence_Fast_ITEMS(seq);
    int rc = 1;
    for (Py_ssize_t r = 0; r < nrows && rc == 1; r++) {
        PyObject *t = rows[r];
        if (!PyTuple_CheckExact(t) && !PyList_CheckExact(t)) {
            rc = -1;
            break;
        }
        Py_ssize_t n = PySequence_Fast_GET_SIZE(t);
        PyObject **vals = PySequence_Fast_ITEMS(t);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i && !buf_byte(b, '\t')) { rc = 0; break; }
            rc = copy_value(b, vals[i]);
            if (rc != 1) break;
        }
        if (rc == 1 && !buf_byte(b, '\n')) rc = 0;
    }
    Py_DECREF(seq);
    return rc;
}

static PyObject *rt_copy_text(PyObject *self, PyObject *texts) {
    if (py_copy_text == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rowtext: configure() was not called");
        return NULL;
    }
    Buf b = {NULL, 0, 0};
    int rc = copy_rows(&b, texts);
    PyObject *out = NULL;
    if (rc == 1) out = PyBytes_FromStringAndSize(b.p ? b.p : "", b.n); /* UTF-8: utf8_of encoded every value */
    PyMem_Free(b.p);
    if (rc == -1) { /* the reference's text, encoded as it encodes it */
        PyObject *text = PyObject_CallOneArg(py_copy_text, texts);
        if (text == NULL) return NULL;
        out = PyUnicode_Check(text) ? PyUnicode_AsUTF8String(text) : NULL;
        if (out == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "copy_text_py did not return a str");
        Py_DECREF(text);
    }
    return out;
}

/* ---- MySQL literals -------------------------------------------------------------------------------------------- */
/* One value as a MySQL literal, appended to b; *chars += its length in characters. 1 done; 0 error set; -1 not
 * recognised (the caller runs the Python reference for the whole call). */
static int mysql_value(Buf *b, Py_ssize_t *chars, PyObject *v, PyObject *literal, int plain_str) {
    char tmp[64];
    int k;
    PyTypeObject *t = Py_TYPE(v);
    if (v == Py_None) {
        *chars += 4;
        return buf_put(b, "NULL", 4);
    }
    if (t == &PyBool_Type) {
        *chars += 1;
        return buf_byte(b, v == Py_True ? '1' : '0');
    }
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow && !(x == -1 && PyErr_Occurred())) {
            k = snprintf(tmp, sizeof tmp, "%lld", x);
            *chars += k;
            return buf_put(b, tmp, k);
        }
        PyErr_Clear();
        goto call;  /* (int.__repr__ through literal: its own limits and errors) */
    }
    if (t == &PyUnicode_Type && plain_str) {
        Py_ssize_t n;
        PyObject *enc;
        const char *s = utf8_of(v, &n, &enc);
        if (s == NULL) return -1;
        if (!buf_grow(b, 2 * n + 2)) {
            Py_XDECREF(enc);
            return 0;
        }
        char *o = b->p + b->n;
        Py_ssize_t extra = 0;
        *o++ = '\'';
        for (Py_ssize_t i = 0; i < n; i++) {
            char c = s[i];
            switch (c) {  /* pymysql.converters.escape_string's table */
            case '\0': *o++ = '\\'; *o++ = '0'; extra++; break;
            case '\n': *o++ = '\\'; *o++ = 'n'; extra++; break;
            case '\r': *o++ = '\\'; *o++ = 'r'; extra++; break;
            case '\x1a': *o++ = '\\'; *o++ = 'Z'; extra++; break;
            case '"': *o++ = '\\'; *o++ = '"'; extra++; break;
            case '\'': *o++ = '\\'; *o++ = '\''; extra++; break;
            case '\\': *o++ = '\\'; *o++ = '\\'; extra++; break;
            default: *o++ = c;
            }
        }
        *o++ = '\'';
        b->n = o - b->p;
        *chars += PyUnicode_GET_LENGTH(v) + extra + 2;
        Py_XDECREF(enc);
        return 1;
    }
    if (t == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(v);
        if (!isfinite(d)) goto call;  /* (raises there: MySQL has no NaN/Infinity) */
        PyObject *r = PyObject_Repr(v);
        if (r == NULL) return 0;
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(r, &n);
        int ok = s != NULL && buf_put(b, s, n);
        if (ok && memchr(s, 'e', (size_t)n) == NULL) {
            ok = buf_put(b, "e0", 2);  /* a DOUBLE literal, not a DECIMAL one */
            n += 2;
        }
        *chars += n;
        Py_DECREF(r);
        return ok;
    }
    if (PyDateTime_CheckExact(v)) {
        if (PyDateTime_DATE_GET_TZINFO(v) != Py_None) goto call;
        k = snprintf(tmp, sizeof tmp, "'%04d-%02d-%02d %02d:%02d:%02d.%06d'", PyDateTime_GET_YEAR(v),
                     PyDateTime_GET_MONTH(v), PyDateTime_GET_DAY(v), PyDateTime_DATE_GET_HOUR(v),
                     PyDateTime_DATE_GET_MINUTE(v), PyDateTime_DATE_GET_SECOND(v), PyDateTime_DATE_GET_MICROSECOND(v));
        *chars += k;
        return buf_put(b, tmp, k);
    }
    if (PyDate_CheckExact(v)) {
        k = snprintf(tmp, sizeof tmp, "'%04d-%02d-%02d'", PyDateTime_GET_YEAR(v), PyDateTime_GET_MONTH(v),
                     PyDateTime_GET_DAY(v));
        *chars += k;
        return buf_put(b, tmp, k);
    }
    if (PyTime_CheckExact(v)) {
        if (PyDateTime_TIME_GET_TZINFO(v) != Py_None) goto call;
        k = snprintf(tmp, sizeof tmp, "'%02d:%02d:%02d.%06d'", PyDateTime_TIME_GET_HOUR(v),
                     PyDateTime_TIME_GET_MINUTE(v), PyDateTime_TIME_GET_SECOND(v),
                     PyDateTime_TIME_GET_MICROSECOND(v));
        *chars += k;
        return buf_put(b, tmp, k);
    }
    if ((PyObject *)t == DecimalType) {
        /* str() unless it chose exponent notation or v is not finite (no final digit): then literal decides */
        PyObject *s = PyObject_Str(v);
        if (s == NULL) return 0;
        Py_ssize_t n;
        const char *u = PyUnicode_AsUTF8AndSize(s, &n);
        if (u == NULL) {
            Py_DECREF(s);
            return 0;
        }
        if (n > 0 && memchr(u, 'E', (size_t)n) == NULL && u[n - 1] >= '0' && u[n - 1] <= '9') {
            int ok = buf_put(b, u, n);
            *chars += n;
            Py_DECREF(s);
            return ok;
        }
        Py_DECREF(s);
        goto call;
    }
call:;
    PyObject *r = PyObject_CallOneArg(literal, v);
    if (r == NULL) return 0;
    if (!PyUnicode_CheckExact(r)) {
        Py_DECREF(r);
        return -1;
    }
    Py_ssize_t n;
    PyObject *enc;
    const char *s = utf8_of(r, &n, &enc);
    if (s == NULL) {
        Py_DECREF(r);
        return -1;
    }
    int ok = buf_put(b, s, n);
    *chars += PyUnicode_GET_LENGTH(r);
    Py_XDECREF(enc);
    Py_DECREF(r);
    return ok;
}

/* Appends one statement, head + the rows in rows + tail, to out. */
static int emit(PyObject *out, const char *head, Py_ssize_t nhead, Buf *rows, const char *tail, Py_ssize_t ntail,
                Buf *stmt) {
    stmt->n = 0;
    if (!buf_put(stmt, head, nhead) || !buf_put(stmt, rows->p, rows->n) || !buf_put(stmt, tail, ntail)) return 0;
    PyObject *s = PyUnicode_DecodeUTF8(stmt->p, stmt->n, "strict");
    if (s == NULL) return 0;
    int rc = PyList_Append(out, s);
    Py_DECREF(s);
    return rc == 0;
}

/* One row appended to rows (a statement emitted first when it would pass limit). 1 done; 0 error; -1 not recognised */
static int mysql_row(Buf *rowsb, Buf *stmt, PyObject *out, PyObject *row, const char *h, Py_ssize_t nhead,
                     const char *tl, Py_ssize_t ntail, Py_ssize_t limit, PyObject *literal, int plain_str,
                     Py_ssize_t *pending, Py_ssize_t *size, Py_ssize_t base) {
    Buf *b = rowsb;
    Py_ssize_t start = b->n, chars = 2;
    if (*pending && !buf_byte(b, ',')) return 0;
    Py_ssize_t text_at = b->n;
    if (!buf_byte(b, '(')) return 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(row); i++) {
        if (i) {
            if (!buf_byte(b, ',')) return 0;
            chars++;
        }
        PyObject *v = PySequence_Fast_GET_ITEM(row, i);
        Py_INCREF(v);
        int rc = mysql_value(b, &chars, v, literal, plain_str);
        Py_DECREF(v);
        if (rc != 1) return rc;
    }
    if (!buf_byte(b, ')')) return 0;
    if (*pending && *size + chars > limit) {  /* this row starts the next statement */
        Py_ssize_t len = b->n - text_at;
        b->n = start;
        if (!emit(out, h, nhead, b, tl, ntail, stmt)) return 0;
        memmove(b->p, b->p + text_at, (size_t)len);
        b->n = len;
        *pending = 0;
        *size = base;
    }
    (*pending)++;
    *size += chars + 1;
    return 1;
}

/* 1 done (*result set); 0 error set; -1 not recognised */
static int mysql_run(PyObject *params, PyObject *head, PyObject *tail, Py_ssize_t limit, PyObject *literal,
                     int plain_str, PyObject **result) {
    Py_ssize_t nhead, ntail;
    const char *h = PyUnicode_AsUTF8AndSize(head, &nhead);
    const char *tl = h ? PyUnicode_AsUTF8AndSize(tail, &ntail) : NULL;
    if (tl == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (!PyList_CheckExact(params) && !PyTuple_CheckExact(params)) return -1;  /* (an iterator would be consumed) */
    PyObject *seq = Py_NewRef(params);
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        Py_DECREF(seq);
        return 0;
    }
    Buf rows = {NULL, 0, 0}, stmt = {NULL, 0, 0};
    Py_ssize_t pending = 0;
    Py_ssize_t base = PyUnicode_GET_LENGTH(head) + PyUnicode_GET_LENGTH(tail), size = base;
    int rc = 1;
    /* (literal() may run any code: the lists are re-read and the row held, as Python's loops do) */
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(seq); r++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, r);
        if (!PyTuple_CheckExact(row) && !PyList_CheckExact(row)) {
            rc = -1;
            break;
        }
        Py_INCREF(row);
        rc = mysql_row(&rows, &stmt, out, row, h, nhead, tl, ntail, limit, literal, plain_str, &pending, &size,
                       base);
        Py_DECREF(row);
        if (rc != 1) break;
    }
    if (rc == 1 && pending && !emit(out, h, nhead, &rows, tl, ntail, &stmt)) rc = 0;
    PyMem_Free(rows.p);
    PyMem_Free(stmt.p);
    Py_DECREF(seq);
    if (rc == 1)
        *result = out;
    else
        Py_DECREF(out);
    return rc;
}

static PyObject *rt_mysql_statements(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "mysql_statements(params, head, tail, limit, literal, plain_str)");
        return NULL;
    }
    if (py_mysql_statements == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rowtext: configure() was not called");
        return NULL;
    }
    PyObject *params = args[0], *head = args[1], *tail = args[2], *literal = args[4];
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    int plain_str = PyObject_IsTrue(args[5]);
    if ((limit == -1 || plain_str < 0) && PyErr_Occurred()) return NULL;
    int rc = -1;
    PyObject *result = NULL;
    if (PyUnicode_CheckExact(head) && PyUnicode_CheckExact(tail))
        rc = mysql_run(params, head, tail, limit, literal, plain_str, &result);
    if (rc == 1) return result;
    if (rc == 0) return NULL;
    return PyObject_Vectorcall(py_mysql_statements, args, 5, NULL);  /* (the reference takes no plain_str) */
}

/* ---- parameter rows: the generated row functions of sinks.sql.target.binding.row_function ----------------------- */
/* Per column, what the generated lambda computes (values.py: fast_path, text_path, keeps):
 *   (g(s[i]) if type(r[i]) is U else None) or (f(r[i]) if type(r[i]) is T else (None if r[i] is None else
 *   (r[i] if type(r[i]) is K and r[i].<keep>() else c(r[i]))))
 * each part only where the converter declares it. g may be one of the text functions below, run in C on an ASCII
 * str (any other argument: the Python function). */
enum { G_CALL = 0, G_SAME = 1, G_TIMESTAMPTZ = 2, G_TIMESTAMP = 3, G_MYSQL_TIMESTAMPTZ = 4 };

typedef struct {
    PyObject *conv;        /* NULL: the value as it is */
    PyObject *fast_t, *fast_f;
    PyObject *text_t, *text_g;
    int gcode;
    PyObject *keep_t, *keep_m;  /* r is returned as it is when type(r) is keep_t and r.keep_m() is true */
} Col;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    int with_text;
    PyObject *fallback;  /* the generated Python function */
    PyObject *specs;
    Col *cols;
} RowConv;

/* values._iso_text on an ASCII str: NULL with no error set when not recognised (the result is None) */
static PyObject *iso_text(PyObject *t, const char *offset, const char *suffix) {
    Py_ssize_t len = PyUnicode_GET_LENGTH(t), lo = (Py_ssize_t)strlen(offset), ls = (Py_ssize_t)strlen(suffix);
    const char *c = (const char *)PyUnicode_DATA(t);
    Py_ssize_t n = len - lo;
    if (n < 19 || n > 26 || n == 20 || c[4] != '-' || c[7] != '-' || c[10] != ' ' || c[13] != ':' || c[16] != ':' ||
        memcmp(c + n, offset, (size_t)lo) != 0)
        return NULL;
    char out[64];
    if (n == 19) {
        memcpy(out, c, 19);
        memcpy(out + 19, ".000000", 7);
        memcpy(out + 26, suffix, (size_t)ls);
        return PyUnicode_FromStringAndSize(out, 26 + ls);
    }
    if (c[19] != '.') return NULL;
    memcpy(out, c, (size_t)n);
    memset(out + n, '0', (size_t)(26 - n));
    memcpy(out + 26, suffix, (size_t)ls);
    return PyUnicode_FromStringAndSize(out, 26 + ls);
}

/* g(s): a new reference (Py_None for None), NULL on error */
static PyObject *text_fn(Col *col, PyObject *s) {
    if (col->gcode == G_SAME) return Py_NewRef(s);
    if (col->gcode != G_CALL && PyUnicode_CheckExact(s) && PyUnicode_IS_ASCII(s)) {
        PyObject *r;
        if (col->gcode == G_TIMESTAMPTZ)
            r = iso_text(s, "+00", "+00:00");
        else if (col->gcode == G_TIMESTAMP)
            r = iso_text(s, "", "");
        else
            r = iso_text(s, "+00", "");
        if (r != NULL || PyErr_Occurred()) return r;
        Py_RETURN_NONE;
    }
    return PyObject_CallOneArg(col->text_g, s);
}

/* one converted value (new reference); NULL on error; *bad = 1: s[i] is not there (the Python function decides) */
static PyObject *convert_value(Col *col, PyObject *v, PyObject *s, Py_ssize_t i, int *bad) {
    PyObject *t = (PyObject *)Py_TYPE(v);
    if (col->conv == NULL) return Py_NewRef(v);
    if (col->text_g != NULL && t == col->text_t) {
        if (s == NULL || i >= PySequence_Fast_GET_SIZE(s)) {
            *bad = 1;
            return NULL;
        }
        PyObject *x = text_fn(col, PySequence_Fast_GET_ITEM(s, i));
        if (x == NULL) return NULL;
        int truth = PyObject_IsTrue(x);
        if (truth < 0) {
            Py_DECREF(x);
            return NULL;
        }
        if (truth) return x;
        Py_DECREF(x);
    }
    if (col->fast_f != NULL && t == col->fast_t) return PyObject_CallOneArg(col->fast_f, v);
    if (v == Py_None) Py_RETURN_NONE;
    if (col->keep_m != NULL && t == col->keep_t) {
        PyObject *k = PyObject_CallMethodNoArgs(v, col->keep_m);
        if (k == NULL) return NULL;
        int truth = PyObject_IsTrue(k);
        Py_DECREF(k);
        if (truth < 0) return NULL;
        if (truth) return Py_NewRef(v);
    }
    return PyObject_CallOneArg(col->conv, v);
}

static PyObject *rowconv_call(RowConv *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (kwargs != NULL || nargs != (self->with_text ? 2 : 1)) return PyObject_Call(self->fallback, args, kwargs);
    PyObject *r = PyTuple_GET_ITEM(args, 0), *s = self->with_text ? PyTuple_GET_ITEM(args, 1) : NULL;
    if ((!PyTuple_CheckExact(r) && !PyList_CheckExact(r)) ||
        (s != NULL && !PyTuple_CheckExact(s) && !PyList_CheckExact(s)))
        return PyObject_Call(self->fallback, args, NULL);
    Py_INCREF(r);
    Py_XINCREF(s);
    PyObject *out = PyTuple_New(self->n);
    int bad = 0;
    for (Py_ssize_t i = 0; out != NULL && i < self->n; i++) {
        if (i >= PySequence_Fast_GET_SIZE(r)) {
            bad = 1;
            break;
        }
        PyObject *v = PySequence_Fast_GET_ITEM(r, i);
        Py_INCREF(v);
        PyObject *x = convert_value(&self->cols[i], v, s, i, &bad);
        Py_DECREF(v);
        if (x == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, x);
    }
    Py_DECREF(r);
    Py_XDECREF(s);
    if (bad) {
        Py_XDECREF(out);
        return PyObject_Call(self->fallback, args, NULL);
    }
    return out;
}

static void rowconv_dealloc(RowConv *self) {
    PyMem_Free(self->cols);  /* (borrowed from specs) */
    Py_XDECREF(self->specs);
    Py_XDECREF(self->fallback);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *none_null(PyObject *o) { return o == Py_None ? NULL : o; }

/* RowConverter(fallback, with_text, specs): specs a tuple of per column (conv, fast_t, fast_f, text_t, text_g,
 * gcode, keep_t, keep_m), None where a part is absent */
static PyObject *rowconv_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *fallback, *specs;
    int with_text;
    if (!PyArg_ParseTuple(args, "OpO!", &fallback, &with_text, &PyTuple_Type, &specs)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(specs);
    Col *cols = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Col));
    if (cols == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sp = PyTuple_GET_ITEM(specs, i);
        if (!PyTuple_Check(sp) || PyTuple_GET_SIZE(sp) != 8) {
            PyMem_Free(cols);
            PyErr_SetString(PyExc_TypeError, "RowConverter: a spec is a tuple of 8");
            return NULL;
        }
        Col *c = &cols[i];
        c->conv = none_null(PyTuple_GET_ITEM(sp, 0));
        c->fast_t = PyTuple_GET_ITEM(sp, 1);
        c->fast_f = none_null(PyTuple_GET_ITEM(sp, 2));
        c->text_t = PyTuple_GET_ITEM(sp, 3);
        c->text_g = none_null(PyTuple_GET_ITEM(sp, 4));
        c->gcode = (int)PyLong_AsLong(PyTuple_GET_ITEM(sp, 5));
        c->keep_t = PyTuple_GET_ITEM(sp, 6);
        c->keep_m = none_null(PyTuple_GET_ITEM(sp, 7));
        if (c->gcode < 0 || c->gcode > G_MYSQL_TIMESTAMPTZ) {
            PyMem_Free(cols);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "RowConverter: unknown text code");
            return NULL;
        }
    }
    RowConv *self = (RowConv *)type->tp_alloc(type, 0);
    if (self == NULL) {
        PyMem_Free(cols);
        return NULL;
    }
    self->n = n;
    self->with_text = with_text;
    self->fallback = Py_NewRef(fallback);
    self->specs = Py_NewRef(specs);
    self->cols = cols;
    return (PyObject *)self;
}

static PyTypeObject RowConvType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_rowtext.RowConverter",
    .tp_basicsize = sizeof(RowConv),
    .tp_dealloc = (destructor)rowconv_dealloc,
    .tp_call = (ternaryfunc)rowconv_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "binding.row_function's generated function in C (rowtext.py)",
    .tp_new = rowconv_new,
};

static PyObject *rt_configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "configure(copy_text, mysql_statements, Decimal)");
        return NULL;
    }
    Py_XSETREF(py_copy_text, Py_NewRef(args[0]));
    Py_XSETREF(py_mysql_statements, Py_NewRef(args[1]));
    Py_XSETREF(DecimalType, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))rt_configure, METH_FASTCALL, "hand over the Python references"},
    {"copy_text", (PyCFunction)rt_copy_text, METH_O, "rowtext.copy_text_py in C"},
    {"mysql_statements", (PyCFunction)(void (*)(void))rt_mysql_statements, METH_FASTCALL,
     "rowtext.mysql_statements_py in C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_rowtext", "the SQL sink's per-row text rendering in C", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rowtext(void) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return NULL;
    if (PyType_Ready(&RowConvType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "RowConverter", (PyObject *)&RowConvType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
