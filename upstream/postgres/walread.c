/* Draining a logical replication stream from libpq in batches (upstream/postgres/walread.py loads this module).
 *
 * psycopg2's read_message costs a Python call, a ReplicationMessage object and two clock reads per message; a busy
 * span reads ~300,000 messages a second. Reader.drain reads every message libpq has (and what one more
 * PQconsumeInput brings) in one call: the payload of each XLogData message, with keepalives consumed here. The
 * non-streamed Insert/Update/Delete messages of the relations in `prefixes` (relid -> the span source's payload
 * prefix) come out already stored the way the sorter keeps them, `prefix + payload`, gathered in runs (lists); those
 * of other relations are dropped (the span does not carry them). Everything else is handed over as its payload
 * bytes, and the drain stops after any message that may change `prefixes` (anything but Begin, Commit and the
 * changes of a streamed transaction), so the caller handles it before the next plain change is looked up.
 *
 * It is the C twin of walread.Router (the Python reference, which walread.PyReader runs over psycopg2's
 * read_message): same items, same order. libpq is not linked: its functions are passed in as addresses (the libpq
 * psycopg2 itself runs on), so this builds with the interpreter's headers alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

typedef int (*getcopy_fn)(void *conn, char **buffer, int async);
typedef int (*consume_fn)(void *conn);
typedef void (*freemem_fn)(void *ptr);

enum { S_IDLE = 0, S_MORE = 1, S_REPLY = 2, S_END = -1, S_FAILED = -2, S_BAD = -3, S_CLOSED = -4 };

typedef struct {
    PyObject_HEAD
    PyObject *owner;  /* the psycopg2 connection: its PGconn is taken again at each drain (NULL once it closed) */
    getcopy_fn get;
    consume_fn consume;
    freemem_fn freemem;
    int in_stream;   /* between Stream Start and Stream Stop */
    int in_txn;      /* between a non-streamed Begin and its Commit */
    unsigned long long wal_end;  /* the server's WAL end of the last XLogData or keepalive */
    long long received;          /* messages read (XLogData and keepalives) */
} Reader;

static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline unsigned long long be64(const unsigned char *p) {
    return ((unsigned long long)be32(p) << 32) | be32(p + 4);
}

/* the tuple marker an Insert/Update/Delete may start its tuple data with (pgoutput.plain_change_relid's check) */
static inline int first_mark_ok(unsigned char kind, unsigned char mark) {
    switch (kind) {
    case 'I': return mark == 'N';
    case 'U': return mark == 'N' || mark == 'K' || mark == 'O';
    case 'D': return mark == 'K' || mark == 'O';
    default: return 0;
    }
}

static inline int is_change(unsigned char c) { return c == 'I' || c == 'U' || c == 'D'; }

static int reader_init(Reader *self, PyObject *args, PyObject *kwds) {
    PyObject *owner, *get, *consume, *freemem;
    if (!PyArg_ParseTuple(args, "OOOO:Reader", &owner, &get, &consume, &freemem)) return -1;
    self->get = (getcopy_fn)PyLong_AsVoidPtr(get);
    self->consume = (consume_fn)PyLong_AsVoidPtr(consume);
    self->freemem = (freemem_fn)PyLong_AsVoidPtr(freemem);
    if (PyErr_Occurred()) return -1;
    if (!self->get || !self->consume || !self->freemem) {
        PyErr_SetString(PyExc_ValueError, "Reader: a null function");
        return -1;
    }
    Py_INCREF(owner);
    Py_XSETREF(self->owner, owner);
    self->in_stream = self->in_txn = 0;
    self->wal_end = 0;
    self->received = 0;
    return 0;
}

/* drain(out, prefixes, limit, run_rows) -> status (module docstring; the statuses are walread.py's) */
static PyObject *reader_drain(Reader *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "drain(out, prefixes, limit, run_rows)");
        return NULL;
    }
    PyObject *out = args[0], *prefixes = args[1];
    if (!PyList_CheckExact(out) || (prefixes != Py_None && !PyDict_CheckExact(prefixes))) {
        PyErr_SetString(PyExc_TypeError, "drain: out must be a list, prefixes a dict or None");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    Py_ssize_t run_rows = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) return NULL;
    if (run_rows < 1) run_rows = 1;
    /* the connection as of now: another thread may have closed it since the last drain (psycopg2 frees the PGconn
     * and its pgconn_ptr is None then); while this call runs it holds the GIL, so nobody closes it meanwhile */
    PyObject *ptr = PyObject_GetAttrString(self->owner, "pgconn_ptr");
    if (ptr == NULL) return NULL;
    void *conn = ptr == Py_None ? NULL : PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (conn == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyLong_FromLong(S_CLOSED);
    }
    int routed = prefixes != Py_None;
    PyObject *run = NULL;  /* the open run (a list owned by out), NULL: none */
    Py_ssize_t run_len = 0;
    uint32_t cached_relid = 0;
    PyObject *cached_prefix = NULL;  /* strong; NULL with cached: the relation is not carried */
    int cached = 0;
    int consumed = 0;
    int status = S_IDLE;
    Py_ssize_t n = 0;
    for (;;) {
        if (n >= limit) { status = S_MORE; break; }
        char *buf = NULL;
        int len = self->get(conn, &buf, 1);
        if (len == 0) {
            if (consumed) { status = S_IDLE; break; }  /* read everything received */
            if (!self->consume(conn)) { status = S_FAILED; break; }
            consumed = 1;
            continue;
        }
        if (len == -1) { status = S_END; break; }
        if (len < -1) { status = S_FAILED; break; }
        consumed = 0;  /* libpq's buffer is read to its end before it reads the socket again */
        n++;
        self->received++;
        const unsigned char *p = (const unsigned char *)buf;
        if (p[0] == 'k') {  /* primary keepalive: walEnd(8), sendTime(8), replyRequested(1) */
            if (len < 18) { self->freemem(buf); status = S_BAD; break; }
            self->wal_end = be64(p + 1);
            int reply = p[17];
            self->freemem(buf);
            if (reply) { status = S_REPLY; break; }
            continue;
        }
        if (p[0] != 'w' || len < 26) { self->freemem(buf); status = S_BAD; break; }
        /* XLogData: dataStart(8), walEnd(8), sendTime(8), then the pgoutput message */
        self->wal_end = be64(p + 9);
        const unsigned char *d = p + 25;
        Py_ssize_t dl = (Py_ssize_t)len - 25;
        unsigned char first = d[0];
        if (routed && !self->in_stream && is_change(first) && dl >= 6 && first_mark_ok(first, d[5])) {
            uint32_t relid = be32(d + 1);
            if (!cached || relid != cached_relid) {
                PyObject *key = PyLong_FromUnsignedLong(relid);
                if (key == NULL) { self->freemem(buf); goto error; }
                PyObject *found = PyDict_GetItemWithError(prefixes, key);
                Py_DECREF(key);
                if (found == NULL && PyErr_Occurred()) { self->freemem(buf); goto error; }
                if (found != NULL && !PyBytes_CheckExact(found)) {
                    self->freemem(buf);
                    PyErr_SetString(PyExc_TypeError, "drain: a prefix must be bytes");
                    goto error;
                }
                Py_XINCREF(found);
                Py_XSETREF(cached_prefix, found);
                cached_relid = relid;
                cached = 1;
            }
            if (cached_prefix == NULL) { self->freemem(buf); continue; }  /* a relation the span does not carry */
            Py_ssize_t pl = PyBytes_GET_SIZE(cached_prefix);
            PyObject *item = PyBytes_FromStringAndSize(NULL, pl + dl);
            if (item == NULL) { self->freemem(buf); goto error; }
            memcpy(PyBytes_AS_STRING(item), PyBytes_AS_STRING(cached_prefix), (size_t)pl);
            memcpy(PyBytes_AS_STRING(item) + pl, d, (size_t)dl);
            self->freemem(buf);
            if (run == NULL || run_len >= run_rows) {
                run = PyList_New(0);
                if (run == NULL) { Py_DECREF(item); goto error; }
                int rc = PyList_Append(out, run);
                Py_DECREF(run);  /* (out holds it) */
                if (rc < 0) { Py_DECREF(item); goto error; }
                run_len = 0;
            }
            int rc = PyList_Append(run, item);
            Py_DECREF(item);
            if (rc < 0) goto error;
            run_len++;
            continue;
        }
        PyObject *item = PyBytes_FromStringAndSize((const char *)d, dl);
        self->freemem(buf);
        if (item == NULL) goto error;
        int rc = PyList_Append(out, item);
        Py_DECREF(item);
        if (rc < 0) goto error;
        run = NULL;
        if (!self->in_stream) {
            if (first == 'B') { self->in_txn = 1; continue; }
            if (first == 'C') { self->in_txn = 0; continue; }
            if (is_change(first) && !routed) continue;
            if (first == 'S') self->in_stream = 1;
        } else if (first == 'E') {
            self->in_stream = 0;
        } else if (is_change(first) || first == 'T') {
            continue;  /* a streamed transaction's change: nothing of the routing depends on it */
        }
        status = S_MORE;  /* the caller handles this message before anything after it is routed */
        break;
    }
    Py_XDECREF(cached_prefix);
    return PyLong_FromLong(status);
error:
    Py_XDECREF(cached_prefix);
    return NULL;
}

static void reader_dealloc(Reader *self) {
    Py_CLEAR(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reader_methods[] = {
    {"drain", (PyCFunction)(void (*)(void))reader_drain, METH_FASTCALL,
     "drain(out, prefixes, limit, run_rows) -> status: append what libpq has received to out (module docstring)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef reader_members[] = {
    {"in_stream", T_INT, offsetof(Reader, in_stream), READONLY, "between Stream Start and Stream Stop"},
    {"in_txn", T_INT, offsetof(Reader, in_txn), READONLY, "between a non-streamed Begin and its Commit"},
    {"wal_end", T_ULONGLONG, offsetof(Reader, wal_end), READONLY, "the server's WAL end last reported"},
    {"received", T_LONGLONG, offsetof(Reader, received), READONLY, "messages read"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "upstream.postgres._walread.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(conn, PQgetCopyData, PQconsumeInput, PQfreemem): a psycopg2 replication connection, drained in C",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_init = (initproc)reader_init,
    .tp_methods = reader_methods,
    .tp_members = reader_members,
};

static struct PyModuleDef walread_module = {
    PyModuleDef_HEAD_INIT, "_walread", "Draining a logical replication stream from libpq (walread.py)", -1, NULL,
};

PyMODINIT_FUNC PyInit__walread(void) {
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&walread_module);
    if (m == NULL) return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "IDLE", S_IDLE) < 0 || PyModule_AddIntConstant(m, "MORE", S_MORE) < 0 ||
        PyModule_AddIntConstant(m, "REPLY", S_REPLY) < 0 || PyModule_AddIntConstant(m, "END", S_END) < 0 ||
        PyModule_AddIntConstant(m, "FAILED", S_FAILED) < 0 || PyModule_AddIntConstant(m, "BAD", S_BAD) < 0 ||
        PyModule_AddIntConstant(m, "CLOSED", S_CLOSED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
