/* The fast lane: the common path of extraction in C (pcapdecomp/read/fastlane.py drives it; see its docstring).
 *
 * Classic pcap bytes are fed in chunks. Each record is decoded (link, IPv4/IPv6, TCP) and looked up among the
 * connections that Python has handed over ("promoted"). A record of a promoted connection that takes the common
 * path is consumed here: in-order payload of a MySQL connection in the command phase, one COM_QUERY or
 * COM_STMT_EXECUTE at a time, answered by an OK or one result set; or any segment without SYN/FIN/RST of a
 * connection that is not parsed (other TCP, another worker's part). Everything else goes back to Python as the raw
 * record, which the Python code (the twin of everything here) handles as if the lane did not exist.
 *
 * When a promoted MySQL connection leaves the common path in the middle of an exchange, the lane "bails": it
 * forgets everything it did since the exchange began, hands back the counters it committed, and returns copies of
 * the connection's records since then so that Python replays them. So the lane never needs to transfer a
 * half-read state: Python always resumes at an exchange boundary. Every decision mirrors the Python code path by
 * path; tests compare whole extractions with and without the lane. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "_lane_columns.h" /* the exchange row layout: COL_<NAME>, NCOLS (setup.py writes it from core/schema.py) */

#define MAX_PACKET 0xFFFFFF
#define MORE_RESULTS 0x0008
#define CURSOR_EXISTS 0x0040
#define QUERY_WAS_SLOW 0x0800
#define REPLAY_LIMIT (4 << 20) /* bytes of one exchange kept for a replay; beyond, Python takes over */
#define HEAD 24                /* payload bytes kept per response packet: all an OK or EOF needs */
#define BATCH_TEXT (16 << 20) /* characters of text a batch of rows holds at most (Lane.batch_text) */
#define FP_CACHE 16            /* statements whose fingerprints the lane keeps (Lane.fp_cache) */
#define FP_CACHE_TEXT 4096     /* … of at most this many characters: what the cache holds stays small */

enum { K_MYSQL = 1, K_OTHER = 2, K_FOREIGN = 3 };
enum { IDLE, COLLECT, WAIT }; /* between exchanges; reading a request; reading its response */
enum { R_START, R_COLS, R_AFTER_COLS, R_ROWS, R_DONE };
enum { RES_NONE, RES_OK, RES_RESULTSET };

/* A connection's key: its address length (4 or 16), both addresses (source first), both ports: 1 + 2 x 16 + 4 = 37
 * bytes, zero-padded to a multiple of 8 for the hash. (It was 36: an IPv6 key's ports overwrote the last byte of
 * its destination address, so [fd77::1]:p and [fd77::11]:p were one connection to the lane; the fuzz found it.) */
#define KEY_LEN 40

typedef struct {
    int64_t frames, last_ts, segs[2], bytes[2], next[2], exchanges, count, other_frames, other_bytes;
    int has_last_ts;
} Counts;

typedef struct {
    int64_t frame, ts, orig_len, caplen, at;
    int linktype;
} Saved;

typedef struct Flow Flow;

typedef struct Entry {
    uint8_t key[KEY_LEN]; /* address length, addresses (source first), source port, destination port: make_key */
    Flow *flow;
    int dir; /* 0: this key is client -> server */
    struct Entry *next;
} Entry;

struct Flow {
    PyObject *obj;
    int kind, owned;
    Counts committed, work;
    Entry *entries[2];
    /* MySQL */
    int deprecate_eof, qa;
    int64_t max_sql, keep_client;
    /* the input's budgets (framing.InputBudget.left, shared with Python; NULL: none): [0] statement text, [1]
     * exchanges; and what the exchange in progress spent: given back when the exchange goes back to Python */
    int64_t *budget, sql_spent, row_spent;
    uint32_t base[2];
    PyObject *statements, *row; /* row: the connection's columns of every row it writes (read/exchanges.py) */
    int64_t conn_index;
    int state;
    /* the exchange in progress */
    int command;
    PyObject *sql, *stmt_id, *params;
    int unknown_statement; /* an EXECUTE of a statement prepared before the capture: its problem, as Python writes it */
    int64_t req_ts, req_frame, req_off, bytes_req, req_last_ts, req_last_frame;
    uint8_t *req; /* a request that spans segments, gathered */
    Py_ssize_t req_len, req_cap;
    int64_t rf_ts, rf_frame, rf_off, rl_ts, rl_frame, rl_end, bytes_resp;
    int has_rf, rstate, next_seq, result, has_status;
    int64_t left, rows, affected, warnings, status, result_sets;
    /* the response packet being read */
    uint8_t hdr[4], head[HEAD];
    int hdr_have, in_pkt, head_have;
    int64_t plen, remaining, pkt_ts, pkt_frame, pkt_off;
    /* records since the exchange began */
    Saved *saved;
    Py_ssize_t n_saved, cap_saved;
    uint8_t *arena;
    Py_ssize_t arena_len, arena_cap;
    Flow *all_next, *all_prev;
};

/* The lane writes its exchange rows column by column, in the layout of schema.EXCHANGE_COLUMNS
 * (_lane_columns.h): 'q' int64 and 'd' float64 columns into plain buffers that Arrow takes as they are; 'n'
 * int64 or None (an int64 buffer and a byte per row, 1 when it holds a value), 'b' bool or None (a byte per row:
 * 0, 1, 2 for None) and 's' text or None (its UTF-8 one row after the other, an int32 offset where each row ends,
 * and a byte per row, 1 when it holds text), which Arrow takes as buffers too (converting Python objects was ~5 %
 * of an extraction); 'o' columns as lists of Python objects. A column of the schema without a kind here makes the
 * import fail. */
static const char ROW_KINDS[NCOLS + 1] = {
    [COL_CAPTURE] = 'o', [COL_CONN_INDEX] = 'q', [COL_CONN_ID] = 'n', [COL_CLIENT] = 'o', [COL_SERVER] = 'o',
    [COL_SEQ] = 'q', [COL_COMMAND] = 'o', [COL_SQL] = 'o', [COL_STMT_ID] = 'n', [COL_PARAMS] = 's',
    [COL_FINGERPRINT] = 'o', [COL_QUERY_ID] = 'o',
    [COL_REQ_FIRST_TS] = 'q', [COL_REQ_LAST_TS] = 'q', [COL_RESP_FIRST_TS] = 'q', [COL_RESP_LAST_TS] = 'q',
    [COL_REQ_FIRST_FRAME] = 'q', [COL_REQ_LAST_FRAME] = 'q', [COL_RESP_FIRST_FRAME] = 'q',
    [COL_RESP_LAST_FRAME] = 'q', [COL_RESPONSE_S] = 'd', [COL_TTFB_S] = 'd',
    [COL_RESULT] = 'o', [COL_ERROR_CODE] = 'n', [COL_ERROR_STATE] = 'o', [COL_ERROR_MESSAGE] = 'o',
    [COL_ROWS] = 'q', [COL_AFFECTED_ROWS] = 'q', [COL_WARNINGS] = 'q', [COL_RESULT_SETS] = 'q',
    [COL_BYTES_REQ] = 'q', [COL_BYTES_RESP] = 'q', [COL_STATUS_FLAGS] = 'q', [COL_SERVER_FLAG_SLOW] = 'b',
    [COL_TLS] = 'b', [COL_COMPRESSED] = 'o', [COL_USER] = 'o', [COL_DB] = 'o',
    [COL_REQ_TCP_SEQ] = 'q', [COL_RESP_TCP_SEQ] = 'q', [COL_RESP_TCP_END] = 'q', [COL_PROBLEMS] = 'o',
};
static const char *const COLUMN_NAME[NCOLS] = {COLUMN_NAMES};

typedef struct {
    PyObject *list;
    char *data;
    Py_ssize_t n, cap; /* items in data */
    /* a dictionary-coded 'o' column (pandas categorical text): int32 codes in data, -1 for None, and the batch's
     * distinct values in `list` (first seen first: Arrow's dictionary_encode order), `codes` value -> code */
    PyObject *codes;
    /* the value last coded (a reference held, so that the same pointer is the same object) and its code: most
     * rows repeat the previous row's capture, server, command, result… and skip the dictionary lookup */
    PyObject *last;
    int32_t last_code;
    /* 'n', 'b', 's' columns: a byte per row (1 a value, 0 None; 'b': 0, 1, 2 for None); 's': the text's UTF-8 and
     * the offset where each row's ends */
    char *valid, *chars;
    Py_ssize_t valid_cap, chars_len, chars_cap;
    int32_t *ends;
    Py_ssize_t ends_cap;
} Column;

/* ---- the records of a capture file: classic pcap or pcapng, times checked (read/capture.py's readers + _timed) ---- */

enum { FMT_PCAP, FMT_PCAPNG };
enum { REC_WAIT, REC_END, REC_PACKET, REC_OTHER, REC_DAMAGE, REC_ERROR }; /* what one step of a reader found */

typedef struct {
    int linktype;
    int64_t snaplen;
    int resol;        /* if_tsresol, -1 when absent (microseconds) */
    int64_t offset_s; /* if_tsoffset */
} Iface;

typedef struct {
    int has_prev, has_prev2;
    int64_t prev, prev2; /* times used for the interface's last two records */
} TimeState;

/* Where a pcapng parse stands: the reader's own position, or a copy that looks ahead without committing. */
typedef struct {
    Py_ssize_t at; /* offset in buf */
    int64_t pos;   /* file offset */
    int big;       /* the section's byte order */
    int64_t base;  /* key of the section's first interface (interface ids restart in each section) */
    int64_t idbs;  /* interface description blocks passed: keys below this are known */
    int64_t last_raw; /* the last EPB/PB's time as read, what a simple packet block borrows */
    int last_valid;
} NgPos;

typedef struct {
    int64_t frame, ts, orig_len, key; /* key: the interface's ordinal over the file, -1 for a borrowed time */
    int linktype, valid;
    const uint8_t *data;
    Py_ssize_t caplen;
} Rec;

typedef struct {
    uint8_t *buf;
    Py_ssize_t start, end, cap;
    int64_t pos; /* file offset of buf[start] */
    int eof, format;
    /* classic pcap */
    int big_endian, linktype;
    int64_t frac_to_ns, limit;
    /* pcapng */
    NgPos ng;
    Iface *ifs;            /* every interface of the file, in file order (keys) */
    TimeState *times;      /* per interface key */
    int64_t n_ifs, cap_ifs;
    int64_t sections, unknown_blocks;
    PyObject *if_drops;    /* dict: interface id -> packets dropped (ISB), as CaptureStats.if_drops */
    /* times */
    TimeState one;         /* classic pcap: its one interface */
    int64_t last_used, bad_ts, frame, first_ts, last_ts;
    int has_ts;
    /* damage: the first, as capture._Damaged says it */
    int damaged;
    char what[96];
    int64_t damage_pos;
} Reader;

/* ---- an excerpt plan (the repair's re-read, fastlane.ExcerptPlan) -------------------------------------------
 *
 * The loss repair reads a few connections of a capture again, with borrowed pieces put in. Their records were once
 * copied into a temporary pcap file (Excerpt's copy: chosen frames rewritten as LINKTYPE_RAW records, the pieces'
 * ready-made records in between) that the lane then read. With a plan the lane reads those same records straight
 * from the capture: the chosen frames of the keys (directed address, port, address, port), each rewritten as the
 * copy writes it (excerpt_put), `blobs[i]` before the frame of ordinal insert_at[i] (len(frames): after the last),
 * numbered from 1 in that order and timed from the record header written, as a reader of that file would. After
 * the last of them the capture is not read further. */

typedef struct RKey {
    uint8_t key[KEY_LEN];
    Py_ssize_t index;
    struct RKey *next;
} RKey;

typedef struct {
    int on, done;
    RKey **table;
    size_t table_mask;
    Py_buffer frames, insert_at;
    PyObject *blobs;
    Py_ssize_t n_frames, at, n_inserts, next_insert;
    int64_t frame, first_ts, last_ts; /* the records handed on: their count (the last frame number), times */
    int has_ts;
    uint8_t *rec; /* the chosen frame being read, rewritten */
    Py_ssize_t rec_cap;
} Plan;

#define LINK_KINDS 16 /* the link types the lane decodes (capture.SUPPORTED_LINK_TYPES), with room to spare */

typedef struct {
    PyObject_HEAD
    Reader R;
    int64_t fast_frames;
    int64_t fast_link[LINK_KINDS][2]; /* link type, records consumed here */
    int n_link;
    int64_t commands[2];
    Entry **table;
    size_t table_mask;
    Flow *all;
    PyObject *fingerprints, *names[2], *results[2], *empty;
    /* the fingerprints of the statements of COM_STMT_EXECUTE met lately, by the statement text's object (a
     * prepared statement's, the same object at every execute; held, so that an address is never another text's):
     * `fingerprints` is a function of its arguments' values, and calling it (an lru_cache) per exchange was ~4 %
     * of an extraction */
    struct { PyObject *sql, *fp; } fp_cache[FP_CACHE];
    Column cols[NCOLS];
    Py_ssize_t batch, n_rows;
    Py_ssize_t batch_text; /* characters of text the batch holds (distinct coded values, 's' columns): a batch is
                              also handed over when they reach BATCH_TEXT */
    Plan plan; /* on: read an excerpt plan's records instead of the capture's */
    Py_buffer budget; /* framing.InputBudget.left: two int64 (buf NULL: no budget) */
    /* bail in progress */
    Flow *bailing;
    Py_ssize_t replay_i;
    int finishing;
} Lane;

/* ---- small helpers ------------------------------------------------------------------------------------ */

static inline uint32_t rd32(const uint8_t *p, int big) {
    return big ? ((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3])
               : ((uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0]);
}
static inline uint32_t be32(const uint8_t *p) { return rd32(p, 1); }
static inline unsigned u16le(const uint8_t *p) { return p[0] | p[1] << 8; }
static inline int64_t u24(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16; }

/* A key's bucket: the key read as five 64-bit words, each mixed in by a multiply (FNV-1a over its bytes one by one
 * was ~3 % of an extraction: one lookup per packet). */
static size_t hash_key(const uint8_t *k) {
    uint64_t w[KEY_LEN / 8];
    memcpy(w, k, KEY_LEN);
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (int i = 0; i < KEY_LEN / 8; i++) h = (h ^ w[i]) * 0xFF51AFD7ED558CCDULL;
    return (size_t)(h ^ h >> 29);
}

static void make_key(uint8_t *k, const uint8_t *src, const uint8_t *dst, int alen, unsigned sport, unsigned dport) {
    memset(k, 0, KEY_LEN);
    k[0] = (uint8_t)alen;
    memcpy(k + 1, src, alen);
    memcpy(k + 1 + alen, dst, alen);
    k[33] = sport >> 8; k[34] = sport & 0xFF; k[35] = dport >> 8; k[36] = dport & 0xFF;
}

static Entry *lookup(Lane *L, const uint8_t *k) {
    for (Entry *e = L->table[hash_key(k) & L->table_mask]; e; e = e->next)
        if (!memcmp(e->key, k, KEY_LEN)) return e;
    return NULL;
}

static void unlink_entry(Lane *L, Entry *target) {
    Entry **slot = &L->table[hash_key(target->key) & L->table_mask];
    while (*slot && *slot != target) slot = &(*slot)->next;
    if (*slot) *slot = target->next;
    PyMem_Free(target);
}

static void clear_exchange(Flow *f) {
    if (f->budget) { f->budget[0] += f->sql_spent; f->budget[1] += f->row_spent; } /* Python reads it again */
    f->sql_spent = f->row_spent = 0;
    Py_CLEAR(f->sql);
    Py_CLEAR(f->stmt_id);
    Py_CLEAR(f->params);
    f->unknown_statement = 0;
    f->state = IDLE;
    f->req_len = 0;
    f->n_saved = 0;
    f->arena_len = 0;
    f->hdr_have = f->in_pkt = f->head_have = 0;
}

/* Forget the flow: out of the table and the list. Its Python references go too. */
static void drop_flow(Lane *L, Flow *f) {
    for (int i = 0; i < 2; i++)
        if (f->entries[i]) unlink_entry(L, f->entries[i]);
    if (f->all_prev) f->all_prev->all_next = f->all_next; else L->all = f->all_next;
    if (f->all_next) f->all_next->all_prev = f->all_prev;
    clear_exchange(f);
    Py_CLEAR(f->obj);
    Py_CLEAR(f->statements);
    Py_CLEAR(f->row);
    PyMem_Free(f->saved);
    PyMem_Free(f->arena);
    PyMem_Free(f->req);
    PyMem_Free(f);
}

static int save_record(Flow *f, const Rec *r) {
    const uint8_t *data = r->data;
    Py_ssize_t caplen = r->caplen;
    if (f->n_saved == f->cap_saved) {
        Py_ssize_t cap = f->cap_saved ? f->cap_saved * 2 : 16;
        Saved *s = PyMem_Realloc(f->saved, cap * sizeof(Saved));
        if (!s) return -1;
        f->saved = s;
        f->cap_saved = cap;
    }
    if (f->arena_len + caplen > f->arena_cap) {
        Py_ssize_t cap = f->arena_cap ? f->arena_cap : 4096;
        while (cap < f->arena_len + caplen) cap *= 2;
        uint8_t *a = PyMem_Realloc(f->arena, cap);
        if (!a) return -1;
        f->arena = a;
        f->arena_cap = cap;
    }
    memcpy(f->arena + f->arena_len, data, caplen);
    f->saved[f->n_saved++] = (Saved){r->frame, r->ts, r->orig_len, caplen, f->arena_len, r->linktype};
    f->arena_len += caplen;
    return 0;
}

/* ---- the records of a capture file ---------------------------------------------------------------------- */

#define TIME_JUMP_NS 1000000000LL           /* capture.TIME_JUMP_NS */
#define IDLE_LIMIT_NS (86400LL * 1000000000LL) /* capture.IDLE_LIMIT_NS */
#define WILD_RUN 8                          /* capture.WILD_RUN */
#define MAX_BLOCK (256LL * 1024 * 1024)     /* capture._MAX_RECORD */
#define PCAPNG_SHB 0x0A0D0D0AU

static inline unsigned rd16(const uint8_t *p, int big) { return big ? (unsigned)(p[0] << 8 | p[1]) : (unsigned)(p[1] << 8 | p[0]); }
static inline uint64_t rd64(const uint8_t *p, int big) {
    return big ? (uint64_t)rd32(p, 1) << 32 | rd32(p + 4, 1) : (uint64_t)rd32(p + 4, 0) << 32 | rd32(p, 0);
}
static inline int64_t dist(int64_t a, int64_t b) { return a > b ? a - b : b - a; }

static int reader_setup(Reader *R, int pcapng, int big, int64_t frac, int linktype, int64_t limit, int64_t pos) {
    R->format = pcapng ? FMT_PCAPNG : FMT_PCAP;
    R->big_endian = big;
    R->frac_to_ns = frac;
    R->linktype = linktype;
    R->limit = limit;
    R->pos = pos;
    R->ng.pos = pos;
    if (!R->if_drops && !(R->if_drops = PyDict_New())) return -1;
    return 0;
}

static void reader_free(Reader *R) {
    PyMem_Free(R->buf);
    PyMem_Free(R->ifs);
    PyMem_Free(R->times);
    Py_CLEAR(R->if_drops);
}

/* Room for n more bytes after buf[end]: what was read moved to the front, the buffer grown if need be. */
static int reader_reserve(Reader *R, Py_ssize_t n) {
    if (R->start) {
        memmove(R->buf, R->buf + R->start, R->end - R->start);
        R->end -= R->start;
        R->ng.at -= R->start;
        R->start = 0;
    }
    if (R->end + n > R->cap) {
        Py_ssize_t cap = R->cap ? R->cap : 1 << 20;
        while (cap < R->end + n) cap *= 2;
        uint8_t *b = PyMem_Realloc(R->buf, cap);
        if (!b) { PyErr_NoMemory(); return -1; }
        R->buf = b;
        R->cap = cap;
    }
    return 0;
}

/* Append capture bytes. */
static int reader_feed(Reader *R, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return -1;
    if (reader_reserve(R, view.len) < 0) { PyBuffer_Release(&view); return -1; }
    memcpy(R->buf + R->end, view.buf, view.len);
    R->end += view.len;
    PyBuffer_Release(&view);
    return 0;
}

/* The room after a reader's bytes, lent to readinto as a writable buffer for one call: it counts the views taken
   of it, and gives none once the call is over. */
typedef struct {
    PyObject_HEAD
    uint8_t *at;
    Py_ssize_t n, exports;
} Room;

static int Room_getbuffer(Room *room, Py_buffer *view, int flags) {
    if (!room->at) {
        PyErr_SetString(PyExc_BufferError, "the lane's buffer is lent only during the read");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)room, room->at, room->n, 0, flags) < 0) return -1;
    room->exports++;
    return 0;
}

static void Room_releasebuffer(Room *room, Py_buffer *Py_UNUSED(view)) { room->exports--; }

static PyBufferProcs Room_as_buffer = {(getbufferproc)Room_getbuffer, (releasebufferproc)Room_releasebuffer};

static PyTypeObject RoomType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pcapdecomp._lane.Room",
    .tp_basicsize = sizeof(Room),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer = &Room_as_buffer,
    .tp_doc = "Room in a lane's buffer, lent to a file's readinto for one call.",
};

/* Append up to n capture bytes read by readinto(room) straight into the buffer: no chunk read elsewhere and copied
   in, a copy of the whole file less (docs/speed.md). Returns how many came (0: the end), -1 on an error (readinto's
   own, an OSError, is passed on). readinto is a file's, which keeps no view of the room; one that kept a view is an
   error, and the buffer is then left to it (never freed or moved), not freed under it. */
static Py_ssize_t reader_fill(Reader *R, PyObject *readinto, Py_ssize_t n) {
    if (n < 0) { PyErr_SetString(PyExc_ValueError, "a negative number of bytes to read"); return -1; }
    if (reader_reserve(R, n) < 0) return -1;
    Room *room = PyObject_New(Room, &RoomType);
    if (!room) return -1;
    room->at = R->buf + R->end;
    room->n = n;
    room->exports = 0;
    PyObject *got = PyObject_CallOneArg(readinto, (PyObject *)room);
    int kept = room->exports != 0;
    room->at = NULL; /* no view of it from now on */
    Py_DECREF(room);
    if (kept) {
        Py_XDECREF(got);
        R->buf = NULL; /* left to the view that holds it */
        R->start = R->end = R->cap = 0;
        PyErr_SetString(PyExc_BufferError, "readinto kept a view of the lane's buffer");
        return -1;
    }
    if (!got) return -1;
    Py_ssize_t k = PyLong_AsSsize_t(got); /* None (a non-blocking stream with nothing yet) is a TypeError */
    Py_DECREF(got);
    if (k == -1 && PyErr_Occurred()) return -1;
    if (k < 0 || k > n) {
        PyErr_Format(PyExc_ValueError, "readinto returned %zd for a buffer of %zd bytes", k, n);
        return -1;
    }
    R->end += k;
    return k;
}

static PyObject *fill_method(Reader *R, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "fill(readinto, n) takes 2 arguments"); return NULL; }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t k = reader_fill(R, args[0], n);
    return k < 0 ? NULL : PyLong_FromSsize_t(k);
}

/* capture._Damaged: only a committing step records it (a look-ahead just stops there) */
static int damage(Reader *R, int commit, int64_t pos, const char *format, long long value) {
    if (commit) {
        R->damaged = 1;
        PyOS_snprintf(R->what, sizeof R->what, format, value);
        R->damage_pos = pos;
    }
    return REC_DAMAGE;
}

/* capture.repaired_time: 1 and *fixed when the record's time must be replaced. nx/nv: the raw times (and whether
 * each is in range) of the next `got` records of the same interface; last: no record follows at all. */
static int repaired_time(const TimeState *s, int64_t ts, int valid, const int64_t *nx, const int *nv, int got,
                         int last, int64_t *fixed) {
    const int64_t jump = TIME_JUMP_NS, idle = IDLE_LIMIT_NS;
    if (!valid) {
        if (s->has_prev) { *fixed = s->prev; return 1; }
        for (int i = 0; i < got; i++)
            if (nv[i]) { *fixed = nx[i]; return 1; }
        *fixed = 0;
        return 1;
    }
    if (!s->has_prev) {
        if (got >= 2 && nv[0] && nv[1] && dist(nx[0], nx[1]) <= jump && (ts - nx[0] > jump || nx[0] - ts > idle)) {
            *fixed = nx[0];
            return 1;
        }
        return 0;
    }
    if (dist(ts, s->prev) <= jump) return 0;
    if (got >= 1) {
        for (int i = 0; i < got; i++)
            if (nv[i] && dist(nx[i], s->prev) <= jump && dist(nx[i], ts) > jump) { *fixed = s->prev; return 1; }
        return 0;
    }
    if (last && s->has_prev2 && dist(s->prev, s->prev2) <= jump && (s->prev - ts > jump || ts - s->prev > idle)) {
        *fixed = s->prev;
        return 1;
    }
    return 0;
}

static void record_done(Reader *R, Rec *out, int64_t ts) {
    out->ts = ts;
    out->frame = ++R->frame;
    if (!R->has_ts) { R->first_ts = ts; R->has_ts = 1; }
    R->last_ts = ts;
}

/* -- classic pcap -- */

static inline int64_t pcap_ts(const Reader *R, const uint8_t *h) {
    return (int64_t)rd32(h, R->big_endian) * 1000000000 + (int64_t)rd32(h + 4, R->big_endian) * R->frac_to_ns;
}

/* The times of up to `want` complete records at p: how many there are (fewer only where the records end, cut or
 * damaged, as capture._timed reads them), or -1: wait for more of the file. Always in range (32-bit fields). */
static int pcap_peek(const Reader *R, const uint8_t *p, Py_ssize_t avail, int want, int64_t *out) {
    int got = 0;
    while (got < want) {
        if (avail < 16) return R->eof ? got : -1;
        int64_t caplen = rd32(p + 8, R->big_endian);
        if (caplen > R->limit) return got;
        if (avail < 16 + caplen) return R->eof ? got : -1;
        out[got++] = pcap_ts(R, p);
        p += 16 + caplen;
        avail -= 16 + caplen;
    }
    return got;
}

static int pcap_next(Reader *R, Rec *out) {
    Py_ssize_t have = R->end - R->start;
    if (have < 16) {
        if (!R->eof) return REC_WAIT;
        if (have == 0) return REC_END;
        return damage(R, 1, R->pos, "file truncated mid-record header", 0);
    }
    const uint8_t *h = R->buf + R->start;
    int64_t caplen = rd32(h + 8, R->big_endian), orig_len = rd32(h + 12, R->big_endian);
    if (caplen > R->limit) return damage(R, 1, R->pos, "insane record length %lld", caplen);
    if (have < 16 + caplen) {
        if (!R->eof) return REC_WAIT;
        return damage(R, 1, R->pos, "file truncated mid-record", 0);
    }
    int64_t ts = pcap_ts(R, h);
    TimeState *s = &R->one;
    if (!s->has_prev || dist(ts, s->prev) > TIME_JUMP_NS) { /* in question: look at the next records */
        int64_t nx[WILD_RUN], fixed;
        int nv[WILD_RUN] = {1, 1, 1, 1, 1, 1, 1, 1};
        int got = pcap_peek(R, h + 16 + caplen, have - 16 - caplen, WILD_RUN, nx);
        if (got < 0) return REC_WAIT;
        if (repaired_time(s, ts, 1, nx, nv, got, got == 0, &fixed)) {
            ts = fixed;
            R->bad_ts += 1;
        }
    }
    s->prev2 = s->prev;
    s->has_prev2 = s->has_prev;
    s->prev = ts;
    s->has_prev = 1;
    out->data = h + 16;
    out->caplen = caplen;
    out->orig_len = orig_len;
    out->linktype = R->linktype;
    out->key = 0;
    R->start += 16 + caplen;
    R->pos += 16 + caplen;
    record_done(R, out, ts);
    return REC_PACKET;
}

/* -- pcapng -- */

/* _ts_converter + if_tsoffset: ticks -> ns, exactly; 0 when the time is outside int64 nanoseconds from 1970 */
static int ng_time(const Iface *f, uint64_t ticks, int64_t *out) {
    __int128 v;
    if (f->resol < 0) {
        v = (__int128)ticks * 1000;
    } else {
        int exponent = f->resol & 0x7F;
        if (f->resol & 0x80) {
            v = ((__int128)ticks * 1000000000) >> exponent;
        } else if (exponent <= 9) {
            int64_t factor = 1;
            for (int i = exponent; i < 9; i++) factor *= 10;
            v = (__int128)ticks * factor;
        } else if (exponent - 9 >= 20) {
            v = 0; /* a divisor beyond 2^64: every tick count floors to 0 */
        } else {
            uint64_t divisor = 1;
            for (int i = 9; i < exponent; i++) divisor *= 10;
            v = ticks / divisor;
        }
    }
    v += (__int128)f->offset_s * 1000000000;
    if (v < 0 || v > INT64_MAX) return 0;
    *out = (int64_t)v;
    return 1;
}

/* _pcapng_options: the next option at *pos of a body of blen bytes; 0 at the end */
static int ng_option(const uint8_t *body, Py_ssize_t blen, Py_ssize_t *pos, int big, unsigned *code,
                     const uint8_t **value, Py_ssize_t *vlen) {
    if (*pos + 4 > blen) return 0;
    *code = rd16(body + *pos, big);
    if (*code == 0) return 0;
    Py_ssize_t length = rd16(body + *pos + 2, big), start = *pos + 4;
    *value = body + start;
    *vlen = start + length <= blen ? length : blen - start; /* a slice past the body is cut, as in Python */
    *pos += 4 + ((length + 3) & ~(Py_ssize_t)3);
    return 1;
}

static int add_interface(Reader *R, const uint8_t *body, Py_ssize_t blen, int big) {
    if (R->n_ifs == R->cap_ifs) {
        int64_t cap = R->cap_ifs ? R->cap_ifs * 2 : 8;
        Iface *ifs = PyMem_Realloc(R->ifs, cap * sizeof(Iface));
        if (!ifs) { PyErr_NoMemory(); return -1; }
        R->ifs = ifs;
        TimeState *times = PyMem_Realloc(R->times, cap * sizeof(TimeState));
        if (!times) { PyErr_NoMemory(); return -1; }
        R->times = times;
        R->cap_ifs = cap;
    }
    Iface *f = &R->ifs[R->n_ifs];
    f->linktype = rd16(body, big);
    f->snaplen = rd32(body + 4, big);
    f->resol = -1;
    f->offset_s = 0;
    Py_ssize_t pos = 8, vlen;
    unsigned code;
    const uint8_t *value;
    while (ng_option(body, blen, &pos, big, &code, &value, &vlen)) {
        if (code == 9 && vlen > 0) f->resol = value[0];
        else if (code == 14 && vlen == 8) f->offset_s = (int64_t)rd64(value, big);
    }
    memset(&R->times[R->n_ifs], 0, sizeof(TimeState));
    R->n_ifs += 1;
    return 0;
}

/* One block at p (capture._pcapng_loop, block for block). commit: count it (a look-ahead only reads). */
static int ng_block(Reader *R, NgPos *p, Rec *out, int commit) {
    Py_ssize_t avail = R->end - p->at;
    const uint8_t *h = R->buf + p->at;
    if (avail < 8) {
        if (!R->eof) return REC_WAIT;
        if (avail == 0) return REC_END;
        return damage(R, commit, p->pos, "file truncated mid-block header", 0);
    }
    int big = p->big;
    uint32_t type = rd32(h, big), len;
    if (type == PCAPNG_SHB) {
        if (avail < 12) {
            if (!R->eof) return REC_WAIT;
            return damage(R, commit, p->pos, "file truncated mid-block header", 0);
        }
        if (!memcmp(h + 8, "\x4d\x3c\x2b\x1a", 4)) big = 0;
        else if (!memcmp(h + 8, "\x1a\x2b\x3c\x4d", 4)) big = 1;
        else return damage(R, commit, p->pos, "bad section header", 0);
        len = rd32(h + 4, big);
        if (len >= 12 && len % 4 == 0 && len <= MAX_BLOCK && avail < len && !R->eof) return REC_WAIT;
        /* the section begins here, whatever follows */
        p->big = big;
        p->base = p->idbs;
        if (commit) R->sections += 1;
        if (len < 28) return damage(R, commit, p->pos, "insane section header length %lld", len);
    } else {
        len = rd32(h + 4, big);
    }
    if (len < 12 || len % 4 || len > MAX_BLOCK) return damage(R, commit, p->pos, "insane block length %lld", len);
    if (avail < len) {
        if (!R->eof) return REC_WAIT;
        return damage(R, commit, p->pos, "file truncated mid-record", 0);
    }
    if (rd32(h + len - 4, big) != len) return damage(R, commit, p->pos, "block length mismatch", 0);
    const uint8_t *body = h + 8;
    Py_ssize_t blen = len - 12;
    Py_ssize_t least = type == 6 || type == 2 ? 20 : type == 3 ? 4 : type == 1 ? 8 : type == 5 ? 12 : 0;
    if (blen < least) return damage(R, commit, p->pos, "block of type %lld too short", type);
    int64_t here = p->pos;
    int rc = REC_OTHER;
    if (type == 6 || type == 2) { /* enhanced / obsolete packet block */
        uint32_t if_id = type == 6 ? rd32(body, big) : rd16(body, big);
        uint64_t ticks = (uint64_t)rd32(body + 4, big) << 32 | rd32(body + 8, big);
        uint32_t caplen = rd32(body + 12, big);
        if ((int64_t)caplen > blen - 20 || (int64_t)if_id >= p->idbs - p->base)
            return damage(R, commit, here, "bad packet block", 0);
        int64_t key = p->base + if_id;
        const Iface *f = &R->ifs[key];
        p->last_valid = ng_time(f, ticks, &p->last_raw);
        out->ts = p->last_raw;
        out->valid = p->last_valid;
        out->key = key;
        out->linktype = f->linktype;
        out->data = body + 20;
        out->caplen = caplen;
        out->orig_len = rd32(body + 16, big);
        rc = REC_PACKET;
    } else if (type == 3) { /* simple packet block: interface 0, the previous packet's time */
        if (p->idbs - p->base <= 0) return damage(R, commit, here, "packet block before any interface", 0);
        const Iface *f = &R->ifs[p->base];
        int64_t orig_len = rd32(body, big), caplen = orig_len;
        if (blen - 4 < caplen) caplen = blen - 4;
        if (f->snaplen && f->snaplen < caplen) caplen = f->snaplen;
        out->ts = p->last_raw;
        out->valid = p->last_valid;
        out->key = -1;
        out->linktype = f->linktype;
        out->data = body + 4;
        out->caplen = caplen;
        out->orig_len = orig_len;
        rc = REC_PACKET;
    } else if (type == 1) { /* interface description: parsed once, by whichever step meets it first */
        if (p->idbs == R->n_ifs && add_interface(R, body, blen, big) < 0) return REC_ERROR;
        p->idbs += 1;
    } else if (type == 5) { /* interface statistics: counters are cumulative, the latest stays */
        if (commit && R->if_drops) {
            Py_ssize_t pos = 12, vlen;
            unsigned code;
            const uint8_t *value;
            while (ng_option(body, blen, &pos, big, &code, &value, &vlen)) {
                if (code != 5 || vlen != 8) continue;
                PyObject *k = PyLong_FromUnsignedLong(rd32(body, big));
                PyObject *v = k ? PyLong_FromUnsignedLongLong(rd64(value, big)) : NULL;
                int bad = !v || PyDict_SetItem(R->if_drops, k, v) < 0;
                Py_XDECREF(k);
                Py_XDECREF(v);
                if (bad) return REC_ERROR;
            }
        }
    } else if (type != PCAPNG_SHB) {
        if (commit) R->unknown_blocks += 1;
    }
    p->at += len;
    p->pos += len;
    return rc;
}

static int ng_next(Reader *R, Rec *out) {
    for (;;) {
        NgPos before = R->ng;
        int rc = ng_block(R, &R->ng, out, 1);
        if (rc == REC_OTHER) {
            R->start = R->ng.at;
            R->pos = R->ng.pos;
            continue;
        }
        if (rc != REC_PACKET) return rc;
        int64_t ts = out->ts, fixed;
        if (out->key < 0) { /* a borrowed time: only checked for range */
            if (!out->valid) {
                R->bad_ts += 1;
                ts = R->last_used;
            }
        } else {
            TimeState *s = &R->times[out->key];
            if (!s->has_prev || !out->valid || dist(ts, s->prev) > TIME_JUMP_NS) {
                int64_t nx[WILD_RUN];
                int nv[WILD_RUN], got = 0, seen = 0, same = 1;
                NgPos ahead = R->ng;
                Rec next;
                while (seen < WILD_RUN) {
                    int r = ng_block(R, &ahead, &next, 0);
                    if (r == REC_OTHER) continue;
                    if (r == REC_WAIT) { R->ng = before; return REC_WAIT; }
                    if (r == REC_ERROR) return REC_ERROR;
                    if (r != REC_PACKET) break; /* the end, or damage: the records before it count */
                    seen += 1;
                    if (same && next.key == out->key) {
                        nx[got] = next.ts;
                        nv[got++] = next.valid;
                    } else {
                        same = 0;
                    }
                }
                s = &R->times[out->key]; /* the look-ahead may have added interfaces (and moved the array) */
                if (repaired_time(s, ts, out->valid, nx, nv, got, seen == 0, &fixed)) {
                    R->bad_ts += 1;
                    ts = fixed;
                }
            }
            s->prev2 = s->prev;
            s->has_prev2 = s->has_prev;
            s->prev = ts;
            s->has_prev = 1;
            R->last_used = ts;
        }
        R->start = R->ng.at;
        R->pos = R->ng.pos;
        record_done(R, out, ts);
        return REC_PACKET;
    }
}

/* The next record: REC_PACKET (in *out, its data valid until the next feed), REC_WAIT (feed more), REC_END,
 * REC_DAMAGE (once; R->what, R->damage_pos), REC_ERROR (a Python exception is set). */
static int reader_next(Reader *R, Rec *out) {
    if (R->damaged) return REC_END;
    return R->format == FMT_PCAP ? pcap_next(R, out) : ng_next(R, out);
}

/* ---- link, IP and TCP: the TCP outcome of capture._decode; anything else is left to Python --------------- */

typedef struct {
    const uint8_t *addr; /* source then destination */
    int alen;
    unsigned sport, dport, flags;
    uint32_t seq, ack;
    const uint8_t *payload;
    Py_ssize_t plen;
    int64_t wire_len; /* payload bytes on the wire (more than plen when the snaplen cut the frame) */
} Seg;

/* 1: a TCP segment the lane can take; 2: a TCP segment cut by the snaplen (capture._decode gives it `missing`
 * bytes), which only Python takes, but whose connection must be given back first if the lane holds it;
 * 0: not a TCP segment (Python counts what it is). */
static int decode(int linktype, const uint8_t *d, Py_ssize_t n, int64_t orig_len, Seg *s) {
    Py_ssize_t off;
    unsigned ethertype;
    switch (linktype) {
    case 1:
        if (n < 14) return 0;
        ethertype = d[12] << 8 | d[13];
        off = 14;
        break;
    case 276:
        if (n < 20) return 0;
        ethertype = d[0] << 8 | d[1];
        off = 20;
        break;
    case 113:
        if (n < 16) return 0;
        ethertype = d[14] << 8 | d[15];
        off = 16;
        break;
    case 0:
    case 108: {
        if (n < 4) return 0;
        unsigned family = d[0] | d[3];
        if (family == 2) ethertype = 0x0800;
        else if (family == 10 || family == 24 || family == 28 || family == 30) ethertype = 0x86DD;
        else return 0;
        off = 4;
        break;
    }
    case 101: case 12: case 14: case 228: case 229:
        if (n < 1) return 0;
        ethertype = (d[0] >> 4) == 4 ? 0x0800 : (d[0] >> 4) == 6 ? 0x86DD : 0;
        if (!ethertype) return 0;
        off = 0;
        break;
    default:
        return 0;
    }
    while (ethertype == 0x8100 || ethertype == 0x88A8 || ethertype == 0x9100) {
        if (n < off + 4) return 0;
        ethertype = d[off + 2] << 8 | d[off + 3];
        off += 4;
    }
    Py_ssize_t wire_end = orig_len > n ? (Py_ssize_t)orig_len : n, tcp;
    if (ethertype == 0x0800) {
        if (n < off + 20) return 0;
        unsigned ver_ihl = d[off], ihl = (ver_ihl & 0x0F) * 4;
        unsigned total = d[off + 2] << 8 | d[off + 3], fragment = d[off + 6] << 8 | d[off + 7];
        if (ver_ihl >> 4 != 4 || ihl < 20 || n < off + (Py_ssize_t)ihl) return 0;
        if (fragment & 0x3FFF || d[off + 9] != 6) return 0;
        if (total) {
            if (total < ihl) return 0;
            if (off + (Py_ssize_t)total < wire_end) wire_end = off + total;
        }
        s->addr = d + off + 12;
        s->alen = 4;
        tcp = off + ihl;
    } else if (ethertype == 0x86DD) {
        if (n < off + 40 || d[off] >> 4 != 6) return 0;
        unsigned payload_len = d[off + 4] << 8 | d[off + 5];
        if (payload_len && off + 40 + (Py_ssize_t)payload_len < wire_end) wire_end = off + 40 + payload_len;
        unsigned next_header = d[off + 6];
        tcp = off + 40;
        while (next_header != 6) { /* hop-by-hop, routing, destination options, AH; a fragment is not TCP */
            if (next_header != 0 && next_header != 43 && next_header != 60 && next_header != 51) return 0;
            if (n < tcp + 2) return 0;
            Py_ssize_t ext_len = next_header == 51 ? (d[tcp + 1] + 2) * 4 : (d[tcp + 1] + 1) * 8;
            next_header = d[tcp];
            tcp += ext_len;
        }
        s->addr = d + off + 8;
        s->alen = 16;
    } else {
        return 0;
    }
    if (n < tcp + 20) return 0;
    Py_ssize_t start = tcp + (d[tcp + 12] >> 4) * 4;
    if (start < tcp + 20 || start > n || start > wire_end) return 0;
    int cut = wire_end > n;
    s->sport = d[tcp] << 8 | d[tcp + 1];
    s->dport = d[tcp + 2] << 8 | d[tcp + 3];
    s->seq = be32(d + tcp + 4);
    s->ack = be32(d + tcp + 8);
    s->flags = d[tcp + 13];
    s->payload = d + start;
    s->plen = (cut ? n : wire_end) - start;
    s->wire_len = wire_end - start;
    return cut ? 2 : 1;
}

/* ---- MySQL ---------------------------------------------------------------------------------------------- */

/* wire.read_lenenc_int within len bytes: 1 and the value (null -> *is_null), 0 where Python raises */
static int lenenc(const uint8_t *p, Py_ssize_t len, Py_ssize_t *pos, uint64_t *value, int *is_null) {
    if (*pos >= len) return 0;
    uint8_t first = p[*pos];
    *is_null = 0;
    if (first < 0xFB) { *value = first; *pos += 1; return 1; }
    if (first == 0xFB) { *value = 0; *is_null = 1; *pos += 1; return 1; }
    int width = first == 0xFC ? 2 : first == 0xFD ? 3 : first == 0xFE ? 8 : 0;
    if (!width || *pos + 1 + width > len) return 0;
    uint64_t v = 0;
    for (int i = width; i >= 1; i--) v = v << 8 | p[*pos + i];
    *value = v;
    *pos += 1 + width;
    return 1;
}

/* wire.parse_ok on the kept head of a packet of length plen */
static int parse_ok(Flow *f, int64_t *affected, int64_t *warnings, int64_t *status) {
    Py_ssize_t len = f->plen, pos = 1;
    uint64_t a, id;
    int null;
    if (len > HEAD) len = HEAD; /* all fields lie in the first 23 bytes; beyond is the info text */
    Py_ssize_t real = f->plen;
    if (!lenenc(f->head, len, &pos, &a, &null)) return 0;
    if (null) a = 0;
    if (!lenenc(f->head, len, &pos, &id, &null)) return 0;
    if (a > (uint64_t)INT64_MAX) return 0;
    *affected = (int64_t)a;
    *status = pos + 2 <= real ? u16le(f->head + pos) : 0;
    *warnings = pos + 4 <= real ? u16le(f->head + pos + 2) : 0;
    return 1;
}

/* One complete response packet of COM_QUERY / COM_STMT_EXECUTE: mysql/responses.py's ResponseReader for kind
 * RESULT (_on_start, _on_columns, _on_after_columns, _on_rows, _terminator; the number of column definitions is
 * responses.column_definitions_sent), on the common path only: one result set or an OK. 1: taken, 0: bail. */
static int response_packet(Flow *f) {
    int64_t plen = f->plen;
    int first = plen ? f->head[0] : -1;
    if (!f->has_rf) {
        f->has_rf = 1;
        f->rf_ts = f->pkt_ts; f->rf_frame = f->pkt_frame; f->rf_off = f->pkt_off;
    }
    f->bytes_resp += 4 + plen;
    f->next_seq = (f->hdr[3] + 1) & 0xFF;
    int64_t affected, warnings, status;
    switch (f->rstate) {
    case R_START: /* _on_start */
        if (first < 0 || first == 0xFF || first == 0xFB || plen > 65536) return 0;
        if (first == 0x00) {
            if (!parse_ok(f, &affected, &warnings, &status) || status & MORE_RESULTS) return 0;
            f->affected += affected; f->warnings += warnings; f->status = status; f->has_status = 1;
            f->result = RES_OK;
            f->rstate = R_DONE;
            return 1;
        }
        if (first >= 0xFB) return 0;
        f->result = RES_RESULTSET;
        f->result_sets += 1;
        f->left = first;
        f->rstate = R_COLS;
        if (plen > 1 && f->head[1] == 0) /* responses.column_definitions_sent: MariaDB's cached metadata */
            f->rstate = f->deprecate_eof ? R_ROWS : R_AFTER_COLS;
        return 1;
    case R_COLS: /* _on_columns */
        if (--f->left == 0) f->rstate = f->deprecate_eof ? R_ROWS : R_AFTER_COLS;
        return 1;
    case R_AFTER_COLS: /* _on_after_columns */
        if (first != 0xFE || plen > 5) return 0;
        status = plen >= 5 ? u16le(f->head + 3) : 0;
        if (status & CURSOR_EXISTS) return 0;
        f->rstate = R_ROWS;
        return 1;
    case R_ROWS: /* _on_rows, _terminator */
        if (first == 0xFE) {
            if (plen > 65536) return 0;
            if (plen <= 5) {
                warnings = plen >= 5 ? u16le(f->head + 1) : 0;
                status = plen >= 5 ? u16le(f->head + 3) : 0;
                affected = 0;
            } else if (!parse_ok(f, &affected, &warnings, &status)) {
                return 0;
            }
            if (status & MORE_RESULTS) return 0;
            f->affected += affected; f->warnings += warnings; f->status = status; f->has_status = 1;
            f->rstate = R_DONE;
            return 1;
        }
        if (first == 0xFF) return 0;
        f->rows += 1;
        return 1;
    }
    return 0;
}

/* Server payload in order: 1 taken, 0 bail. */
static int server_data(Flow *f, const uint8_t *d, Py_ssize_t n, int64_t ts, int64_t frame, int64_t off0) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (f->rstate == R_DONE) return 0; /* bytes after the response: Python reports them */
        if (!f->in_pkt) {
            f->in_pkt = 1;
            f->hdr_have = 0;
            f->pkt_ts = ts; f->pkt_frame = frame; f->pkt_off = off0 + i;
            /* a whole packet here: no copying of the header */
            if (i + 4 <= n) {
                int64_t len = u24(d + i);
                if (len < MAX_PACKET && i + 4 + len <= n) {
                    if (d[i + 3] != f->next_seq) return 0;
                    memcpy(f->hdr, d + i, 4);
                    f->plen = len;
                    f->head_have = len < HEAD ? (int)len : HEAD;
                    memcpy(f->head, d + i + 4, f->head_have);
                    i += 4 + len;
                    f->rl_ts = ts; f->rl_frame = frame; f->rl_end = off0 + i;
                    f->in_pkt = 0;
                    if (!response_packet(f)) return 0;
                    continue;
                }
            }
        }
        if (f->hdr_have < 4) {
            Py_ssize_t take = 4 - f->hdr_have;
            if (take > n - i) take = n - i;
            memcpy(f->hdr + f->hdr_have, d + i, take);
            f->hdr_have += (int)take;
            i += take;
            if (f->hdr_have < 4) break;
            f->plen = f->remaining = u24(f->hdr);
            f->head_have = 0;
            if (f->plen >= MAX_PACKET || f->hdr[3] != f->next_seq) return 0;
        }
        Py_ssize_t take = f->remaining < n - i ? (Py_ssize_t)f->remaining : n - i;
        if (f->head_have < HEAD) {
            Py_ssize_t keep = HEAD - f->head_have < take ? HEAD - f->head_have : take;
            memcpy(f->head + f->head_have, d + i, keep);
            f->head_have += (int)keep;
        }
        i += take;
        f->remaining -= take;
        if (f->remaining == 0) {
            f->rl_ts = ts; f->rl_frame = frame; f->rl_end = off0 + i;
            f->in_pkt = 0;
            f->hdr_have = 0;
            if (!response_packet(f)) return 0;
        }
    }
    return 1;
}

/* params.decode_value for the types the lane decodes; NULL with no error set: leave it to Python */
static PyObject *param_value(const uint8_t *b, Py_ssize_t len, Py_ssize_t *pos, unsigned type_code) {
    unsigned kind = type_code & 0xFF;
    int is_unsigned = (type_code & 0x8000) != 0;
    int width = kind == 1 ? 1 : (kind == 2 || kind == 13) ? 2 : (kind == 3 || kind == 9) ? 4 : kind == 8 ? 8 : 0;
    if (width) {
        if (*pos + width > len) return NULL;
        uint64_t v = 0;
        for (int i = width - 1; i >= 0; i--) v = v << 8 | b[*pos + i];
        *pos += width;
        int negative = 0;
        if (!is_unsigned) {
            if (width < 8 && v >> (8 * width - 1)) v |= ~0ULL << (8 * width); /* sign-extend */
            if ((int64_t)v < 0) { negative = 1; v = 0 - v; } /* the magnitude, also of INT64_MIN */
        }
        char digits[24], *d = digits + sizeof digits; /* str(int): no format string to parse per value */
        do { *--d = (char)('0' + v % 10); v /= 10; } while (v);
        if (negative) *--d = '-';
        return PyUnicode_FromStringAndSize(d, digits + sizeof digits - d);
    }
    if (kind == 4 || kind == 5) {
        double x;
        if (kind == 4) {
            if (*pos + 4 > len) return NULL;
            float g;
            memcpy(&g, b + *pos, 4); /* little-endian host (x86-64, arm64): the wire's byte order */
            x = g;
            *pos += 4;
        } else {
            if (*pos + 8 > len) return NULL;
            memcpy(&x, b + *pos, 8);
            *pos += 8;
        }
        PyObject *number = PyFloat_FromDouble(x);
        if (!number) return NULL;
        PyObject *text = PyObject_Repr(number);
        Py_DECREF(number);
        return text;
    }
    if (kind == 6) return PyUnicode_FromString("NULL");
    if (kind == 7 || kind == 10 || kind == 11 || kind == 12) return NULL; /* temporal: Python */
    uint64_t n;
    int null;
    if (!lenenc(b, len, pos, &n, &null)) return NULL;
    if (null) return PyUnicode_FromString("NULL");
    if (n > (uint64_t)(len - *pos)) return NULL;
    const uint8_t *raw = b + *pos;
    *pos += (Py_ssize_t)n;
    /* quote: ASCII escapes inserted before decoding decode as they would after it */
    Py_ssize_t extra = 0;
    for (uint64_t i = 0; i < n; i++) extra += raw[i] == '\\' || raw[i] == '\'';
    char *q = PyMem_Malloc(n + extra + 2);
    if (!q) return PyErr_NoMemory();
    Py_ssize_t k = 0;
    q[k++] = '\'';
    for (uint64_t i = 0; i < n; i++) {
        if (raw[i] == '\\' || raw[i] == '\'') q[k++] = '\\';
        q[k++] = (char)raw[i];
    }
    q[k++] = '\'';
    PyObject *text = PyUnicode_DecodeUTF8(q, k, "replace");
    PyMem_Free(q);
    return text;
}

/* connection.PreparedStatement: the fields the lane reads, the method it calls */
static PyObject *S_num_params, *S_types, *S_long_data, *S_sql, *S_executed, *S_sep;
/* the problems column of an EXECUTE whose statement the capture never saw prepared (connection._describe) */
static PyObject *S_unknown_statement;

/* connection._describe + _decode_params for COM_STMT_EXECUTE, with the connection's prepared statements
 * (connection.PreparedStatement: reads sql, num_params, types, long_data; calls executed(types) as _decode_params
 * does): 1 done, 0 leave it to Python, -1 error. A statement the connection does not know (prepared before the
 * capture began: every pooled connection's) is read here too, as Python reads it: no text, no parameters (their
 * count is unknown, so the values cannot be delimited), the id, and the problem unknown-statement. Handing each
 * such exchange to Python and the connection back cost a round trip per exchange: ~30× slower per byte on a
 * capture of a pool started before tcpdump (issue 37). */
static int describe_execute(Flow *f, const uint8_t *payload, Py_ssize_t n) {
    if (n < 5) return 0;
    uint32_t id = payload[1] | payload[2] << 8 | payload[3] << 16 | (uint32_t)payload[4] << 24;
    if (id == 0xFFFFFFFFu) return 0;
    PyObject *key = PyLong_FromUnsignedLong(id);
    if (!key) return -1;
    PyObject *statement = PyDict_GetItemWithError(f->statements, key); /* borrowed */
    if (!statement) {
        /* decode_execute without the statement: a payload shorter than its fixed 9 bytes is params-undecoded
         * (Python's; a connection with query attributes never gets here: client_request leaves it to Python) */
        if (PyErr_Occurred() || n - 1 < 9) {
            Py_DECREF(key);
            return PyErr_Occurred() ? -1 : 0;
        }
        f->sql = Py_NewRef(Py_None);
        f->stmt_id = key;
        f->params = Py_NewRef(Py_None);
        f->unknown_statement = 1;
        return 1;
    }
    Py_INCREF(statement);
    int rc = 0;
    PyObject *num_obj = NULL, *prior = NULL, *long_data = NULL, *types = NULL, *values = NULL, *params = NULL;
    num_obj = PyObject_GetAttr(statement, S_num_params);
    prior = num_obj ? PyObject_GetAttr(statement, S_types) : NULL;
    long_data = prior ? PyObject_GetAttr(statement, S_long_data) : NULL;
    if (!long_data) { rc = -1; goto out; }
    if (!PyDict_Check(long_data) || PyDict_GET_SIZE(long_data)) goto out;
    const uint8_t *b = payload + 1;
    Py_ssize_t len = n - 1, pos = 9;
    if (len < 9) goto out;
    if (num_obj == Py_None) {
        params = Py_NewRef(Py_None);
        types = Py_NewRef(prior);
    } else {
        long num = PyLong_AsLong(num_obj);
        if (num < 0) { if (PyErr_Occurred()) rc = -1; goto out; }
        if (num == 0) {
            params = PyUnicode_FromString("");
            types = Py_NewRef(prior);
            if (!params) rc = -1;
        } else {
            Py_ssize_t bitmap = pos, bitmap_len = (num + 7) / 8;
            pos += bitmap_len;
            if (pos >= len) goto out;
            int new_bound = b[pos++];
            if (new_bound) {
                types = PyList_New(num);
                if (!types) { rc = -1; goto out; }
                for (long i = 0; i < num; i++) {
                    if (pos + 2 > len) goto out;
                    PyObject *t = PyLong_FromLong(u16le(b + pos));
                    if (!t) { rc = -1; goto out; }
                    PyList_SET_ITEM(types, i, t);
                    pos += 2;
                }
            } else {
                types = Py_NewRef(prior);
            }
            if (types == Py_None || !PyList_Check(types) || PyList_GET_SIZE(types) != num) {
                if (types != Py_None && !PyList_Check(types)) goto out;
                params = Py_NewRef(Py_None);
            } else {
                values = PyList_New(num);
                if (!values) { rc = -1; goto out; }
                for (long i = 0; i < num; i++) {
                    if (bitmap + i / 8 >= len) goto out; /* the bitmap is cut: IndexError in Python */
                    PyObject *v;
                    if (b[bitmap + i / 8] >> (i % 8) & 1) {
                        v = PyUnicode_FromString("NULL");
                    } else {
                        long code = PyLong_AsLong(PyList_GET_ITEM(types, i));
                        if (code == -1 && PyErr_Occurred()) { rc = -1; goto out; }
                        v = param_value(b, len, &pos, (unsigned)code);
                    }
                    if (!v) { if (PyErr_Occurred()) rc = -1; goto out; }
                    PyList_SET_ITEM(values, i, v);
                }
                params = PyUnicode_Join(S_sep, values);
                if (!params) { rc = -1; goto out; }
            }
        }
    }
    /* The statement takes the types (PreparedStatement.executed) unless they are those it has: it then stays as
     * it was (its long data is empty: above). Most clients send the same types with every execute. */
    int same = types == prior || (PyList_Check(prior) && PyObject_RichCompareBool(types, prior, Py_EQ) == 1);
    if (PyErr_Occurred()) { rc = -1; goto out; }
    if (!same) {
        PyObject *done = PyObject_CallMethodOneArg(statement, S_executed, types);
        if (!done) { rc = -1; goto out; }
        Py_DECREF(done);
    }
    f->sql = PyObject_GetAttr(statement, S_sql);
    if (!f->sql) { rc = -1; goto out; }
    f->stmt_id = Py_NewRef(key);
    f->params = Py_NewRef(params);
    rc = 1;
out:
    Py_DECREF(key);
    Py_DECREF(statement);
    Py_XDECREF(num_obj); Py_XDECREF(prior); Py_XDECREF(long_data); Py_XDECREF(types);
    Py_XDECREF(values); Py_XDECREF(params);
    return rc;
}

/* A whole request packet (header included): 1 taken, 0 bail, -1 error. */
static int client_request(Flow *f, const uint8_t *d, Py_ssize_t n) {
    if (n < 5) return 0;
    int64_t len = u24(d);
    if (len >= MAX_PACKET || 4 + len != n || d[3] != 0 || len > f->keep_client) return 0;
    const uint8_t *payload = d + 4;
    int code = payload[0];
    if (f->budget && f->budget[1] <= 0) return 0; /* no exchange left in the budget: Python counts the cut */
    if (code == 0x03) {
        if (len > f->max_sql || f->qa == 1) return 0;
        const uint8_t *body = payload + 1;
        Py_ssize_t blen = len - 1;
        if (f->qa == 2 && blen > 2 && body[0] == 0 && body[1] == 1) return 0;
        /* past the budget: Python keeps its prefix and counts the cut (connection._describe) */
        if (f->budget && blen > f->budget[0]) return 0;
        f->sql = PyUnicode_DecodeUTF8((const char *)body, blen, "replace");
        if (!f->sql) return -1;
        if (f->budget) { f->budget[0] -= blen; f->sql_spent = blen; }
        f->stmt_id = Py_NewRef(Py_None);
        f->params = Py_NewRef(Py_None);
        f->command = 0;
    } else if (code == 0x17) {
        if (f->qa == 1) return 0;
        int rc = describe_execute(f, payload, len);
        if (rc <= 0) return rc;
        f->command = 1;
    } else {
        return 0;
    }
    if (f->budget) { f->budget[1] -= 1; f->row_spent = 1; } /* a request started is a row (connection._start) */
    f->state = WAIT;
    f->bytes_req = n;
    f->has_rf = 0; f->bytes_resp = 0;
    f->rstate = R_START; f->next_seq = 1; f->result = RES_NONE; f->has_status = 0;
    f->left = f->rows = f->affected = f->warnings = f->status = f->result_sets = 0;
    f->hdr_have = f->in_pkt = f->head_have = 0;
    return 1;
}

/* *p holding at least `need` items of `item` bytes (*cap of them now): doubled from 1024 as often as needed */
static int grow(char **p, Py_ssize_t *cap, Py_ssize_t need, Py_ssize_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t more = *cap ? *cap : 1024;
    while (more < need) more *= 2;
    char *d = PyMem_Realloc(*p, more * item);
    if (!d) { PyErr_NoMemory(); return -1; }
    *p = d;
    *cap = more;
    return 0;
}

static int put_num(Lane *L, int i, const void *value) {
    Column *c = &L->cols[i];
    if (grow(&c->data, &c->cap, c->n + 1, 8) < 0) return -1;
    memcpy(c->data + 8 * c->n++, value, 8);
    return 0;
}
static int put_q(Lane *L, int i, int64_t v) { return put_num(L, i, &v); }
static int put_d(Lane *L, int i, double v) { return put_num(L, i, &v); }

/* a value of an 'n', 'b' or 's' column (ROW_KINDS) */
static int put_typed(Lane *L, int i, PyObject *v) {
    Column *c = &L->cols[i];
    char kind = ROW_KINDS[i];
    if (grow(&c->valid, &c->valid_cap, c->n + 1, 1) < 0) return -1;
    if (kind == 'b') {
        int truth = v == Py_None ? 2 : PyObject_IsTrue(v);
        if (truth < 0) return -1;
        c->valid[c->n++] = (char)truth;
        return 0;
    }
    if (kind == 'n') {
        int64_t x = 0;
        if (v != Py_None) {
            x = PyLong_AsLongLong(v);
            if (x == -1 && PyErr_Occurred()) return -1;
        }
        c->valid[c->n] = v != Py_None;
        return put_num(L, i, &x); /* counts the row */
    }
    Py_ssize_t len = 0;
    const char *text = NULL;
    if (v != Py_None && !(text = PyUnicode_AsUTF8AndSize(v, &len))) return -1;
    if (c->chars_len + len > INT32_MAX)
        return PyErr_Format(PyExc_OverflowError, "column %s: over 2 GiB of text in one batch", COLUMN_NAME[i]), -1;
    if (grow(&c->chars, &c->chars_cap, c->chars_len + len, 1) < 0 ||
        grow((char **)&c->ends, &c->ends_cap, c->n + 1, sizeof(int32_t)) < 0)
        return -1;
    if (len) memcpy(c->chars + c->chars_len, text, len);
    L->batch_text += len;
    c->chars_len += len;
    c->ends[c->n] = (int32_t)c->chars_len;
    c->valid[c->n++] = v != Py_None;
    return 0;
}

static int put_o(Lane *L, int i, PyObject *v) { /* borrows v */
    Column *c = &L->cols[i];
    if (ROW_KINDS[i] != 'o') return put_typed(L, i, v);
    if (!c->codes) return PyList_Append(c->list, v);
    int32_t code = -1;
    if (v == c->last) {
        code = c->last_code;
    } else if (v != Py_None) {
        PyObject *known = PyDict_GetItemWithError(c->codes, v); /* borrowed */
        if (known) {
            code = (int32_t)PyLong_AsLong(known);
        } else {
            if (PyErr_Occurred()) return -1;
            Py_ssize_t next = PyList_GET_SIZE(c->list);
            PyObject *number = PyLong_FromSsize_t(next);
            int bad = !number || PyDict_SetItem(c->codes, v, number) < 0 || PyList_Append(c->list, v) < 0;
            if (PyUnicode_Check(v)) L->batch_text += PyUnicode_GET_LENGTH(v);
            Py_XDECREF(number);
            if (bad) return -1;
            code = (int32_t)next;
        }
        Py_XSETREF(c->last, Py_NewRef(v));
        c->last_code = code;
    }
    if (grow(&c->data, &c->cap, c->n + 1, 4) < 0) return -1;
    memcpy(c->data + 4 * c->n++, &code, 4);
    return 0;
}

/* connection._finish + exchanges.emit for a finished exchange: one row, column by column. */
static int emit(Lane *L, Flow *f) {
    PyObject *fp = NULL;
    int cached = f->command == 1 && (f->sql == Py_None ||
                                     (PyUnicode_Check(f->sql) && PyUnicode_GET_LENGTH(f->sql) <= FP_CACHE_TEXT));
    size_t slot = ((uintptr_t)f->sql >> 4) % FP_CACHE;
    if (cached && L->fp_cache[slot].sql == f->sql) {
        fp = Py_NewRef(L->fp_cache[slot].fp);
    } else {
        fp = PyObject_CallFunctionObjArgs(L->fingerprints, f->sql, L->names[f->command], NULL);
        if (!fp) return -1;
        if (!PyTuple_Check(fp) || PyTuple_GET_SIZE(fp) != 2) {
            Py_DECREF(fp);
            PyErr_SetString(PyExc_TypeError, "fingerprints must return a pair");
            return -1;
        }
        if (cached) {
            Py_XSETREF(L->fp_cache[slot].sql, Py_NewRef(f->sql));
            Py_XSETREF(L->fp_cache[slot].fp, Py_NewRef(fp));
        }
    }
    PyObject **conn = &PyTuple_GET_ITEM(f->row, 0); /* the connection's columns */
    int slow = (f->status & QUERY_WAS_SLOW) != 0;
    /* one column after the other, stopping at the first that fails (its exception set: MemoryError) */
    int bad = 0;
    if (!bad) bad = put_o(L, COL_CAPTURE, conn[COL_CAPTURE]) < 0;
    if (!bad) bad = put_q(L, COL_CONN_INDEX, f->conn_index) < 0;
    if (!bad) bad = put_o(L, COL_CONN_ID, conn[COL_CONN_ID]) < 0;
    if (!bad) bad = put_o(L, COL_CLIENT, conn[COL_CLIENT]) < 0;
    if (!bad) bad = put_o(L, COL_SERVER, conn[COL_SERVER]) < 0;
    if (!bad) bad = put_q(L, COL_SEQ, f->work.count) < 0;
    if (!bad) bad = put_o(L, COL_COMMAND, L->names[f->command]) < 0;
    if (!bad) bad = put_o(L, COL_SQL, f->sql) < 0;
    if (!bad) bad = put_o(L, COL_STMT_ID, f->stmt_id) < 0;
    if (!bad) bad = put_o(L, COL_PARAMS, f->params) < 0;
    if (!bad) bad = put_o(L, COL_FINGERPRINT, PyTuple_GET_ITEM(fp, 0)) < 0;
    if (!bad) bad = put_o(L, COL_QUERY_ID, PyTuple_GET_ITEM(fp, 1)) < 0;
    if (!bad) bad = put_q(L, COL_REQ_FIRST_TS, f->req_ts) < 0;
    if (!bad) bad = put_q(L, COL_REQ_LAST_TS, f->req_last_ts) < 0;
    if (!bad) bad = put_q(L, COL_RESP_FIRST_TS, f->rf_ts) < 0;
    if (!bad) bad = put_q(L, COL_RESP_LAST_TS, f->rl_ts) < 0;
    if (!bad) bad = put_q(L, COL_REQ_FIRST_FRAME, f->req_frame) < 0;
    if (!bad) bad = put_q(L, COL_REQ_LAST_FRAME, f->req_last_frame) < 0;
    if (!bad) bad = put_q(L, COL_RESP_FIRST_FRAME, f->rf_frame) < 0;
    if (!bad) bad = put_q(L, COL_RESP_LAST_FRAME, f->rl_frame) < 0;
    if (!bad) bad = put_d(L, COL_RESPONSE_S, (double)(f->rl_ts - f->req_ts) / 1e9) < 0;
    if (!bad) bad = put_d(L, COL_TTFB_S, (double)(f->rf_ts - f->req_last_ts) / 1e9) < 0;
    if (!bad) bad = put_o(L, COL_RESULT, L->results[f->result == RES_OK ? 0 : 1]) < 0;
    if (!bad) bad = put_o(L, COL_ERROR_CODE, Py_None) < 0;
    if (!bad) bad = put_o(L, COL_ERROR_STATE, Py_None) < 0;
    if (!bad) bad = put_o(L, COL_ERROR_MESSAGE, Py_None) < 0;
    if (!bad) bad = put_q(L, COL_ROWS, f->rows) < 0;
    if (!bad) bad = put_q(L, COL_AFFECTED_ROWS, f->affected) < 0;
    if (!bad) bad = put_q(L, COL_WARNINGS, f->warnings) < 0;
    if (!bad) bad = put_q(L, COL_RESULT_SETS, f->result_sets) < 0;
    if (!bad) bad = put_q(L, COL_BYTES_REQ, f->bytes_req) < 0;
    if (!bad) bad = put_q(L, COL_BYTES_RESP, f->bytes_resp) < 0;
    if (!bad) bad = put_q(L, COL_STATUS_FLAGS, f->status) < 0;
    if (!bad) bad = put_o(L, COL_SERVER_FLAG_SLOW, slow ? Py_True : Py_False) < 0;
    if (!bad) bad = put_o(L, COL_TLS, conn[COL_TLS]) < 0;
    if (!bad) bad = put_o(L, COL_COMPRESSED, conn[COL_COMPRESSED]) < 0;
    if (!bad) bad = put_o(L, COL_USER, conn[COL_USER]) < 0;
    if (!bad) bad = put_o(L, COL_DB, conn[COL_DB]) < 0;
    if (!bad) bad = put_q(L, COL_REQ_TCP_SEQ, (uint32_t)(f->base[0] + (uint64_t)f->req_off)) < 0;
    if (!bad) bad = put_q(L, COL_RESP_TCP_SEQ, (uint32_t)(f->base[1] + (uint64_t)f->rf_off)) < 0;
    if (!bad) bad = put_q(L, COL_RESP_TCP_END, (uint32_t)(f->base[1] + (uint64_t)f->rl_end)) < 0;
    if (!bad) bad = put_o(L, COL_PROBLEMS, f->unknown_statement ? S_unknown_statement : L->empty) < 0;
    Py_DECREF(fp);
    if (bad) return -1; /* a failed append leaves the columns uneven: the error ends the extraction */
    L->n_rows += 1;
    L->commands[f->command] += 1;
    f->work.exchanges += 1;
    f->work.count += 1;
    return 0;
}

/* Client payload in order: the next request, whole or in pieces. 1 taken, 0 bail, -1 error. */
static int client_segment(Flow *f, const uint8_t *d, Py_ssize_t n, int64_t ts, int64_t frame) {
    if (f->state == WAIT) return 0; /* pipelined: Python */
    if (f->state == IDLE) {
        f->req_ts = ts; f->req_frame = frame; f->req_off = f->work.next[0];
        f->req_len = 0;
        if (n >= 4 && 4 + u24(d) == n) { /* the whole request in one segment: no copy */
            f->req_last_ts = ts; f->req_last_frame = frame;
            return client_request(f, d, n);
        }
        f->state = COLLECT;
    }
    Py_ssize_t want = f->req_len + n;
    if (want >= 4) {
        const uint8_t *h = f->req_len >= 4 ? f->req : NULL;
        uint8_t head[4];
        if (!h) { /* the header may straddle what is held and this segment */
            for (int i = 0; i < 4; i++) head[i] = i < f->req_len ? f->req[i] : d[i - f->req_len];
            h = head;
        }
        int64_t total = 4 + u24(h);
        if (total - 4 >= MAX_PACKET || total - 4 > f->keep_client || want > total) return 0;
    }
    if (want > f->req_cap) {
        Py_ssize_t cap = f->req_cap ? f->req_cap : 4096;
        while (cap < want) cap *= 2;
        uint8_t *r = PyMem_Realloc(f->req, cap);
        if (!r) { PyErr_NoMemory(); return -1; }
        f->req = r;
        f->req_cap = cap;
    }
    memcpy(f->req + f->req_len, d, n);
    f->req_len = want;
    if (want >= 4 && want == 4 + u24(f->req)) {
        f->req_last_ts = ts; f->req_last_frame = frame;
        return client_request(f, f->req, want);
    }
    return 1;
}

/* One segment of a promoted connection: 1 taken, 0 bail, -1 error. */
static int take_segment(Lane *L, Flow *f, int dir, Seg *s, int64_t ts, int64_t frame) {
    if (s->flags & 0x07) return 0; /* SYN, FIN, RST: Python */
    Counts *w = &f->work;
    if (f->kind != K_MYSQL) {
        w->frames += 1;
        if (f->kind == K_OTHER) {
            w->last_ts = ts; w->has_last_ts = 1;
            if (f->owned) { w->other_frames += 1; w->other_bytes += s->plen; }
        }
        f->committed = *w;
        return 1;
    }
    if (s->plen == 0) { /* a pure ACK: nothing held in either direction, so nothing to declare */
        w->frames += 1;
        w->last_ts = ts; w->has_last_ts = 1;
        if (f->state == IDLE) f->committed = *w;
        return 1;
    }
    if (s->seq != (uint32_t)(f->base[dir] + (uint64_t)w->next[dir])) return 0; /* out of order, retransmitted */
    int64_t off = w->next[dir];
    if (dir == 0) {
        int was_idle = f->state == IDLE;
        int rc = client_segment(f, s->payload, s->plen, ts, frame);
        if (rc <= 0) {
            if (was_idle) clear_exchange(f); /* else the pieces gathered so far are replayed too */
            return rc;
        }
    } else {
        if (f->state != WAIT) return 0;
        if (!server_data(f, s->payload, s->plen, ts, frame, off)) return 0;
    }
    w->frames += 1;
    w->last_ts = ts; w->has_last_ts = 1;
    w->segs[dir] += 1;
    w->bytes[dir] += s->plen;
    w->next[dir] += s->plen;
    if (f->state == WAIT && f->rstate == R_DONE) {
        if (emit(L, f) < 0) return -1;
        f->sql_spent = f->row_spent = 0; /* finished here: spent for good */
        clear_exchange(f);
        f->committed = *w;
    }
    return 1;
}

/* ---- the repair's records: chosen connections' segments, rewritten (Excerpt's copy, a Lane's plan) ---------- */

static inline void put_le32(uint8_t *p, uint32_t v) { p[0] = v; p[1] = v >> 8; p[2] = v >> 16; p[3] = v >> 24; }
static inline void put_be16(uint8_t *p, unsigned v) { p[0] = v >> 8; p[1] = v; }
static inline void put_be32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }

/* The table of `keys`, a list of (source address bytes, source port, destination address bytes, destination port):
 * the first of equal keys is found, with its index in the list. */
static int rkeys_build(PyObject *keys, RKey ***table, size_t *mask) {
    Py_ssize_t n = PyList_GET_SIZE(keys);
    size_t size = 1 << 10;
    while (size < (size_t)(4 * n)) size <<= 1;
    *mask = size - 1;
    *table = PyMem_Calloc(size, sizeof(RKey *));
    if (!*table) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer a, b;
        unsigned ap, bp;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(keys, i), "y*Iy*I", &a, &ap, &b, &bp)) return -1;
        int bad = a.len != b.len || (a.len != 4 && a.len != 16) || ap > 0xFFFF || bp > 0xFFFF;
        uint8_t k[KEY_LEN];
        if (!bad) make_key(k, a.buf, b.buf, (int)a.len, ap, bp);
        PyBuffer_Release(&a);
        PyBuffer_Release(&b);
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "a key is (4- or 16-byte address, port, same-size address, port)");
            return -1;
        }
        size_t slot = hash_key(k) & *mask;
        RKey *e = (*table)[slot];
        while (e && memcmp(e->key, k, KEY_LEN)) e = e->next;
        if (e) continue; /* the first of equal keys */
        e = PyMem_Calloc(1, sizeof(RKey));
        if (!e) { PyErr_NoMemory(); return -1; }
        memcpy(e->key, k, KEY_LEN);
        e->index = i;
        e->next = (*table)[slot];
        (*table)[slot] = e;
    }
    return 0;
}

static RKey *rkeys_find(RKey **table, size_t mask, const Seg *s) {
    uint8_t k[KEY_LEN];
    make_key(k, s->addr, s->addr + s->alen, s->alen, s->sport, s->dport);
    RKey *e = table[hash_key(k) & mask];
    while (e && memcmp(e->key, k, KEY_LEN)) e = e->next;
    return e;
}

static void rkeys_free(RKey **table, size_t mask) {
    if (!table) return;
    for (size_t i = 0; i <= mask; i++) {
        RKey *e = table[i];
        while (e) { RKey *next = e->next; PyMem_Free(e); e = next; }
    }
    PyMem_Free(table);
}

/* The size of `s` as a record of the excerpt file: record header, IPv4 or IPv6 header, 20-byte TCP header, payload */
static inline Py_ssize_t excerpt_size(const Seg *s) { return 16 + (s->alen == 4 ? 20 : 40) + 20 + s->plen; }

/* `s` at `ts` as a classic pcap record (nanoseconds, LINKTYPE_RAW) at p (excerpt_size bytes), which capture._decode
 * and the lane decode into the segment's fields; its lengths say what the snaplen cut. */
static void excerpt_put(uint8_t *p, const Seg *s, int64_t ts) {
    Py_ssize_t ip = s->alen == 4 ? 20 : 40, caplen = ip + 20 + s->plen;
    int64_t missing = s->wire_len - s->plen, ip_len = (s->alen == 4 ? caplen : caplen - 40) + missing;
    put_le32(p, (uint32_t)(ts / 1000000000));
    put_le32(p + 4, (uint32_t)(ts % 1000000000));
    put_le32(p + 8, (uint32_t)caplen);
    put_le32(p + 12, (uint32_t)(caplen + missing));
    p += 16;
    memset(p, 0, ip + 20);
    if (s->alen == 4) {
        p[0] = 0x45;
        put_be16(p + 2, ip_len <= 0xFFFF ? (unsigned)ip_len : 0); /* 0: the frame's length holds */
        p[8] = 64;
        p[9] = 6;
        memcpy(p + 12, s->addr, 8);
    } else {
        p[0] = 0x60;
        put_be16(p + 4, ip_len <= 0xFFFF ? (unsigned)ip_len : 0);
        p[6] = 6;
        p[7] = 64;
        memcpy(p + 8, s->addr, 32);
    }
    uint8_t *t = p + ip;
    put_be16(t, s->sport);
    put_be16(t + 2, s->dport);
    put_be32(t + 4, s->seq);
    put_be32(t + 8, s->ack);
    t[12] = 0x50;
    t[13] = (uint8_t)s->flags;
    memcpy(t + 20, s->payload, s->plen);
}

/* The frames and insert_at buffers of an excerpt (sorted int64: Excerpt's copy, a Plan), with one blob per
 * insert_at. On success both are held (their owner releases them); on failure neither is. */
static int excerpt_buffers(PyObject *frames, PyObject *insert_at, Py_ssize_t n_blobs, Py_buffer *fr, Py_buffer *ins) {
    if (PyObject_GetBuffer(frames, fr, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(insert_at, ins, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(fr);
        return -1;
    }
    if (n_blobs != ins->len / 8) {
        PyErr_SetString(PyExc_ValueError, "one blob per insert_at");
        PyBuffer_Release(fr);
        PyBuffer_Release(ins);
        return -1;
    }
    return 0;
}

/* A plan from `excerpt`: (keys, frames, insert_at, blobs), as Excerpt's copy takes them; every blob a whole record
 * of the excerpt file. */
static int plan_setup(Plan *P, PyObject *excerpt) {
    PyObject *keys, *frames, *insert_at, *blobs;
    if (!PyArg_ParseTuple(excerpt, "O!OOO!", &PyList_Type, &keys, &frames, &insert_at, &PyList_Type, &blobs))
        return -1;
    if (P->on) {
        PyErr_SetString(PyExc_RuntimeError, "a Lane reads one excerpt plan");
        return -1;
    }
    if (excerpt_buffers(frames, insert_at, PyList_GET_SIZE(blobs), &P->frames, &P->insert_at) < 0) return -1;
    P->on = 1; /* the buffers are released at dealloc from here on */
    P->n_frames = P->frames.len / 8;
    P->n_inserts = P->insert_at.len / 8;
    for (Py_ssize_t i = 0; i < P->n_inserts; i++) {
        PyObject *blob = PyList_GET_ITEM(blobs, i);
        if (!PyBytes_Check(blob) || PyBytes_GET_SIZE(blob) < 16 ||
            rd32((const uint8_t *)PyBytes_AS_STRING(blob) + 8, 0) != (uint64_t)PyBytes_GET_SIZE(blob) - 16) {
            PyErr_SetString(PyExc_ValueError, "a blob is one record of the excerpt file (fastlane.excerpt_record)");
            return -1;
        }
    }
    if (!(P->blobs = PyList_AsTuple(blobs))) return -1; /* its own: the records checked above stay as they are */
    return rkeys_build(keys, &P->table, &P->table_mask);
}

static void plan_free(Plan *P) {
    if (!P->on) return;
    rkeys_free(P->table, P->table_mask);
    PyBuffer_Release(&P->frames);
    PyBuffer_Release(&P->insert_at);
    Py_XDECREF(P->blobs);
    PyMem_Free(P->rec);
}

/* The plan's next record (reader_next's answers): a blob whose turn it is, else the next chosen frame (the records
 * before it passed over, as the copy passes over them), rewritten; REC_END after the last of them. */
static int plan_next(Plan *P, Reader *R, Rec *out) {
    const int64_t *insert_at = P->insert_at.buf, *frames = P->frames.buf;
    const uint8_t *h;
    if (P->next_insert < P->n_inserts && insert_at[P->next_insert] <= P->at) {
        h = (const uint8_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(P->blobs, P->next_insert));
        P->next_insert++;
    } else {
        if (P->at >= P->n_frames) {
            P->done = 1;
            return REC_END;
        }
        Rec rec;
        Seg s;
        for (;;) {
            int got = reader_next(R, &rec);
            if (got != REC_PACKET) return got;
            if (rec.frame == frames[P->at] && decode(rec.linktype, rec.data, rec.caplen, rec.orig_len, &s) &&
                rkeys_find(P->table, P->table_mask, &s))
                break;
        }
        Py_ssize_t size = excerpt_size(&s);
        if (size > P->rec_cap) {
            Py_ssize_t cap = P->rec_cap ? P->rec_cap : 1 << 16;
            while (cap < size) cap *= 2;
            uint8_t *b = PyMem_Realloc(P->rec, cap);
            if (!b) { PyErr_NoMemory(); return REC_ERROR; }
            P->rec = b;
            P->rec_cap = cap;
        }
        excerpt_put(P->rec, &s, rec.ts);
        h = P->rec;
        P->at++;
    }
    int64_t ts = (int64_t)rd32(h, 0) * 1000000000 + rd32(h + 4, 0);
    out->data = h + 16;
    out->caplen = rd32(h + 8, 0);
    out->orig_len = rd32(h + 12, 0);
    out->linktype = 101; /* LINKTYPE_RAW */
    out->key = 0;
    out->valid = 1;
    out->ts = ts;
    out->frame = ++P->frame;
    if (!P->has_ts) { P->first_ts = ts; P->has_ts = 1; }
    P->last_ts = ts;
    return REC_PACKET;
}

/* ---- what the lane hands to Python: typed records (named tuples), never told apart by their length -------- */

static PyStructSequence_Field RecordFields[] = {
    {"frame", "frame number (from 1)"}, {"ts_ns", "time, checked (capture._timed)"}, {"linktype", NULL},
    {"data", "the captured bytes"}, {"orig_len", "the frame's length on the wire"}, {NULL, NULL}};
static PyStructSequence_Desc RecordDesc = {
    "pcapdecomp._lane.Record", "A record the lane does not read itself: Python reads it (capture.frame_segment).",
    RecordFields, 5};

static PyStructSequence_Field GivenBackFields[] = {
    {"flow", "the flows.Flow promoted"}, {"frames", NULL}, {"last_ts", "None: none that Flow.last_ts counts"},
    {"segments_to_server", NULL}, {"bytes_to_server", NULL}, {"segments_to_client", NULL},
    {"bytes_to_client", NULL}, {"exchanges", "finished and written as rows"}, {"count", "exchanges in all"},
    {"other_frames", NULL}, {"other_bytes", NULL}, {"replays", "how many Records follow: the exchange in progress"},
    {NULL, NULL}};
static PyStructSequence_Desc GivenBackDesc = {
    "pcapdecomp._lane.GivenBack",
    "A connection the lane gives back, at an exchange boundary: what it committed (flows.HandBack), then `replays` "
    "Records of the exchange it was reading, which Python reads again.",
    GivenBackFields, 12};

static PyStructSequence_Field DamageFields[] = {
    {"what", NULL}, {"offset", "byte offset in the (uncompressed) file"}, {NULL, NULL}};
static PyStructSequence_Desc DamageDesc = {
    "pcapdecomp._lane.Damage", "The records end at damage (CaptureReader.records_ended).", DamageFields, 2};

static PyStructSequence_Field RowsReadyFields[] = {{"rows", NULL}, {NULL, NULL}};
static PyStructSequence_Desc RowsReadyDesc = {
    "pcapdecomp._lane.RowsReady", "A batch of rows is written: take_columns() before reading on.", RowsReadyFields,
    1};

static PyStructSequence_Field CountsFields[] = {
    {"records", "records read"}, {"consumed", "records consumed here"}, {"first_ts", "None: no record"},
    {"last_ts", NULL}, {"position", "bytes consumed"}, {"queries", "COM_QUERY rows"},
    {"executes", "COM_STMT_EXECUTE rows"}, {"bad_ts", "records whose time was repaired"},
    {"sections", "pcapng section headers"}, {"interfaces", "pcapng interface descriptions"},
    {"unknown_blocks", NULL}, {"if_drops", "{interface id: packets dropped}"},
    {"link_types", "{link type: records consumed here}"}, {NULL, NULL}};
static PyStructSequence_Desc CountsDesc = {"pcapdecomp._lane.Counts", "What the lane read and consumed.",
                                           CountsFields, 13};

static PyTypeObject *RecordType, *GivenBackType, *DamageType, *RowsReadyType, *CountsType;

/* A record of `type` with the values Py_BuildValue makes of `format` (a tuple format). */
static PyObject *typed(PyTypeObject *type, const char *format, ...) {
    va_list va;
    va_start(va, format);
    PyObject *values = Py_VaBuildValue(format, va);
    va_end(va);
    if (!values) return NULL;
    PyObject *item = PyStructSequence_New(type);
    if (item)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); i++)
            PyStructSequence_SET_ITEM(item, i, Py_NewRef(PyTuple_GET_ITEM(values, i)));
    Py_DECREF(values);
    return item;
}

/* ---- the Lane type -------------------------------------------------------------------------------------- */

static void begin_bail(Lane *L, Flow *f) {
    f->work = f->committed;
    if (f->budget) { f->budget[0] += f->sql_spent; f->budget[1] += f->row_spent; } /* before Python respends */
    f->sql_spent = f->row_spent = 0;
    L->bailing = f;
    L->replay_i = -1; /* the header comes first */
}

static PyObject *bail_header(Flow *f) {
    Counts *c = &f->committed;
    PyObject *last = c->has_last_ts ? PyLong_FromLongLong(c->last_ts) : Py_NewRef(Py_None);
    if (!last) return NULL;
    return typed(GivenBackType, "(OLNLLLLLLLLn)", f->obj, (long long)c->frames, last, (long long)c->segs[0],
                 (long long)c->bytes[0], (long long)c->segs[1], (long long)c->bytes[1], (long long)c->exchanges,
                 (long long)c->count, (long long)c->other_frames, (long long)c->other_bytes, f->n_saved);
}

static PyObject *raw_record(int64_t frame, int64_t ts, int linktype, const uint8_t *data, Py_ssize_t caplen,
                            int64_t orig_len) {
    /* the most frequent answer: made directly, not through typed() */
    PyObject *item = PyStructSequence_New(RecordType);
    if (!item) return NULL;
    PyObject *values[5] = {PyLong_FromLongLong(frame), PyLong_FromLongLong(ts), PyLong_FromLong(linktype),
                           PyBytes_FromStringAndSize((const char *)data, caplen), PyLong_FromLongLong(orig_len)};
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        if (!values[i]) bad = 1;
        else PyStructSequence_SET_ITEM(item, i, values[i]);
    }
    if (bad) Py_CLEAR(item);
    return item;
}

/* Records consumed here, per link type (CaptureStats.link_types); n < 0 gives records back. */
static void count_fast(Lane *L, int linktype, int64_t n) {
    L->fast_frames += n;
    for (int i = 0; i < L->n_link; i++)
        if (L->fast_link[i][0] == linktype) { L->fast_link[i][1] += n; return; }
    if (L->n_link < LINK_KINDS) {
        L->fast_link[L->n_link][0] = linktype;
        L->fast_link[L->n_link++][1] = n;
    }
}

static void end_bail(Lane *L) {
    Flow *f = L->bailing;
    for (Py_ssize_t i = 0; i < f->n_saved; i++) count_fast(L, f->saved[i].linktype, -1); /* Python counts them */
    L->bailing = NULL;
    drop_flow(L, f);
}

static PyObject *Lane_next(Lane *L, PyObject *Py_UNUSED(ignored)) {
    for (;;) {
        Flow *f = L->bailing;
        if (f) {
            PyObject *item;
            if (L->replay_i < 0) {
                L->replay_i = 0;
                item = bail_header(f);
            } else {
                Saved *r = &f->saved[L->replay_i++];
                item = raw_record(r->frame, r->ts, r->linktype, f->arena + r->at, r->caplen, r->orig_len);
            }
            if (item && L->replay_i == f->n_saved) end_bail(L); /* out of the table before Python promotes */
            return item;
        }
        if (L->finishing) {
            if (!L->all) Py_RETURN_NONE;
            begin_bail(L, L->all);
            continue;
        }
        if (L->n_rows >= L->batch || (L->n_rows && L->batch_text >= BATCH_TEXT))
            return typed(RowsReadyType, "(n)", L->n_rows);
        Rec rec;
        int got = L->plan.on ? plan_next(&L->plan, &L->R, &rec) : reader_next(&L->R, &rec);
        if (got == REC_ERROR) return NULL;
        if (got == REC_DAMAGE) return typed(DamageType, "(sL)", L->R.what, (long long)L->R.damage_pos);
        if (got != REC_PACKET) Py_RETURN_NONE;
        const uint8_t *data = rec.data;
        int64_t ts = rec.ts, caplen = rec.caplen, orig_len = rec.orig_len;
        Seg s;
        Entry *e = NULL;
        int kind = decode(rec.linktype, data, caplen, orig_len, &s);
        if (kind) {
            uint8_t key[KEY_LEN];
            make_key(key, s.addr, s.addr + s.alen, s.alen, s.sport, s.dport);
            e = lookup(L, key);
        }
        if (!e) return raw_record(rec.frame, ts, rec.linktype, data, caplen, orig_len);
        f = e->flow;
        int rc = kind == 1 ? take_segment(L, f, e->dir, &s, ts, rec.frame) : 0;
        if (rc < 0) return NULL;
        count_fast(L, rec.linktype, 1);
        if (rc == 1 && f->state == IDLE) continue; /* committed */
        /* inside an exchange, or leaving the lane: keep a copy for a replay */
        if (rc == 0 && f->state == IDLE) clear_exchange(f); /* at a boundary only this record is replayed */
        if (save_record(f, &rec) < 0) return PyErr_NoMemory();
        if (rc == 0 || f->arena_len > REPLAY_LIMIT) begin_bail(L, f); /* huge responses: Python's bounded buffers */
    }
}

static PyObject *Lane_feed(Lane *L, PyObject *arg) {
    if (reader_feed(&L->R, arg) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Lane_fill(Lane *L, PyObject *const *args, Py_ssize_t nargs) {
    return fill_method(&L->R, args, nargs);
}

static PyObject *Lane_eof(Lane *L, PyObject *Py_UNUSED(ignored)) {
    L->R.eof = 1;
    Py_RETURN_NONE;
}

static PyObject *Lane_finish(Lane *L, PyObject *Py_UNUSED(ignored)) {
    L->finishing = 1;
    Py_RETURN_NONE;
}

static Flow *new_flow(Lane *L, PyObject *obj, int kind, int owned, const uint8_t *ca, const uint8_t *sa, int alen,
                      unsigned cport, unsigned sport) {
    uint8_t k[2][KEY_LEN];
    make_key(k[0], ca, sa, alen, cport, sport);
    make_key(k[1], sa, ca, alen, sport, cport);
    if (lookup(L, k[0]) || lookup(L, k[1])) {
        PyErr_SetString(PyExc_ValueError, "connection already in the lane");
        return NULL;
    }
    Flow *f = PyMem_Calloc(1, sizeof(Flow));
    if (!f) return (Flow *)PyErr_NoMemory();
    for (int i = 0; i < 2; i++) {
        Entry *e = PyMem_Calloc(1, sizeof(Entry));
        if (!e) { PyErr_NoMemory(); drop_flow(L, f); return NULL; }
        memcpy(e->key, k[i], KEY_LEN);
        e->flow = f;
        e->dir = i;
        size_t slot = hash_key(k[i]) & L->table_mask;
        e->next = L->table[slot];
        L->table[slot] = e;
        f->entries[i] = e;
    }
    f->obj = Py_NewRef(obj);
    f->kind = kind;
    f->owned = owned;
    f->all_next = L->all;
    if (L->all) L->all->all_prev = f;
    L->all = f;
    return f;
}

/* promote(flow, client_addr, client_port, server_addr, server_port, kind, owned) for other / foreign */
static PyObject *Lane_promote(Lane *L, PyObject *args) {
    PyObject *obj;
    Py_buffer ca, sa;
    unsigned cport, sport;
    int kind, owned;
    if (!PyArg_ParseTuple(args, "Oy*Iy*Iip", &obj, &ca, &cport, &sa, &sport, &kind, &owned)) return NULL;
    Flow *f = NULL;
    if (ca.len != sa.len || (ca.len != 4 && ca.len != 16) || (kind != K_OTHER && kind != K_FOREIGN))
        PyErr_SetString(PyExc_ValueError, "bad promotion");
    else
        f = new_flow(L, obj, kind, owned, ca.buf, sa.buf, (int)ca.len, cport, sport);
    PyBuffer_Release(&ca);
    PyBuffer_Release(&sa);
    if (!f) return NULL;
    Py_RETURN_NONE;
}

/* promote_mysql(flow, client, client_port, server, server_port, to_server, to_client, count, deprecate_eof,
 *               query_attributes, max_sql, request_keep, statements, row): a MySQL connection between two
 * exchanges (connection.Handover; tcp.HalfStream.position gives to_server and to_client: (base, next)). Addresses
 * as packed bytes; query_attributes 0 off, 1 on, 2 unknown; `row` holds the connection's columns of every row it
 * writes (NCOLS items; those of an exchange are not read). Positional: keywords cost more than a short exchange. */
static PyObject *Lane_promote_mysql(Lane *L, PyObject *args) {
    PyObject *obj, *statements, *row;
    Py_buffer ca, sa;
    unsigned cport, sport;
    unsigned long long b0, b1;
    long long n0, n1, count, max_sql, keep_client;
    int deprecate_eof, qa;
    if (!PyArg_ParseTuple(args, "Oy*Iy*I(KL)(KL)LpiLLO!O!", &obj, &ca, &cport, &sa, &sport, &b0, &n0, &b1, &n1,
                          &count, &deprecate_eof, &qa, &max_sql, &keep_client, &PyDict_Type, &statements,
                          &PyTuple_Type, &row))
        return NULL;
    Flow *f = NULL;
    if (ca.len != sa.len || (ca.len != 4 && ca.len != 16) || PyTuple_GET_SIZE(row) != NCOLS)
        PyErr_SetString(PyExc_ValueError, "bad promotion");
    else
        f = new_flow(L, obj, K_MYSQL, 1, ca.buf, sa.buf, (int)ca.len, cport, sport);
    PyBuffer_Release(&ca);
    PyBuffer_Release(&sa);
    if (!f) return NULL;
    f->base[0] = (uint32_t)b0;
    f->base[1] = (uint32_t)b1;
    f->work.next[0] = n0;
    f->work.next[1] = n1;
    f->work.count = count;
    f->committed = f->work;
    f->deprecate_eof = deprecate_eof;
    f->qa = qa;
    f->max_sql = max_sql;
    f->keep_client = keep_client;
    f->budget = L->budget.buf;
    f->conn_index = PyLong_AsLongLong(PyTuple_GET_ITEM(row, COL_CONN_INDEX));
    if (f->conn_index == -1 && PyErr_Occurred()) { drop_flow(L, f); return NULL; }
    f->statements = Py_NewRef(statements);
    f->row = Py_NewRef(row);
    Py_RETURN_NONE;
}

/* counts() -> Counts */
static PyObject *Lane_counts(Lane *L, PyObject *Py_UNUSED(ignored)) {
    Reader *R = &L->R;
    const Plan *P = &L->plan;
    /* with a plan: its records, as the excerpt file's reader counts them (their times are what it would check) */
    int has_ts = P->on ? P->has_ts : R->has_ts;
    int64_t first_ts = P->on ? P->first_ts : R->first_ts, last_ts = P->on ? P->last_ts : R->last_ts;
    PyObject *first = has_ts ? PyLong_FromLongLong(first_ts) : Py_NewRef(Py_None);
    PyObject *last = has_ts ? PyLong_FromLongLong(last_ts) : Py_NewRef(Py_None);
    PyObject *links = PyDict_New();
    for (int i = 0; links && i < L->n_link; i++) {
        if (!L->fast_link[i][1]) continue;
        PyObject *k = PyLong_FromLongLong(L->fast_link[i][0]), *v = PyLong_FromLongLong(L->fast_link[i][1]);
        if (!k || !v || PyDict_SetItem(links, k, v) < 0) Py_CLEAR(links);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    if (!first || !last || !links) {
        Py_XDECREF(first); Py_XDECREF(last); Py_XDECREF(links);
        return NULL;
    }
    return typed(CountsType, "(LLNNLLLLLLLON)", (long long)(P->on ? P->frame : R->frame), (long long)L->fast_frames,
                 first, last, (long long)R->pos, (long long)L->commands[0], (long long)L->commands[1],
                 (long long)(P->on ? 0 : R->bad_ts),
                 (long long)R->sections, (long long)R->ng.idbs, (long long)R->unknown_blocks, R->if_drops, links);
}

/* take_columns() -> the rows written since the last call, as NCOLS columns: bytes (int64 / float64 values, native
 * byte order) for 'q' / 'd' columns of ROW_KINDS, lists for 'o' columns, and for the 'o' columns the lane was
 * told to code (`coded`) a pair: the bytes of int32 codes (-1 for None) and the list of distinct values. Every
 * column holds one value per row: a column written twice, or not at all, or as another kind is an error. */
static PyObject *Lane_take_columns(Lane *L, PyObject *Py_UNUSED(ignored)) {
    for (int i = 0; i < NCOLS; i++) {
        Column *c = &L->cols[i];
        Py_ssize_t n = !c->codes && ROW_KINDS[i] == 'o' ? PyList_GET_SIZE(c->list) : c->n;
        if (n != L->n_rows)
            return PyErr_Format(PyExc_RuntimeError, "the lane wrote %zd values of column %s for %zd rows", n,
                                COLUMN_NAME[i], L->n_rows);
    }
    PyObject *out = PyList_New(NCOLS);
    if (!out) return NULL;
    for (int i = 0; i < NCOLS; i++) {
        Column *c = &L->cols[i];
        PyObject *item;
        if (c->codes) {
            PyObject *values = PyList_New(0);
            PyObject *codes = values ? PyBytes_FromStringAndSize(c->n ? c->data : "", 4 * c->n) : NULL;
            item = codes ? PyTuple_Pack(2, codes, c->list) : NULL;
            Py_XDECREF(codes);
            if (!item) { Py_XDECREF(values); Py_DECREF(out); return NULL; }
            Py_DECREF(c->list);
            c->list = values;
            c->n = 0;
            PyDict_Clear(c->codes);
            Py_CLEAR(c->last); /* its code was of this batch */
        } else if (ROW_KINDS[i] == 'o') {
            item = c->list;
            c->list = PyList_New(0);
            if (!c->list) { c->list = item; Py_DECREF(out); return NULL; }
        } else if (ROW_KINDS[i] == 'b') {
            item = PyBytes_FromStringAndSize(c->n ? c->valid : "", c->n);
            if (!item) { Py_DECREF(out); return NULL; }
            c->n = 0;
        } else if (ROW_KINDS[i] == 'n') {
            item = Py_BuildValue("(y#y#)", c->n ? c->data : "", 8 * c->n, c->n ? c->valid : "", c->n);
            if (!item) { Py_DECREF(out); return NULL; }
            c->n = 0;
        } else if (ROW_KINDS[i] == 's') {
            /* Arrow's offsets: where each row starts, then where the last ends */
            PyObject *ends = PyBytes_FromStringAndSize(NULL, 4 * (c->n + 1));
            if (!ends) { Py_DECREF(out); return NULL; }
            int32_t zero = 0;
            memcpy(PyBytes_AS_STRING(ends), &zero, 4);
            if (c->n) memcpy(PyBytes_AS_STRING(ends) + 4, c->ends, 4 * c->n);
            item = Py_BuildValue("(Ny#y#)", ends, c->chars_len ? c->chars : "", c->chars_len, c->n ? c->valid : "",
                                 c->n);
            if (!item) { Py_DECREF(out); return NULL; }
            c->n = 0;
            c->chars_len = 0;
        } else {
            item = PyBytes_FromStringAndSize(c->data, 8 * c->n);
            if (!item) { Py_DECREF(out); return NULL; }
            c->n = 0;
        }
        PyList_SET_ITEM(out, i, item);
    }
    L->n_rows = 0;
    L->batch_text = 0;
    return out;
}

/* Lane(pcapng, big_endian, frac_to_ns, linktype, limit, pos, batch, fingerprints, query, execute, ok, resultset,
 * coded="", excerpt=None); excerpt: an excerpt plan (keys, frames, insert_at, blobs), see Plan */
static int Lane_init(Lane *L, PyObject *args, PyObject *kw) {
    static char *names[] = {"pcapng", "big_endian", "frac_to_ns", "linktype", "limit", "pos", "batch",
                            "fingerprints", "query", "execute", "ok", "resultset", "coded", "excerpt", "budget_left",
                            NULL};
    int pcapng, big, linktype;
    long long frac, limit, pos;
    Py_ssize_t batch;
    PyObject *fingerprints, *query, *execute, *ok, *resultset, *excerpt = Py_None, *budget_left = Py_None;
    const char *coded = "";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ppLiLLnOUUUU|sOO", names, &pcapng, &big, &frac, &linktype, &limit,
                                     &pos, &batch, &fingerprints, &query, &execute, &ok, &resultset, &coded,
                                     &excerpt, &budget_left))
        return -1;
    if (budget_left != Py_None && !L->budget.buf) {
        if (PyObject_GetBuffer(budget_left, &L->budget, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return -1;
        if (L->budget.len != 16 || L->budget.itemsize != 8 || !L->budget.format ||
            strcmp(L->budget.format, "q") != 0) {
            PyBuffer_Release(&L->budget);
            L->budget.buf = NULL;
            PyErr_SetString(PyExc_ValueError, "budget_left must be an array('q') of two items");
            return -1;
        }
    }
    if (excerpt != Py_None && plan_setup(&L->plan, excerpt) < 0) return -1;
    for (int i = 0; i < NCOLS && coded[i]; i++)
        if (coded[i] == 'c' && ROW_KINDS[i] == 'o' && !L->cols[i].codes && !(L->cols[i].codes = PyDict_New()))
            return -1;
    if (reader_setup(&L->R, pcapng, big, frac, linktype, limit, pos) < 0) return -1;
    L->batch = batch;
    for (int i = 0; i < NCOLS; i++)
        if (ROW_KINDS[i] == 'o' && !L->cols[i].list && !(L->cols[i].list = PyList_New(0))) return -1;
    Py_XSETREF(L->fingerprints, Py_NewRef(fingerprints));
    for (int i = 0; i < FP_CACHE; i++) { Py_CLEAR(L->fp_cache[i].sql); Py_CLEAR(L->fp_cache[i].fp); }
    Py_XSETREF(L->names[0], Py_NewRef(query));
    Py_XSETREF(L->names[1], Py_NewRef(execute));
    Py_XSETREF(L->results[0], Py_NewRef(ok));
    Py_XSETREF(L->results[1], Py_NewRef(resultset));
    if (!L->empty && !(L->empty = PyUnicode_FromString(""))) return -1;
    if (!L->table) {
        L->table_mask = (1 << 14) - 1;
        L->table = PyMem_Calloc(L->table_mask + 1, sizeof(Entry *));
        if (!L->table) { PyErr_NoMemory(); return -1; }
    }
    return 0;
}

static void Lane_dealloc(Lane *L) {
    while (L->all) drop_flow(L, L->all);
    plan_free(&L->plan);
    if (L->budget.buf) PyBuffer_Release(&L->budget);
    PyMem_Free(L->table);
    reader_free(&L->R);
    for (int i = 0; i < NCOLS; i++) {
        Py_XDECREF(L->cols[i].list);
        Py_XDECREF(L->cols[i].codes);
        Py_XDECREF(L->cols[i].last);
        PyMem_Free(L->cols[i].data);
        PyMem_Free(L->cols[i].valid);
        PyMem_Free(L->cols[i].chars);
        PyMem_Free(L->cols[i].ends);
    }
    Py_XDECREF(L->fingerprints);
    for (int i = 0; i < FP_CACHE; i++) { Py_XDECREF(L->fp_cache[i].sql); Py_XDECREF(L->fp_cache[i].fp); }
    for (int i = 0; i < 2; i++) { Py_XDECREF(L->names[i]); Py_XDECREF(L->results[i]); }
    Py_XDECREF(L->empty);
    Py_TYPE(L)->tp_free((PyObject *)L);
}

/* excerpt_done() -> with an excerpt plan, True once its last record was read: the rest of the capture is not needed */
static PyObject *Lane_excerpt_done(Lane *L, PyObject *Py_UNUSED(ignored)) { return PyBool_FromLong(L->plan.done); }

static PyMethodDef Lane_methods[] = {
    {"feed", (PyCFunction)Lane_feed, METH_O, "Append capture bytes (after the file header)."},
    {"fill", (PyCFunction)(void (*)(void))Lane_fill, METH_FASTCALL, "Read up to N capture bytes with READINTO(view) straight into the buffer; returns how many came (0: the end)."},
    {"next", (PyCFunction)Lane_next, METH_NOARGS,
     "Run until Python is needed: a Record, a GivenBack (then its replays: Records), RowsReady, Damage, or None "
     "(more bytes needed / all done)."},
    {"eof", (PyCFunction)Lane_eof, METH_NOARGS, "The whole file was fed: the last records need no look-ahead."},
    {"finish", (PyCFunction)Lane_finish, METH_NOARGS, "End of the capture: every connection bails, in turn."},
    {"promote", (PyCFunction)Lane_promote, METH_VARARGS, "Hand over a connection that is not parsed."},
    {"promote_mysql", (PyCFunction)Lane_promote_mysql, METH_VARARGS,
     "Hand over a MySQL connection between two exchanges."},
    {"counts", (PyCFunction)Lane_counts, METH_NOARGS, "What the lane read and consumed."},
    {"excerpt_done", (PyCFunction)Lane_excerpt_done, METH_NOARGS,
     "With an excerpt plan: its last record was read (the rest of the capture is not needed)."},
    {"take_columns", (PyCFunction)Lane_take_columns, METH_NOARGS, "The rows written since the last call, by column."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pcapdecomp._lane.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_methods = Lane_methods,
    .tp_doc = "The fast lane of extraction (see pcapdecomp/read/fastlane.py).",
};


/* ---- the clock's segments: clocks.read_segments_of in C ------------------------------------------------------
 *
 * The keys and times of every TCP segment of chosen connections, read from the same records as the lane (times
 * checked alike): seq << 32 | ack, wire payload length << 9 | flags << 1 | direction, and the time. */

typedef struct {
    PyObject_HEAD
    Reader R;
    Entry **table;
    size_t table_mask;
    uint64_t *cols[3];
    Py_ssize_t n, cap;
} Segments;

static int segments_add_key(Segments *S, const uint8_t *k, int dir) {
    size_t slot = hash_key(k) & S->table_mask;
    for (Entry *e = S->table[slot]; e; e = e->next)
        if (!memcmp(e->key, k, KEY_LEN)) return 0; /* both ways round: the first (client -> server) wins */
    Entry *e = PyMem_Calloc(1, sizeof(Entry));
    if (!e) { PyErr_NoMemory(); return -1; }
    memcpy(e->key, k, KEY_LEN);
    e->dir = dir;
    e->next = S->table[slot];
    S->table[slot] = e;
    return 0;
}

/* Segments(pcapng, big_endian, frac_to_ns, linktype, limit, pos, flows): flows a list of (client address bytes,
 * client port, server address bytes, server port) */
static int Segments_init(Segments *S, PyObject *args, PyObject *kw) {
    static char *names[] = {"pcapng", "big_endian", "frac_to_ns", "linktype", "limit", "pos", "flows", NULL};
    int pcapng, big, linktype;
    long long frac, limit, pos;
    PyObject *flows;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ppLiLLO!", names, &pcapng, &big, &frac, &linktype, &limit, &pos,
                                     &PyList_Type, &flows))
        return -1;
    if (S->table) {
        PyErr_SetString(PyExc_RuntimeError, "Segments cannot be initialised twice");
        return -1;
    }
    if (reader_setup(&S->R, pcapng, big, frac, linktype, limit, pos) < 0) return -1;
    Py_ssize_t n = PyList_GET_SIZE(flows);
    size_t size = 1 << 10;
    while (size < (size_t)(4 * n)) size <<= 1;
    S->table_mask = size - 1;
    S->table = PyMem_Calloc(size, sizeof(Entry *));
    if (!S->table) { PyErr_NoMemory(); return -1; }
    for (int dir = 0; dir < 2; dir++) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_buffer ca, sa;
            unsigned cport, sport;
            if (!PyArg_ParseTuple(PyList_GET_ITEM(flows, i), "y*Iy*I", &ca, &cport, &sa, &sport)) return -1;
            int bad = ca.len != sa.len || (ca.len != 4 && ca.len != 16) || cport > 0xFFFF || sport > 0xFFFF;
            uint8_t k[KEY_LEN];
            if (!bad) {
                if (dir == 0) make_key(k, ca.buf, sa.buf, (int)ca.len, cport, sport);
                else make_key(k, sa.buf, ca.buf, (int)ca.len, sport, cport);
            }
            PyBuffer_Release(&ca);
            PyBuffer_Release(&sa);
            if (bad) {
                PyErr_SetString(PyExc_ValueError, "a flow is (4- or 16-byte address, port, same-size address, port)");
                return -1;
            }
            if (segments_add_key(S, k, dir) < 0) return -1;
        }
    }
    return 0;
}

static PyObject *Segments_feed(Segments *S, PyObject *arg) {
    if (reader_feed(&S->R, arg) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Segments_fill(Segments *S, PyObject *const *args, Py_ssize_t nargs) {
    return fill_method(&S->R, args, nargs);
}

static PyObject *Segments_eof(Segments *S, PyObject *Py_UNUSED(ignored)) {
    S->R.eof = 1;
    Py_RETURN_NONE;
}

/* Read every complete record fed so far; at damage, stop (as read_segments_of does). */
static PyObject *Segments_run(Segments *S, PyObject *Py_UNUSED(ignored)) {
    Rec rec;
    for (;;) {
        int got = reader_next(&S->R, &rec);
        if (got == REC_ERROR) return NULL;
        if (got != REC_PACKET) Py_RETURN_NONE;
        Seg s;
        if (!decode(rec.linktype, rec.data, rec.caplen, rec.orig_len, &s)) continue;
        uint8_t k[KEY_LEN];
        make_key(k, s.addr, s.addr + s.alen, s.alen, s.sport, s.dport);
        Entry *e = S->table[hash_key(k) & S->table_mask];
        while (e && memcmp(e->key, k, KEY_LEN)) e = e->next;
        if (!e) continue;
        if (S->n == S->cap) {
            Py_ssize_t cap = S->cap ? S->cap * 2 : 1 << 16;
            for (int i = 0; i < 3; i++) {
                uint64_t *c = PyMem_Realloc(S->cols[i], cap * sizeof(uint64_t));
                if (!c) return PyErr_NoMemory();
                S->cols[i] = c;
            }
            S->cap = cap;
        }
        S->cols[0][S->n] = (uint64_t)s.seq << 32 | s.ack;
        S->cols[1][S->n] = (uint64_t)s.wire_len << 9 | s.flags << 1 | (unsigned)e->dir;
        S->cols[2][S->n] = (uint64_t)rec.ts;
        S->n += 1;
    }
}

/* take() -> [k1, k2, ts]: the bytes of uint64 / uint64 / int64 arrays (native byte order); the lane lets go of
 * each column as soon as its copy exists. */
static PyObject *Segments_take(Segments *S, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(3);
    if (!out) return NULL;
    for (int i = 0; i < 3; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)S->cols[i], S->n * (Py_ssize_t)sizeof(uint64_t));
        if (!b) { Py_DECREF(out); return NULL; }
        PyMem_Free(S->cols[i]);
        S->cols[i] = NULL;
        PyList_SET_ITEM(out, i, b);
    }
    S->n = S->cap = 0;
    return out;
}

static void Segments_dealloc(Segments *S) {
    if (S->table) {
        for (size_t i = 0; i <= S->table_mask; i++) {
            Entry *e = S->table[i];
            while (e) { Entry *next = e->next; PyMem_Free(e); e = next; }
        }
        PyMem_Free(S->table);
    }
    for (int i = 0; i < 3; i++) PyMem_Free(S->cols[i]);
    reader_free(&S->R);
    Py_TYPE(S)->tp_free((PyObject *)S);
}

static PyMethodDef Segments_methods[] = {
    {"feed", (PyCFunction)Segments_feed, METH_O, "Append capture bytes."},
    {"fill", (PyCFunction)(void (*)(void))Segments_fill, METH_FASTCALL, "Read up to N capture bytes with READINTO(view) straight into the buffer; returns how many came (0: the end)."},
    {"eof", (PyCFunction)Segments_eof, METH_NOARGS, "The whole file was fed."},
    {"run", (PyCFunction)Segments_run, METH_NOARGS, "Read the records fed so far."},
    {"take", (PyCFunction)Segments_take, METH_NOARGS, "The keys and times read: [k1, k2, ts] as bytes."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SegmentsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pcapdecomp._lane.Segments",
    .tp_basicsize = sizeof(Segments),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Segments_init,
    .tp_dealloc = (destructor)Segments_dealloc,
    .tp_methods = Segments_methods,
    .tp_doc = "The clock's segment keys of chosen connections (see pcapdecomp/read/fastlane.py).",
};

static int add_repair_types(PyObject *m); /* the repair stage's passes, at the end of this file */

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lane", "The fast lane of extraction.", -1, NULL};

PyMODINIT_FUNC PyInit__lane(void) {
    for (int i = 0; i < NCOLS; i++)
        if (!ROW_KINDS[i])
            return PyErr_Format(PyExc_ImportError, "the lane does not write column %s of schema.EXCHANGE_COLUMNS",
                                COLUMN_NAME[i]);
    if (PyType_Ready(&LaneType) < 0 || PyType_Ready(&SegmentsType) < 0 || PyType_Ready(&RoomType) < 0) return NULL;
    S_num_params = PyUnicode_InternFromString("num_params");
    S_types = PyUnicode_InternFromString("types");
    S_long_data = PyUnicode_InternFromString("long_data");
    S_sql = PyUnicode_InternFromString("sql");
    S_executed = PyUnicode_InternFromString("executed");
    S_sep = PyUnicode_InternFromString(", ");
    S_unknown_statement = PyUnicode_InternFromString("unknown-statement");
    if (!S_num_params || !S_types || !S_long_data || !S_sql || !S_executed || !S_sep || !S_unknown_statement)
        return NULL;
    if (!(RecordType = PyStructSequence_NewType(&RecordDesc)) ||
        !(GivenBackType = PyStructSequence_NewType(&GivenBackDesc)) ||
        !(DamageType = PyStructSequence_NewType(&DamageDesc)) ||
        !(RowsReadyType = PyStructSequence_NewType(&RowsReadyDesc)) ||
        !(CountsType = PyStructSequence_NewType(&CountsDesc)))
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *columns = PyTuple_New(NCOLS); /* the layout it was built with: read/fastlane.py checks it is the schema's */
    for (int i = 0; columns && i < NCOLS; i++) {
        PyObject *name = PyUnicode_FromString(COLUMN_NAME[i]);
        if (!name) Py_CLEAR(columns);
        else PyTuple_SET_ITEM(columns, i, name);
    }
    if (!columns || PyModule_AddObjectRef(m, "COLUMNS", columns) < 0 ||
        PyModule_AddObjectRef(m, "Lane", (PyObject *)&LaneType) < 0 ||
        PyModule_AddObjectRef(m, "Segments", (PyObject *)&SegmentsType) < 0 ||
        PyModule_AddObjectRef(m, "Record", (PyObject *)RecordType) < 0 ||
        PyModule_AddObjectRef(m, "GivenBack", (PyObject *)GivenBackType) < 0 ||
        PyModule_AddObjectRef(m, "Damage", (PyObject *)DamageType) < 0 ||
        PyModule_AddObjectRef(m, "RowsReady", (PyObject *)RowsReadyType) < 0 ||
        PyModule_AddObjectRef(m, "Counts", (PyObject *)CountsType) < 0 ||
        PyModule_AddStringConstant(m, "ROW_KINDS", ROW_KINDS) < 0 || add_repair_types(m) < 0) {
        Py_XDECREF(columns);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(columns);
    return m;
}


/* ==== the repair stage's passes (pair/repair.py through fastlane.excerpt_scan / excerpt_copy; its re-read is a Lane
 * with an excerpt plan, see Plan) ============================================================================
 *
 * The loss repair reads the TCP segments of a few chosen connections again (the giver's, to borrow bytes; the lossy
 * point's, to read them once more with the borrowed pieces in). Excerpt reads the same records as the lane (times
 * checked alike, frames numbered alike, up to damage) and, keyed by directed (address, port, address, port):
 * - scan (frames None): for every segment of a key, its key index, frame, time, seq, ack, flags, captured payload
 *   length and the payload bytes the snaplen cut (capture._decode's `missing`), as columns;
 * - copy (frames: the sorted frame numbers to copy): those segments as classic pcap records (nanoseconds,
 *   LINKTYPE_RAW, an IPv4 or IPv6 header, a 20-byte TCP header, the captured payload; their lengths say what the
 *   snaplen cut) that capture._decode and the lane decode into the same fields, with the given ready-made records
 *   (`blobs`) put in before the copied frame of each one's ordinal in `insert_at` (len(frames): after the last). */

#define EXCERPT_COLS 8

typedef struct {
    PyObject_HEAD
    Reader R;
    RKey **table;
    size_t table_mask;
    int64_t *cols[EXCERPT_COLS];
    Py_ssize_t n, cap;
    /* copy */
    int copy;
    Py_buffer frames, insert_at;
    PyObject *blobs;
    Py_ssize_t n_frames, at, n_inserts, next_insert, copied;
    uint8_t *out;
    Py_ssize_t out_n, out_cap;
    int ended;
} Excerpt;

static int excerpt_reserve(Excerpt *X, Py_ssize_t more) {
    if (X->out_n + more <= X->out_cap) return 0;
    Py_ssize_t cap = X->out_cap ? X->out_cap : 1 << 20;
    while (cap < X->out_n + more) cap *= 2;
    uint8_t *b = PyMem_Realloc(X->out, cap);
    if (!b) { PyErr_NoMemory(); return -1; }
    X->out = b;
    X->out_cap = cap;
    return 0;
}

/* the blobs whose ordinal is `upto` or less */
static int excerpt_inserts(Excerpt *X, Py_ssize_t upto) {
    const int64_t *at = X->insert_at.buf;
    while (X->next_insert < X->n_inserts && at[X->next_insert] <= upto) {
        PyObject *blob = PyList_GET_ITEM(X->blobs, X->next_insert);
        if (!PyBytes_Check(blob)) { PyErr_SetString(PyExc_TypeError, "a blob is bytes"); return -1; }
        Py_ssize_t len = PyBytes_GET_SIZE(blob);
        if (excerpt_reserve(X, len) < 0) return -1;
        memcpy(X->out + X->out_n, PyBytes_AS_STRING(blob), len);
        X->out_n += len;
        X->next_insert++;
    }
    return 0;
}

static int excerpt_write(Excerpt *X, const Seg *s, int64_t ts) {
    Py_ssize_t size = excerpt_size(s);
    if (excerpt_reserve(X, size) < 0) return -1;
    excerpt_put(X->out + X->out_n, s, ts);
    X->out_n += size;
    return 0;
}

/* Excerpt(pcapng, big_endian, frac_to_ns, linktype, limit, pos, keys, frames=None, insert_at=None, blobs=None):
 * keys a list of (source address bytes, source port, destination address bytes, destination port); frames and
 * insert_at buffers of sorted int64, blobs a list of bytes (one per insert_at) */
static int Excerpt_init(Excerpt *X, PyObject *args, PyObject *kw) {
    static char *names[] = {"pcapng", "big_endian", "frac_to_ns", "linktype", "limit", "pos", "keys", "frames",
                            "insert_at", "blobs", NULL};
    int pcapng, big, linktype;
    long long frac, limit, pos;
    PyObject *keys, *frames = Py_None, *insert_at = Py_None, *blobs = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ppLiLLO!|OOO", names, &pcapng, &big, &frac, &linktype, &limit, &pos,
                                     &PyList_Type, &keys, &frames, &insert_at, &blobs))
        return -1;
    if (X->table) {
        PyErr_SetString(PyExc_RuntimeError, "Excerpt cannot be initialised twice");
        return -1;
    }
    if (reader_setup(&X->R, pcapng, big, frac, linktype, limit, pos) < 0) return -1;
    if (frames != Py_None) {
        if (insert_at == Py_None || !PyList_Check(blobs)) {
            PyErr_SetString(PyExc_TypeError, "a copy takes frames, insert_at and blobs");
            return -1;
        }
        if (excerpt_buffers(frames, insert_at, PyList_GET_SIZE(blobs), &X->frames, &X->insert_at) < 0) return -1;
        X->copy = 1; /* the buffers are released at dealloc from here on */
        X->n_frames = X->frames.len / 8;
        X->n_inserts = X->insert_at.len / 8;
        Py_INCREF(blobs);
        X->blobs = blobs;
    }
    return rkeys_build(keys, &X->table, &X->table_mask);
}

static PyObject *Excerpt_feed(Excerpt *X, PyObject *arg) {
    if (reader_feed(&X->R, arg) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Excerpt_fill(Excerpt *X, PyObject *const *args, Py_ssize_t nargs) {
    return fill_method(&X->R, args, nargs);
}

static PyObject *Excerpt_eof(Excerpt *X, PyObject *Py_UNUSED(ignored)) {
    X->R.eof = 1;
    Py_RETURN_NONE;
}

/* Read every complete record fed so far (at damage, stop: as extraction does). A scan returns None; a copy returns
 * the records written since the last call (bytes; after the last record, the blobs left). */
static PyObject *Excerpt_run(Excerpt *X, PyObject *Py_UNUSED(ignored)) {
    Rec rec;
    const int64_t *frames = X->copy ? X->frames.buf : NULL;
    for (;;) {
        if (X->copy && X->at >= X->n_frames && !X->ended) { /* every frame copied: what is left to put in */
            if (excerpt_inserts(X, X->n_frames) < 0) return NULL;
            X->ended = 1;
        }
        if (X->ended) break;
        int got = reader_next(&X->R, &rec);
        if (got == REC_ERROR) return NULL;
        if (got != REC_PACKET) break;
        if (X->copy && rec.frame != frames[X->at]) continue;
        Seg s;
        if (!decode(rec.linktype, rec.data, rec.caplen, rec.orig_len, &s)) continue;
        RKey *e = rkeys_find(X->table, X->table_mask, &s);
        if (!e) continue;
        if (X->copy) {
            if (excerpt_inserts(X, X->at) < 0 || excerpt_write(X, &s, rec.ts) < 0) return NULL;
            X->at++;
            X->copied++;
            continue;
        }
        if (X->n == X->cap) {
            Py_ssize_t cap = X->cap ? X->cap * 2 : 1 << 16;
            for (int i = 0; i < EXCERPT_COLS; i++) {
                int64_t *c = PyMem_Realloc(X->cols[i], cap * sizeof(int64_t));
                if (!c) return PyErr_NoMemory();
                X->cols[i] = c;
            }
            X->cap = cap;
        }
        Py_ssize_t i = X->n++;
        X->cols[0][i] = e->index;
        X->cols[1][i] = rec.frame;
        X->cols[2][i] = rec.ts;
        X->cols[3][i] = s.seq;
        X->cols[4][i] = s.ack;
        X->cols[5][i] = s.flags;
        X->cols[6][i] = s.plen;
        X->cols[7][i] = s.wire_len - s.plen;
    }
    if (!X->copy) Py_RETURN_NONE;
    PyObject *chunk = PyBytes_FromStringAndSize((const char *)X->out, X->out_n);
    X->out_n = 0;
    return chunk;
}

/* take() -> a scan's columns [key index, frame, ts, seq, ack, flags, payload length, missing] as bytes of int64
 * arrays; a copy's count of frames copied */
static PyObject *Excerpt_take(Excerpt *X, PyObject *Py_UNUSED(ignored)) {
    if (X->copy) return PyLong_FromSsize_t(X->copied);
    PyObject *out = PyList_New(EXCERPT_COLS);
    if (!out) return NULL;
    for (int i = 0; i < EXCERPT_COLS; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)X->cols[i], X->n * (Py_ssize_t)sizeof(int64_t));
        if (!b) { Py_DECREF(out); return NULL; }
        PyMem_Free(X->cols[i]);
        X->cols[i] = NULL;
        PyList_SET_ITEM(out, i, b);
    }
    X->n = X->cap = 0;
    return out;
}

static void Excerpt_dealloc(Excerpt *X) {
    rkeys_free(X->table, X->table_mask);
    for (int i = 0; i < EXCERPT_COLS; i++) PyMem_Free(X->cols[i]);
    if (X->copy) {
        PyBuffer_Release(&X->frames);
        PyBuffer_Release(&X->insert_at);
    }
    Py_XDECREF(X->blobs);
    PyMem_Free(X->out);
    reader_free(&X->R);
    Py_TYPE(X)->tp_free((PyObject *)X);
}

/* frames() -> the records (frames) read so far: a scan that reached the end, the file's frames up to damage */
static PyObject *Excerpt_frames(Excerpt *X, PyObject *Py_UNUSED(ignored)) { return PyLong_FromLongLong(X->R.frame); }

static PyMethodDef Excerpt_methods[] = {
    {"frames", (PyCFunction)Excerpt_frames, METH_NOARGS, "The frames read so far."},
    {"feed", (PyCFunction)Excerpt_feed, METH_O, "Append capture bytes."},
    {"fill", (PyCFunction)(void (*)(void))Excerpt_fill, METH_FASTCALL, "Read up to N capture bytes with READINTO(view) straight into the buffer; returns how many came (0: the end)."},
    {"eof", (PyCFunction)Excerpt_eof, METH_NOARGS, "The whole file was fed."},
    {"run", (PyCFunction)Excerpt_run, METH_NOARGS, "Read the records fed so far (a copy: the records written)."},
    {"take", (PyCFunction)Excerpt_take, METH_NOARGS, "A scan's columns, or how many frames a copy copied."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ExcerptType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pcapdecomp._lane.Excerpt",
    .tp_basicsize = sizeof(Excerpt),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Excerpt_init,
    .tp_dealloc = (destructor)Excerpt_dealloc,
    .tp_methods = Excerpt_methods,
    .tp_doc = "The segments of chosen connections, scanned or copied (the repair stage; see pcapdecomp/read/fastlane.py).",
};

static int add_repair_types(PyObject *m) {
    if (PyType_Ready(&ExcerptType) < 0) return -1;
    return PyModule_AddObjectRef(m, "Excerpt", (PyObject *)&ExcerptType);
}
/* ==== end of the repair stage's passes ==== */
