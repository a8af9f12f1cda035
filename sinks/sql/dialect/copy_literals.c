/* PostgreSQL COPY text rows -> MySQL/MariaDB literal rows "(v1,v2,...)", for the initial copy into MySQL targets.
 *
 * A CPython extension module (built by cdc/cbuild.py). Two functions:
 *
 *   render(data: bytes, kinds: bytes, scales: tuple[int, ...], max_bytes: int, max_rows: int)
 *       -> (list[bytes], rows) | (None, index)
 *
 * ``data`` holds whole COPY text lines, each ended by '\n'. Each line becomes one literal row, exactly the text that
 * the sink's Python path (sinks/sql/dialect/copy_literals.py, the reference) makes of the same line: split on TAB,
 * COPY escapes undone, the column's PostgreSQL parser, the MySQL converter, the MySQL literal. Rows are joined with
 * ',' into bodies of at most ``max_rows`` rows and ``max_bytes`` bytes (a single larger row is a body of its own).
 * C renders only the forms it recognises exactly (PostgreSQL's canonical output of the column's type); at the first
 * line holding anything else (a NaN or infinite value, a numeric with non-zero digits beyond ``scales[i]``, a BC or
 * 5-digit year, a time zone other than +00, a backslash in a non-text value, a wrong column count) it returns
 * (None, index of that line): the caller then takes the Python path, which decides, or raises the precise error.
 *
 *   render_load(data, kinds, scales, max_bytes, max_rows) -> (list[tuple[bytes, int]], rows) | (None, index)
 *
 * The same lines, the same acceptance (a line is rendered by one function exactly when it is by the other), as the
 * input of MySQL's ``LOAD DATA`` in its default format instead: each value is its literal's text without the quotes
 * (so the server converts the same string, or for numbers the same digits, to the column's type), fields separated
 * by TAB, each row ended by '\n', NULL as \N, and in text values NUL, TAB, LF, CR and backslash written as the
 * format's escapes \0 \t \n \r \\ (every other byte as itself). Bodies are (text, rows in it), cut as render's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <math.h>

enum { K_INT = 1, K_BOOL, K_TEXT, K_NUMERIC, K_FLOAT, K_DATE, K_TIME, K_TIMESTAMP, K_TIMESTAMPTZ, K_UUID };

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} buf_t;

static int reserve(buf_t *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra)
        cap *= 2;
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(buf_t *b, const char *s, Py_ssize_t n) {
    if (reserve(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

static inline int isdig(char c) { return c >= '0' && c <= '9'; }

/* 1: recognised and written; 0: not recognised; -1: error (exception set) */

static int r_int(buf_t *o, const char *f, Py_ssize_t n) {
    Py_ssize_t i = 0;
    if (n > 0 && f[0] == '-')
        i = 1;
    if (i == n || n - i > 40)
        return 0;
    if (f[i] == '0' && n - i > 1)
        return 0; /* leading zero: int() would drop it */
    if (i == 1 && f[1] == '0')
        return 0; /* -0 */
    for (Py_ssize_t j = i; j < n; j++)
        if (!isdig(f[j]))
            return 0;
    return put(o, f, n) < 0 ? -1 : 1;
}

static int r_bool(buf_t *o, const char *f, Py_ssize_t n) {
    if (n != 1 || (f[0] != 't' && f[0] != 'f'))
        return 0;
    return put(o, f[0] == 't' ? "1" : "0", 1) < 0 ? -1 : 1;
}

static int r_text(buf_t *o, const char *f, Py_ssize_t n) {
    if (reserve(o, 2 * n + 2) < 0)
        return -1;
    char *d = o->p + o->len;
    *d++ = '\'';
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = f[i];
        if (c == '\\' && i + 1 < n) { /* COPY's escapes (copy_unescape: \X is X for any other X) */
            c = f[++i];
            switch (c) {
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'v': c = '\v'; break;
            default: break;
            }
        }
        switch (c) { /* pymysql escape_string */
        case '\0': *d++ = '\\'; *d++ = '0'; break;
        case '\n': *d++ = '\\'; *d++ = 'n'; break;
        case '\r': *d++ = '\\'; *d++ = 'r'; break;
        case '\x1a': *d++ = '\\'; *d++ = 'Z'; break;
        case '"': *d++ = '\\'; *d++ = '"'; break;
        case '\'': *d++ = '\\'; *d++ = '\''; break;
        case '\\': *d++ = '\\'; *d++ = '\\'; break;
        default: *d++ = c;
        }
    }
    *d++ = '\'';
    o->len = d - o->p;
    return 1;
}

/* a text value as a LOAD DATA field: COPY's escapes undone as r_text does, then the load format's escapes */
static int r_text_load(buf_t *o, const char *f, Py_ssize_t n) {
    if (reserve(o, 2 * n) < 0)
        return -1;
    char *d = o->p + o->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = f[i];
        if (c == '\\' && i + 1 < n) {
            c = f[++i];
            switch (c) {
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'v': c = '\v'; break;
            default: break;
            }
        }
        switch (c) {
        case '\0': *d++ = '\\'; *d++ = '0'; break;
        case '\t': *d++ = '\\'; *d++ = 't'; break;
        case '\n': *d++ = '\\'; *d++ = 'n'; break;
        case '\r': *d++ = '\\'; *d++ = 'r'; break;
        case '\\': *d++ = '\\'; *d++ = '\\'; break;
        default: *d++ = c;
        }
    }
    o->len = d - o->p;
    return 1;
}

static int r_numeric(buf_t *o, const char *f, Py_ssize_t n, long scale) {
    Py_ssize_t i = 0;
    if (n > 0 && f[0] == '-')
        i = 1;
    Py_ssize_t start = i;
    while (i < n && isdig(f[i]))
        i++;
    Py_ssize_t intdigits = i - start;
    if (intdigits == 0 || (intdigits > 1 && f[start] == '0'))
        return 0;
    if (i < n) {
        if (f[i] != '.' || i + 1 == n)
            return 0;
        Py_ssize_t frac = ++i;
        while (i < n && isdig(f[i]))
            i++;
        if (i != n)
            return 0;
        if (scale >= 0 && n - frac > scale) /* refused by the Python path if a digit beyond the scale is not 0 */
            for (Py_ssize_t j = frac + scale; j < n; j++)
                if (f[j] != '0')
                    return 0;
    }
    return put(o, f, n) < 0 ? -1 : 1;
}

static int r_float(buf_t *o, const char *f, Py_ssize_t n) {
    char tmp[64];
    if (n == 0 || n >= (Py_ssize_t)sizeof tmp)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = f[i];
        if (!(isdig(c) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
            return 0;
    }
    memcpy(tmp, f, (size_t)n);
    tmp[n] = 0;
    char *end = NULL;
    double v = PyOS_string_to_double(tmp, &end, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (end != tmp + n || !isfinite(v))
        return 0;
    char *r = PyOS_double_to_string(v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (r == NULL)
        return -1;
    size_t rl = strlen(r);
    int rc = put(o, r, (Py_ssize_t)rl);
    if (rc == 0 && strchr(r, 'e') == NULL)
        rc = put(o, "e0", 2); /* a DOUBLE literal, not a DECIMAL one */
    PyMem_Free(r);
    return rc < 0 ? -1 : 1;
}

static int num2(const char *f) { return (f[0] - '0') * 10 + (f[1] - '0'); }

/* YYYY-MM-DD, a date Python's date() takes (year 1..9999) */
static int valid_date(const char *f) {
    for (int i = 0; i < 10; i++)
        if (i == 4 || i == 7 ? f[i] != '-' : !isdig(f[i]))
            return 0;
    int y = (f[0] - '0') * 1000 + (f[1] - '0') * 100 + num2(f + 2), m = num2(f + 5), d = num2(f + 8);
    static const int dim[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 1 || m < 1 || m > 12 || d < 1)
        return 0;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= dim[m - 1] + (m == 2 && leap);
}

/* HH:MM:SS[.f{1,6}] (exactly n bytes) written as 'HH:MM:SS.ffffff' without quotes */
static int r_clock(buf_t *o, const char *f, Py_ssize_t n) {
    if (n < 8 || n == 9 || n > 15)
        return 0;
    for (int i = 0; i < 8; i++)
        if (i == 2 || i == 5 ? f[i] != ':' : !isdig(f[i]))
            return 0;
    if (num2(f) > 23 || num2(f + 3) > 59 || num2(f + 6) > 59)
        return 0;
    char out[15];
    memcpy(out, f, 8);
    out[8] = '.';
    memset(out + 9, '0', 6);
    if (n > 8) {
        if (f[8] != '.')
            return 0;
        for (Py_ssize_t i = 9; i < n; i++) {
            if (!isdig(f[i]))
                return 0;
            out[i] = f[i];
        }
    }
    return put(o, out, 15) < 0 ? -1 : 1;
}

static int r_quoted(buf_t *o, int (*inner)(buf_t *, const char *, Py_ssize_t), const char *f, Py_ssize_t n,
                    int load) {
    if (load)
        return inner(o, f, n);
    Py_ssize_t mark = o->len;
    if (put(o, "'", 1) < 0)
        return -1;
    int rc = inner(o, f, n);
    if (rc != 1) {
        o->len = mark;
        return rc;
    }
    return put(o, "'", 1) < 0 ? -1 : 1;
}

static int i_date(buf_t *o, const char *f, Py_ssize_t n) {
    if (n != 10 || !valid_date(f))
        return 0;
    return put(o, f, 10) < 0 ? -1 : 1;
}

static int i_time(buf_t *o, const char *f, Py_ssize_t n) { return r_clock(o, f, n); }

static int i_timestamp(buf_t *o, const char *f, Py_ssize_t n) {
    if (n < 19 || f[10] != ' ' || !valid_date(f))
        return 0;
    if (put(o, f, 11) < 0)
        return -1;
    int rc = r_clock(o, f + 11, n - 11);
    return rc;
}

static int i_timestamptz(buf_t *o, const char *f, Py_ssize_t n) {
    if (n < 22 || memcmp(f + n - 3, "+00", 3) != 0)
        return 0;
    return i_timestamp(o, f, n - 3);
}

static int i_uuid(buf_t *o, const char *f, Py_ssize_t n) {
    if (n != 36)
        return 0;
    for (int i = 0; i < 36; i++) {
        char c = f[i];
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (c != '-')
                return 0;
        } else if (!(isdig(c) || (c >= 'a' && c <= 'f'))) {
            return 0;
        }
    }
    return put(o, f, 36) < 0 ? -1 : 1;
}

static int flush_body(PyObject *bodies, buf_t *body, int load, Py_ssize_t rows) {
    PyObject *b = load ? Py_BuildValue("(y#n)", body->p, body->len, rows)
                       : PyBytes_FromStringAndSize(body->p, body->len);
    if (b == NULL)
        return -1;
    int rc = PyList_Append(bodies, b);
    Py_DECREF(b);
    body->len = 0;
    return rc;
}

static PyObject *render_any(PyObject *args, int load) {
    Py_buffer data, kinds;
    PyObject *scales_obj;
    Py_ssize_t max_bytes, max_rows;
    if (!PyArg_ParseTuple(args, "y*y*O!nn", &data, &kinds, &PyTuple_Type, &scales_obj, &max_bytes, &max_rows))
        return NULL;
    PyObject *result = NULL, *bodies = NULL;
    buf_t body = {0}, row = {0};
    long *scales = NULL;
    Py_ssize_t ncols = kinds.len;
    const unsigned char *kind = kinds.buf;
    if (PyTuple_GET_SIZE(scales_obj) != ncols || ncols == 0) {
        PyErr_SetString(PyExc_ValueError, "one kind and one scale per column");
        goto done;
    }
    scales = PyMem_Malloc(sizeof(long) * (size_t)ncols);
    if (scales == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        scales[i] = PyLong_AsLong(PyTuple_GET_ITEM(scales_obj, i));
        if (scales[i] == -1 && PyErr_Occurred())
            goto done;
    }
    bodies = PyList_New(0);
    if (bodies == NULL)
        goto done;
    const char *p = data.buf, *end = p + data.len;
    Py_ssize_t line = 0, in_body = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) {
            PyErr_SetString(PyExc_ValueError, "data must end with a newline");
            goto done;
        }
        row.len = 0;
        int ok = load ? 1 : (put(&row, "(", 1) < 0 ? -1 : 1);
        const char *f = p;
        for (Py_ssize_t c = 0; ok == 1; c++) {
            const char *tab = memchr(f, '\t', (size_t)(nl - f));
            const char *fe = tab ? tab : nl;
            if (c >= ncols || (tab == NULL) != (c == ncols - 1)) {
                ok = 0; /* wrong column count */
                break;
            }
            Py_ssize_t n = fe - f;
            if (c > 0 && put(&row, load ? "\t" : ",", 1) < 0) {
                ok = -1;
                break;
            }
            if (n == 2 && f[0] == '\\' && f[1] == 'N') {
                ok = (load ? put(&row, "\\N", 2) : put(&row, "NULL", 4)) < 0 ? -1 : 1;
            } else if (kind[c] != K_TEXT && memchr(f, '\\', (size_t)n) != NULL) {
                ok = 0;
            } else {
                switch (kind[c]) {
                case K_INT: ok = r_int(&row, f, n); break;
                case K_BOOL: ok = r_bool(&row, f, n); break;
                case K_TEXT: ok = load ? r_text_load(&row, f, n) : r_text(&row, f, n); break;
                case K_NUMERIC: ok = r_numeric(&row, f, n, scales[c]); break;
                case K_FLOAT: ok = r_float(&row, f, n); break;
                case K_DATE: ok = r_quoted(&row, i_date, f, n, load); break;
                case K_TIME: ok = r_quoted(&row, i_time, f, n, load); break;
                case K_TIMESTAMP: ok = r_quoted(&row, i_timestamp, f, n, load); break;
                case K_TIMESTAMPTZ: ok = r_quoted(&row, i_timestamptz, f, n, load); break;
                case K_UUID: ok = r_quoted(&row, i_uuid, f, n, load); break;
                default: ok = 0;
                }
            }
            if (tab == NULL)
                break;
            f = tab + 1;
        }
        if (ok == 1)
            ok = (load ? put(&row, "\n", 1) : put(&row, ")", 1)) < 0 ? -1 : 1;
        if (ok < 0)
            goto done;
        if (ok == 0) {
            Py_CLEAR(bodies);
            result = Py_BuildValue("(On)", Py_None, line);
            goto done;
        }
        if (in_body && (in_body >= max_rows || body.len + 1 + row.len > max_bytes)) {
            if (flush_body(bodies, &body, load, in_body) < 0)
                goto done;
            in_body = 0;
        }
        if ((in_body && !load && put(&body, ",", 1) < 0) || put(&body, row.p, row.len) < 0)
            goto done;
        in_body++;
        line++;
        p = nl + 1;
    }
    if (in_body && flush_body(bodies, &body, load, in_body) < 0)
        goto done;
    result = Py_BuildValue("(On)", bodies, line);
done:
    Py_XDECREF(bodies);
    PyMem_Free(body.p);
    PyMem_Free(row.p);
    PyMem_Free(scales);
    PyBuffer_Release(&data);
    PyBuffer_Release(&kinds);
    return result;
}

static PyObject *render(PyObject *self, PyObject *args) { return render_any(args, 0); }

static PyObject *render_load(PyObject *self, PyObject *args) { return render_any(args, 1); }

static PyMethodDef methods[] = {
    {"render", render, METH_VARARGS, "COPY text lines -> MySQL literal row bodies (see the file's comment)."},
    {"render_load", render_load, METH_VARARGS, "COPY text lines -> MySQL LOAD DATA bodies (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_copy_literals", NULL, -1, methods};

PyMODINIT_FUNC PyInit__copy_literals(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "INT", K_INT) < 0 || PyModule_AddIntConstant(m, "BOOL", K_BOOL) < 0 ||
        PyModule_AddIntConstant(m, "TEXT", K_TEXT) < 0 || PyModule_AddIntConstant(m, "NUMERIC", K_NUMERIC) < 0 ||
        PyModule_AddIntConstant(m, "FLOAT", K_FLOAT) < 0 || PyModule_AddIntConstant(m, "DATE", K_DATE) < 0 ||
        PyModule_AddIntConstant(m, "TIME", K_TIME) < 0 || PyModule_AddIntConstant(m, "TIMESTAMP", K_TIMESTAMP) < 0 ||
        PyModule_AddIntConstant(m, "TIMESTAMPTZ", K_TIMESTAMPTZ) < 0 ||
        PyModule_AddIntConstant(m, "UUID", K_UUID) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
