/* Differential expression: the special functions against closed forms and
 * published values; Benjamini-Hochberg on a hand-worked list; both tests
 * on a six-cell gene worked by hand; and genes with many distinct values
 * (the sorting path) and few (the counting table), with negative values,
 * stored zeros and ties: rank sums against ranks counted here by brute
 * force, Welch's t against moments computed here, one-versus-rest and
 * against a reference. */
#include <check.h>

#include "check_main.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "diffexp.h"

static void near(double got, double want, double rtol)
{
    ck_assert_msg(fabs(got - want) <= rtol * fabs(want) + 1e-300, "got %.17g want %.17g", got, want);
}

START_TEST(special_functions)
{
    near(iv_de_erfc(0), 1, 1e-15);
    near(iv_de_erfc(0.3), 0.6713732405408726, 1e-14);
    near(iv_de_erfc(1), 0.15729920705028516, 1e-14);
    near(iv_de_erfc(3), 2.2090496998585445e-05, 1e-13);
    near(iv_de_erfc(10), 2.0884875837625446e-45, 1e-13);
    near(iv_de_erfc(26), 5.663192408856145e-296, 1e-12);
    near(iv_de_erfc(-1), 2 - 0.15729920705028516, 1e-15);
    ck_assert(iv_de_erfc(40) == 0);
    near(iv_de_norm_p2(1.959963984540054), 0.05, 1e-12);
    near(iv_de_norm_p2(-1.959963984540054), 0.05, 1e-12);
    /* Student t: closed forms for df 1 and 2. */
    for (double t = 0.05; t < 60; t *= 1.37) {
        near(iv_de_t_p2(t, 1), 1 - 2 / M_PI * atan(t), 1e-12);
        near(iv_de_t_p2(-t, 2), 1 - t / sqrt(2 + t * t), 1e-12);
    }
    ck_assert(iv_de_t_p2(0, 5) == 1);
    ck_assert(iv_de_t_p2(INFINITY, 5) == 0);
    ck_assert(isnan(iv_de_t_p2(NAN, 5)));
    /* The t-test's df at a million cells, where double precision lost six
     * digits (values from scipy.stats.t.sf). */
    near(iv_de_t_p2(2.5, 1.26e6), 0.01241945672340223, 1e-12);
    near(iv_de_t_p2(2.5, 1e8), 0.012419332240054539, 1e-11);
    /* The incomplete beta: closed forms. */
    for (double x = 0.01; x < 1; x += 0.07) {
        near(iv_de_betainc(1, 1, x), x, 1e-14);
        near(iv_de_betainc(3.5, 1, x), pow(x, 3.5), 1e-13);
        near(iv_de_betainc(1, 2.25, x), 1 - pow(1 - x, 2.25), 1e-13);
    }
    near(iv_de_betainc(40, 40, 0.5), 0.5, 1e-13);
    near(iv_de_betainc(0.5, 0.5, 0.5), 0.5, 1e-13);
    ck_assert(isnan(iv_de_betainc(-1, 1, 0.5)));
}
END_TEST

START_TEST(benjamini_hochberg)
{
    /* sorted 0.01 0.03 0.04 0.5 -> *4/rank 0.04 0.06 0.0533 0.5 -> running
     * minimum from the top 0.04 0.0533 0.0533 0.5 */
    double p[5] = {0.01, 0.04, 0.03, 0.5, 0}, adj[5];
    ck_assert_int_eq(iv_de_bh(p, 4, adj), 0);
    near(adj[0], 0.04, 1e-15);
    near(adj[1], 0.04 * 4 / 3, 1e-15);
    near(adj[2], 0.04 * 4 / 3, 1e-15);
    near(adj[3], 0.5, 1e-15);
    /* In place, and capped at 1. */
    double q[3] = {0.9, 0.95, 0.99};
    ck_assert_int_eq(iv_de_bh(q, 3, q), 0);
    near(q[0], 0.99, 1e-15);
    near(q[2], 0.99, 1e-15);
}
END_TEST

/* One gene over six cells: group 0 holds 1, 2 and an implicit 0; group 1
 * holds 3, an implicit 0 and 2 (gene-row layout: positions, values). */
static void six_cells(iv_de_method_t m, iv_de_row_t *out)
{
    int32_t label[6] = {0, 0, 0, 1, 1, 1};
    int64_t n_cells[2] = {3, 3};
    int32_t pos[4] = {0, 1, 3, 5};
    int32_t val[4] = {1, 2, 3, 2};
    iv_de_spec_t s = {.method = m, .n_labels = 2, .n_tested = 1, .reference = -1, .n_cells = n_cells,
                      .label = label, .n_universe = 6, .n_genes = 1};
    iv_de_t *de = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_de_new(&s, &de, &err), 0);
    iv_de_work_t *w = iv_de_work_new(de);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(iv_de_gene(de, w, 0, 4, pos, 4, val, IV_DT_INT32), 0);
    ck_assert_int_eq(iv_de_finish(de, &err), 0);
    *out = *iv_de_row(de, 0, 0);
    iv_de_work_free(w);
    iv_de_free(de);
}

START_TEST(six_cells_by_hand)
{
    iv_de_row_t r;
    /* Welch: means 1 and 5/3, variances 1 and 7/3: t = (-2/3) / sqrt(10/9),
     * df = 200/58; p from scipy.stats.ttest_ind(equal_var=False). */
    six_cells(IV_DE_TTEST, &r);
    near(r.score, (-2.0 / 3) / sqrt(10.0 / 9), 1e-14);
    near(r.pval, 0.5665671267489903, 1e-12);
    near(r.pval_adj, r.pval, 0);
    near(r.mean1, 1, 1e-15);
    near(r.mean2, 5.0 / 3, 1e-15);
    near(r.frac1, 2.0 / 3, 1e-15);
    near(r.frac2, 2.0 / 3, 1e-15);
    near(r.lfc, log2((expm1(1) + 1e-9) / (expm1(5.0 / 3) + 1e-9)), 1e-14);
    /* Ranks: 0 0 -> 1.5, 1 -> 3, 2 2 -> 4.5, 3 -> 6; R0 = 9, U = 3; two
     * ties of two: var = 9/12 * (7 - 12/30) = 4.95; z = -1.5 / sqrt(4.95);
     * p from scipy.stats.mannwhitneyu(asymptotic, no continuity). */
    six_cells(IV_DE_WILCOXON, &r);
    near(r.score, -1.5 / sqrt(4.95), 1e-14);
    near(r.pval, 0.5001842570707944, 1e-12);
}
END_TEST

#define NC 1500
#define NL 4

/* Rank sum of label a among cells of labels a and b (b < 0: every other
 * cell), by counting: rank = 1 + #smaller + (#equal - 1) / 2. */
static void brute(const double *x, const int32_t *lab, int a, int b, double *r_a, double *tie, double *n1,
                  double *n2)
{
    *r_a = 0;
    *tie = 0;
    *n1 = *n2 = 0;
    for (int i = 0; i < NC; i++) {
        int in_i = lab[i] == a || (b < 0 ? 1 : lab[i] == b);
        if (!in_i) continue;
        if (lab[i] == a) *n1 += 1;
        else *n2 += 1;
        double less = 0, eq = 0;
        for (int j = 0; j < NC; j++) {
            int in_j = lab[j] == a || (b < 0 ? 1 : lab[j] == b);
            if (!in_j) continue;
            less += x[j] < x[i];
            eq += x[j] == x[i];
        }
        if (lab[i] == a) *r_a += 1 + less + (eq - 1) / 2;
        *tie += eq * eq - 1;  /* summed over the t members: t * (t^2 - 1) per block */
    }
}

static double z_of(double r, double tie, double n1, double n2)
{
    double n = n1 + n2;
    double s2 = n1 * n2 / 12 * ((n + 1) - tie / (n * (n - 1)));
    return (r - n1 * (n1 + 1) / 2 - n1 * n2 / 2) / sqrt(s2);
}

/* distinct: many values (the sort) or few (the counting table). */
static void ranks_case(int many, int reference)
{
    static double x[NC];
    static int32_t lab[NC];
    static int32_t pos[NC];
    static double val[NC];
    int64_t n_cells[NL] = {0};
    srand(many * 2 + reference + 11);
    int64_t nnz = 0;
    for (int i = 0; i < NC; i++) {
        lab[i] = rand() % NL;
        n_cells[lab[i]]++;
        x[i] = 0;
        int r = rand() % 10;
        if (r < 4) continue;               /* implicit zero */
        if (r == 4) x[i] = 0;              /* stored zero */
        else if (many) x[i] = (rand() % 4000 - 1000) / 7.0;   /* ~NC distinct, some negative */
        else x[i] = rand() % 6 - 1;        /* -1 .. 4 */
        pos[nnz] = i;
        val[nnz++] = x[i];
    }
    int32_t ref = reference ? NL - 1 : -1;
    iv_de_spec_t s = {.method = IV_DE_WILCOXON, .n_labels = NL, .n_tested = reference ? NL - 1 : NL,
                      .reference = ref, .n_cells = n_cells, .label = lab, .n_universe = NC, .n_genes = 2};
    iv_de_t *de = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_de_new(&s, &de, &err), 0);
    iv_de_work_t *w = iv_de_work_new(de);
    /* Gene 1 is gene 0 fed with 64-bit indices. */
    int64_t pos64[NC];
    for (int64_t k = 0; k < nnz; k++) pos64[k] = pos[k];
    ck_assert_int_eq(iv_de_gene(de, w, 0, nnz, pos, 4, val, IV_DT_FLOAT64), 0);
    ck_assert_int_eq(iv_de_gene(de, w, 1, nnz, pos64, 8, val, IV_DT_FLOAT64), 0);
    ck_assert_int_eq(iv_de_finish(de, &err), 0);
    for (int g = 0; g < s.n_tested; g++) {
        double r, tie, n1, n2;
        brute(x, lab, g, ref, &r, &tie, &n1, &n2);
        double z = z_of(r, tie, n1, n2);
        near(iv_de_row(de, g, 0)->score, z, 1e-12);
        near(iv_de_row(de, g, 1)->score, z, 0);
        near(iv_de_row(de, g, 0)->pval, iv_de_norm_p2(z), 1e-12);
    }
    iv_de_work_free(w);
    iv_de_free(de);
    /* Welch's t on the same gene, from two-pass moments computed here. */
    s.method = IV_DE_TTEST;
    ck_assert_int_eq(iv_de_new(&s, &de, &err), 0);
    w = iv_de_work_new(de);
    ck_assert_int_eq(iv_de_gene(de, w, 0, nnz, pos, 4, val, IV_DT_FLOAT64), 0);
    for (int g = 0; g < s.n_tested; g++) {
        double n1 = 0, n2 = 0, s1 = 0, s2 = 0, q1 = 0, q2 = 0;
        for (int i = 0; i < NC; i++) {
            if (lab[i] == g) n1++, s1 += x[i];
            else if (ref < 0 || lab[i] == ref) n2++, s2 += x[i];
        }
        double m1 = s1 / n1, m2 = s2 / n2;
        for (int i = 0; i < NC; i++) {
            if (lab[i] == g) q1 += (x[i] - m1) * (x[i] - m1);
            else if (ref < 0 || lab[i] == ref) q2 += (x[i] - m2) * (x[i] - m2);
        }
        double vn1 = q1 / (n1 - 1) / n1, vn2 = q2 / (n2 - 1) / n2;
        double t = (m1 - m2) / sqrt(vn1 + vn2);
        double df = (vn1 + vn2) * (vn1 + vn2) / (vn1 * vn1 / (n1 - 1) + vn2 * vn2 / (n2 - 1));
        near(iv_de_row(de, g, 0)->score, t, 1e-11);
        near(iv_de_row(de, g, 0)->pval, iv_de_t_p2(t, df), 1e-11);
        near(iv_de_row(de, g, 0)->mean1, m1, 1e-13);
        near(iv_de_row(de, g, 0)->mean2, m2, 1e-13);
    }
    iv_de_work_free(w);
    iv_de_free(de);
}

START_TEST(rank_sums_by_brute_force)
{
    ranks_case(1, 0);
    ranks_case(1, 1);
    ranks_case(0, 0);
    ranks_case(0, 1);
}
END_TEST

START_TEST(edge_cases)
{
    /* A gene with no entries and one equal everywhere: score 0, p 1. */
    int32_t label[4] = {0, 1, 1, 0};
    int64_t n_cells[2] = {2, 2};
    int32_t pos[4] = {0, 1, 2, 3};
    float val[4] = {2, 2, 2, 2};
    for (int m = IV_DE_TTEST; m <= IV_DE_WILCOXON; m++) {
        iv_de_spec_t s = {.method = (iv_de_method_t)m, .n_labels = 2, .n_tested = 1, .reference = -1,
                          .n_cells = n_cells, .label = label, .n_universe = 4, .n_genes = 2};
        iv_de_t *de = NULL;
        iv_err_t err;
        iv_err_clear(&err);
        ck_assert_int_eq(iv_de_new(&s, &de, &err), 0);
        iv_de_work_t *w = iv_de_work_new(de);
        ck_assert_int_eq(iv_de_gene(de, w, 0, 0, pos, 4, val, IV_DT_FLOAT32), 0);
        ck_assert_int_eq(iv_de_gene(de, w, 1, 4, pos, 4, val, IV_DT_FLOAT32), 0);
        ck_assert_int_eq(iv_de_gene(de, w, 2, 4, pos, 4, val, IV_DT_FLOAT32), IV_EINVALID_ARG);
        ck_assert_int_eq(iv_de_finish(de, &err), 0);
        for (int j = 0; j < 2; j++) {
            ck_assert(iv_de_row(de, 0, j)->score == 0);
            ck_assert(iv_de_row(de, 0, j)->pval == 1);
            ck_assert(iv_de_row(de, 0, j)->pval_adj == 1);
        }
        ck_assert(iv_de_row(de, 0, 1)->mean1 == 2 && iv_de_row(de, 0, 1)->frac2 == 1);
        iv_de_work_free(w);
        iv_de_free(de);
    }
    /* Constant groups that differ: the t-test's t is infinite, p 0. */
    float v2[2] = {5, 5};
    int32_t p2[2] = {0, 3};
    iv_de_spec_t s = {.method = IV_DE_TTEST, .n_labels = 2, .n_tested = 1, .reference = -1,
                      .n_cells = n_cells, .label = label, .n_universe = 4, .n_genes = 1};
    iv_de_t *de = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_de_new(&s, &de, &err), 0);
    iv_de_work_t *w = iv_de_work_new(de);
    ck_assert_int_eq(iv_de_gene(de, w, 0, 2, p2, 4, v2, IV_DT_FLOAT32), 0);
    ck_assert(isinf(iv_de_row(de, 0, 0)->score) && iv_de_row(de, 0, 0)->score > 0);
    ck_assert(iv_de_row(de, 0, 0)->pval == 0);
    iv_de_work_free(w);
    iv_de_free(de);
    /* Inconsistent specs are refused. */
    iv_de_spec_t bad = s;
    bad.reference = 0;
    ck_assert_int_eq(iv_de_new(&bad, &de, &err), IV_EINVALID_ARG);
    bad = s;
    bad.n_tested = 3;
    ck_assert_int_eq(iv_de_new(&bad, &de, &err), IV_EINVALID_ARG);
    bad = s;
    bad.method = (iv_de_method_t)7;
    ck_assert_int_eq(iv_de_new(&bad, &de, &err), IV_EINVALID_ARG);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("diffexp");
    TCase *tc = tcase_create("diffexp");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, special_functions);
    tcase_add_test(tc, benjamini_hochberg);
    tcase_add_test(tc, six_cells_by_hand);
    tcase_add_test(tc, rank_sums_by_brute_force);
    tcase_add_test(tc, edge_cases);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
