/*
 * Per-thread decoder state shared by the codec files (private to core/).
 *
 * Decoders are called per chunk on worker threads, so they must not
 * allocate per call: each thread keeps one zstd decompression context and
 * one growable scratch buffer, created on first use and freed by a
 * pthread key destructor when the thread exits (or explicitly with
 * iv_codec_thread_release()).  Nothing here is shared between threads.
 */
#ifndef IV_CODEC_TLS_H
#define IV_CODEC_TLS_H

#include <stddef.h>
#include <stdint.h>

#include <zstd.h>

/* The calling thread's zstd context, or NULL when out of memory. */
ZSTD_DCtx *iv_codec_zstd_dctx(void);

/*
 * The calling thread's scratch buffer of at least cap bytes, or NULL when
 * out of memory.  Valid until the next call on the same thread; callers
 * must not nest uses (the Blosc2 frame decoder takes its scratch only
 * inside the chunk decoder).
 */
uint8_t *iv_codec_scratch(size_t cap);

/* Frees the calling thread's decoder state now (tests; thread shutdown). */
void iv_codec_thread_release(void);

#endif /* IV_CODEC_TLS_H */
