/* Name search: every match found, ranked as search.h says, against a
 * brute-force reference over random names (a sort of all candidates),
 * at several limits; edge cases (empty query, NUL, no names, limit). */
#include <check.h>

#include "check_main.h"
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "search.h"

typedef struct names {
    int64_t n;
    char **s;
} names_t;

static const char *get(const void *ctx, int64_t i)
{
    const names_t *nm = ctx;
    return nm->s[i];
}

typedef struct ref {
    int kind, case_differs;
    int64_t len, pos, row;
} ref_t;

static int ref_cmp(const void *a, const void *b)
{
    const ref_t *x = a, *y = b;
#define CMP(f) if (x->f != y->f) return x->f < y->f ? -1 : 1
    CMP(kind);
    CMP(case_differs);
    CMP(len);
    CMP(pos);
    CMP(row);
#undef CMP
    return 0;
}

/* The ranking written the slow, obvious way. */
static int64_t reference(const names_t *nm, const char *q, ref_t *out)
{
    size_t ql = strlen(q);
    int64_t k = 0;
    for (int64_t i = 0; i < nm->n; i++) {
        const char *s = nm->s[i] ? nm->s[i] : "";
        size_t len = strlen(s);
        for (size_t p = 0; p + ql <= len; p++) {
            if (strncasecmp(s + p, q, ql) == 0) {
                out[k].kind = p > 0 ? 2 : len == ql ? 0 : 1;
                out[k].case_differs = memcmp(s + p, q, ql) != 0;
                out[k].len = (int64_t)len;
                out[k].pos = (int64_t)p;
                out[k].row = i;
                k++;
                break;
            }
        }
    }
    qsort(out, (size_t)k, sizeof *out, ref_cmp);
    return k;
}

START_TEST(random_names_match_reference)
{
    srand(7);
    names_t nm;
    nm.n = 3000;
    nm.s = calloc((size_t)nm.n, sizeof *nm.s);
    static const char alpha[] = "aAbBcC0-";
    for (int64_t i = 0; i < nm.n; i++) {
        if (i % 500 == 7) continue;  /* a NULL name reads as "" */
        int len = rand() % 7;
        nm.s[i] = calloc(1, (size_t)len + 1);
        for (int j = 0; j < len; j++) nm.s[i][j] = alpha[rand() % 8];
    }
    iv_search_t *s = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_search_build(nm.n, get, &nm, &s, &err), 0);
    ref_t *want = malloc((size_t)nm.n * sizeof *want);
    iv_search_hit_t *hits = malloc((size_t)nm.n * sizeof *hits);
    static const char *qs[] = {"a", "A", "ab", "aB", "c0", "-", "abc", "CCC", "0-a", "zz", "aaaaaa"};
    for (size_t qi = 0; qi < sizeof qs / sizeof *qs; qi++) {
        int64_t nw = reference(&nm, qs[qi], want);
        static const int64_t limits[] = {1, 5, 20, 1000, 100000};
        for (size_t li = 0; li < 5; li++) {
            int64_t total = -1;
            int64_t k = iv_search_run(s, qs[qi], strlen(qs[qi]), limits[li], hits, &total);
            ck_assert_int_eq(total, nw);
            ck_assert_int_eq(k, nw < limits[li] ? nw : limits[li]);
            for (int64_t i = 0; i < k; i++) {
                ck_assert_int_eq(hits[i].row, want[i].row);
                ck_assert_int_eq((int)hits[i].kind, want[i].kind);
            }
        }
    }
    free(want);
    free(hits);
    iv_search_free(s);
    for (int64_t i = 0; i < nm.n; i++) free(nm.s[i]);
    free(nm.s);
}
END_TEST

START_TEST(edge_cases)
{
    char *raw[] = {"CD3E", "cd3e", "CD3", "xCD3"};
    names_t nm = {4, raw};
    iv_search_t *s = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_search_build(nm.n, get, &nm, &s, &err), 0);
    iv_search_hit_t hits[8];
    int64_t total = -1;
    ck_assert_int_eq(iv_search_run(s, "", 0, 8, hits, &total), 0);
    ck_assert_int_eq(total, 0);
    ck_assert_int_eq(iv_search_run(s, "C\0D", 3, 8, hits, &total), 0);
    ck_assert_int_eq(iv_search_run(s, "cd3", 3, 0, hits, &total), 0);
    /* Exact (ignoring case) first, then the prefix matches by case and
     * length, then the substring. */
    ck_assert_int_eq(iv_search_run(s, "cd3", 3, 8, hits, &total), 4);
    ck_assert_int_eq(total, 4);
    ck_assert_int_eq(hits[0].row, 2);
    ck_assert_int_eq(hits[0].kind, IV_MATCH_EXACT);
    ck_assert_int_eq(hits[1].row, 1);  /* "cd3e": same case as the query */
    ck_assert_int_eq(hits[2].row, 0);
    ck_assert_int_eq(hits[2].kind, IV_MATCH_PREFIX);
    ck_assert_int_eq(hits[3].row, 3);
    ck_assert_int_eq(hits[3].kind, IV_MATCH_SUBSTRING);
    ck_assert_str_eq(iv_match_name(IV_MATCH_SUBSTRING), "substring");
    ck_assert(iv_search_bytes(s) > 0);
    iv_search_free(s);
    /* No names at all. */
    ck_assert_int_eq(iv_search_build(0, get, &nm, &s, &err), 0);
    ck_assert_int_eq(iv_search_run(s, "a", 1, 8, hits, &total), 0);
    ck_assert_int_eq(total, 0);
    iv_search_free(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("search");
    TCase *tc = tcase_create("search");
    tcase_add_test(tc, random_names_match_reference);
    tcase_add_test(tc, edge_cases);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
