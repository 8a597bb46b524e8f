/* The one way every libcheck unit test runs its suite. */
#ifndef IV_CHECK_MAIN_H
#define IV_CHECK_MAIN_H

#include <check.h>

/* Runs suite s (taking ownership) and returns the process exit status:
 * 0 when every test passed, 1 otherwise. */
int iv_check_run(Suite *s);

#endif
