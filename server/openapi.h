/*
 * The OpenAPI 3.1 description of the HTTP API (server/openapi.json),
 * embedded at build time (cmake/embed.cmake) and served at
 * GET /openapi.json.  Edit the JSON file; the tests check that it
 * describes every route they call and that its examples are answered as
 * it says.
 */
#ifndef IV_OPENAPI_H
#define IV_OPENAPI_H

#include <stddef.h>

extern const unsigned char iv_openapi_json[];   /* NUL-terminated */
extern const size_t iv_openapi_json_len;

#endif
