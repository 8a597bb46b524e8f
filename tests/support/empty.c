/* Keeps the test support library non-empty before any helper exists. */
typedef int iv_test_support_empty_t;
