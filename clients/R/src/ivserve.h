/* What the package's C files share: the receive buffer (sink.c), which
 * the decoder (decode.c) reads from, and the routines registered with R
 * (init.c). */
#ifndef IVSERVE_R_H
#define IVSERVE_R_H

#include <stddef.h>

#include <R.h>
#include <Rinternals.h>

/* The bytes of a sink (an external pointer made by ivs_sink_new), or NULL
 * with *len 0 when it is not one or was released. */
const unsigned char *sink_bytes(SEXP sink, size_t *len);

/* Asks the kernel to back the 2 MiB-aligned part of [p, p + n) with huge
 * pages when it is first touched; a hint, ignored where unsupported.  On
 * the virtual machines this client often runs on, first touches of fresh
 * small pages cost more CPU than the decoding itself (see sink.c). */
void advise_huge(void *p, size_t n);

SEXP ivs_sink_new(void);
SEXP ivs_sink_fill(SEXP sink, SEXP con);
SEXP ivs_sink_raw(SEXP sink, SEXP max);
SEXP ivs_sink_release(SEXP sink);
SEXP ivs_decode_csr(SEXP body, SEXP csc, SEXP tile);

#endif
