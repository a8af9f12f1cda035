/* A MySQL/MariaDB rows event's full images straight into stored payloads, in C (upstream/mysql/rowcodec.py compiles
 * and loads this; upstream/mysql/rowdecode.py is the reference it must equal).
 *
 * decode_rows(data, off, end, kind, head, codes, p1, p2, calls) decodes every row image of a WRITE ('I'), UPDATE
 * ('U': before and after image per row) or DELETE ('D') rows event from data[off:end] (every column present) and
 * returns one bytes object per row change: head (the schema-version prefix, the kind byte and the relation id) then
 * the new and/or old tuple in upstream/mysql/payload.py's form (u16 BE count, per column an i32 BE length, -1 for
 * NULL, and the value's text as UTF-8). Per column, codes[i] says how its value is read and rendered (p1[i], p2[i]
 * its parameters); C_CALL calls calls[i](data, offset) -> (text, next offset), the Python reader of rowdecode.py.
 *
 * The rule that keeps it equal to Python: C renders only values it recognises exactly (integers, YEAR, UTF-8 text
 * that is valid UTF-8, binary strings, valid DATE/DATETIME/TIMESTAMP/TIME values within the ranges the renderers
 * accept). Anything else - an invalid or zero date, a TIME outside a day, invalid UTF-8, a truncated event, an
 * exception from a Python reader - makes decode_rows return None with no exception set, and the caller decodes the
 * whole event with the Python decoder, which decides or raises the precise error naming the column.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { C_CALL = 0, C_INT = 1, C_UINT = 2, C_YEAR = 3, C_TEXT = 4, C_BYTEA = 5, C_BINARY = 6, C_DATE = 7,
       C_DATETIME2 = 8, C_TIMESTAMP2 = 9, C_TIME2 = 10 };

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} buf_t;

static int grow(buf_t *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 1;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    b->p = p;
    b->cap = cap;
    return 1;
}

static inline void put_be32(char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (char)(u >> 24); p[1] = (char)(u >> 16); p[2] = (char)(u >> 8); p[3] = (char)u;
}

/* room for a value of up to n bytes after its 4-byte length; returns where the value goes */
static char *value_slot(buf_t *b, Py_ssize_t n) {
    if (!grow(b, 4 + n)) return NULL;
    return b->p + b->n + 4;
}

static void value_done(buf_t *b, Py_ssize_t n) {
    put_be32(b->p + b->n, (int32_t)n);
    b->n += 4 + n;
}

/* strict UTF-8 as Python's codec: no overlongs, no surrogates, nothing above U+10FFFF */
static int valid_utf8(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && s[i + 1] < 0xA0) return 0;
            if (c == 0xED && s[i + 1] > 0x9F) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80)
                return 0;
            if (c == 0xF0 && s[i + 1] < 0x90) return 0;
            if (c == 0xF4 && s[i + 1] > 0x8F) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static inline uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

static int days_in_month(int y, int m) {
    static const int d[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return d[m - 1];
}

static int valid_date(int y, int m, int d) {
    return y >= 1 && y <= 9999 && m >= 1 && m <= 12 && d >= 1 && d <= days_in_month(y, m);
}

/* microseconds of a fractional part of fsp digits (1..6) at p; *n its byte count */
static long fraction(const unsigned char *p, int fsp, int *n) {
    static const long scale[] = {1, 100000, 10000, 1000, 100, 10, 1};
    *n = (fsp + 1) / 2;
    if (*n == 0) return 0;
    long v = (long)be(p, *n);
    if (fsp % 2) v /= 10;
    return v * scale[fsp];
}

/* days since 1970-01-01 -> civil date (proleptic Gregorian) */
static void civil(int64_t z, int *y, int *m, int *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t yy = yoe + era * 400;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = (int)(yy + (*m <= 2));
}

static int put_text(buf_t *b, const char *s, Py_ssize_t n) {
    char *dst = value_slot(b, n);
    if (dst == NULL) return -1;
    memcpy(dst, s, (size_t)n);
    value_done(b, n);
    return 1;
}

static const char HEX[] = "0123456789abcdef";

static int put_hex(buf_t *b, const unsigned char *s, Py_ssize_t n, Py_ssize_t pad) {
    Py_ssize_t total = n > pad ? n : pad;
    char *dst = value_slot(b, 2 + 2 * total);
    if (dst == NULL) return -1;
    dst[0] = '\\';
    dst[1] = 'x';
    for (Py_ssize_t i = 0; i < total; i++) {
        unsigned char c = i < n ? s[i] : 0;
        dst[2 + 2 * i] = HEX[c >> 4];
        dst[3 + 2 * i] = HEX[c & 15];
    }
    value_done(b, 2 + 2 * total);
    return 1;
}

typedef struct {
    Py_ssize_t ncols;
    const unsigned char *codes, *p1, *p2;
    PyObject *calls;  /* tuple */
    PyObject *data;   /* the event's bytes (for the Python readers) */
} plan_t;

/* one image at *pos into b: 1 done, 0 not handled (no exception), -1 error (exception set) */
static int image(const unsigned char *s, Py_ssize_t end, Py_ssize_t *pos, const plan_t *pl, buf_t *b) {
    Py_ssize_t p = *pos, nb = (pl->ncols + 7) / 8;
    if (p + nb > end) return 0;
    const unsigned char *nulls = s + p;
    p += nb;
    if (!grow(b, 2)) return -1;
    b->p[b->n] = (char)(pl->ncols >> 8);
    b->p[b->n + 1] = (char)pl->ncols;
    b->n += 2;
    char tmp[64];
    for (Py_ssize_t i = 0; i < pl->ncols; i++) {
        if (nulls[i >> 3] >> (i & 7) & 1) {
            if (!grow(b, 4)) return -1;
            put_be32(b->p + b->n, -1);
            b->n += 4;
            continue;
        }
        int code = pl->codes[i], a = pl->p1[i], r, k;
        switch (code) {
        case C_INT:
        case C_UINT: {
            if (p + a > end) return 0;
            uint64_t u = le(s + p, a);
            p += a;
            if (code == C_INT) {
                int64_t v = (a < 8 && (u >> (8 * a - 1) & 1)) ? (int64_t)(u | (~(uint64_t)0 << (8 * a))) : (int64_t)u;
                k = snprintf(tmp, sizeof tmp, "%lld", (long long)v);
            } else {
                k = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)u);
            }
            r = put_text(b, tmp, k);
            break;
        }
        case C_YEAR:
            if (p + 1 > end) return 0;
            k = s[p] ? snprintf(tmp, sizeof tmp, "%d", s[p] + 1900) : snprintf(tmp, sizeof tmp, "0");
            p += 1;
            r = put_text(b, tmp, k);
            break;
        case C_TEXT:
        case C_BYTEA:
        case C_BINARY: {
            if (p + a > end) return 0;
            Py_ssize_t n = (Py_ssize_t)le(s + p, a);
            p += a;
            if (n > end - p) return 0;
            if (code == C_TEXT) {
                if (!valid_utf8(s + p, n)) return 0;
                r = put_text(b, (const char *)s + p, n);
            } else {
                r = put_hex(b, s + p, n, code == C_BINARY ? pl->p2[i] : 0);
            }
            p += n;
            break;
        }
        case C_DATE: {
            if (p + 3 > end) return 0;
            uint32_t v = (uint32_t)le(s + p, 3);
            int y = (int)(v >> 9), m = (int)(v >> 5 & 15), d = (int)(v & 31);
            p += 3;
            if (!valid_date(y, m, d)) return 0;
            k = snprintf(tmp, sizeof tmp, "%04d-%02d-%02d", y, m, d);
            r = put_text(b, tmp, k);
            break;
        }
        case C_DATETIME2: {
            int fn = (a + 1) / 2;
            if (p + 5 + fn > end) return 0;
            uint64_t v = be(s + p, 5);
            int ym = (int)(v >> 22 & 0x1FFFF), y = ym / 13, m = ym % 13, d = (int)(v >> 17 & 31);
            int hh = (int)(v >> 12 & 31), mi = (int)(v >> 6 & 63), ss = (int)(v & 63);
            long us = fraction(s + p + 5, a, &fn);
            p += 5 + fn;
            if (!valid_date(y, m, d) || hh > 23 || mi > 59 || ss > 59) return 0;
            k = us ? snprintf(tmp, sizeof tmp, "%04d-%02d-%02d %02d:%02d:%02d.%06ld", y, m, d, hh, mi, ss, us)
                   : snprintf(tmp, sizeof tmp, "%04d-%02d-%02d %02d:%02d:%02d", y, m, d, hh, mi, ss);
            r = put_text(b, tmp, k);
            break;
        }
        case C_TIMESTAMP2: {
            int fn = (a + 1) / 2;
            if (p + 4 + fn > end) return 0;
            uint64_t secs = be(s + p, 4);
            long us = fraction(s + p + 4, a, &fn);
            p += 4 + fn;
            if (secs >= 0x80000000u || (secs == 0 && us == 0)) return 0;  /* the zero TIMESTAMP: Python refuses */
            int y, m, d;
            civil((int64_t)(secs / 86400), &y, &m, &d);
            int sod = (int)(secs % 86400);
            k = us ? snprintf(tmp, sizeof tmp, "%04d-%02d-%02d %02d:%02d:%02d.%06ld+00", y, m, d, sod / 3600,
                              sod / 60 % 60, sod % 60, us)
                   : snprintf(tmp, sizeof tmp, "%04d-%02d-%02d %02d:%02d:%02d+00", y, m, d, sod / 3600, sod / 60 % 60,
                              sod % 60);
            r = put_text(b, tmp, k);
            break;
        }
        case C_TIME2: {
            int fn = (a + 1) / 2;
            if (p + 3 + fn > end) return 0;
            uint32_t v = (uint32_t)be(s + p, 3);
            long us = fraction(s + p + 3, a, &fn);
            p += 3 + fn;
            if (!(v & 0x800000)) return 0;  /* negative: outside the range Python keeps */
            int hh = (int)(v >> 12 & 0x3FF), mi = (int)(v >> 6 & 63), ss = (int)(v & 63);
            if (hh > 23 || mi > 59 || ss > 59) return 0;
            k = us ? snprintf(tmp, sizeof tmp, "%02d:%02d:%02d.%06ld", hh, mi, ss, us)
                   : snprintf(tmp, sizeof tmp, "%02d:%02d:%02d", hh, mi, ss);
            r = put_text(b, tmp, k);
            break;
        }
        default: {  /* C_CALL */
            PyObject *fn = PyTuple_GET_ITEM(pl->calls, i);
            PyObject *res = PyObject_CallFunction(fn, "On", pl->data, p);
            if (res == NULL) {
                PyErr_Clear();  /* Python decides again, with the column named */
                return 0;
            }
            if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(res, 0))) {
                Py_DECREF(res);
                return 0;
            }
            Py_ssize_t n, np = PyLong_AsSsize_t(PyTuple_GET_ITEM(res, 1));
            const char *u = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(res, 0), &n);
            if (u == NULL || np < p || np > end) {
                PyErr_Clear();
                Py_DECREF(res);
                return 0;
            }
            r = put_text(b, u, n);
            Py_DECREF(res);
            p = np;
            break;
        }
        }
        if (r < 0) return -1;
    }
    *pos = p;
    return 1;
}

/* Every row change of data[off:end] as payloads (decode_rows' loop): the list, or None (Python decides), or NULL */
static PyObject *rows_out(PyObject *data, Py_ssize_t off, Py_ssize_t end, int kind, PyObject *head, const plan_t *pl) {
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(data);
    if (off < 0 || end > PyBytes_GET_SIZE(data) || off > end) Py_RETURN_NONE;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    buf_t first = {NULL, 0, 0}, second = {NULL, 0, 0};
    const char *h = PyBytes_AS_STRING(head);
    Py_ssize_t hn = PyBytes_GET_SIZE(head);
    Py_ssize_t pos = off;
    int r = 1;
    while (pos < end) {
        first.n = second.n = 0;
        r = image(s, end, &pos, pl, &first);
        if (r == 1 && kind == 'U') r = image(s, end, &pos, pl, &second);
        if (r != 1) break;
        /* U: the binlog's before image is first, the payload's new (after) tuple first */
        buf_t *a = kind == 'U' ? &second : &first, *o = kind == 'U' ? &first : NULL;
        PyObject *item = PyBytes_FromStringAndSize(NULL, hn + a->n + (o ? o->n : 0));
        if (item == NULL) {
            r = -1;
            break;
        }
        char *dst = PyBytes_AS_STRING(item);
        memcpy(dst, h, (size_t)hn);
        memcpy(dst + hn, a->p, (size_t)a->n);
        if (o) memcpy(dst + hn + a->n, o->p, (size_t)o->n);
        int fail = PyList_Append(out, item);
        Py_DECREF(item);
        if (fail) {
            r = -1;
            break;
        }
    }
    PyMem_Free(first.p);
    PyMem_Free(second.p);
    if (r == 1 && pos != end) r = 0;
    if (r != 1) {
        Py_DECREF(out);
        if (r < 0) return NULL;
        Py_RETURN_NONE;
    }
    return out;
}

static int plan_of(plan_t *pl, PyObject *codes, PyObject *p1, PyObject *p2, PyObject *calls, PyObject *data) {
    *pl = (plan_t){PyBytes_GET_SIZE(codes), (const unsigned char *)PyBytes_AS_STRING(codes),
                   (const unsigned char *)PyBytes_AS_STRING(p1), (const unsigned char *)PyBytes_AS_STRING(p2), calls,
                   data};
    if (PyBytes_GET_SIZE(p1) != pl->ncols || PyBytes_GET_SIZE(p2) != pl->ncols || PyTuple_GET_SIZE(calls) != pl->ncols) {
        PyErr_SetString(PyExc_ValueError, "codes, p1, p2 and calls differ in length");
        return -1;
    }
    return 0;
}

static PyObject *decode_rows(PyObject *self, PyObject *args) {
    PyObject *data, *head, *codes, *p1, *p2, *calls;
    Py_ssize_t off, end;
    int kind;
    if (!PyArg_ParseTuple(args, "SnniSSSSO!", &data, &off, &end, &kind, &head, &codes, &p1, &p2, &PyTuple_Type,
                          &calls))
        return NULL;
    plan_t pl;
    if (plan_of(&pl, codes, p1, p2, calls, data) < 0) return NULL;
    return rows_out(data, off, end, kind, head, &pl);
}

/* decode_event(heads, full, padded, codes, p1, p2, calls, data, end, etype): a whole WRITE/UPDATE/DELETE rows event
 * (v1 or v2; the packet data, its body ending at end) as decode_rows' payloads, its header read here: the column
 * count must be the plan's and every columns-present bitmap `full` (or `padded`, MySQL 8's unused bits set).
 * heads: the payload heads of 'I', 'U' and 'D'. Anything else (another event type, a partial image, a count that
 * differs, a value C does not render exactly) returns None: rowdecode.RowDecoder.payloads after
 * rowdecode.rows_header, the reference, decides or raises the precise error. */
static PyObject *decode_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 3 || !PyBytes_CheckExact(args[1]) ||
        !PyBytes_CheckExact(args[2]) || !PyBytes_CheckExact(args[3]) || !PyBytes_CheckExact(args[4]) ||
        !PyBytes_CheckExact(args[5]) || !PyTuple_CheckExact(args[6]) || !PyBytes_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "decode_event(heads, full, padded, codes, p1, p2, calls, data, end, etype)");
        return NULL;
    }
    PyObject *data = args[7];
    Py_ssize_t end = PyLong_AsSsize_t(args[8]);
    long etype = PyLong_AsLong(args[9]);
    if (PyErr_Occurred()) return NULL;
    int kind, v2 = etype >= 30 && etype <= 32;
    switch (etype) {
    case 23: case 30: kind = 'I'; break;
    case 24: case 31: kind = 'U'; break;
    case 25: case 32: kind = 'D'; break;
    default: Py_RETURN_NONE;
    }
    PyObject *head = PyTuple_GET_ITEM(args[0], kind == 'I' ? 0 : kind == 'U' ? 1 : 2);
    if (!PyBytes_CheckExact(head)) {
        PyErr_SetString(PyExc_TypeError, "decode_event: heads must be bytes");
        return NULL;
    }
    plan_t pl;
    if (plan_of(&pl, args[3], args[4], args[5], args[6], data) < 0) return NULL;
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t len = PyBytes_GET_SIZE(data), off = 28; /* 1 OK byte, 19 header bytes, 6 table id, 2 flags */
    if (end > len || end < off + 3) Py_RETURN_NONE;
    if (v2) off += (Py_ssize_t)le(s + off, 2); /* extra data, its 2-byte length included */
    if (off + 1 > end || s[off] >= 0xFB) Py_RETURN_NONE; /* (a one-byte column count below 251 only) */
    Py_ssize_t n = s[off++];
    if (n != pl.ncols) Py_RETURN_NONE;
    Py_ssize_t nb = (n + 7) >> 3;
    const char *full = PyBytes_AS_STRING(args[1]), *padded = PyBytes_AS_STRING(args[2]);
    if (PyBytes_GET_SIZE(args[1]) != nb || PyBytes_GET_SIZE(args[2]) != nb) Py_RETURN_NONE;
    for (int k = kind == 'U' ? 2 : 1; k > 0; k--) {
        if (off + nb > end || (memcmp(s + off, full, (size_t)nb) && memcmp(s + off, padded, (size_t)nb))) Py_RETURN_NONE;
        off += nb;
    }
    return rows_out(data, off, end, kind, head, &pl);
}

/* ---- CRC32 (zlib's polynomial, reflected), slicing by 8 ------------------------------------------------------- */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_of(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][lo >> 8 & 0xFF] ^ crc_table[5][lo >> 16 & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][hi >> 8 & 0xFF] ^ crc_table[1][hi >> 16 & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* ---- the dump's packets framed into events (upstream/mysql/wire.py's frame, in C) ---------------------------------
 * frame_events(buf, off, seq, checksum) -> (events, off, seq): every whole packet of buf from off that is one plain
 * binlog event, each as the tuple (event type, packet bytes, end of its body, log_pos), the packet's sequence number
 * checked, the event's size checked against the packet's and its CRC32 verified when checksum (not a heartbeat's).
 * It stops before the first packet that is not whole or not such an event (a wrong sequence number, a packet of 16 MB
 * or more, an error or EOF packet, a size or checksum mismatch): wire.py's Python path reads that one and raises the
 * precise error. Returns the offset and sequence number after the last packet framed. */
static PyObject *frame_events(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "frame_events(buf: bytes, off, seq, checksum)");
        return NULL;
    }
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t off = PyLong_AsSsize_t(args[1]);
    long seq = PyLong_AsLong(args[2]);
    int checksum = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred() || checksum < 0) return NULL;
    if (off < 0) off = len;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    while (off + 4 <= len) {
        const unsigned char *h = s + off;
        Py_ssize_t n = (Py_ssize_t)h[0] | (Py_ssize_t)h[1] << 8 | (Py_ssize_t)h[2] << 16;
        if (n >= 0xFFFFFF || h[3] != seq || off + 4 + n > len || n < 20) break;
        const unsigned char *d = h + 4;
        if (d[0] != 0) break;
        uint32_t size = (uint32_t)le(d + 10, 4);
        if ((Py_ssize_t)size + 1 != n) break;
        int etype = d[5];
        Py_ssize_t end = n;
        if (checksum && etype != 27) {
            if (n < 24) break;
            end = n - 4;
            if (crc32_of(d + 1, end - 1) != (uint32_t)le(d + end, 4)) break;
        }
        PyObject *ev = Py_BuildValue("(iy#nk)", etype, (const char *)d, n, end, (unsigned long)le(d + 14, 4));
        if (ev == NULL || PyList_Append(out, ev) < 0) {
            Py_XDECREF(ev);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(ev);
        off += 4 + n;
        seq = (seq + 1) & 0xFF;
    }
    return Py_BuildValue("(Nnl)", out, off, seq);
}

/* ---- the decoder side: stored payloads back into values (upstream/mysql/payload.py's parse, in C) ---------------
 * configure() hands over the Python functions these stand in for; C handles only well-formed payloads given as bytes
 * whose text is valid UTF-8, and calls the Python function for anything else (which decides or raises the precise
 * error). The mounter (MySqlMounter) builds the RowChange of a change whose images are whole (no absent value) and
 * whose values all parse; everything else goes to the Python mounter. */
static PyObject *UNCHANGED = NULL;       /* cdc.events.UNCHANGED */
static PyObject *py_insert = NULL;       /* payload.insert_values */
static PyObject *py_parse = NULL;        /* payload.parse */
static PyObject *py_plain_row = NULL;    /* payload.plain_row */
static PyObject *make_parsed = NULL;     /* ParsedChange */
static PyObject *S_I = NULL, *S_U = NULL, *S_D = NULL, *S_K = NULL, *S_O = NULL, *ZERO = NULL;

static int configured(void) {
    if (UNCHANGED == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rowcodec: configure() was not called");
        return 0;
    }
    return 1;
}

static inline uint32_t be32u(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* The values of the tuple at b[pos:len] (str, None for NULL, UNCHANGED for an absent value), *end the position after
 * it, *absent whether a value is absent. NULL without an exception: not well-formed or not valid UTF-8 (ask Python);
 * NULL with one: out of memory. */
static PyObject *read_tuple(const unsigned char *b, Py_ssize_t len, Py_ssize_t pos, Py_ssize_t *end, int *absent) {
    if (pos < 0 || len - pos < 2) return NULL;
    Py_ssize_t n = ((Py_ssize_t)b[pos] << 8) | b[pos + 1];
    pos += 2;
    PyObject *vals = PyList_New(n);
    if (vals == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (len - pos < 4) goto malformed;
        int32_t ln = (int32_t)be32u(b + pos);
        pos += 4;
        PyObject *v;
        if (ln >= 0) {
            if ((Py_ssize_t)ln > len - pos) goto malformed;
            v = PyUnicode_DecodeUTF8((const char *)b + pos, ln, NULL);
            if (v == NULL) {
                if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    PyErr_Clear();
                    goto malformed;
                }
                Py_DECREF(vals);
                return NULL;
            }
            pos += ln;
        } else if (ln == -1) {
            v = Py_NewRef(Py_None);
        } else if (ln == -2) {
            v = Py_NewRef(UNCHANGED);
            *absent = 1;
        } else {
            goto malformed;
        }
        PyList_SET_ITEM(vals, i, v);
    }
    *end = pos;
    return vals;
malformed:
    Py_DECREF(vals);
    return NULL;
}

/* A whole change at b[off:len]: 1 with *kind, *relid, *new_ and *old (new references or NULL) and *absent set;
 * 0: not well-formed (ask Python); -1: an exception is set. */
static int read_change(const unsigned char *b, Py_ssize_t len, Py_ssize_t off, unsigned char *kind, uint32_t *relid,
                       PyObject **new_, PyObject **old, int *absent_new, int *absent_old) {
    *new_ = *old = NULL;
    *absent_new = *absent_old = 0;
    if (len - off < 5) return 0;
    unsigned char k = b[off];
    if (k != 'I' && k != 'U' && k != 'D') return 0;
    Py_ssize_t pos = off + 5;
    if (k != 'D') {
        *new_ = read_tuple(b, len, pos, &pos, absent_new);
        if (*new_ == NULL) return PyErr_Occurred() ? -1 : 0;
    }
    if (k != 'I') {
        *old = read_tuple(b, len, pos, &pos, absent_old);
        if (*old == NULL) {
            Py_CLEAR(*new_);
            return PyErr_Occurred() ? -1 : 0;
        }
    }
    if (pos != len) {
        Py_CLEAR(*new_);
        Py_CLEAR(*old);
        return 0;
    }
    *kind = k;
    *relid = be32u(b + off + 1);
    return 1;
}

static Py_ssize_t offset_arg(PyObject *o, Py_ssize_t len) {
    if (!PyLong_CheckExact(o)) return -1;
    Py_ssize_t off = PyLong_AsSsize_t(o);
    if (off == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return off >= 0 && off <= len ? off : -1;
}

static PyObject *fallback(PyObject *fn, PyObject *const *args, Py_ssize_t nargs) {
    return PyObject_Vectorcall(fn, args, (size_t)nargs, NULL);
}

/* insert_values(payload, offset): payload.insert_values */
static PyObject *rc_insert_values(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured()) return NULL;
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) return fallback(py_insert, args, nargs);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t off = offset_arg(args[1], len);
    if (off < 0) return fallback(py_insert, args, nargs);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    if (off >= len || b[off] != 'I') Py_RETURN_NONE;
    unsigned char kind;
    uint32_t relid;
    PyObject *new_, *old;
    int an, ao;
    int rc = read_change(b, len, off, &kind, &relid, &new_, &old, &an, &ao);
    if (rc < 0) return NULL;
    if (rc == 0) return fallback(py_insert, args, nargs);
    PyObject *r = PyLong_FromUnsignedLong(relid);
    PyObject *out = r == NULL ? NULL : PyTuple_Pack(2, r, new_);
    Py_XDECREF(r);
    Py_DECREF(new_);
    return out;
}

/* parse_change(raw): payload.parse */
static PyObject *rc_parse_change(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured()) return NULL;
    if (nargs != 1 || !PyBytes_CheckExact(args[0])) return fallback(py_parse, args, nargs);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    unsigned char kind;
    uint32_t relid;
    PyObject *new_, *old;
    int an, ao;
    int rc = read_change(b, PyBytes_GET_SIZE(args[0]), 0, &kind, &relid, &new_, &old, &an, &ao);
    if (rc < 0) return NULL;
    if (rc == 0) return fallback(py_parse, args, nargs);
    PyObject *r = PyLong_FromUnsignedLong(relid);
    PyObject *out = NULL;
    if (r != NULL) {
        PyObject *kind_s = kind == 'I' ? S_I : kind == 'U' ? S_U : S_D;
        PyObject *old_kind = old == NULL ? Py_None : ao ? S_K : S_O;
        PyObject *cargs[6] = {kind_s, r, new_ ? new_ : Py_None, old ? old : Py_None, old_kind, ZERO};
        out = PyObject_Vectorcall(make_parsed, cargs, 6, NULL);
        Py_DECREF(r);
    }
    Py_XDECREF(new_);
    Py_XDECREF(old);
    return out;
}

/* parse_row(values) -> the parsed row, or NULL: with an exception set (not an Exception: propagate), else the row
 * does not parse (the caller's general path reports it) */
static PyObject *parse_with(PyObject *parse_row, PyObject *vals) {
    PyObject *row = PyObject_Vectorcall(parse_row, &vals, 1, NULL);
    if (row == NULL && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    return row;
}

/* whether every item of the list is str or None */
static int all_text(PyObject *vals) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(vals); i++) {
        PyObject *v = PyList_GET_ITEM(vals, i);
        if (v != Py_None && !PyUnicode_CheckExact(v)) return 0;
    }
    return 1;
}

/* plain_row(payload, offset, parse_row, ncols): payload.plain_row (an insert of whole text rows that parse) */
static PyObject *rc_plain_row(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (!configured()) return NULL;
    if (nargs != 4 || !PyBytes_CheckExact(args[0]) || !PyLong_CheckExact(args[3]))
        return fallback(py_plain_row, args, nargs);
    Py_ssize_t len = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t off = offset_arg(args[1], len);
    Py_ssize_t ncols = PyLong_AsSsize_t(args[3]);
    if (off < 0 || (ncols == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return fallback(py_plain_row, args, nargs);
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    if (off >= len || b[off] != 'I') Py_RETURN_NONE;
    unsigned char kind;
    uint32_t relid;
    PyObject *new_, *old;
    int an, ao;
    int rc = read_change(b, len, off, &kind, &relid, &new_, &old, &an, &ao);
    if (rc < 0) return NULL;
    if (rc == 0) Py_RETURN_NONE; /* malformed: insert_values answers None, so does plain_row */
    if (an || PyList_GET_SIZE(new_) != ncols || !all_text(new_)) {
        Py_DECREF(new_);
        Py_RETURN_NONE;
    }
    PyObject *row = parse_with(args[2], new_);
    if (row == NULL) {
        Py_DECREF(new_);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *r = PyLong_FromUnsignedLong(relid);
    PyObject *out = r == NULL ? NULL : PyTuple_Pack(4, S_I, r, row, new_);
    Py_XDECREF(r);
    Py_DECREF(row);
    Py_DECREF(new_);
    return out;
}

/* configure(UNCHANGED, insert_values, parse_change, plain_row, ParsedChange) */
static PyObject *rc_configure(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "configure(UNCHANGED, insert_values, parse_change, plain_row, ParsedChange)");
        return NULL;
    }
    Py_XSETREF(py_insert, Py_NewRef(args[1]));
    Py_XSETREF(py_parse, Py_NewRef(args[2]));
    Py_XSETREF(py_plain_row, Py_NewRef(args[3]));
    Py_XSETREF(make_parsed, Py_NewRef(args[4]));
    if (S_I == NULL) {
        S_I = PyUnicode_InternFromString("I");
        S_U = PyUnicode_InternFromString("U");
        S_D = PyUnicode_InternFromString("D");
        S_K = PyUnicode_InternFromString("K");
        S_O = PyUnicode_InternFromString("O");
        ZERO = PyLong_FromLong(0);
        if (!S_I || !S_U || !S_D || !S_K || !S_O || !ZERO) return NULL;
    }
    Py_XSETREF(UNCHANGED, Py_NewRef(args[0])); /* last: configured() from here on */
    Py_RETURN_NONE;
}

/* ---- MySqlMounter ------------------------------------------------------------------------------------------------
 * RowChange's slots, by name (read from the class's member table by configure_rows; processor/mounter.py's
 * _positional sets the same ones). If the class has any other slot, or one of these is missing, rc_layout stays 0
 * and every call goes to the Python mounter. */
static PyTypeObject *row_change_type = NULL;
static PyObject *op_insert = NULL, *op_update = NULL, *op_delete = NULL;
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
            return 0;
        }
        if (mp->type != T_OBJECT_EX || (mp->flags & READONLY) || field_offset[f] != -1) return 0;
        field_offset[f] = mp->offset;
        seen++;
    }
    return seen == F_N;
}

/* configure_rows(RowChange, OpType.INSERT, OpType.UPDATE, OpType.DELETE): True when RowChange's slots are the ones
 * C sets */
static PyObject *rc_configure_rows(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "configure_rows(RowChange, insert_op, update_op, delete_op)");
        return NULL;
    }
    Py_XSETREF(row_change_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(op_insert, Py_NewRef(args[1]));
    Py_XSETREF(op_update, Py_NewRef(args[2]));
    Py_XSETREF(op_delete, Py_NewRef(args[3]));
    rc_layout = read_layout(row_change_type);
    return PyBool_FromLong(rc_layout);
}

typedef struct {
    PyObject_HEAD
    PyObject *plans;    /* dict: schema version -> (schema, relation id or 0, parse_row, ncols) (the mounter's) */
    PyObject *names;    /* dict: schema version -> its column names (filled here on first use) */
    PyObject *general;  /* the Python mounter: everything else */
    PyObject *defer;    /* None, or defer_row(parse_row, texts) of the PostgreSQL codec: an insert's row deferred */
    vectorcallfunc vectorcall;
} MySqlMounter;

static inline void set_field(PyObject *o, int f, PyObject *v) {
    *(PyObject **)((char *)o + field_offset[f]) = v; /* a new reference; the slot was NULL (fresh object) */
}

/* dict(zip(names, row)), or NULL (exception set) */
static PyObject *named(PyObject *names, PyObject *row) {
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(names, i), PyTuple_GET_ITEM(row, i)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

/* the column names of a version's schema (schema.column_names, kept per version), borrowed; NULL: exception set */
static PyObject *names_of(MySqlMounter *mm, PyObject *key, PyObject *schema) {
    PyObject *names = PyDict_GetItemWithError(mm->names, key);
    if (names != NULL || PyErr_Occurred()) return names;
    PyObject *got = PyObject_GetAttrString(schema, "column_names");
    if (got == NULL) return NULL;
    if (!PyTuple_CheckExact(got)) {
        Py_DECREF(got);
        PyErr_SetString(PyExc_TypeError, "column_names is not a tuple");
        return NULL;
    }
    int fail = PyDict_SetItem(mm->names, key, got);
    Py_DECREF(got);
    return fail ? NULL : PyDict_GetItemWithError(mm->names, key);
}

/* the RowChange of a whole-image change, or NULL: with an exception set (error), else not handled here */
static PyObject *mount_whole(MySqlMounter *mm, PyObject *payload, PyObject *commit_ts, PyObject *commit_time) {
    if (!rc_layout || !PyBytes_CheckExact(payload) || PyBytes_GET_SIZE(payload) < 5 || !PyDict_CheckExact(mm->plans))
        return NULL;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t len = PyBytes_GET_SIZE(payload);
    PyObject *key = PyLong_FromUnsignedLong(be32u(b));
    if (key == NULL) return NULL;
    PyObject *out = NULL, *new_ = NULL, *old = NULL, *row = NULL, *orow = NULL, *old_values = NULL;
    PyObject *plan = PyDict_GetItemWithError(mm->plans, key); /* borrowed */
    if (plan == NULL || !PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 4 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(plan, 1)) || !PyLong_CheckExact(PyTuple_GET_ITEM(plan, 3))) {
        Py_DECREF(key);
        return NULL;
    }
    Py_INCREF(plan);
    PyObject *schema = PyTuple_GET_ITEM(plan, 0), *parse_row = PyTuple_GET_ITEM(plan, 2);
    unsigned long want = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(plan, 1));
    Py_ssize_t ncols = PyLong_AsSsize_t(PyTuple_GET_ITEM(plan, 3));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        goto done;
    }
    unsigned char kind;
    uint32_t relid;
    int an, ao;
    int rc = read_change(b, len, 4, &kind, &relid, &new_, &old, &an, &ao);
    if (rc != 1) goto done; /* -1 leaves its exception set */
    if ((want != 0 && want != relid) || an || ao) goto done; /* another relation's, or a partial image */
    if (new_ != NULL && (PyList_GET_SIZE(new_) != ncols || !all_text(new_))) goto done;
    if (old != NULL && (PyList_GET_SIZE(old) != ncols || !all_text(old))) goto done;
    int deferred = 0;
    if (kind == 'I' && new_ != NULL && mm->defer != Py_None) { /* parsed later exactly as now, or None: parse now */
        PyObject *args[2] = {parse_row, new_};
        row = PyObject_Vectorcall(mm->defer, args, 2, NULL);
        if (row == NULL) goto done;
        if (row == Py_None) Py_CLEAR(row);
        else deferred = 1;
    }
    if (new_ != NULL && row == NULL && (row = parse_with(parse_row, new_)) == NULL) goto done;
    if (old != NULL && (orow = parse_with(parse_row, old)) == NULL) goto done;
    if ((row != NULL && !deferred && (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != ncols)) ||
        (orow != NULL && (!PyTuple_CheckExact(orow) || PyTuple_GET_SIZE(orow) != ncols)))
        goto done;
    if (kind != 'I') { /* an update or delete: the old row by name (the new row stays positional, as an insert's) */
        PyObject *names = names_of(mm, key, schema);
        if (names == NULL) goto done;
        if (PyTuple_GET_SIZE(names) != ncols) goto done;
        if ((old_values = named(names, orow)) == NULL) goto done;
    }
    PyObject *extra = PyDict_New();
    if (extra == NULL) goto done;
    out = row_change_type->tp_alloc(row_change_type, 0);
    if (out == NULL) {
        Py_DECREF(extra);
        goto done;
    }
    set_field(out, F_OP, Py_NewRef(kind == 'I' ? op_insert : kind == 'U' ? op_update : op_delete));
    set_field(out, F_SCHEMA, Py_NewRef(schema));
    set_field(out, F_COMMIT_TS, Py_NewRef(commit_ts));
    set_field(out, F_COMMIT_TIME, Py_NewRef(commit_time));
    set_field(out, F_EXTRA, extra);
    /* the new row (an insert's, an update's) positional, as processor.mounter's _positional: values built on first
     * access; an update's and a delete's whole old row by name (upstream.mysql.rowcodec.whole_mounter) */
    set_field(out, F_VALUES, Py_NewRef(Py_None));
    set_field(out, F_OLD_VALUES, old_values ? Py_NewRef(old_values) : Py_NewRef(Py_None));
    set_field(out, F_ROW, row ? Py_NewRef(row) : Py_NewRef(Py_None));
    set_field(out, F_ROW_TEXT, row ? Py_NewRef(new_) : Py_NewRef(Py_None));
done:
    Py_DECREF(key);
    Py_DECREF(plan);
    Py_XDECREF(new_);
    Py_XDECREF(old);
    Py_XDECREF(row);
    Py_XDECREF(orow);
    Py_XDECREF(old_values);
    return out;
}

static PyObject *MySqlMounter_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 3 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0)) {
        PyObject *r = mount_whole((MySqlMounter *)self, args[0], args[1], args[2]);
        if (r != NULL || PyErr_Occurred()) return r;
    }
    return PyObject_Vectorcall(((MySqlMounter *)self)->general, args, nargsf, kwnames);
}

static PyObject *MySqlMounter_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *plans, *general, *defer = Py_None;
    static char *kwlist[] = {"plans", "general", "defer", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O|O:MySqlMounter", kwlist, &PyDict_Type, &plans, &general,
                                     &defer))
        return NULL;
    if (defer != Py_None && !PyCallable_Check(defer)) {
        PyErr_SetString(PyExc_TypeError, "MySqlMounter: defer must be None or callable");
        return NULL;
    }
    if (!PyCallable_Check(general)) {
        PyErr_SetString(PyExc_TypeError, "MySqlMounter: general must be callable");
        return NULL;
    }
    PyObject *names = PyDict_New();
    if (names == NULL) return NULL;
    MySqlMounter *self = (MySqlMounter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(names);
        return NULL;
    }
    self->plans = Py_NewRef(plans);
    self->names = names;
    self->general = Py_NewRef(general);
    self->defer = Py_NewRef(defer);
    self->vectorcall = MySqlMounter_vectorcall;
    return (PyObject *)self;
}

static int MySqlMounter_traverse(MySqlMounter *self, visitproc visit, void *arg) {
    Py_VISIT(self->plans);
    Py_VISIT(self->names);
    Py_VISIT(self->general);
    Py_VISIT(self->defer);
    return 0;
}

static int MySqlMounter_clear(MySqlMounter *self) {
    Py_CLEAR(self->plans);
    Py_CLEAR(self->names);
    Py_CLEAR(self->general);
    Py_CLEAR(self->defer);
    return 0;
}

static void MySqlMounter_dealloc(MySqlMounter *self) {
    PyObject_GC_UnTrack(self);
    MySqlMounter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject MySqlMounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_rowcodec.MySqlMounter",
    .tp_basicsize = sizeof(MySqlMounter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "MySqlMounter(plans, general, defer=None): mount(payload, commit_ts, commit_time) with whole-image changes "
               "built in C (defer: an insert's row deferred where defer(parse_row, texts) gives one)",
    .tp_new = MySqlMounter_new,
    .tp_dealloc = (destructor)MySqlMounter_dealloc,
    .tp_traverse = (traverseproc)MySqlMounter_traverse,
    .tp_clear = (inquiry)MySqlMounter_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(MySqlMounter, vectorcall),
};

static PyMethodDef methods[] = {
    {"frame_events", (PyCFunction)(void (*)(void))frame_events, METH_FASTCALL,
     "frame_events(buf, off, seq, checksum) -> (events, off, seq): wire.frame in C"},
    {"decode_event", (PyCFunction)(void (*)(void))decode_event, METH_FASTCALL,
     "decode_event(heads, full, padded, codes, p1, p2, calls, data, end, etype) -> payloads, or None (Python decides)"},
    {"decode_rows", decode_rows, METH_VARARGS,
     "decode_rows(data, off, end, kind, head, codes, p1, p2, calls) -> list of payloads, or None (decode in Python)"},
    {"configure", (PyCFunction)(void (*)(void))rc_configure, METH_FASTCALL,
     "configure(UNCHANGED, insert_values, parse_change, plain_row, ParsedChange): the Python functions C falls back to"},
    {"configure_rows", (PyCFunction)(void (*)(void))rc_configure_rows, METH_FASTCALL,
     "configure_rows(RowChange, insert_op, update_op, delete_op) -> whether C can build RowChange objects"},
    {"insert_values", (PyCFunction)(void (*)(void))rc_insert_values, METH_FASTCALL,
     "insert_values(payload, offset): payload.insert_values"},
    {"parse_change", (PyCFunction)(void (*)(void))rc_parse_change, METH_FASTCALL, "parse_change(raw): payload.parse"},
    {"plain_row", (PyCFunction)(void (*)(void))rc_plain_row, METH_FASTCALL,
     "plain_row(payload, offset, parse_row, ncols): payload.plain_row"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_rowcodec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__rowcodec(void) {
    crc_init();
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "CALL", C_CALL) || PyModule_AddIntConstant(m, "INT", C_INT) ||
        PyModule_AddIntConstant(m, "UINT", C_UINT) || PyModule_AddIntConstant(m, "YEAR", C_YEAR) ||
        PyModule_AddIntConstant(m, "TEXT", C_TEXT) || PyModule_AddIntConstant(m, "BYTEA", C_BYTEA) ||
        PyModule_AddIntConstant(m, "BINARY", C_BINARY) || PyModule_AddIntConstant(m, "DATE", C_DATE) ||
        PyModule_AddIntConstant(m, "DATETIME2", C_DATETIME2) || PyModule_AddIntConstant(m, "TIMESTAMP2", C_TIMESTAMP2) ||
        PyModule_AddIntConstant(m, "TIME2", C_TIME2)) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyType_Ready(&MySqlMounterType) < 0 || PyModule_AddObjectRef(m, "MySqlMounter", (PyObject *)&MySqlMounterType)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
