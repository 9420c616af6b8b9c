/* The pipe: a large send through a ring of cache-sized cells in the sender's staging pool, the
 * sender filling cells while its receiver empties them.
 *
 * Staged whole, a 4 MiB send costs two full passes over memory, one after the other (the
 * sender's copy into the pool, then the receiver's copy out); read by CMA it costs one pass at a
 * fifth of memcpy's speed, the kernel pinning each 4 KiB page. Through a ring of a few 64 KiB
 * cells the two copies overlap, and the cells stay in cache between them: MPICH's shared-memory
 * protocol does the same. The per-cell handshake is two counters, which is why this is C: in
 * Python each cell would cost more than its copy.
 *
 * Ring (in the sender's staging pool, 64-byte aligned): the count of chunks the sender has
 * written (one cache line), the count the receiver has taken (the next line), then the cells.
 * Chunk i of the message goes to cell i % ncells; the sender writes it once i < taken + ncells,
 * the receiver reads it once i < written. Each side stores its own counter with release
 * semantics after its copy and loads the other's with acquire semantics, so a cell is never
 * read before it is written nor overwritten before it is read, on any CPU.
 *
 * Nothing here waits without bound: pull returns after ``spin`` seconds without progress and
 * the Python caller (transport/shm/messages.py) decides whether the peer is late, gone or past
 * the deadline, and calls again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_copy.h"
#include "_polling.h"

#define LINE 64
#define HEADER (2 * LINE)
#define MAX_SENDS 64
#define TAIL_SECONDS 50e-6   /* how long a send's last cells are waited for once the receive is in */
#define RETIRED 2   /* the busy word of a send nobody may fill any more */

/* A pipe's descriptor: int64 words, kept by the Python request that owns the pipe. */
enum { D_RING, D_BUF, D_NBYTES, D_CELL, D_CELLS, D_BUSY, D_WORDS };

typedef struct {
    char *ring;
    char *buf;
    int64_t nbytes, cell, cells, chunks;
    int64_t *busy;
} Pipe;

static inline int64_t *written(const Pipe *p) { return (int64_t *)p->ring; }
static inline int64_t *taken(const Pipe *p) { return (int64_t *)(p->ring + LINE); }
static inline char *cell(const Pipe *p, int64_t i) { return p->ring + HEADER + (i % p->cells) * p->cell; }
static inline int64_t length(const Pipe *p, int64_t i) {
    int64_t rest = p->nbytes - i * p->cell;
    return rest < p->cell ? rest : p->cell;
}

/* The pipe a descriptor names; -1 with a Python error when it is not one. */
static int pipe_of(Py_buffer *view, Pipe *p) {
    if (view->len != D_WORDS * (Py_ssize_t)sizeof(int64_t) || view->readonly) {
        PyErr_Format(PyExc_ValueError, "pipe: a descriptor is a writable int64 array of %d words", D_WORDS);
        return -1;
    }
    int64_t *d = view->buf;
    p->ring = (char *)(intptr_t)d[D_RING];
    p->buf = (char *)(intptr_t)d[D_BUF];
    p->nbytes = d[D_NBYTES];
    p->cell = d[D_CELL];
    p->cells = d[D_CELLS];
    p->busy = &d[D_BUSY];
    if (p->ring == NULL || (p->buf == NULL && p->nbytes) || p->nbytes < 0 || p->cell <= 0 || p->cells <= 0
        || ((intptr_t)p->ring % LINE)) {
        PyErr_SetString(PyExc_ValueError, "pipe: malformed descriptor");
        return -1;
    }
    p->chunks = (p->nbytes + p->cell - 1) / p->cell;
    return 0;
}

/* The pipe of descriptor ``obj``, its buffer held in ``view`` until the caller releases it. */
static int open_pipe(PyObject *obj, Py_buffer *view, Pipe *p) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    if (pipe_of(view, p) < 0) {
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Write every chunk that has a free cell. 1: moved something; 0: nothing (the ring is full, or
 * another thread of this process is filling this pipe just now). */
static int fill(const Pipe *p) {
    int64_t zero = 0;
    if (!__atomic_compare_exchange_n(p->busy, &zero, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return 0;
    int64_t i = __atomic_load_n(written(p), __ATOMIC_RELAXED);   /* ours: only we store it */
    int64_t free_until = __atomic_load_n(taken(p), __ATOMIC_ACQUIRE) + p->cells;
    int moved = 0;
    while (i < p->chunks) {
        if (i >= free_until) {
            free_until = __atomic_load_n(taken(p), __ATOMIC_ACQUIRE) + p->cells;
            if (i >= free_until) break;
        }
        rc_copy(cell(p, i), p->buf + i * p->cell, (size_t)length(p, i));
        __atomic_store_n(written(p), ++i, __ATOMIC_RELEASE);
        moved = 1;
    }
    __atomic_store_n(p->busy, 0, __ATOMIC_RELEASE);
    return moved;
}

static int filled(const Pipe *p) { return __atomic_load_n(written(p), __ATOMIC_ACQUIRE) >= p->chunks; }

/* Read every chunk written so far. 1: moved something. */
static int drain(const Pipe *p) {
    int64_t i = __atomic_load_n(taken(p), __ATOMIC_RELAXED);   /* ours */
    int64_t ready = __atomic_load_n(written(p), __ATOMIC_ACQUIRE);
    int moved = 0;
    while (i < p->chunks && i < ready) {
        rc_copy(p->buf + i * p->cell, cell(p, i), (size_t)length(p, i));
        __atomic_store_n(taken(p), ++i, __ATOMIC_RELEASE);
        moved = 1;
        if (i >= ready) ready = __atomic_load_n(written(p), __ATOMIC_ACQUIRE);
    }
    return moved;
}

static int drained(const Pipe *p) { return __atomic_load_n(taken(p), __ATOMIC_RELAXED) >= p->chunks; }

/* push(descriptor) -> True when every chunk of the send is in a cell. Never waits. */
static PyObject *pipe_push(PyObject *module, PyObject *arg) {
    Py_buffer view;
    Pipe p;
    if (open_pipe(arg, &view, &p) < 0) return NULL;
    int done;
    Py_BEGIN_ALLOW_THREADS
    fill(&p);
    done = filled(&p);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyBool_FromLong(done);
}

/* retire(descriptor): no fill of this send from now on, in any thread; waits out one running
 * now (it is bounded: at most a ring's worth of copies), so the caller may give the ring back. */
static PyObject *pipe_retire(PyObject *module, PyObject *arg) {
    Py_buffer view;
    Pipe p;
    if (open_pipe(arg, &view, &p) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        int64_t seen = __atomic_load_n(p.busy, __ATOMIC_ACQUIRE);
        if (seen == RETIRED) break;
        if (seen == 0 && __atomic_compare_exchange_n(p.busy, &seen, RETIRED, 0, __ATOMIC_ACQ_REL,
                                                     __ATOMIC_RELAXED)) break;
        RELAX();
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* pull(descriptor, sends, spin) -> True when the receive has every chunk; False after ``spin``
 * seconds without a chunk arriving. While it waits it fills this process's own pipe sends
 * (``sends``: their descriptors): two ranks exchanging large messages each wait for the other's
 * cells, which only the other's own wait can fill. */
static PyObject *pipe_pull(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pull(descriptor, sends: tuple, spin: float)");
        return NULL;
    }
    double spin = PyFloat_AsDouble(args[2]);
    if (spin == -1.0 && PyErr_Occurred()) return NULL;
    Py_ssize_t nsends = PyTuple_GET_SIZE(args[1]);
    if (nsends > MAX_SENDS) nsends = MAX_SENDS;   /* the rest are filled by their own tests */
    Py_buffer views[MAX_SENDS + 1];
    Pipe pipes[MAX_SENDS + 1];
    Py_ssize_t opened = 0;
    PyObject *result = NULL;
    for (; opened <= nsends; opened++) {
        PyObject *d = opened == 0 ? args[0] : PyTuple_GET_ITEM(args[1], opened - 1);
        if (open_pipe(d, &views[opened], &pipes[opened]) < 0) goto out;
    }
    int done;
    Py_BEGIN_ALLOW_THREADS
    const Pipe *in = &pipes[0];
    double idle_since = 0, tail_since = 0;
    unsigned idle = 0, tail = 0;
    for (;;) {
        int moved = drain(in), all_in = drained(in), sends_left = 0;
        for (Py_ssize_t s = 1; s <= nsends; s++)
            if (!filled(&pipes[s])) {
                moved |= fill(&pipes[s]);
                sends_left |= !filled(&pipes[s]);
            }
        /* Once the receive is in, the sends' last cells are still worth a short wait: their
         * receivers are emptying them right now (an exchange ends about together) and nobody
         * else fills them until the caller's next call into the transport. */
        if (all_in && (!sends_left || !moved)) {
            if (!sends_left) break;
            if ((++tail & 63) == 0) {
                double t = now();
                if (tail == 64) tail_since = t;
                else if (t - tail_since >= TAIL_SECONDS) break;
            }
            RELAX();
            continue;
        }
        if (moved) {
            idle = 0;
            tail = 0;
            continue;
        }
        RELAX();
        if ((++idle & 63) == 0) {
            double t = now();
            if (idle == 64) idle_since = t;
            else if (t - idle_since >= spin) break;
        }
    }
    done = drained(in);
    Py_END_ALLOW_THREADS
    result = PyBool_FromLong(done);
out:
    for (Py_ssize_t i = 0; i < opened; i++) PyBuffer_Release(&views[i]);
    return result;
}

static PyMethodDef module_methods[] = {
    {"push", (PyCFunction)pipe_push, METH_O, "push(descriptor) -> True when every chunk is in a cell"},
    {"retire", (PyCFunction)pipe_retire, METH_O, "retire(descriptor): no fill of this send from now on"},
    {"pull", (PyCFunction)(void (*)(void))pipe_pull, METH_FASTCALL,
     "pull(descriptor, sends, spin) -> True when every chunk has been read"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pipe", "Large sends through a ring of cells (see _pipe.c).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__pipe(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyModule_AddIntConstant(m, "HEADER", HEADER);
    PyModule_AddIntConstant(m, "WORDS", D_WORDS);
    return m;
}
