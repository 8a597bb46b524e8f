/* The routines R calls (.Call), registered so that R finds them by their
 * C_ names (useDynLib(ivserve, .registration = TRUE, .fixes = "C_")). */
#include <R_ext/Rdynload.h>

#include "ivserve.h"

static const R_CallMethodDef call_methods[] = {
    {"ivs_decode_csr", (DL_FUNC)&ivs_decode_csr, 3},
    {"ivs_sink_new", (DL_FUNC)&ivs_sink_new, 0},
    {"ivs_sink_fill", (DL_FUNC)&ivs_sink_fill, 2},
    {"ivs_sink_raw", (DL_FUNC)&ivs_sink_raw, 2},
    {"ivs_sink_release", (DL_FUNC)&ivs_sink_release, 1},
    {NULL, NULL, 0},
};

void R_init_ivserve(DllInfo *dll);
void R_init_ivserve(DllInfo *dll)
{
    R_registerRoutines(dll, NULL, call_methods, NULL, NULL);
    R_useDynamicSymbols(dll, FALSE);
}
