/* The shared fixtures (../shared/fixtures, or $IV_FIXTURES) for unit tests. */
#ifndef IV_TEST_FIXTURES_H
#define IV_TEST_FIXTURES_H

#include "meta.h"

/* The path of fixture `name`, in a static buffer (valid until the next
 * call); NULL, with a line saying the checks are skipped, when the file
 * is absent. */
const char *iv_test_fixture(const char *name);

/* The obs/var metadata of fixture `name` (a failed load fails the test);
 * NULL when the file is absent. */
iv_meta_t *iv_test_meta(const char *name);

#endif
