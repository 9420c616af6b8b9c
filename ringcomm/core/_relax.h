/* RELAX(): what a polling loop does between two looks at a flag another core will store, for
 * the compiled pieces (core/_round.c, transport/shm/_pipe.c). */
#ifndef RINGCOMM_RELAX_H
#define RINGCOMM_RELAX_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RELAX() _mm_pause()
#elif defined(__aarch64__)
#define RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define RELAX() do {} while (0)
#endif

#endif
