/* How the compiled pieces copy bytes between two buffers (core/_round.c, transport/shm/_pipe.c,
 * and every Python copy on the hot paths through _round.copy: core/copying.py).
 *
 * glibc's memcpy moves a copy of a few KiB to several hundred KiB with one `rep movsb`, and on
 * the AMD EPYC we measure (glibc 2.36) that instruction runs 6-12x slower when the destination
 * lies 1 to 31 bytes past the source modulo 4 KiB: 256 KiB in 150 us instead of 13. Such
 * distances are common, not bad luck: numpy's large arrays start 16 bytes into a page (malloc's
 * header) and the staging pool's messages at a page, so every receive of a pooled message into
 * a numpy array copied slowly. Copied in 2 KiB pieces, under glibc's threshold for `rep movsb`,
 * the same copy takes its vector loop and runs at full speed (benchmarks/copy_distance.py;
 * docs/transports.md, "Copies whose buffers are a few bytes apart"). The pieces are taken only
 * where the distance is in the window (a cache line, with margin) and the size is in the range
 * glibc hands to rep movsb, so every other copy is memcpy's, unchanged.
 *
 * Longer copies (from RC_COPY_LIMIT) glibc moves with its vector loop, whose plain stores must
 * first own each line: where the destination's lines sit in another core's cache, as the staging
 * pool's do after the receiver read the previous message from them, every line is a round trip
 * to that core. On this VM's EPYC host that trip is cheap in some periods and dear in others
 * (most likely where the hypervisor places the two vCPUs), and in the dear ones a 1 MiB copy
 * into the pool took 100-150 us instead of 25. `rep movsb` writes whole lines without owning
 * them first, so such a copy goes in RC_COPY_CHUNK pieces, each one glibc moves with rep movsb:
 * the copy in 27-33 us against 106-136 in the dear periods, 18-21 against 22-27 in the cheap
 * ones, and private copies within noise (benchmarks/copy_shared.py, copy_distance.py;
 * docs/transports.md, "Copies into lines another core holds"). At a slow distance the long copy
 * stays memcpy's: pieces would be rep movsb at its slow speed.
 *
 * A copy at least as long as the last-level cache (rc_stream_min: core/copying.py sets it from
 * the host's cache) cannot stay in cache whatever it does, and both rep movsb and the vector loop
 * still fill the cache with its lines, evicting everything else; streaming (non-temporal) stores
 * go around the cache, and need no line owned first. On this VM's EPYC (32 MiB of L3),
 * benchmarks/copy_stream.py, ms streamed / in 256 KiB pieces / by memcpy: 32 MiB 1.34 / 1.57 /
 * 1.87, 64 MiB 2.82 / 3.09 / 4.01, both ranks copying at once 2.22 / 2.85 / 3.03 and 4.89 / 5.83
 * / 6.40; at 16 MiB streaming is the slower (0.54 against 0.44), as it gives up the cache a copy
 * that fits could use. */
#ifndef RINGCOMM_COPY_H
#define RINGCOMM_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define RC_COPY_WINDOW 64      /* (dst - src) mod 4 KiB in [1, RC_COPY_WINDOW): the slow distances */
#define RC_COPY_PIECE 2048     /* under glibc's rep movsb threshold for every vector size */
/* From here on glibc leaves rep movsb for its own vector loop (from 512 KiB here): at a slow
 * distance that loop is as fast, and faster than 2 KiB pieces (4 MiB 133-156 us against 192), so
 * such a copy is memcpy's whole; at any other, the copy goes in RC_COPY_CHUNK pieces (above). */
#define RC_COPY_LIMIT (1 << 20)
#define RC_COPY_CHUNK (256 << 10)   /* under glibc's stop threshold for rep movsb (512 KiB here) */

/* Copies from this many bytes on are streamed (above). Where the compiler has no SSE2 the
 * streaming copy is memcpy. Each compiled module has its own, and none streams until told:
 * _round's is set on import from the host's cache (copying.stream_from); the pipe's copies are
 * single 64 KiB cells and never are. */
#define RC_STREAM_FLOOR (1 << 20)   /* set_stream_min's least: below it the cache always helps */
static size_t rc_stream_min = SIZE_MAX;

static inline void rc_stream(char *d, const char *s, size_t n) {
#if defined(__SSE2__)
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;   /* the stores need 16-byte aligned addresses */
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t body = n & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    /* Streaming stores are weakly ordered: every one is visible before anything stored after
     * the copy (a flag that tells a peer the bytes are there). */
    _mm_sfence();
    memcpy(d + body, s + body, n - body);
#else
    memcpy(d, s, n);
#endif
}

static inline int rc_slow_distance(const void *dst, const void *src) {
    size_t d = ((uintptr_t)dst - (uintptr_t)src) & 4095;
    return d != 0 && d < RC_COPY_WINDOW;
}

/* The pieces call glibc's memcpy through a pointer the compiler cannot see through: given a
 * constant 2 KiB it would inline `rep movsq`, which is as slow at these distances. */
static void *(*volatile const rc_memcpy)(void *, const void *, size_t) = memcpy;

static inline void rc_copy_pieces(char *d, const char *s, size_t n, size_t piece) {
    for (size_t i = 0; i < n; i += piece)
        rc_memcpy(d + i, s + i, n - i < piece ? n - i : piece);
}

/* memcpy, but for three kinds of copy: from rc_stream_min on, streamed; longer than
 * RC_COPY_PIECE, one at a slow distance and shorter than RC_COPY_LIMIT goes in 2 KiB pieces, one
 * at a full-speed distance and from RC_COPY_LIMIT on in RC_COPY_CHUNK pieces. */
static inline void rc_copy(void *dst, const void *src, size_t n) {
    if (n >= rc_stream_min) {
        rc_stream((char *)dst, (const char *)src, n);
        return;
    }
    if (n > RC_COPY_PIECE) {
        int slow = rc_slow_distance(dst, src);
        if (slow && n < RC_COPY_LIMIT) {
            rc_copy_pieces((char *)dst, (const char *)src, n, RC_COPY_PIECE);
            return;
        }
        if (!slow && n >= RC_COPY_LIMIT) {
            rc_copy_pieces((char *)dst, (const char *)src, n, RC_COPY_CHUNK);
            return;
        }
    }
    memcpy(dst, src, n);
}

/* memmove's contract: ranges that overlap go to memmove itself. */
static inline void rc_move(void *dst, const void *src, size_t n) {
    if ((const char *)src < (const char *)dst + n && (const char *)dst < (const char *)src + n)
        memmove(dst, src, n);
    else
        rc_copy(dst, src, n);
}

#endif
