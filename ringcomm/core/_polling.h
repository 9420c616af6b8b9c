/* What the compiled pieces' polling loops share (core/_round.c, transport/shm/_pipe.c): RELAX(),
 * done between two looks at a flag another core will store, and now(), the monotonic clock their
 * spin budgets are measured on. */
#ifndef RINGCOMM_POLLING_H
#define RINGCOMM_POLLING_H

#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RELAX() _mm_pause()
#elif defined(__aarch64__)
#define RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define RELAX() do {} while (0)
#endif

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif
