/* A deadline for a call that blocks while holding the GIL: MPI_Init.

   MPICH's MPI_Init (and Open MPI's) waits for every process of the job, and mpi4py makes the
   call without releasing the GIL, so no Python thread can run while it waits: a watchdog thread
   in Python never wakes, and a process that never reaches init holds every other one there
   forever, with no word anywhere. This thread needs no GIL. Unless ``cancel()`` comes first,
   at the deadline it writes its message to stderr and ends the process; the launcher (mpirun,
   srun) then ends the job, as for any process that dies.

   Deadline(seconds, message) arms one; cancel() (or dropping the object) disarms it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Shared by the Python object and the thread; the last of the two to let go frees it. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct timespec at;   /* CLOCK_MONOTONIC: a clock step must not fire or delay it */
    int cancelled;
    int holders;
    size_t length;
    char message[];
} Shared;

typedef struct {
    PyObject_HEAD
    Shared *shared;
} Deadline;

static void let_go(Shared *s) {
    pthread_mutex_lock(&s->mu);
    int last = --s->holders == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
    }
}

static void *watch(void *arg) {
    Shared *s = arg;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (!s->cancelled && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->cv, &s->mu, &s->at);
    int fire = !s->cancelled;
    pthread_mutex_unlock(&s->mu);
    if (fire) {
        size_t done = 0;
        while (done < s->length) {
            ssize_t n = write(2, s->message + done, s->length - done);
            if (n <= 0 && errno != EINTR)
                break;
            if (n > 0)
                done += (size_t)n;
        }
        /* The launcher forwards stderr through its proxy, which ends with the job: give the
           line time to leave before the exit starts that (transport/factory.py saw it lost). */
        struct timespec pause = {0, 500000000};
        nanosleep(&pause, NULL);
        _exit(1);
    }
    let_go(s);
    return NULL;
}

static int deadline_init(Deadline *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"seconds", "message", NULL};
    double seconds;
    const char *message;
    Py_ssize_t length;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ds#", names, &seconds, &message, &length))
        return -1;
    if (!(seconds > 0 && seconds < 1e9)) {   /* NaN too */
        PyObject *got = PyFloat_FromDouble(seconds);
        PyErr_Format(PyExc_ValueError, "Deadline got unexpected value for argument \"seconds\" (expected a "
                     "number of seconds > 0 and < 1e9, got %R)", got);
        Py_XDECREF(got);
        return -1;
    }
    if (self->shared != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Deadline is armed once, when it is made");
        return -1;
    }
    Shared *s = malloc(sizeof(Shared) + (size_t)length);
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(s->message, message, (size_t)length);
    s->length = (size_t)length;
    s->cancelled = 0;
    s->holders = 2;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&s->mu, NULL);
    clock_gettime(CLOCK_MONOTONIC, &s->at);
    double whole = (double)(long long)seconds;
    s->at.tv_sec += (time_t)whole;
    s->at.tv_nsec += (long)((seconds - whole) * 1e9);
    if (s->at.tv_nsec >= 1000000000L) {
        s->at.tv_sec += 1;
        s->at.tv_nsec -= 1000000000L;
    }
    pthread_t thread;
    pthread_attr_t tattr;
    pthread_attr_init(&tattr);
    pthread_attr_setdetachstate(&tattr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&thread, &tattr, watch, s);
    pthread_attr_destroy(&tattr);
    if (rc != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->shared = s;
    return 0;
}

static void disarm(Deadline *self) {
    Shared *s = self->shared;
    if (s == NULL)
        return;
    self->shared = NULL;
    pthread_mutex_lock(&s->mu);
    s->cancelled = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    let_go(s);
}

static PyObject *deadline_cancel(Deadline *self, PyObject *Py_UNUSED(ignored)) {
    disarm(self);
    Py_RETURN_NONE;
}

static void deadline_dealloc(Deadline *self) {
    disarm(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef deadline_methods[] = {
    {"cancel", (PyCFunction)deadline_cancel, METH_NOARGS, "disarm it (no effect once cancelled)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DeadlineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ringcomm._deadline.Deadline",
    .tp_doc = "Deadline(seconds, message): unless cancelled within seconds, write message to stderr and "
              "end the process (a thread that needs no GIL)",
    .tp_basicsize = sizeof(Deadline),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)deadline_init,
    .tp_dealloc = (destructor)deadline_dealloc,
    .tp_methods = deadline_methods,
};

static struct PyModuleDef deadline_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_deadline",
    .m_doc = "A deadline for calls that block holding the GIL.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__deadline(void) {
    if (PyType_Ready(&DeadlineType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&deadline_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&DeadlineType);
    if (PyModule_AddObject(module, "Deadline", (PyObject *)&DeadlineType) < 0) {
        Py_DECREF(&DeadlineType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
