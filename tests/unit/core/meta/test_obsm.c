/* obsm/varm arrays: a file written here with the HDF5 C API (2-D float64,
 * 1-D int16, chunked+deflate float32, an array of the wrong length, a
 * 3-D array, a group) is listed with the right shapes and reasons; held
 * values equal what was written; gathers with and without conversion. */
#include <check.h>

#include "check_main.h"
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "obsm.h"

#define N_OBS 50
#define N_VAR 7

static void put(hid_t g, const char *name, hid_t type, int rank, const hsize_t *dims, const void *data,
                int deflate)
{
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (deflate) {
        hsize_t ch[2] = {16, dims[1]};
        H5Pset_chunk(dcpl, rank, ch);
        H5Pset_deflate(dcpl, 4);
    }
    hid_t d = H5Dcreate2(g, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(sp);
}

static double umap[N_OBS][2];
static float pca[N_OBS][3];
static int16_t labels[N_OBS];
static double pcs[N_VAR][2];

static void write_file(const char *path)
{
    for (int i = 0; i < N_OBS; i++) {
        umap[i][0] = i * 0.1 + 1e-12;
        umap[i][1] = -i * 3.25;
        for (int j = 0; j < 3; j++) pca[i][j] = (float)(i * 10 + j) / 7.0f;
        labels[i] = (int16_t)(i % 5 - 2);
    }
    for (int i = 0; i < N_VAR; i++) pcs[i][0] = i, pcs[i][1] = -i;
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t g = H5Gcreate2(f, "obsm", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t d2[2] = {N_OBS, 2}, d3[2] = {N_OBS, 3}, d1[1] = {N_OBS}, bad[2] = {N_OBS - 1, 2};
    hsize_t cube[3] = {N_OBS, 2, 2};
    put(g, "X_umap", H5T_NATIVE_DOUBLE, 2, d2, umap, 0);
    put(g, "X_pca", H5T_NATIVE_FLOAT, 2, d3, pca, 1);
    put(g, "labels", H5T_NATIVE_INT16, 1, d1, labels, 0);
    static double zeros[N_OBS * 4];
    put(g, "short", H5T_NATIVE_DOUBLE, 2, bad, zeros, 0);
    put(g, "cube", H5T_NATIVE_DOUBLE, 3, cube, zeros, 0);
    hid_t sg = H5Gcreate2(g, "sparse", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(sg);
    H5Gclose(g);
    g = H5Gcreate2(f, "varm", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dv[2] = {N_VAR, 2};
    put(g, "PCs", H5T_NATIVE_DOUBLE, 2, dv, pcs, 0);
    H5Gclose(g);
    H5Fclose(f);
}

START_TEST(lists_reads_and_gathers)
{
    char path[] = "obsmXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path);
    iv_marrays_t *s = NULL;
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_marrays_load(path, N_OBS, N_VAR, &s, &err), 0);
    ck_assert_uint_eq(s->n, 7);
    const iv_marray_t *u = iv_marrays_find(s, IV_AXIS_OBS, "X_umap");
    ck_assert_ptr_nonnull(u);
    ck_assert_int_eq(u->n_rows, N_OBS);
    ck_assert_int_eq(u->n_cols, 2);
    ck_assert_int_eq(u->dtype, IV_DT_FLOAT64);
    ck_assert_int_eq(memcmp(u->data, umap, sizeof umap), 0);
    const iv_marray_t *p = iv_marrays_find(s, IV_AXIS_OBS, "X_pca");
    ck_assert_int_eq(p->dtype, IV_DT_FLOAT32);
    ck_assert_int_eq(memcmp(p->data, pca, sizeof pca), 0);
    const iv_marray_t *l = iv_marrays_find(s, IV_AXIS_OBS, "labels");
    ck_assert_int_eq(l->n_cols, 1);
    ck_assert_int_eq(l->dtype, IV_DT_INT16);
    ck_assert_int_eq(memcmp(l->data, labels, sizeof labels), 0);
    ck_assert_ptr_null(iv_marrays_find(s, IV_AXIS_OBS, "short")->data);
    ck_assert_ptr_nonnull(strstr(iv_marrays_find(s, IV_AXIS_OBS, "short")->why, "49 rows"));
    ck_assert_ptr_null(iv_marrays_find(s, IV_AXIS_OBS, "cube")->data);
    ck_assert_ptr_null(iv_marrays_find(s, IV_AXIS_OBS, "sparse")->data);
    ck_assert_ptr_null(iv_marrays_find(s, IV_AXIS_OBS, "PCs"));
    const iv_marray_t *v = iv_marrays_find(s, IV_AXIS_VAR, "PCs");
    ck_assert_ptr_nonnull(v);
    ck_assert_uint_eq(s->bytes, sizeof umap + sizeof pca + sizeof labels + sizeof pcs);

    /* Gathers: order and duplicates kept; float64 -> float32 as a C cast;
     * int16 -> float64. */
    int64_t idx[] = {49, 0, 0, 7};
    float f32[8];
    iv_marray_gather(u, idx, 4, IV_DT_FLOAT32, f32);
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 2; j++) ck_assert(f32[r * 2 + j] == (float)umap[idx[r]][j]);
    double f64[8];
    iv_marray_gather(u, idx, 4, IV_DT_FLOAT64, f64);
    for (int r = 0; r < 4; r++) ck_assert(f64[r * 2 + 1] == umap[idx[r]][1]);
    iv_marray_gather(l, idx, 4, IV_DT_FLOAT64, f64);
    for (int r = 0; r < 4; r++) ck_assert(f64[r] == (double)labels[idx[r]]);
    static float all[N_OBS * 3];
    iv_marray_gather(p, NULL, 0, IV_DT_FLOAT32, all);
    ck_assert_int_eq(memcmp(all, pca, sizeof pca), 0);
    iv_marrays_free(s);

    /* A file without obsm/varm gives an empty set; a missing file an error. */
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(f);
    ck_assert_int_eq(iv_marrays_load(path, N_OBS, N_VAR, &s, &err), 0);
    ck_assert_uint_eq(s->n, 0);
    iv_marrays_free(s);
    unlink(path);
    ck_assert_int_eq(iv_marrays_load(path, N_OBS, N_VAR, &s, &err), IV_EIO);
    ck_assert_ptr_null(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("obsm");
    TCase *tc = tcase_create("obsm");
    tcase_add_test(tc, lists_reads_and_gathers);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
