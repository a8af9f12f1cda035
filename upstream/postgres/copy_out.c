/* Drain a libpq COPY OUT into a caller's buffer (upstream/postgres/copy_out.py loads this with ctypes).
 *
 * No Python API, no libpq headers: the libpq functions are passed in as pointers (the very libpq psycopg2 runs
 * on), so this builds with a bare C compiler. One call fills up to `cap` bytes with the COPY's data, rows cut
 * anywhere (COPY FROM accepts data in pieces of any size); a row that does not fit stays pending in the state
 * for the next call. ctypes releases the GIL for the call, so other threads run meanwhile.
 */
#include <string.h>

typedef int (*getcopy_fn)(void *conn, char **buffer, int async);
typedef void (*freemem_fn)(void *ptr);

typedef struct {
    char *pending;   /* a row from PQgetCopyData not yet fully handed out (libpq's memory) */
    int pending_len;
    int pending_off;
    int done;        /* 0: more to come; 1: the COPY ended (PQgetCopyData -1); -1: it failed (-2) */
} tw_copy_state;

int tw_copy_fill(void *conn, char *buf, int cap, tw_copy_state *st, getcopy_fn get, freemem_fn freemem) {
    int used = 0;
    while (used < cap) {
        if (st->pending != NULL) {
            int n = st->pending_len - st->pending_off;
            if (n > cap - used) n = cap - used;
            memcpy(buf + used, st->pending + st->pending_off, (size_t)n);
            used += n;
            st->pending_off += n;
            if (st->pending_off == st->pending_len) {
                freemem(st->pending);
                st->pending = NULL;
            }
            continue;
        }
        if (st->done != 0) break;
        char *row = NULL;
        int n = get(conn, &row, 0);
        if (n == -1) { st->done = 1; break; }
        if (n < 0) { st->done = -1; break; }
        st->pending = row;
        st->pending_len = n;
        st->pending_off = 0;
    }
    return used;
}

void tw_copy_release(tw_copy_state *st, freemem_fn freemem) {
    if (st->pending != NULL) {
        freemem(st->pending);
        st->pending = NULL;
    }
}
