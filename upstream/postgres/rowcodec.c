/* The per-row functions of the PostgreSQL change path in C (upstream/postgres/rowcodec.py compiles and loads this).
 *
 * A CPython extension module: the same functions as the pure-Python reference implementations in pgoutput.py and
 * types.py (plain_change_relid, insert_values, parse_change, plain_row, row_parser), with the same results. The rule
 * that makes that hold: C handles only the inputs it recognises exactly (well-formed messages given as bytes, text
 * values in PostgreSQL's canonical output forms); for anything else it calls the Python function it stands in for
 * (handed over by configure()), which decides, raises the precise error, or returns None. A value parser C does not
 * know is called as it is. So C never guesses: it either computes the value Python would, or asks Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <structmember.h>
#include <stddef.h>
#include <string.h>

/* ---- what configure() hands over ----------------------------------------------------------------------------- */
static PyObject *UNCHANGED = NULL;      /* cdc.events.UNCHANGED */
static PyObject *py_relid = NULL;       /* pgoutput.plain_change_relid */
static PyObject *py_insert = NULL;      /* pgoutput.insert_values */
static PyObject *py_parse = NULL;       /* pgoutput.parse_change */
static PyObject *py_plain_row = NULL;   /* pgoutput.plain_row */
static PyObject *make_parsed = NULL;    /* builds a ParsedChange from (kind, relid, new, old, old_kind, options) */
static PyObject *S_I = NULL, *S_U = NULL, *S_D = NULL, *S_K = NULL, *S_O = NULL;

/* value codes (rowcodec.py maps each Python parser to one; CALL: call the parser) */
enum { C_TEXT = 0, C_CALL = 1, C_INT = 2, C_FLOAT = 3, C_BOOL = 4, C_DATE = 5, C_TIME = 6, C_TIMESTAMP = 7,
       C_TIMESTAMPTZ = 8, C_NUMERIC = 9, C_MAX = 9 }; /* C_NUMERIC: called like C_CALL (Decimal); known to defer */

static int configured(void) {
    if (UNCHANGED == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rowcodec: configure() was not called");
        return 0;
    }
    return 1;
}

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* ---- TupleData ------------------------------------------------------------------------------------------------ */
/* The values of the TupleData at buf[pos:]: a new list (str for 't', bytes for 'b', None for 'n', UNCHANGED for
 * 'u'); *end is set to the position after it. NULL with no exception set: not well-formed (the caller asks Python);
 * NULL with an exception set: out of memory. A text value that is not valid UTF-8 counts as not well-formed. */
static PyObject *parse_tuple(const unsigned char *buf, Py_ssize_t len, Py_ssize_t pos, Py_ssize_t *end) {
    if (pos < 0 || pos + 2 > len) return NULL;
    Py_ssize_t ncols = ((Py_ssize_t)buf[pos] << 8) | buf[pos + 1];
    pos += 2;
    PyObject *values = PyList_New(ncols);
    if (values == NULL) return NULL;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (pos >= len) goto malformed;
        unsigned char k = buf[pos];
        PyObject *v;
        if (k == 't' || k == 'b') {
            if (len - pos < 5) goto malformed;
            int32_t n = (int32_t)be32(buf + pos + 1);
            pos += 5;
            if (n < 0 || (Py_ssize_t)n > len - pos) goto malformed;
            if (k == 't') {
                v = PyUnicode_DecodeUTF8((const char *)buf + pos, n, NULL);
                if (v == NULL) {
                    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                        PyErr_Clear();
                        goto malformed;
                    }
                    Py_DECREF(values);
                    return NULL;
                }
            } else {
                v = PyBytes_FromStringAndSize((const char *)buf + pos, n);
                if (v == NULL) {
                    Py_DECREF(values);
                    return NULL;
                }
            }
            pos += n;
        } else if (k == 'n') {
            v = Py_NewRef(Py_None);
            pos += 1;
        } else if (k == 'u') {
            v = Py_NewRef(UNCHANGED);
            pos += 1;
        } else {
            goto malformed;
        }
        PyList_SET_ITEM(values, i, v);
    }
    *end = pos;
    return values;
malformed:
    Py_DECREF(values);
    return NULL;
}

/* ---- value parsers ------------------------------------------------------------------------------------------- */
static inline int digits(const char *s, Py_ssize_t n, int *out) {
    int v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 1;
}

/* "HH:MM:SS" optionally followed by "." and 1 to 6 digits, at s[0:n] exactly; microseconds scaled. */
static int parse_hms(const char *s, Py_ssize_t n, int *h, int *mi, int *sec, int *us) {
    if (n < 8 || s[2] != ':' || s[5] != ':') return 0;
    if (!digits(s, 2, h) || !digits(s + 3, 2, mi) || !digits(s + 6, 2, sec)) return 0;
    *us = 0;
    if (n == 8) return 1;
    Py_ssize_t f = n - 9;
    if (s[8] != '.' || f < 1 || f > 6) return 0;
    int frac;
    if (!digits(s + 9, f, &frac)) return 0;
    for (Py_ssize_t i = f; i < 6; i++) frac *= 10;
    *us = frac;
    return 1;
}

/* "YYYY-MM-DD" at s[0:10]. */
static int parse_ymd(const char *s, int *y, int *m, int *d) {
    return s[4] == '-' && s[7] == '-' && digits(s, 4, y) && digits(s + 5, 2, m) && digits(s + 8, 2, d);
}

/* The value of text ``s`` for a parser of ``code`` when ``s`` is in the type's canonical output form: a new
 * reference, or NULL with no exception set when C does not recognise it (the caller calls the Python parser). An
 * out-of-range field (month 13, hour 25) also answers NULL: the Python parser decides what it is. */
static PyObject *fast_value(int code, PyObject *s) {
    if (PyUnicode_READY(s) < 0) return NULL;
    if (!PyUnicode_IS_ASCII(s)) return NULL;
    const char *p = (const char *)PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    PyObject *r = NULL;
    switch (code) {
    case C_INT: {
        Py_ssize_t i = 0;
        int neg = 0;
        if (n > 0 && p[0] == '-') { neg = 1; i = 1; }
        if (n - i < 1 || n - i > 18) return NULL;
        long long v = 0;
        for (; i < n; i++) {
            if (p[i] < '0' || p[i] > '9') return NULL;
            v = v * 10 + (p[i] - '0');
        }
        return PyLong_FromLongLong(neg ? -v : v);
    }
    case C_FLOAT:
        r = PyFloat_FromString(s); /* what float(s) does for a str */
        break;
    case C_BOOL:
        if (n == 1 && p[0] == 't') return Py_NewRef(Py_True);
        if (n == 1 && p[0] == 'f') return Py_NewRef(Py_False);
        return NULL;
    case C_DATE: {
        int y, m, d;
        if (n != 10 || !parse_ymd(p, &y, &m, &d)) return NULL;
        r = PyDate_FromDate(y, m, d);
        break;
    }
    case C_TIME: {
        int h, mi, sec, us;
        if (!parse_hms(p, n, &h, &mi, &sec, &us)) return NULL;
        r = PyTime_FromTime(h, mi, sec, us);
        break;
    }
    case C_TIMESTAMP:
    case C_TIMESTAMPTZ: {
        int y, m, d, h, mi, sec, us;
        Py_ssize_t t = n;
        if (code == C_TIMESTAMPTZ) { /* the session's TimeZone is UTC: "+00" */
            if (n < 3 || p[n - 3] != '+' || p[n - 2] != '0' || p[n - 1] != '0') return NULL;
            t = n - 3;
        }
        if (t < 19 || p[10] != ' ' || !parse_ymd(p, &y, &m, &d) || !parse_hms(p + 11, t - 11, &h, &mi, &sec, &us))
            return NULL;
        r = PyDateTimeAPI->DateTime_FromDateAndTime(y, m, d, h, mi, sec, us,
                                                    code == C_TIMESTAMPTZ ? PyDateTime_TimeZone_UTC : Py_None,
                                                    PyDateTimeAPI->DateTimeType);
        break;
    }
    default:
        return NULL;
    }
    if (r == NULL && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear(); /* not ours to judge: ask Python */
    return r;
}

/* ---- RowParser ------------------------------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    unsigned char *codes;
    PyObject *parsers;   /* tuple of n callables */
    PyObject *fallback;  /* the pure-Python row parser of the same parsers */
    vectorcallfunc vectorcall;
} RowParser;

static PyTypeObject RowParserType;

/* parse items[0:n] (str or None) into a new tuple; NULL with an exception from a parser */
static PyObject *parse_values(RowParser *rp, PyObject *seq) {
    Py_ssize_t n = rp->n;
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* re-read per item: a parser called below is Python code (the lambda reads v[i] as it goes) */
        if (i >= PySequence_Fast_GET_SIZE(seq)) {
            PyErr_SetString(PyExc_IndexError, "row has fewer values than parsers");
            Py_DECREF(out);
            return NULL;
        }
        PyObject *s = PySequence_Fast_GET_ITEM(seq, i);
        int code = rp->codes[i];
        PyObject *r;
        if (code == C_TEXT) {
            r = Py_NewRef(s);
        } else if (s == Py_None) {
            r = Py_NewRef(Py_None);
        } else {
            r = NULL;
            if (code != C_CALL && code != C_NUMERIC && PyUnicode_CheckExact(s)) {
                r = fast_value(code, s);
                if (r == NULL && PyErr_Occurred()) {
                    Py_DECREF(out);
                    return NULL;
                }
            }
            if (r == NULL) {
                Py_INCREF(s); /* the parser may drop the row's reference */
                r = PyObject_CallOneArg(PyTuple_GET_ITEM(rp->parsers, i), s);
                Py_DECREF(s);
                if (r == NULL) {
                    Py_DECREF(out);
                    return NULL;
                }
            }
        }
        PyTuple_SET_ITEM(out, i, r);
    }
    return out;
}

static PyObject *RowParser_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    RowParser *rp = (RowParser *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0))
        return PyObject_Vectorcall(rp->fallback, args, nargsf, kwnames);
    PyObject *v = args[0];
    if (rp->n == 0) return PyTuple_New(0);
    if ((!PyList_CheckExact(v) && !PyTuple_CheckExact(v)) || PySequence_Fast_GET_SIZE(v) < rp->n)
        return PyObject_CallOneArg(rp->fallback, v);
    Py_INCREF(v);
    PyObject *r = parse_values(rp, v);
    Py_DECREF(v);
    return r;
}

static PyObject *RowParser_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *codes, *parsers, *fallback;
    static char *kwlist[] = {"codes", "parsers", "fallback", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "SO!O:RowParser", kwlist, &codes, &PyTuple_Type, &parsers,
                                     &fallback))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(parsers);
    if (PyBytes_GET_SIZE(codes) != n) {
        PyErr_SetString(PyExc_ValueError, "RowParser: one code per parser");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (((unsigned char *)PyBytes_AS_STRING(codes))[i] > C_MAX || !PyCallable_Check(PyTuple_GET_ITEM(parsers, i))) {
            PyErr_SetString(PyExc_ValueError, "RowParser: unknown code or a parser that is not callable");
            return NULL;
        }
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "RowParser: fallback must be callable");
        return NULL;
    }
    RowParser *self = (RowParser *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->codes = PyMem_Malloc(n > 0 ? (size_t)n : 1);
    if (self->codes == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    memcpy(self->codes, PyBytes_AS_STRING(codes), (size_t)n);
    self->n = n;
    self->parsers = Py_NewRef(parsers);
    self->fallback = Py_NewRef(fallback);
    self->vectorcall = RowParser_vectorcall;
    return (PyObject *)self;
}

static int RowParser_traverse(RowParser *self, visitproc visit, void *arg) {
    Py_VISIT(self->parsers);
    Py_VISIT(self->fallback);
    return 0;
}

static int RowParser_clear(RowParser *self) {
    Py_CLEAR(self->parsers);
    Py_CLEAR(self->fallback);
    return 0;
}

static void RowParser_dealloc(RowParser *self) {
    PyObject_GC_UnTrack(self);
    RowParser_clear(self);
    PyMem_Free(self->codes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *RowParser_get_fallback(RowParser *self, void *closure) {
    return Py_NewRef(self->fallback);
}

static PyGetSetDef RowParser_getset[] = {
    {"fallback", (getter)RowParser_get_fallback, NULL, "the pure-Python row parser this one stands in for", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RowParserType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rowcodec.RowParser",
    .tp_basicsize = sizeof(RowParser),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "RowParser(codes, parsers, fallback): parses a row of str/None values like fallback does",
    .tp_new = RowParser_new,
    .tp_dealloc = (destructor)RowParser_dealloc,
    .tp_traverse = (traverseproc)RowParser_traverse,
    .tp_clear = (inquiry)RowParser_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(RowParser, vectorcall),
    .tp_getset = RowParser_getset,
};

/* ---- message functions -------------------------------------------------------------------------------------- */
/* ---- deferred rows ------------------------------------------------------------------------------------------- */
/* 1 when fast_value(code, s) is certain to return a value (s a str): the form it recognises with every field in the
 * range Python's constructors accept. Then parsing the value later gives exactly what parsing it now gives, and
 * nothing can be refused later that is accepted now. 0: parse now (a float, a parser C calls, an odd form). */
static int in_days(int y, int m, int d) {
    static const int dim[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 1 || y > 9999 || m < 1 || m > 12 || d < 1) return 0;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return d <= dim[m - 1] + (m == 2 && leap);
}

static int in_hms(const char *s, Py_ssize_t n) {
    int h, mi, sec, us;
    return parse_hms(s, n, &h, &mi, &sec, &us) && h < 24 && mi < 60 && sec < 60;
}

/* p[i:n] is one or more ASCII digits from i: the index after them (n when they end the text), or -1 */
static Py_ssize_t digit_run(const char *p, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t start = i;
    while (i < n && p[i] >= '0' && p[i] <= '9') i++;
    return i == start ? -1 : i;
}

/* "-?D+(.D+)?" then, with ``exponent``, "(e[+-]D+)?", exactly */
static int decimal_form(const char *p, Py_ssize_t n, int exponent) {
    Py_ssize_t i = (n > 0 && p[0] == '-') ? 1 : 0;
    if ((i = digit_run(p, i, n)) < 0) return 0;
    if (i < n && p[i] == '.' && (i = digit_run(p, i + 1, n)) < 0) return 0;
    if (exponent && i < n && p[i] == 'e') {
        if (i + 1 >= n || (p[i + 1] != '+' && p[i + 1] != '-')) return 0;
        if ((i = digit_run(p, i + 2, n)) < 0) return 0;
    }
    return i == n;
}

static int deferrable(int code, PyObject *s) {
    if (code == C_TEXT || s == Py_None) return 1;
    if (!PyUnicode_CheckExact(s) || PyUnicode_READY(s) < 0 || !PyUnicode_IS_ASCII(s)) return 0;
    const char *p = (const char *)PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int y, m, d;
    switch (code) {
    case C_INT: {
        Py_ssize_t i = (n > 0 && p[0] == '-') ? 1 : 0;
        if (n - i < 1 || n - i > 18) return 0;
        for (; i < n; i++)
            if (p[i] < '0' || p[i] > '9') return 0;
        return 1;
    }
    case C_BOOL:
        return n == 1 && (p[0] == 't' || p[0] == 'f');
    case C_NUMERIC: /* Decimal() of it cannot fail (NaN and the infinities: parsed now) */
        return decimal_form(p, n, 0);
    case C_FLOAT: /* float() of these cannot fail */
        return decimal_form(p, n, 1) || (n == 3 && memcmp(p, "NaN", 3) == 0) ||
               (n == 8 && memcmp(p, "Infinity", 8) == 0) || (n == 9 && memcmp(p, "-Infinity", 9) == 0);
    case C_DATE:
        return n == 10 && parse_ymd(p, &y, &m, &d) && in_days(y, m, d);
    case C_TIME:
        return in_hms(p, n);
    case C_TIMESTAMP:
    case C_TIMESTAMPTZ: {
        Py_ssize_t t = n;
        if (code == C_TIMESTAMPTZ) {
            if (n < 3 || p[n - 3] != '+' || p[n - 2] != '0' || p[n - 1] != '0') return 0;
            t = n - 3;
        }
        return t >= 19 && p[10] == ' ' && parse_ymd(p, &y, &m, &d) && in_days(y, m, d) && in_hms(p + 11, t - 11);
    }
    default:
        return 0;
    }
}

/* DeferredRow: a row whose text values are all deferrable, parsed on the first call (the tuple is kept). It stands in
 * RowChange.row until someone reads the row (cdc.events makes ``row`` materialise it); a sequence too (length, items,
 * iteration, comparison and hash of the tuple), so that a sink keeping it among its rows reads the same values. */
typedef struct {
    PyObject_HEAD
    RowParser *parser;
    PyObject *texts; /* list of str/None, RowChange.row_text */
    PyObject *row;   /* NULL until parsed */
} DeferredRow;

static PyTypeObject DeferredRowType;

static PyObject *deferred_tuple(DeferredRow *dr) {
    if (dr->row == NULL) {
        PyObject *row = parse_values(dr->parser, dr->texts);
        if (row == NULL) return NULL;
        if (dr->row == NULL) /* (a parser that runs Python code may let another thread parse it meanwhile) */
            dr->row = row;
        else
            Py_DECREF(row);
    }
    return dr->row;
}

static PyObject *DeferredRow_call(PyObject *self, PyObject *args, PyObject *kwds) {
    if ((args != NULL && PyTuple_GET_SIZE(args) != 0) || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "DeferredRow() takes no arguments");
        return NULL;
    }
    return Py_XNewRef(deferred_tuple((DeferredRow *)self));
}

static Py_ssize_t DeferredRow_len(PyObject *self) { return ((DeferredRow *)self)->parser->n; }

static PyObject *DeferredRow_item(PyObject *self, Py_ssize_t i) {
    PyObject *t = deferred_tuple((DeferredRow *)self);
    return t == NULL ? NULL : PySequence_GetItem(t, i);
}

static PyObject *DeferredRow_subscript(PyObject *self, PyObject *key) {
    PyObject *t = deferred_tuple((DeferredRow *)self);
    return t == NULL ? NULL : PyObject_GetItem(t, key);
}

static PyObject *DeferredRow_iter(PyObject *self) {
    PyObject *t = deferred_tuple((DeferredRow *)self);
    return t == NULL ? NULL : PyObject_GetIter(t);
}

static PyObject *DeferredRow_richcompare(PyObject *self, PyObject *other, int op) {
    PyObject *t = deferred_tuple((DeferredRow *)self);
    if (t == NULL) return NULL;
    if (Py_TYPE(other) == &DeferredRowType) {
        other = deferred_tuple((DeferredRow *)other);
        if (other == NULL) return NULL;
    }
    return PyObject_RichCompare(t, other, op);
}

static Py_hash_t DeferredRow_hash(PyObject *self) {
    PyObject *t = deferred_tuple((DeferredRow *)self);
    return t == NULL ? -1 : PyObject_Hash(t);
}

static PyObject *DeferredRow_repr(PyObject *self) {
    PyObject *t = deferred_tuple((DeferredRow *)self);
    return t == NULL ? NULL : PyObject_Repr(t);
}

static PyObject *DeferredRow_get_parsed(PyObject *self, void *closure) {
    return PyBool_FromLong(((DeferredRow *)self)->row != NULL);
}

static PyGetSetDef DeferredRow_getset[] = {
    {"parsed", DeferredRow_get_parsed, NULL, "whether the row was parsed (called, read, compared)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* no GC: it holds a RowParser, a list of str/None and a tuple of values, none of which can refer back to it */
static void DeferredRow_dealloc(DeferredRow *self) {
    Py_XDECREF(self->parser);
    Py_XDECREF(self->texts);
    Py_XDECREF(self->row);
    PyObject_Free(self);
}

static PySequenceMethods DeferredRow_as_sequence = {
    .sq_length = DeferredRow_len,
    .sq_item = DeferredRow_item,
};

static PyMappingMethods DeferredRow_as_mapping = {
    .mp_length = DeferredRow_len,
    .mp_subscript = DeferredRow_subscript,
};

static PyTypeObject DeferredRowType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rowcodec.DeferredRow",
    .tp_basicsize = sizeof(DeferredRow),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a row parsed on the first call (the tuple); a sequence of its values",
    .tp_call = DeferredRow_call,
    .tp_as_sequence = &DeferredRow_as_sequence,
    .tp_as_mapping = &DeferredRow_as_mapping,
    .tp_iter = DeferredRow_iter,
    .tp_richcompare = DeferredRow_richcompare,
    .tp_hash = DeferredRow_hash,
    .tp_repr = DeferredRow_repr,
    .tp_getset = DeferredRow_getset,
    .tp_dealloc = (destructor)DeferredRow_dealloc,
};

/* a DeferredRow of ``vals`` (str/None, one per parser) when every value is deferrable; NULL with no exception set
 * when one is not (parse now); NULL with an exception set on failure */
static PyObject *deferred_row(RowParser *rp, PyObject *vals) {
    for (Py_ssize_t i = 0; i < rp->n; i++)
        if (!deferrable(rp->codes[i], PyList_GET_ITEM(vals, i))) return NULL;
    DeferredRow *dr = PyObject_New(DeferredRow, &DeferredRowType);
    if (dr == NULL) return NULL;
    dr->parser = (RowParser *)Py_NewRef((PyObject *)rp);
    dr->texts = Py_NewRef(vals);
    dr->row = NULL;
    return (PyObject *)dr;
}

/* defer_row(row_parser, texts): a DeferredRow of ``texts`` (a list of str/None, one per parser) when every value is
 * deferrable, else None (parse now); for other upstreams' mounters whose stored text these parsers read */
static PyObject *rc_defer_row(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || Py_TYPE(args[0]) != &RowParserType || !PyList_CheckExact(args[1]) ||
        PyList_GET_SIZE(args[1]) != ((RowParser *)args[0])->n)
        Py_RETURN_NONE;
    PyObject *vals = args[1];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(vals); i++) {
        PyObject *v = PyList_GET_ITEM(vals, i);
        if (v != Py_None && !PyUnicode_CheckExact(v)) Py_RETURN_NONE;
    }
    PyObject *r = deferred_row((RowParser *)args[0], vals);
    if (r == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
    return r;
}

static PyObject *call_fallback(PyObject *fn, PyObject *const *args, Py_ssize_t nargs) {
    return PyObject_Vectorcall(fn, args, (size_t)nargs, NULL);
}

static inline int is_change_type(unsigned char t) { return t == 'I' || t == 'U' || t == 'D'; }

static inline int first_mark_ok(unsigned char t, unsigned char m) {
    if (t == 'I') return m == 'N';
    if (t == 'U') return m == 'N' || m == 'K' || m == 'O';
    return m == 'K' || m == 'O';
}

/* plain_change_relid(buf) */
static PyObject *rc_plain_change_relid(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured()) return NULL;
    if (nargs == 1 && PyBytes_CheckExact(args[0])) {
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
        if (PyBytes_GET_SIZE(args[0]) >= 6 && is_change_type(b[0]) && first_mark_ok(b[0], b[5]))
            return PyLong_FromUnsignedLong(be32(b + 1));
    }
    return call_fallback(py_relid, args, nargs);
}

/* offset argument: a non-negative int within the buffer, else -1 (no exception) */
static Py_ssize_t offset_arg(PyObject *o, Py_ssize_t len) {
    if (!PyLong_CheckExact(o)) return -1;
    Py_ssize_t off = PyLong_AsSsize_t(o);
    if (off == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return off >= 0 && off <= len ? off : -1;
}

/* insert_values(buf, offset) */
static PyObject *rc_insert_values(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured()) return NULL;
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) return call_fallback(py_insert, args, nargs);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t off = offset_arg(args[1], len);
    if (off < 0) return call_fallback(py_insert, args, nargs);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    if (len - off < 6) return call_fallback(py_insert, args, nargs);
    if (b[off] != 'I' || b[off + 5] != 'N') Py_RETURN_NONE; /* another kind: what the Python function answers */
    Py_ssize_t end;
    PyObject *values = parse_tuple(b, len, off + 6, &end);
    if (values == NULL) return PyErr_Occurred() ? NULL : call_fallback(py_insert, args, nargs);
    if (end != len) {
        Py_DECREF(values);
        return call_fallback(py_insert, args, nargs);
    }
    PyObject *relid = PyLong_FromUnsignedLong(be32(b + off + 1));
    if (relid == NULL) {
        Py_DECREF(values);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, relid, values);
    Py_DECREF(relid);
    Py_DECREF(values);
    return out;
}

/* The core of plain_row at b[off:len]: 1 with *kind ('I'/'U'), *relid, *row and *values set (new references);
 * 0 for a message that is well-formed but not plain (another kind, an old tuple, a value that is not text or NULL, a
 * value the parser refuses: the Python function answers None for these); -1 for anything C does not handle (the
 * caller asks Python); -2 with an exception set (out of memory, an interrupt). */
static int plain_core(const unsigned char *b, Py_ssize_t len, Py_ssize_t off, RowParser *rp, int defer,
                      unsigned char *kind, uint32_t *relid, PyObject **row, PyObject **values) {
    if (len - off < 6) return -1;
    unsigned char t = b[off];
    if ((t != 'I' && t != 'U') || b[off + 5] != 'N') return 0;
    Py_ssize_t end;
    PyObject *vals = parse_tuple(b, len, off + 6, &end);
    if (vals == NULL) return PyErr_Occurred() ? -2 : -1;
    if (end != len || PyList_GET_SIZE(vals) != rp->n) {
        Py_DECREF(vals);
        return -1;
    }
    for (Py_ssize_t i = 0; i < rp->n; i++) {
        PyObject *v = PyList_GET_ITEM(vals, i);
        if (v != Py_None && !PyUnicode_CheckExact(v)) { /* an unchanged TOAST value or a binary one */
            Py_DECREF(vals);
            return 0;
        }
    }
    PyObject *r = NULL;
    if (defer && t == 'I') { /* an insert whose values parse later exactly as now: parsed when read */
        r = deferred_row(rp, vals);
        if (r == NULL && PyErr_Occurred()) {
            Py_DECREF(vals);
            return -2;
        }
    }
    if (r == NULL) r = parse_values(rp, vals);
    if (r == NULL) {
        Py_DECREF(vals);
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return -2;
        PyErr_Clear(); /* a value that does not parse: the caller's general path reports it */
        return 0;
    }
    *kind = t;
    *relid = be32(b + off + 1);
    *row = r;
    *values = vals;
    return 1;
}

/* plain_row(buf, offset, parse_row, ncols): an Insert, or an Update without an old tuple, whose values are all
 * text or NULL and parse: (kind 'I'/'U', relid, row, texts); None otherwise */
static PyObject *rc_plain_row(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured()) return NULL;
    if (nargs != 4 || !PyBytes_CheckExact(args[0]) || Py_TYPE(args[2]) != &RowParserType ||
        !PyLong_CheckExact(args[3]))
        return call_fallback(py_plain_row, args, nargs);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t off = offset_arg(args[1], len);
    Py_ssize_t ncols = PyLong_AsSsize_t(args[3]);
    if (ncols == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return call_fallback(py_plain_row, args, nargs);
    }
    RowParser *rp = (RowParser *)args[2];
    if (off < 0 || ncols != rp->n) return call_fallback(py_plain_row, args, nargs);
    unsigned char kind;
    uint32_t relid;
    PyObject *row, *values;
    int rc = plain_core((const unsigned char *)PyBytes_AS_STRING(args[0]), len, off, rp, 0, &kind, &relid, &row,
                        &values);
    if (rc == -2) return NULL;
    if (rc == -1) return call_fallback(py_plain_row, args, nargs);
    if (rc == 0) Py_RETURN_NONE;
    PyObject *r = PyLong_FromUnsignedLong(relid);
    PyObject *out = r == NULL ? NULL : PyTuple_Pack(4, kind == 'I' ? S_I : S_U, r, row, values);
    Py_XDECREF(r);
    Py_DECREF(row);
    Py_DECREF(values);
    return out;
}

/* ---- PlainMounter ---------------------------------------------------------------------------------------------- */
/* RowChange's slots, by name (read from the class's member table at configure time; the mounter's _positional
 * sets the same ones). If the class has any other slot, or one of these is missing, rc_layout stays 0 and every
 * PlainMounter call goes to the Python mounter. */
static PyTypeObject *row_change_type = NULL;
static PyObject *op_insert = NULL, *op_update = NULL;
static int rc_layout = 0;
enum { F_OP, F_SCHEMA, F_COMMIT_TS, F_COMMIT_TIME, F_VALUES, F_OLD_VALUES, F_EXTRA, F_ROW, F_ROW_TEXT, F_N };
static const char *const field_names[F_N] = {"op", "schema", "commit_ts", "commit_time", "values", "old_values",
                                             "extra", "row", "row_text"};
static Py_ssize_t field_offset[F_N];

static int read_layout(PyTypeObject *type) {
    int seen = 0;
    for (int f = 0; f < F_N; f++) field_offset[f] = -1;
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || type->tp_base != &PyBaseObject_Type || type->tp_members == NULL ||
        type->tp_dictoffset != 0)
        return 0;
    for (PyMemberDef *mp = type->tp_members; mp->name != NULL; mp++) {
        int f;
        for (f = 0; f < F_N; f++)
            if (strcmp(mp->name, field_names[f]) == 0) break;
        if (f == F_N) {
            if (strcmp(mp->name, "__weakref__") == 0) continue;
            return 0; /* a slot the C path would leave unset */
        }
        if (mp->type != T_OBJECT_EX || (mp->flags & READONLY) || field_offset[f] != -1) return 0;
        field_offset[f] = mp->offset;
        seen++;
    }
    return seen == F_N;
}

typedef struct {
    PyObject_HEAD
    PyObject *plans;    /* dict: schema version -> (schema, relation id or 0, RowParser, ncols) */
    PyObject *general;  /* the Python mounter: called for everything else */
    int defer;          /* an insert's values may be a DeferredRow (PlainMounter(..., defer=True)) */
    vectorcallfunc vectorcall;
} PlainMounter;

static PyTypeObject PlainMounterType;

static inline void set_field(PyObject *o, int f, PyObject *v) {
    *(PyObject **)((char *)o + field_offset[f]) = v; /* a new reference; the slot was NULL (fresh object) */
}

/* the RowChange of a plain row, or NULL: with an exception set (error), else not handled here */
static PyObject *mount_plain(PlainMounter *pm, PyObject *payload, PyObject *commit_ts, PyObject *commit_time) {
    if (!rc_layout || !PyBytes_CheckExact(payload) || PyBytes_GET_SIZE(payload) < 5 || !PyDict_CheckExact(pm->plans))
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t len = PyBytes_GET_SIZE(payload);
    PyObject *key = PyLong_FromUnsignedLong(be32(b));
    if (key == NULL) return NULL;
    PyObject *plan = PyDict_GetItemWithError(pm->plans, key); /* borrowed */
    Py_DECREF(key);
    if (plan == NULL || !PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 4 ||
        Py_TYPE(PyTuple_GET_ITEM(plan, 2)) != &RowParserType || !PyLong_CheckExact(PyTuple_GET_ITEM(plan, 1)))
        return NULL;
    Py_INCREF(plan);
    PyObject *out = NULL;
    RowParser *rp = (RowParser *)PyTuple_GET_ITEM(plan, 2);
    unsigned long want = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(plan, 1));
    if (want == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        goto done;
    }
    unsigned char kind;
    uint32_t relid;
    PyObject *row, *values;
    int rc = plain_core(b, len, 4, rp, pm->defer, &kind, &relid, &row, &values);
    if (rc != 1) goto done; /* -2 leaves its exception set */
    if (want != 0 && want != relid) { /* another relation's change: the general path reports it */
        Py_DECREF(row);
        Py_DECREF(values);
        goto done;
    }
    PyObject *extra = PyDict_New();
    out = extra == NULL ? NULL : row_change_type->tp_alloc(row_change_type, 0);
    if (out == NULL) {
        Py_XDECREF(extra);
        Py_DECREF(row);
        Py_DECREF(values);
        goto done;
    }
    set_field(out, F_OP, Py_NewRef(kind == 'I' ? op_insert : op_update));
    set_field(out, F_SCHEMA, Py_NewRef(PyTuple_GET_ITEM(plan, 0)));
    set_field(out, F_COMMIT_TS, Py_NewRef(commit_ts));
    set_field(out, F_COMMIT_TIME, Py_NewRef(commit_time));
    set_field(out, F_VALUES, Py_NewRef(Py_None));
    set_field(out, F_OLD_VALUES, Py_NewRef(Py_None));
    set_field(out, F_EXTRA, extra);
    set_field(out, F_ROW, row);
    set_field(out, F_ROW_TEXT, values);
done:
    Py_DECREF(plan);
    return out;
}

static PyObject *PlainMounter_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PlainMounter *pm = (PlainMounter *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 3 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0)) {
        PyObject *r = mount_plain(pm, args[0], args[1], args[2]);
        if (r != NULL || PyErr_Occurred()) return r;
    }
    return PyObject_Vectorcall(pm->general, args, nargsf, kwnames);
}

static PyObject *PlainMounter_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *plans, *general;
    int defer = 0;
    static char *kwlist[] = {"plans", "general", "defer", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O|p:PlainMounter", kwlist, &PyDict_Type, &plans, &general, &defer))
        return NULL;
    if (!PyCallable_Check(general)) {
        PyErr_SetString(PyExc_TypeError, "PlainMounter: general must be callable");
        return NULL;
    }
    PlainMounter *self = (PlainMounter *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->plans = Py_NewRef(plans);
    self->general = Py_NewRef(general);
    self->defer = defer;
    self->vectorcall = PlainMounter_vectorcall;
    return (PyObject *)self;
}

static int PlainMounter_traverse(PlainMounter *self, visitproc visit, void *arg) {
    Py_VISIT(self->plans);
    Py_VISIT(self->general);
    return 0;
}

static int PlainMounter_clear(PlainMounter *self) {
    Py_CLEAR(self->plans);
    Py_CLEAR(self->general);
    return 0;
}

static void PlainMounter_dealloc(PlainMounter *self) {
    PyObject_GC_UnTrack(self);
    PlainMounter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject PlainMounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rowcodec.PlainMounter",
    .tp_basicsize = sizeof(PlainMounter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "PlainMounter(plans, general, defer=False): mount(payload, commit_ts, commit_time) with plain rows built "
               "in C (with defer, an insert's row may be a DeferredRow)",
    .tp_new = PlainMounter_new,
    .tp_dealloc = (destructor)PlainMounter_dealloc,
    .tp_traverse = (traverseproc)PlainMounter_traverse,
    .tp_clear = (inquiry)PlainMounter_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(PlainMounter, vectorcall),
};

/* configure_rows(RowChange, OpType.INSERT, OpType.UPDATE): True when RowChange's slots are the ones C sets */
static PyObject *rc_configure_rows(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "configure_rows(RowChange, insert_op, update_op)");
        return NULL;
    }
    Py_XSETREF(row_change_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(op_insert, Py_NewRef(args[1]));
    Py_XSETREF(op_update, Py_NewRef(args[2]));
    rc_layout = read_layout(row_change_type);
    return PyBool_FromLong(rc_layout);
}

/* parse_change(raw): well-formed Insert/Update/Delete as bytes; anything else goes to Python */
static PyObject *rc_parse_change(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured()) return NULL;
    if (nargs != 1 || !PyBytes_CheckExact(args[0])) return call_fallback(py_parse, args, nargs);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    if (len < 6 || !is_change_type(b[0]) || !first_mark_ok(b[0], b[5])) return call_fallback(py_parse, args, nargs);
    unsigned char t = b[0], mark = b[5];
    PyObject *new_ = NULL, *old = NULL, *old_kind = Py_None, *kind;
    Py_ssize_t pos = 6, end;
    if (t == 'U' || t == 'D') {
        if (mark == 'K' || mark == 'O') {
            old = parse_tuple(b, len, pos, &end);
            if (old == NULL) goto decline;
            old_kind = mark == 'K' ? S_K : S_O;
            pos = end;
            if (t == 'U') {
                if (pos >= len || b[pos] != 'N') goto decline;
                pos += 1;
            }
        } else {
            pos = 6; /* an Update whose new tuple follows the relid */
        }
    }
    if (t != 'D') {
        new_ = parse_tuple(b, len, pos, &end);
        if (new_ == NULL) goto decline;
        pos = end;
    }
    if (pos != len) goto decline;
    kind = t == 'I' ? S_I : (t == 'U' ? S_U : S_D);
    PyObject *relid = PyLong_FromUnsignedLong(be32(b + 1));
    if (relid == NULL) goto error;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        Py_DECREF(relid);
        goto error;
    }
    PyObject *cargs[6] = {kind, relid, new_ ? new_ : Py_None, old ? old : Py_None, old_kind, zero};
    PyObject *out = PyObject_Vectorcall(make_parsed, cargs, 6, NULL);
    Py_DECREF(relid);
    Py_DECREF(zero);
    Py_XDECREF(new_);
    Py_XDECREF(old);
    return out;
decline:
    Py_XDECREF(new_);
    Py_XDECREF(old);
    if (PyErr_Occurred()) return NULL;
    return call_fallback(py_parse, args, nargs);
error:
    Py_XDECREF(new_);
    Py_XDECREF(old);
    return NULL;
}

/* configure(unchanged, plain_change_relid, insert_values, parse_change, plain_row, make_parsed) */
static PyObject *rc_configure(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "configure() takes 6 arguments");
        return NULL;
    }
    for (Py_ssize_t i = 1; i < 6; i++) {
        if (!PyCallable_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "configure(): the fallbacks must be callable");
            return NULL;
        }
    }
    Py_XSETREF(UNCHANGED, Py_NewRef(args[0]));
    Py_XSETREF(py_relid, Py_NewRef(args[1]));
    Py_XSETREF(py_insert, Py_NewRef(args[2]));
    Py_XSETREF(py_parse, Py_NewRef(args[3]));
    Py_XSETREF(py_plain_row, Py_NewRef(args[4]));
    Py_XSETREF(make_parsed, Py_NewRef(args[5]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))rc_configure, METH_FASTCALL, "hand over UNCHANGED and the fallbacks"},
    {"plain_change_relid", (PyCFunction)(void (*)(void))rc_plain_change_relid, METH_FASTCALL,
     "pgoutput.plain_change_relid"},
    {"insert_values", (PyCFunction)(void (*)(void))rc_insert_values, METH_FASTCALL, "pgoutput.insert_values"},
    {"parse_change", (PyCFunction)(void (*)(void))rc_parse_change, METH_FASTCALL, "pgoutput.parse_change"},
    {"plain_row", (PyCFunction)(void (*)(void))rc_plain_row, METH_FASTCALL, "pgoutput.plain_row"},
    {"defer_row", (PyCFunction)(void (*)(void))rc_defer_row, METH_FASTCALL,
     "a DeferredRow of a row's text values, or None (parse now)"},
    {"configure_rows", (PyCFunction)(void (*)(void))rc_configure_rows, METH_FASTCALL,
     "hand over RowChange and the two OpTypes of PlainMounter"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_rowcodec", "the per-row functions of the PostgreSQL change path in C", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rowcodec(void) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return NULL;
    if (PyType_Ready(&RowParserType) < 0 || PyType_Ready(&PlainMounterType) < 0 || PyType_Ready(&DeferredRowType) < 0)
        return NULL;
    S_I = PyUnicode_InternFromString("I");
    S_U = PyUnicode_InternFromString("U");
    S_D = PyUnicode_InternFromString("D");
    S_K = PyUnicode_InternFromString("K");
    S_O = PyUnicode_InternFromString("O");
    if (!S_I || !S_U || !S_D || !S_K || !S_O) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    Py_INCREF(&RowParserType);
    if (PyModule_AddObject(m, "RowParser", (PyObject *)&RowParserType) < 0) {
        Py_DECREF(&RowParserType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&DeferredRowType);
    if (PyModule_AddObject(m, "DeferredRow", (PyObject *)&DeferredRowType) < 0) {
        Py_DECREF(&DeferredRowType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PlainMounterType);
    if (PyModule_AddObject(m, "PlainMounter", (PyObject *)&PlainMounterType) < 0) {
        Py_DECREF(&PlainMounterType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "TEXT", C_TEXT) < 0 || PyModule_AddIntConstant(m, "CALL", C_CALL) < 0 ||
        PyModule_AddIntConstant(m, "INT", C_INT) < 0 || PyModule_AddIntConstant(m, "FLOAT", C_FLOAT) < 0 ||
        PyModule_AddIntConstant(m, "BOOL", C_BOOL) < 0 || PyModule_AddIntConstant(m, "DATE", C_DATE) < 0 ||
        PyModule_AddIntConstant(m, "TIME", C_TIME) < 0 || PyModule_AddIntConstant(m, "TIMESTAMP", C_TIMESTAMP) < 0 ||
        PyModule_AddIntConstant(m, "TIMESTAMPTZ", C_TIMESTAMPTZ) < 0 ||
        PyModule_AddIntConstant(m, "NUMERIC", C_NUMERIC) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
