/* Tests of server/registry.c's matrix lookup (iv_rds_matrix): X by default
 * or by name, an unknown name is IV_EUNKNOWN_MATRIX listing every matrix
 * (cut short when there are many), one listed but not servable is
 * IV_EUNSERVABLE with its reason, and the entry frees its matrices
 * (the sanitizer builds see a leak).  No file is opened: the entries are
 * filled by hand as a load would leave them. */
#include <check.h>

#include "check_main.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"

static iv_rds_t *entry(size_t n_mx)
{
    iv_ds_conf_t c;
    memset(&c, 0, sizeof c);
    c.id = (char *)"ds1";
    c.path = (char *)"none.h5ad";
    c.transpose_bytes = -1;
    iv_rds_t *d = iv_rds_new(&c);
    ck_assert_ptr_nonnull(d);
    d->mx = calloc(n_mx ? n_mx : 1, sizeof *d->mx);
    ck_assert_ptr_nonnull(d->mx);
    d->n_mx = n_mx;
    for (size_t i = 0; i < n_mx; i++) {
        snprintf(d->mx[i].name, sizeof d->mx[i].name, "layers/layer_number_%03zu", i);
        snprintf(d->mx[i].reason, sizeof d->mx[i].reason, "a plain csr_matrix");
    }
    return d;
}

START_TEST(test_x_unknown_and_unservable)
{
    iv_rds_t *d = entry(2);
    iv_dataset_t *ds = (iv_dataset_t *)1;
    iv_meta_t *vm = (iv_meta_t *)1;
    iv_err_t e;
    iv_err_clear(&e);
    /* X, absent or by name: the entry's own dataset and metadata. */
    ck_assert_int_eq(iv_rds_matrix(d, NULL, &ds, &vm, &e), 0);
    ck_assert_ptr_eq(ds, d->ds);
    ck_assert_ptr_eq(vm, d->meta);
    ck_assert_int_eq(iv_rds_matrix(d, "X", &ds, &vm, &e), 0);
    ck_assert_int_eq(iv_rds_matrix(d, "layers/nope", &ds, &vm, &e), IV_EUNKNOWN_MATRIX);
    ck_assert_ptr_nonnull(strstr(e.msg, "no matrix 'layers/nope' in dataset 'ds1'"));
    ck_assert_ptr_nonnull(strstr(e.msg, "available: X, layers/layer_number_000, layers/layer_number_001"));
    iv_err_clear(&e);
    ck_assert_int_eq(iv_rds_matrix(d, "layers/layer_number_001", &ds, &vm, &e), IV_EUNSERVABLE);
    ck_assert_ptr_nonnull(strstr(e.msg, "not servable: a plain csr_matrix"));
    /* Case matters: "x" is not X. */
    iv_err_clear(&e);
    ck_assert_int_eq(iv_rds_matrix(d, "x", &ds, &vm, &e), IV_EUNKNOWN_MATRIX);
    iv_rds_unref(d);
}
END_TEST

START_TEST(test_many_matrices_cut_the_list)
{
    iv_rds_t *d = entry(40);
    iv_dataset_t *ds;
    iv_meta_t *vm;
    iv_err_t e;
    iv_err_clear(&e);
    ck_assert_int_eq(iv_rds_matrix(d, "raw/X", &ds, &vm, &e), IV_EUNKNOWN_MATRIX);
    size_t n = strlen(e.msg);
    ck_assert_uint_lt(n, sizeof e.msg - 1);
    ck_assert_str_eq(e.msg + n - 3, "...");
    ck_assert_ptr_nonnull(strstr(e.msg, "available: X, layers/layer_number_000"));
    iv_rds_unref(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("registry_matrices");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, test_x_unknown_and_unservable);
    tcase_add_test(tc, test_many_matrices_cut_the_list);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
