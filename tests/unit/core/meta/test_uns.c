/* uns entries: a file written here with the HDF5 C API (scalars of each
 * kind, 1-D numeric, bool-enum and string arrays, fixed-length strings, a
 * nested dict, an empty string, and what is left out: a dataframe group and its members,
 * a 2-D array, a compound, a string that is not UTF-8, a soft link) is
 * read back flattened, parents first and in name order, values equal to
 * what was written; what is left out is named with its reason. */
#include <check.h>

#include "check_main.h"
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "uns.h"

static void put(hid_t g, const char *name, hid_t type, int rank, const hsize_t *dims, const void *data)
{
    hid_t sp = rank ? H5Screate_simple(rank, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t d = H5Dcreate2(g, name, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(d);
    H5Sclose(sp);
}

static void set_enc(hid_t obj, const char *enc)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(enc));
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, "encoding-type", t, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, enc);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
}

static void put_vlen(hid_t g, const char *name, int rank, hsize_t n, const char **v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    put(g, name, t, rank, &n, v);
    H5Tclose(t);
}

static void write_file(const char *path)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t u = H5Gcreate2(f, "uns", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    set_enc(u, "dict");
    int64_t seven = 7;
    double half = 0.5;
    put(u, "n", H5T_NATIVE_INT64, 0, NULL, &seven);
    put(u, "ratio", H5T_NATIVE_DOUBLE, 0, NULL, &half);
    const char *title[] = {"na\xc3\xafve"};
    put_vlen(u, "title", 0, 1, title);
    const char *names[] = {"a", "", "b\xc3\xa9ta"};
    put_vlen(u, "names", 1, 3, names);
    const char *blank[] = {""};  /* an empty string first: nothing buffered yet */
    put_vlen(u, "blank", 0, 1, blank);
    const char *bad[] = {"\xff\xfe"};
    put_vlen(u, "not_utf8", 0, 1, bad);
    int32_t ids[4] = {3, -1, 40000, 0};
    hsize_t n4 = 4, d23[2] = {2, 3};
    put(u, "ids", H5T_NATIVE_INT32, 1, &n4, ids);
    double grid[6] = {0};
    put(u, "grid", H5T_NATIVE_DOUBLE, 2, d23, grid);
    /* h5py's bool: an enum of int8 {FALSE 0, TRUE 1}. */
    hid_t be = H5Tenum_create(H5T_NATIVE_INT8);
    int8_t v0 = 0, v1 = 1;
    H5Tenum_insert(be, "FALSE", &v0);
    H5Tenum_insert(be, "TRUE", &v1);
    int8_t mask[4] = {1, 0, 0, 1};
    put(u, "mask", be, 1, &n4, mask);
    H5Tclose(be);
    hid_t ft = H5Tcopy(H5T_C_S1);
    H5Tset_size(ft, 6);
    H5Tset_strpad(ft, H5T_STR_SPACEPAD);
    hsize_t n2 = 2;
    put(u, "fixed", ft, 1, &n2, "ab    cdef  ");
    H5Tclose(ft);
    hid_t ct = H5Tcreate(H5T_COMPOUND, 8);
    H5Tinsert(ct, "x", 0, H5T_NATIVE_INT64);
    put(u, "compound", ct, 0, NULL, &seven);
    H5Tclose(ct);
    hid_t nb = H5Gcreate2(u, "neighbors", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t pr = H5Gcreate2(nb, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int64_t k = 15;
    put(pr, "n_neighbors", H5T_NATIVE_INT64, 0, NULL, &k);
    H5Gclose(pr);
    H5Gclose(nb);
    hid_t df = H5Gcreate2(u, "frame", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    set_enc(df, "dataframe");
    put(df, "a", H5T_NATIVE_INT64, 0, NULL, &seven);
    H5Gclose(df);
    H5Lcreate_soft("/uns", u, "loop", H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(u);
    H5Fclose(f);
}

static const iv_uns_entry_t *find(const iv_uns_t *u, const char *path)
{
    for (size_t i = 0; i < u->n; i++)
        if (!strcmp(u->e[i].path, path)) return &u->e[i];
    return NULL;
}

static void check_str(const iv_uns_entry_t *e, int64_t i, const char *want)
{
    size_t len;
    const char *s = iv_uns_str(e, i, &len);
    ck_assert_uint_eq(len, strlen(want));
    ck_assert_str_eq(s, want);
}

START_TEST(reads_what_it_can_serve)
{
    char path[] = "unsXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path);
    iv_uns_t *u = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_uns_load(path, &u, &err), 0);
    /* Name order, parents before children; the rest left out. */
    const char *want[] = {"blank", "fixed", "ids", "mask", "n", "names", "neighbors", "neighbors/params",
                          "neighbors/params/n_neighbors", "ratio", "title"};
    ck_assert_uint_eq(u->n, sizeof want / sizeof *want);
    for (size_t i = 0; i < u->n; i++) ck_assert_str_eq(u->e[i].path, want[i]);
    const iv_uns_entry_t *e = find(u, "n");
    ck_assert(e->kind == IV_UNS_NUM && e->scalar && e->dtype == IV_DT_INT64 && e->n == 1);
    ck_assert_int_eq(*(const int64_t *)e->data, 7);
    e = find(u, "ratio");
    ck_assert(e->kind == IV_UNS_NUM && e->dtype == IV_DT_FLOAT64);
    ck_assert(*(const double *)e->data == 0.5);
    e = find(u, "ids");
    ck_assert(e->kind == IV_UNS_NUM && !e->scalar && e->dtype == IV_DT_INT32 && e->n == 4);
    ck_assert_int_eq(((const int32_t *)e->data)[2], 40000);
    e = find(u, "mask");
    ck_assert(e->kind == IV_UNS_BOOL && e->n == 4);
    ck_assert_mem_eq(e->data, "\1\0\0\1", 4);
    e = find(u, "title");
    ck_assert(e->kind == IV_UNS_STR && e->scalar);
    check_str(e, 0, "na\xc3\xafve");
    e = find(u, "names");
    ck_assert(e->kind == IV_UNS_STR && !e->scalar && e->n == 3);
    check_str(e, 0, "a");
    check_str(e, 1, "");
    check_str(e, 2, "b\xc3\xa9ta");
    check_str(find(u, "blank"), 0, "");
    e = find(u, "fixed");
    check_str(e, 0, "ab");
    check_str(e, 1, "cdef");
    ck_assert(find(u, "neighbors/params")->kind == IV_UNS_DICT);
    /* What was left out is named, in name order, with the reason; the
     * dataframe once, not its member. */
    const char *skipped[][2] = {{"compound", "compound"}, {"frame", "encoding-type dataframe"},
                                {"grid", "2-D array"}, {"loop", "soft link"}, {"not_utf8", "UTF-8"}};
    ck_assert_uint_eq(u->n_skip, 5);
    ck_assert_int_eq(u->more_skipped, 0);
    for (size_t i = 0; i < u->n_skip; i++) {
        ck_assert_str_eq(u->skip[i].path, skipped[i][0]);
        ck_assert_ptr_nonnull(strstr(u->skip[i].why, skipped[i][1]));
    }
    iv_uns_free(u);

    /* A file without uns: empty; a missing file: an error. */
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    ck_assert_int_eq(iv_uns_load(path, &u, &err), 0);
    ck_assert_uint_eq(u->n, 0);
    ck_assert_uint_eq(u->n_skip, 0);
    iv_uns_free(u);
    unlink(path);
    ck_assert_int_eq(iv_uns_load(path, &u, &err), IV_EIO);
    ck_assert_ptr_null(u);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("uns");
    TCase *tc = tcase_create("uns");
    tcase_add_test(tc, reads_what_it_can_serve);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
