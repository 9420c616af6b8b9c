/* The one-shot rounds of a shared window, compiled: the all-reduce round, and one round of the
 * copy collectives (broadcast, all-gather, all-to-all, gather, scatter) and of the reduce-scatter, which follow a
 * plan of byte ranges their Python algorithm builds once per shape; and the direct all-to-all's
 * two rounds with the reads of its peers' blocks by CMA between them (``direct``).
 *
 * A 1 KiB all-reduce through the window is one flag store, n - 1 flag loads and a few hundred
 * bytes of arithmetic, about a microsecond of work; in Python it took 5-7 us of interpreter time
 * (slot views, publish, the wait, the stamp check, two ufunc calls). This file does exactly what
 * algorithms/one_shot.py's Python round does, on the same window layout (transport/window.py),
 * in one call. The algorithm stays in Python: one_shot.py decides when to use this, and every
 * slow path (a peer late past the spin, a mismatch, a timeout, a peer that gave up) goes back to
 * the Python code that explains it.
 *
 * Bitwise identity: every rank reduces the slots in rank order, element by element
 * (x0 OP x1, then OP x2, ...), the same operations in the same order as numpy's ufuncs in the
 * Python round, so compiled, Python and mixed ranks end with the same bits. Floating types get
 * only + and * (IEEE-exact elementwise, no contraction: built with -ffp-contract=off); integers
 * wrap as numpy's do (arithmetic in unsigned types). Everything else takes the Python round.
 *
 * Memory order: the payload, stamp and word are stored before the round flag with release
 * semantics, and flags are loaded with acquire semantics, so a reader that sees round k sees
 * what its owner wrote for round k, on any CPU.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "_copy.h"
#include "_polling.h"

#define LINE 64

/* Reduction codes: op * 8 + dtype (ringcomm/core/ops.py builds them; -1 means "not here"). */
enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_BAND, OP_BOR, OP_BXOR, N_OPS };
enum { T_F32, T_F64, T_I8, T_I16, T_I32, T_I64, T_U8, N_TYPES };
static const int ITEMSIZE[N_TYPES] = {4, 8, 1, 2, 4, 8, 1};

typedef struct {
    PyObject_HEAD
    int rank, size;
    Py_ssize_t capacity;
    char **base;   /* rank r's region, as this process maps it */
    char **slots;  /* scratch: one round's slots in rank order (one call runs at a time per window) */
    pid_t *pids;   /* each rank's process, where the direct round may read peers by CMA; else NULL */
    int detour;    /* reads whose two sides lie a slow distance apart are left to Python's detour */
} Core;

static inline int64_t *flag_of(const Core *c, int r) { return (int64_t *)c->base[r]; }
static inline int64_t *slot_header(const Core *c, int r, int64_t k) {
    return (int64_t *)(c->base[r] + LINE + (k & 1) * (LINE + c->capacity));
}
static inline char *payload(const Core *c, int r, int64_t k) {
    return (char *)slot_header(c, r, k) + LINE;
}

static int lagging(const Core *c, int64_t k) {
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && __atomic_load_n(flag_of(c, r), __ATOMIC_ACQUIRE) < k)
            return r;
    return -1;
}

/* The first peer whose round-k slot carries another stamp or word, or -1. */
static int odd_stamp(const Core *c, int64_t k, int64_t stamp, int64_t word) {
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        const int64_t *h = slot_header(c, r, k);
        if (h[0] != stamp || h[1] != word) return r;
    }
    return -1;
}

/* out = s0 OP s1 OP ... in rank order: a first pass over two slots, then one more per rank, so
 * each element sees the same sequence of operations as the Python round's ufunc calls. */
#define PASS(T, EXPR)                                                            \
    do {                                                                         \
        T *restrict o = (T *)out;                                                \
        const T *restrict a0 = (const T *)src[0], *restrict a1 = (const T *)src[1]; \
        for (Py_ssize_t i = 0; i < count; i++) { T a = a0[i], b = a1[i]; o[i] = (EXPR); } \
        for (int r = 2; r < n; r++) {                                            \
            const T *restrict br = (const T *)src[r];                            \
            for (Py_ssize_t i = 0; i < count; i++) { T a = o[i], b = br[i]; o[i] = (EXPR); } \
        }                                                                        \
    } while (0)

/* Integers wrap like numpy's: add and multiply in the unsigned type W (wide enough that the
 * product of two promoted operands cannot overflow a signed int), then truncate. */
#define INT_OPS(T, U, W)                                                         \
    switch (op) {                                                                \
    case OP_SUM: PASS(T, (T)(U)((W)(U)a + (W)(U)b)); return 0;                   \
    case OP_PROD: PASS(T, (T)(U)((W)(U)a * (W)(U)b)); return 0;                  \
    case OP_MIN: PASS(T, a < b ? a : b); return 0;                               \
    case OP_MAX: PASS(T, a > b ? a : b); return 0;                               \
    case OP_BAND: PASS(T, (T)(a & b)); return 0;                                 \
    case OP_BOR: PASS(T, (T)(a | b)); return 0;                                  \
    case OP_BXOR: PASS(T, (T)(a ^ b)); return 0;                                 \
    default: return -1;                                                          \
    }

#define FLOAT_OPS(T)                                                             \
    switch (op) {                                                                \
    case OP_SUM: PASS(T, a + b); return 0;                                       \
    case OP_PROD: PASS(T, a * b); return 0;                                      \
    default: return -1;                                                          \
    }

static int reduce_slots(int code, char *out, char *const *src, int n, Py_ssize_t count) {
    int op = code / N_TYPES, type = code % N_TYPES;
    if (n == 1) {   /* one rank: its own slot is the result */
        rc_copy(out, src[0], count * ITEMSIZE[type]);
        return 0;
    }
    switch (type) {
    case T_F32: FLOAT_OPS(float)
    case T_F64: FLOAT_OPS(double)
    case T_I8: INT_OPS(int8_t, uint8_t, uint32_t)
    case T_I16: INT_OPS(int16_t, uint16_t, uint32_t)
    case T_I32: INT_OPS(int32_t, uint32_t, uint32_t)
    case T_I64: INT_OPS(int64_t, uint64_t, uint64_t)
    case T_U8: INT_OPS(uint8_t, uint8_t, uint32_t)
    }
    return -1;
}

static int valid_code(long code) {
    if (code < 0 || code >= N_OPS * N_TYPES) return 0;
    int op = code / N_TYPES, type = code % N_TYPES;
    return !((type == T_F32 || type == T_F64) && op > OP_PROD);
}

/* ---- Python glue ---------------------------------------------------------------------------- */

static void core_dealloc(Core *self) {
    PyMem_Free(self->base);
    PyMem_Free(self->slots);
    PyMem_Free(self->pids);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int core_init(Core *self, PyObject *args, PyObject *kwds) {
    int rank;
    Py_ssize_t capacity;
    PyObject *addresses, *pid_list = Py_None;
    int detour = 0;
    if (!PyArg_ParseTuple(args, "inO!|Op", &rank, &capacity, &PyTuple_Type, &addresses, &pid_list, &detour))
        return -1;
    Py_ssize_t size = PyTuple_GET_SIZE(addresses);
    if (size < 1 || size > 65536 || rank < 0 || rank >= size || capacity <= 0) {
        PyErr_Format(PyExc_ValueError, "Core: rank %d of %zd regions, capacity %zd", rank, size, capacity);
        return -1;
    }
    if (pid_list != Py_None && (!PyTuple_Check(pid_list) || PyTuple_GET_SIZE(pid_list) != size)) {
        PyErr_Format(PyExc_ValueError, "Core: pids must be None or a tuple of %zd pids", size);
        return -1;
    }
    char **base = PyMem_Calloc(size, sizeof(char *)), **slots = PyMem_Calloc(size, sizeof(char *));
    pid_t *pids = pid_list == Py_None ? NULL : PyMem_Calloc(size, sizeof(pid_t));
    if (base == NULL || slots == NULL || (pid_list != Py_None && pids == NULL)) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t r = 0; r < size; r++) {
        base[r] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(addresses, r));
        if (base[r] == NULL) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Core: a region address is NULL");
            goto fail;
        }
        if (pids != NULL) {
            long pid = PyLong_AsLong(PyTuple_GET_ITEM(pid_list, r));
            if (pid <= 0) {
                if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "Core: pid %ld", pid);
                goto fail;
            }
            pids[r] = (pid_t)pid;
        }
    }
    PyMem_Free(self->base);
    PyMem_Free(self->slots);
    PyMem_Free(self->pids);
    self->base = base;
    self->slots = slots;
    self->pids = pids;
    self->detour = detour;
    self->rank = rank;
    self->size = (int)size;
    self->capacity = capacity;
    return 0;
fail:
    PyMem_Free(base);
    PyMem_Free(slots);
    PyMem_Free(pids);
    return -1;
}

/* The slots of round k, in rank order. */
static char *const *slots_of(const Core *c, int64_t k) {
    for (int r = 0; r < c->size; r++) c->slots[r] = payload(c, r, k);
    return c->slots;
}

static int ready(const Core *c) {
    if (c->base != NULL) return 1;
    PyErr_SetString(PyExc_RuntimeError, "Core: not initialised");
    return 0;
}

static int get_buffers(PyObject *const *args, Py_buffer *in, Py_buffer *out, Py_ssize_t capacity) {
    if (PyObject_GetBuffer(args[0], in, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(args[1], out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(in);
        return -1;
    }
    if (in->len != out->len || in->len > capacity) {
        PyErr_Format(PyExc_ValueError, "all_reduce round: %zd bytes in, %zd out, window slot %zd",
                     in->len, out->len, capacity);
        PyBuffer_Release(in);
        PyBuffer_Release(out);
        return -1;
    }
    return 0;
}

/* Post round k (this rank's slot filled already): stamp, word, then the flag with release
 * semantics. */
static void post(const Core *c, int64_t k, int64_t stamp, int64_t word) {
    int64_t *mine = slot_header(c, c->rank, k);
    mine[0] = stamp;
    mine[1] = word;
    __atomic_store_n(flag_of(c, c->rank), k, __ATOMIC_RELEASE);
}

/* Poll the peers' flags for round k (posted by this rank) for up to ``spin`` seconds. 0: every
 * peer posted round k with this stamp and word; r + 1: peer r has not posted yet; -(r + 1): peer
 * r posted another stamp or word. Called without the GIL. */
static int await_round(const Core *c, int64_t k, int64_t stamp, int64_t word, double spin) {
    int late = lagging(c, k);
    if (late >= 0 && spin > 0) {
        double until = now() + spin;
        for (unsigned i = 1; late >= 0; i++) {
            RELAX();
            late = lagging(c, k);
            if (late >= 0 && (i & 63) == 0 && now() >= until) break;
        }
    }
    if (late >= 0) return late + 1;
    int odd = odd_stamp(c, k, stamp, word);
    return odd >= 0 ? -(odd + 1) : 0;
}

static int post_and_wait(const Core *c, int64_t k, int64_t stamp, int64_t word, double spin) {
    post(c, k, stamp, word);
    return await_round(c, k, stamp, word, spin);
}

/* all_reduce(k, src, dst, code, stamp, word, spin) -> status
 * Posts round k (src copied into this rank's slot, then stamp, word and the flag), polls the
 * peers' flags for up to ``spin`` seconds with the GIL released, and, if all posted with the same
 * stamp and word, writes the reduction of the slots into dst. Status: 0 done; r + 1 when peer r
 * has not posted yet (the round is posted: the caller waits, checks and calls reduce(k, ...));
 * -(r + 1) when peer r posted another stamp or word (nothing reduced). */
static PyObject *core_all_reduce(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready(self)) return NULL;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "all_reduce(k, src, dst, code, stamp, word, spin)");
        return NULL;
    }
    int64_t k = PyLong_AsLongLong(args[0]);
    long code = PyLong_AsLong(args[3]);
    int64_t stamp = PyLong_AsLongLong(args[4]), word = PyLong_AsLongLong(args[5]);
    double spin = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred()) return NULL;
    if (!valid_code(code)) return PyErr_Format(PyExc_ValueError, "all_reduce round: reduction code %ld", code);
    Py_buffer in, out;
    if (get_buffers(args + 1, &in, &out, self->capacity) < 0) return NULL;
    Py_ssize_t count = in.len / ITEMSIZE[code % N_TYPES];
    int status;
    Py_BEGIN_ALLOW_THREADS
    rc_copy(payload(self, self->rank, k), in.buf, in.len);
    status = post_and_wait(self, k, stamp, word, spin);
    if (status == 0) reduce_slots((int)code, out.buf, slots_of(self, k), self->size, count);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return PyLong_FromLong(status);
}

/* reduce(k, dst, code): dst = the reduction of round k's slots (every peer has posted it, and
 * the caller checked their stamps). */
static PyObject *core_reduce(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready(self)) return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "reduce(k, dst, code)");
        return NULL;
    }
    int64_t k = PyLong_AsLongLong(args[0]);
    long code = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (!valid_code(code)) return PyErr_Format(PyExc_ValueError, "all_reduce round: reduction code %ld", code);
    Py_buffer out;
    if (PyObject_GetBuffer(args[1], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    if (out.len > self->capacity) {
        PyBuffer_Release(&out);
        return PyErr_Format(PyExc_ValueError, "all_reduce round: %zd bytes, window slot %zd", out.len, self->capacity);
    }
    Py_BEGIN_ALLOW_THREADS
    reduce_slots((int)code, out.buf, slots_of(self, k), self->size, out.len / ITEMSIZE[code % N_TYPES]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* ---- one round of a plan ---------------------------------------------------------------------
 * A plan is int64s: nw, nr, then nw writes (from, to, len): bytes of src copied into this rank's
 * slot before the round is posted; then nr reads (peer, from, to, len): bytes of peer's slot
 * (peer -1: of src) copied to dst + to once every rank has posted. With a reduction code >= 0
 * the reads are instead the operands of one reduction in rank order, all of the same length and
 * destination: dst + to = op0 OP op1 OP ..., as reduce_slots does it. */
typedef struct {
    const int64_t *w, *r;
    Py_ssize_t nw, nr;
} Plan;

static int plan_of(const Core *c, const Py_buffer *plan, Py_ssize_t src_len, Py_ssize_t dst_len, long code,
                   Plan *p) {
    const int64_t *v = plan->buf;
    Py_ssize_t words = plan->len / 8;
    if (plan->len % 8 || words < 2 || v[0] < 0 || v[1] < 0 || words != 2 + 3 * v[0] + 4 * v[1]) goto bad;
    p->nw = v[0];
    p->nr = v[1];
    p->w = v + 2;
    p->r = v + 2 + 3 * v[0];
    for (Py_ssize_t i = 0; i < p->nw; i++) {
        const int64_t *e = p->w + 3 * i;
        if (e[0] < 0 || e[1] < 0 || e[2] < 0 || e[0] + e[2] > src_len || e[1] + e[2] > c->capacity) goto bad;
    }
    if (code >= 0 && p->nr != 0 && p->nr != c->size) goto bad;
    int own = 0;   /* a reduction reads this rank's input once at most: only that one may overlap dst */
    for (Py_ssize_t i = 0; i < p->nr; i++) {
        const int64_t *e = p->r + 4 * i;
        if (code >= 0 && e[0] < 0 && own++) goto bad;
        if (e[0] < -1 || e[0] >= c->size || e[1] < 0 || e[2] < 0 || e[3] < 0 || e[2] + e[3] > dst_len
            || e[1] + e[3] > (e[0] < 0 ? src_len : c->capacity))
            goto bad;
        if (code >= 0 && (e[2] != p->r[2] || e[3] != p->r[3] || e[3] > c->capacity
                          || e[3] % ITEMSIZE[code % N_TYPES]))
            goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "window round: a malformed plan");
    return -1;
}

static void plan_writes(const Core *c, int64_t k, const Plan *p, const char *src) {
    char *slot = payload(c, c->rank, k);
    for (Py_ssize_t i = 0; i < p->nw; i++) {
        const int64_t *e = p->w + 3 * i;
        rc_copy(slot + e[1], src + e[0], e[2]);
    }
}

/* The reads of round k (every peer has posted it). A reduction operand that overlaps its
 * destination (an in-place reduce-scatter's own part) is read from a copy, so the rank-order
 * passes never write what they have yet to read. -1 only when that copy cannot be made. Called
 * without the GIL. */
static int plan_reads(const Core *c, int64_t k, const Plan *p, const char *src, char *dst, long code) {
    if (code < 0) {
        for (Py_ssize_t i = 0; i < p->nr; i++) {
            const int64_t *e = p->r + 4 * i;
            const char *from = e[0] < 0 ? src + e[1] : payload(c, (int)e[0], k) + e[1];
            rc_move(dst + e[2], from, e[3]);
        }
        return 0;
    }
    if (p->nr == 0) return 0;
    Py_ssize_t len = p->r[3];
    char *out = dst + p->r[2], *spare = NULL;
    for (Py_ssize_t i = 0; i < p->nr; i++) {
        const int64_t *e = p->r + 4 * i;
        const char *from = e[0] < 0 ? src + e[1] : payload(c, (int)e[0], k) + e[1];
        if (from < out + len && out < from + len) {
            if ((spare = PyMem_RawMalloc(len ? len : 1)) == NULL) return -1;
            rc_copy(spare, from, len);
            from = spare;
        }
        c->slots[i] = (char *)from;
    }
    reduce_slots((int)code, out, c->slots, (int)p->nr, len / ITEMSIZE[code % N_TYPES]);
    PyMem_RawFree(spare);
    return 0;
}

/* The arguments round() and finish() share: k, src, dst, plan, code. */
typedef struct {
    int64_t k;
    long code;
    Py_buffer src, dst, plan;
    Plan p;
} RoundCall;

static int round_open(Core *self, PyObject *const *args, RoundCall *rc) {
    rc->k = PyLong_AsLongLong(args[0]);
    rc->code = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return -1;
    if (rc->code >= 0 && !valid_code(rc->code)) {
        PyErr_Format(PyExc_ValueError, "window round: reduction code %ld", rc->code);
        return -1;
    }
    if (PyObject_GetBuffer(args[1], &rc->src, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(args[2], &rc->dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto no_dst;
    if (PyObject_GetBuffer(args[3], &rc->plan, PyBUF_C_CONTIGUOUS) < 0) goto no_plan;
    if (plan_of(self, &rc->plan, rc->src.len, rc->dst.len, rc->code, &rc->p) == 0) return 0;
    PyBuffer_Release(&rc->plan);
no_plan:
    PyBuffer_Release(&rc->dst);
no_dst:
    PyBuffer_Release(&rc->src);
    return -1;
}

static void round_close(RoundCall *rc) {
    PyBuffer_Release(&rc->src);
    PyBuffer_Release(&rc->dst);
    PyBuffer_Release(&rc->plan);
}

/* round(k, src, dst, plan, code, stamp, word, spin) -> status, as all_reduce's: 0 done (the
 * plan's writes posted and its reads made); r + 1 peer r has not posted yet (the round is posted:
 * the caller waits, checks and calls finish(k, src, dst, plan, code)); -(r + 1) peer r posted
 * another stamp or word (nothing read). */
static PyObject *core_round(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready(self)) return NULL;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "round(k, src, dst, plan, code, stamp, word, spin)");
        return NULL;
    }
    int64_t stamp = PyLong_AsLongLong(args[5]), word = PyLong_AsLongLong(args[6]);
    double spin = PyFloat_AsDouble(args[7]);
    RoundCall rc;
    if (PyErr_Occurred() || round_open(self, args, &rc) < 0) return NULL;
    int status, failed = 0;
    Py_BEGIN_ALLOW_THREADS
    plan_writes(self, rc.k, &rc.p, rc.src.buf);
    status = post_and_wait(self, rc.k, stamp, word, spin);
    if (status == 0) failed = plan_reads(self, rc.k, &rc.p, rc.src.buf, rc.dst.buf, rc.code);
    Py_END_ALLOW_THREADS
    round_close(&rc);
    return failed ? PyErr_NoMemory() : PyLong_FromLong(status);
}

/* finish(k, src, dst, plan, code): the reads of round k, which every peer has posted (the caller
 * checked their stamps). */
static PyObject *core_finish(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready(self)) return NULL;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "finish(k, src, dst, plan, code)");
        return NULL;
    }
    RoundCall rc;
    if (round_open(self, args, &rc) < 0) return NULL;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = plan_reads(self, rc.k, &rc.p, rc.src.buf, rc.dst.buf, rc.code);
    Py_END_ALLOW_THREADS
    round_close(&rc);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* ---- the direct all-to-all's two rounds ------------------------------------------------------
 * algorithms/direct_all_to_all.py, compiled for windows whose ranks are processes this one reads
 * by CMA (the Core was given their pids). The plan is int64s: nt, nc, nr, item; then nt table
 * words; nc copies (from, to, len) in bytes, src to dst; nr reads (peer, at, len_at, to, count).
 *
 * Round k: this rank's slot gets the address of src and the nt table words after it (the words
 * the Python round posts, so compiled and Python ranks read each other), the round is posted,
 * and the copies (this rank's own block) are made while the peers post theirs. Once every rank
 * has posted round k with this stamp and word, each read checks that word len_at of the peer's
 * table is ``count`` and copies count * item bytes at (its word 0 + word at * item) of the peer's
 * memory to dst + to; then round k + 1 says the reads are done.
 *
 * Status: 0 done (both rounds posted and complete); 1 round k posted and the copies made, a peer
 * late or in another call (the caller settles round k, then checks and reads); 2 round k
 * complete, a count differs, a read failed, or (``detour``) a read's two sides lie a slow distance
 * apart (the caller checks and reads, and explains or takes the detour); 3 the
 * reads done and round k + 1 posted, a peer late or in another call (the caller settles it). */
typedef struct {
    Py_ssize_t nt, nc, nr, item;
    const int64_t *table, *copies, *reads;
} DirectPlan;

enum { DIRECT_DONE, DIRECT_POSTED, DIRECT_CHECK, DIRECT_READ };

static int direct_plan_of(const Core *c, const Py_buffer *plan, Py_ssize_t src_len, Py_ssize_t dst_len,
                          DirectPlan *p) {
    const int64_t *v = plan->buf;
    Py_ssize_t words = plan->len / 8;
    if (plan->len % 8 || words < 4 || v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] <= 0 || v[0] > words
        || v[1] > words || v[2] > words || (1 + v[0]) * 8 > c->capacity || words != 4 + v[0] + 3 * v[1] + 5 * v[2])
        goto bad;
    p->nt = v[0];
    p->nc = v[1];
    p->nr = v[2];
    p->item = v[3];
    p->table = v + 4;
    p->copies = p->table + p->nt;
    p->reads = p->copies + 3 * p->nc;
    for (Py_ssize_t i = 0; i < p->nc; i++) {
        const int64_t *e = p->copies + 3 * i;
        if (e[0] < 0 || e[1] < 0 || e[2] < 0 || e[0] + e[2] > src_len || e[1] + e[2] > dst_len) goto bad;
    }
    for (Py_ssize_t i = 0; i < p->nr; i++) {
        const int64_t *e = p->reads + 5 * i;
        if (e[0] < 0 || e[0] >= c->size || e[0] == c->rank || e[1] < 0 || e[1] > p->nt || e[2] < 0
            || e[2] > p->nt || e[3] < 0 || e[4] < 0 || e[4] > (dst_len - e[3]) / p->item)
            goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "direct round: a malformed plan");
    return -1;
}

/* len bytes between ``remote`` in process pid and ``local`` here: read into local, or (``write``)
 * written from it; -1 where the kernel refuses (the caller's Python road says why). The kernel
 * may stop short at a page it cannot reach: the rest is asked for again, and that call reports
 * the error. */
static int transfer(pid_t pid, char *local, int64_t remote, Py_ssize_t len, int write) {
    Py_ssize_t done = 0;
    while (done < len) {
        struct iovec here = {local + done, (size_t)(len - done)};
        struct iovec there = {(void *)(intptr_t)(remote + done), (size_t)(len - done)};
        ssize_t got = write ? process_vm_writev(pid, &here, 1, &there, 1, 0)
                            : process_vm_readv(pid, &here, 1, &there, 1, 0);
        if (got <= 0) return -1;
        done += got;
    }
    return 0;
}

/* ``offset`` bytes past the address ``peer`` posted first in its round-k row. Unsigned: an
 * address the kernel refuses, never undefined arithmetic. */
static inline uint64_t peer_address(const Core *c, int64_t k, int peer, uint64_t offset) {
    return (uint64_t)((const int64_t *)payload(c, peer, k))[0] + offset;
}

/* Where read ``e`` of round k starts in its peer's memory: its x plus the block's offset, a word
 * of its table. */
static inline uint64_t direct_from(const Core *c, int64_t k, const DirectPlan *p, const int64_t *e) {
    const int64_t *theirs = (const int64_t *)payload(c, (int)e[0], k);
    return peer_address(c, k, (int)e[0], (uint64_t)theirs[e[1]] * (uint64_t)p->item);
}

/* Whether a copy of ``len`` bytes from ``from`` to ``to`` is left to the Python road's detour
 * (cma.PeerMemory): with ``detour``, past the pieces, at a slow distance. */
static inline int needs_detour(const Core *c, const void *to, const void *from, int64_t len) {
    return c->detour && len > RC_COPY_PIECE && rc_slow_distance(to, from);
}

static int direct_rounds(const Core *c, int64_t k, const DirectPlan *p, const char *src, char *dst,
                         int64_t stamp, int64_t word, double spin) {
    int64_t *slot = (int64_t *)payload(c, c->rank, k);
    slot[0] = (int64_t)(intptr_t)src;
    memcpy(slot + 1, p->table, (size_t)p->nt * 8);
    post(c, k, stamp, word);
    for (Py_ssize_t i = 0; i < p->nc; i++) {
        const int64_t *e = p->copies + 3 * i;
        rc_move(dst + e[1], src + e[0], (size_t)e[2]);
    }
    if (await_round(c, k, stamp, word, spin)) return DIRECT_POSTED;
    for (Py_ssize_t i = 0; i < p->nr; i++) {
        const int64_t *e = p->reads + 5 * i;
        if (((const int64_t *)payload(c, (int)e[0], k))[e[2]] != e[4]) return DIRECT_CHECK;
    }
    for (Py_ssize_t i = 0; c->detour && i < p->nr; i++) {   /* before any read: Python then makes them all */
        const int64_t *e = p->reads + 5 * i;
        if (needs_detour(c, dst + e[3], (const void *)(uintptr_t)direct_from(c, k, p, e), e[4] * p->item))
            return DIRECT_CHECK;
    }
    for (Py_ssize_t i = 0; i < p->nr; i++) {
        const int64_t *e = p->reads + 5 * i;
        if (e[4] && transfer(c->pids[e[0]], dst + e[3], (int64_t)direct_from(c, k, p, e), e[4] * p->item, 0))
            return DIRECT_CHECK;
    }
    post(c, k + 1, stamp, word);
    return await_round(c, k + 1, stamp, word, spin) ? DIRECT_READ : DIRECT_DONE;
}

/* direct(k, src, dst, plan, stamp, word, spin) -> status (above) */
static PyObject *core_direct(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready(self)) return NULL;
    if (self->pids == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "direct round: this window's ranks are not read by CMA");
        return NULL;
    }
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "direct(k, src, dst, plan, stamp, word, spin)");
        return NULL;
    }
    int64_t k = PyLong_AsLongLong(args[0]);
    int64_t stamp = PyLong_AsLongLong(args[4]), word = PyLong_AsLongLong(args[5]);
    double spin = PyFloat_AsDouble(args[6]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer src, dst, plan;
    if (PyObject_GetBuffer(args[1], &src, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[2], &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto no_dst;
    if (PyObject_GetBuffer(args[3], &plan, PyBUF_C_CONTIGUOUS) < 0) goto no_plan;
    DirectPlan p;
    int status = -1;
    if (direct_plan_of(self, &plan, src.len, dst.len, &p) == 0) {
        Py_BEGIN_ALLOW_THREADS
        status = direct_rounds(self, k, &p, src.buf, dst.buf, stamp, word, spin);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&plan);
no_plan:
    PyBuffer_Release(&dst);
no_dst:
    PyBuffer_Release(&src);
    return status < 0 ? NULL : PyLong_FromLong(status);
}

/* ---- direct gather, scatter, all-gather, broadcast: a round of addresses, the moves, a round ----
 * The Python roads (algorithms/direct_gather.py, direct_scatter.py, direct_all_gather.py,
 * direct_broadcast.py),
 * compiled for windows whose ranks are processes this one reaches by CMA. ``posted`` is the row
 * of int64 words the Python road posts in round k (its buffer's address, then the words that
 * let peers map a ringcomm.empty block: Window.address_words), so compiled and Python ranks read
 * each other's rows. The plan is int64s: nc, nr, nw, block; then nc copies (from, to, len), src
 * to dst; nr reads (peer, at, to, len): len bytes at (the peer's word 0 + at) of its memory to
 * dst + to; nw writes (peer, from, at, len): src + from to (the peer's word 0 + at). ``block``:
 * the word of a row that is nonzero where that buffer is a ringcomm.empty block, or -1.
 *
 * Round k: the row is posted and the copies made while the peers post theirs. Once every rank
 * has posted round k with this stamp and word, the moves are made, unless a peer's buffer is a
 * block (Python maps it: Window.learn), a move's two sides lie a slow distance apart (with
 * ``detour``), or a peer to write to has given up (its newest round is its poison); then round
 * k + 1 says they are done. Status as ``direct``'s: 0 done; 1 round k posted and the copies
 * made, a peer late or in another call; 2 round k complete and the moves left to the caller
 * (some may be made: making them again is harmless); 3 the moves made and round k + 1 posted,
 * a peer late or in another call. */
typedef struct {
    Py_ssize_t nc, nr, nw, block, row;
    const int64_t *copies, *reads, *writes;
} MovesPlan;

#define POISON (-1)   /* the stamp of a rank that gave up (transport/window.py) */

static int moves_plan_of(const Core *c, const Py_buffer *plan, Py_ssize_t row_len, Py_ssize_t src_len,
                         Py_ssize_t dst_len, MovesPlan *p) {
    const int64_t *v = plan->buf;
    Py_ssize_t words = plan->len / 8;
    if (plan->len % 8 || row_len % 8 || row_len < 8 || row_len > c->capacity || words < 4 || v[0] < 0
        || v[1] < 0 || v[2] < 0 || v[0] > words || v[1] > words || v[2] > words || v[3] < -1
        || v[3] >= row_len / 8 || words != 4 + 3 * v[0] + 4 * v[1] + 4 * v[2])
        goto bad;
    p->nc = v[0];
    p->nr = v[1];
    p->nw = v[2];
    p->block = v[3];
    p->row = row_len / 8;
    p->copies = v + 4;
    p->reads = p->copies + 3 * p->nc;
    p->writes = p->reads + 4 * p->nr;
    for (Py_ssize_t i = 0; i < p->nc; i++) {
        const int64_t *e = p->copies + 3 * i;
        if (e[0] < 0 || e[1] < 0 || e[2] < 0 || e[0] > src_len - e[2] || e[1] > dst_len - e[2]) goto bad;
    }
    for (Py_ssize_t i = 0; i < p->nr + p->nw; i++) {
        const int64_t *e = p->reads + 4 * i;   /* reads, then writes right after them */
        Py_ssize_t local = i < p->nr ? e[2] : e[1], limit = i < p->nr ? dst_len : src_len;
        if (e[0] < 0 || e[0] >= c->size || e[0] == c->rank || e[1] < 0 || e[2] < 0 || e[3] < 0
            || local > limit - e[3])
            goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "moves round: a malformed plan");
    return -1;
}

/* Whether any move needs the Python road: a peer's buffer is a block, a move's sides lie a
 * slow distance apart (with ``detour``), or a peer written to gave up. */
static int moves_left(const Core *c, int64_t k, const MovesPlan *p, const char *src, char *dst) {
    for (Py_ssize_t i = 0; i < p->nr + p->nw; i++) {
        const int64_t *e = p->reads + 4 * i;
        int is_read = i < p->nr, peer = (int)e[0];
        if (p->block >= 0 && ((const int64_t *)payload(c, peer, k))[p->block] != 0) return 1;
        const char *local = is_read ? dst + e[2] : src + e[1];
        const void *there = (const void *)(uintptr_t)peer_address(c, k, peer, (uint64_t)(is_read ? e[1] : e[2]));
        if (is_read ? needs_detour(c, local, there, e[3]) : needs_detour(c, there, local, e[3])) return 1;
    }
    return 0;
}

static int gave_up(const Core *c, int peer, int64_t k) {
    int64_t newest = __atomic_load_n(flag_of(c, peer), __ATOMIC_ACQUIRE);
    return newest > k && slot_header(c, peer, newest)[0] == POISON;
}

static int moves_rounds(const Core *c, int64_t k, const MovesPlan *p, const char *posted, const char *src,
                        char *dst, int64_t stamp, int64_t word, double spin) {
    memcpy(payload(c, c->rank, k), posted, (size_t)p->row * 8);
    post(c, k, stamp, word);
    for (Py_ssize_t i = 0; i < p->nc; i++) {
        const int64_t *e = p->copies + 3 * i;
        rc_move(dst + e[1], src + e[0], (size_t)e[2]);
    }
    if (await_round(c, k, stamp, word, spin)) return DIRECT_POSTED;
    if (moves_left(c, k, p, src, dst)) return DIRECT_CHECK;
    for (Py_ssize_t i = 0; i < p->nr; i++) {
        const int64_t *e = p->reads + 4 * i;
        uint64_t from = peer_address(c, k, (int)e[0], (uint64_t)e[1]);
        if (e[3] && transfer(c->pids[e[0]], dst + e[2], (int64_t)from, e[3], 0)) return DIRECT_CHECK;
    }
    for (Py_ssize_t i = 0; i < p->nw; i++) {
        const int64_t *e = p->writes + 4 * i;
        uint64_t to = peer_address(c, k, (int)e[0], (uint64_t)e[2]);
        if (gave_up(c, (int)e[0], k)) return DIRECT_CHECK;   /* its buffers are its caller's again */
        if (e[3] && transfer(c->pids[e[0]], (char *)src + e[1], (int64_t)to, e[3], 1)) return DIRECT_CHECK;
    }
    post(c, k + 1, stamp, word);
    return await_round(c, k + 1, stamp, word, spin) ? DIRECT_READ : DIRECT_DONE;
}

/* moves(k, src, dst, posted, plan, stamp, word, spin) -> status (above) */
static PyObject *core_moves(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!ready(self)) return NULL;
    if (self->pids == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "moves round: this window's ranks are not reached by CMA");
        return NULL;
    }
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "moves(k, src, dst, posted, plan, stamp, word, spin)");
        return NULL;
    }
    int64_t k = PyLong_AsLongLong(args[0]);
    int64_t stamp = PyLong_AsLongLong(args[5]), word = PyLong_AsLongLong(args[6]);
    double spin = PyFloat_AsDouble(args[7]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer src, dst, posted, plan;
    int status = -1;
    if (PyObject_GetBuffer(args[1], &src, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[2], &dst, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto no_dst;
    if (PyObject_GetBuffer(args[3], &posted, PyBUF_C_CONTIGUOUS) < 0) goto no_posted;
    if (PyObject_GetBuffer(args[4], &plan, PyBUF_C_CONTIGUOUS) < 0) goto no_plan;
    MovesPlan p;
    if (moves_plan_of(self, &plan, posted.len, src.len, dst.len, &p) == 0) {
        Py_BEGIN_ALLOW_THREADS
        status = moves_rounds(self, k, &p, posted.buf, src.buf, dst.buf, stamp, word, spin);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&plan);
no_plan:
    PyBuffer_Release(&posted);
no_posted:
    PyBuffer_Release(&dst);
no_dst:
    PyBuffer_Release(&src);
    return status < 0 ? NULL : PyLong_FromLong(status);
}

static PyMethodDef core_methods[] = {
    {"all_reduce", (PyCFunction)(void (*)(void))core_all_reduce, METH_FASTCALL,
     "all_reduce(k, src, dst, code, stamp, word, spin) -> 0 done, r+1 peer r late, -(r+1) peer r differs"},
    {"reduce", (PyCFunction)(void (*)(void))core_reduce, METH_FASTCALL,
     "reduce(k, dst, code): dst = the reduction of round k's slots, in rank order"},
    {"round", (PyCFunction)(void (*)(void))core_round, METH_FASTCALL,
     "round(k, src, dst, plan, code, stamp, word, spin) -> 0 done, r+1 peer r late, -(r+1) peer r differs"},
    {"finish", (PyCFunction)(void (*)(void))core_finish, METH_FASTCALL,
     "finish(k, src, dst, plan, code): the plan's reads of round k"},
    {"direct", (PyCFunction)(void (*)(void))core_direct, METH_FASTCALL,
     "direct(k, src, dst, plan, stamp, word, spin) -> 0 done, 1 posted, 2 check and read, 3 read"},
    {"moves", (PyCFunction)(void (*)(void))core_moves, METH_FASTCALL,
     "moves(k, src, dst, posted, plan, stamp, word, spin) -> 0 done, 1 posted, 2 moves left, 3 moved"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ringcomm.core._round.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Core(rank, capacity, addresses, pids=None, detour=False): the compiled rounds of one window",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)core_init,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = core_methods,
};

/* address(array) -> int: where the array's first element lies (numpy's ``a.ctypes.data``, which
 * builds a ctypes object and costs ~3 us on the machines we measure; a send asks for it every time). */
static PyObject *module_address(PyObject *module, PyObject *obj) {
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_RECORDS_RO) < 0) return NULL;
    PyObject *result = PyLong_FromVoidPtr(view.buf);
    PyBuffer_Release(&view);
    return result;
}

/* copy(dst, src): dst's bytes = src's (two contiguous buffers of one length), by rc_copy
 * (_copy.h): memcpy, or memcpy in pieces where the two lie a few bytes apart modulo a page. The
 * GIL is let go for copies long enough to be worth the hand-over, as numpy does. */
static PyObject *module_copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy(dst, src)");
        return NULL;
    }
    Py_buffer dst, src;
    if (PyObject_GetBuffer(args[0], &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &src, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    int same = dst.len == src.len;
    if (!same) {
        PyErr_Format(PyExc_ValueError, "copy: dst has %zd bytes, src %zd", dst.len, src.len);
    } else if (dst.len >= (64 << 10)) {
        Py_BEGIN_ALLOW_THREADS
        rc_move(dst.buf, src.buf, (size_t)dst.len);
        Py_END_ALLOW_THREADS
    } else {
        rc_move(dst.buf, src.buf, (size_t)dst.len);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (!same) return NULL;
    Py_RETURN_NONE;
}

/* set_stream_min(nbytes): copies from nbytes on are streamed (_copy.h); at least RC_STREAM_FLOOR.
 * Returns the value now in force. */
static PyObject *module_set_stream_min(PyObject *module, PyObject *arg) {
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    rc_stream_min = n < RC_STREAM_FLOOR ? RC_STREAM_FLOOR : (size_t)n;
    return PyLong_FromSize_t(rc_stream_min);
}

/* stream_min() -> the length from which copies are streamed now. */
static PyObject *module_stream_min(PyObject *module, PyObject *unused) {
    return PyLong_FromSize_t(rc_stream_min);
}

/* transfer(pid, local, remote, nbytes, write): nbytes between address ``remote`` of process pid
 * and address ``local`` here, read into local or (``write``) written from it, the GIL let go;
 * OSError with the kernel's errno where it refuses (transport/shm/cma.py words it). The call
 * cma.py made through ctypes, less ctypes' ~1 us of argument conversion: a 64 MiB direct
 * all-reduce of 2 ranks makes 128 such calls, a send of 1 MiB one. */
static PyObject *module_transfer(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "transfer(pid, local, remote, nbytes, write)");
        return NULL;
    }
    long pid = PyLong_AsLong(args[0]);
    char *local = (char *)PyLong_AsVoidPtr(args[1]);
    unsigned long long remote = PyLong_AsUnsignedLongLong(args[2]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[3]);
    int write = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (nbytes < 0) {
        PyErr_Format(PyExc_ValueError, "transfer: nbytes must be >= 0, got %zd", nbytes);
        return NULL;
    }
    int failed, err;
    Py_BEGIN_ALLOW_THREADS
    errno = 0;
    failed = transfer((pid_t)pid, local, (int64_t)remote, nbytes, write) < 0;
    err = errno;
    Py_END_ALLOW_THREADS
    if (failed) {
        errno = err ? err : EIO;   /* 0 bytes moved without an error: the kernel's empty-vector case */
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"stream_min", (PyCFunction)module_stream_min, METH_NOARGS, "stream_min() -> the length from which copies are streamed"},
    {"set_stream_min", (PyCFunction)module_set_stream_min, METH_O,
     "set_stream_min(nbytes) -> nbytes in force: copies from that many bytes on use streaming stores"},
    {"address", (PyCFunction)module_address, METH_O, "address(array) -> the address of its first element"},
    {"copy", (PyCFunction)(void (*)(void))module_copy, METH_FASTCALL,
     "copy(dst, src): copy src's bytes into dst (contiguous, same length), avoiding slow rep movsb distances"},
    {"transfer", (PyCFunction)(void (*)(void))module_transfer, METH_FASTCALL,
     "transfer(pid, local, remote, nbytes, write): process_vm_readv (or writev) of nbytes, GIL released"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_round", "The compiled one-shot window rounds (see _round.c).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__round(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "TYPES", N_TYPES);
    return m;
}
