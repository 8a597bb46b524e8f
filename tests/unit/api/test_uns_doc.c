/*
 * The uns document (api/uns_doc.h) from entries built here, no file: the
 * nesting rebuilt from the flat list (a dict member named "dtype", an
 * empty dict, an entry whose parent is missing left out), each element's
 * dtype, shape and data, strings escaped, the skipped list; NaN and the
 * infinities as strings and -0.0 signed; every float32 and float64 of a
 * pseudo-random sweep (all exponents, subnormals) printed in digits that
 * strtod reads back to the same bits; the size limit.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check_main.h"
#include "uns_doc.h"

static iv_uns_entry_t entry(const char *path, iv_uns_kind_t kind, int scalar, iv_dtype_t dt, int64_t n,
                            const void *data, size_t bytes)
{
    iv_uns_entry_t e = {.path = (char *)path, .kind = kind, .scalar = scalar, .dtype = dt, .n = n,
                        .data = (void *)data};
    (void)bytes;
    return e;
}

static char *doc_of(const iv_uns_t *u, size_t max, int want_rc)
{
    iv_buf_t b;
    iv_buf_init(&b);
    iv_err_t err;
    iv_err_clear(&err);
    ck_assert_int_eq(iv_api_uns_doc(u, max, &b, &err), want_rc);
    iv_buf_append(&b, "", 1);
    return b.data;
}

START_TEST(nests_and_types)
{
    int64_t k = 15;
    uint64_t big[2] = {UINT64_MAX, 0};
    uint8_t mask[3] = {1, 0, 1};
    float f[4] = {NAN, INFINITY, -INFINITY, -0.0f};
    char strs[] = "a\"b\0\xc3\xa9\0";
    size_t offs[3] = {0, 4, 7};
    iv_uns_entry_t e[] = {
        entry("colors", IV_UNS_STR, 0, IV_DT_UINT8, 2, strs, sizeof strs - 1),
        entry("dtype", IV_UNS_DICT, 0, IV_DT_UINT8, 0, "", 0),
        entry("dtype/dtype", IV_UNS_NUM, 1, IV_DT_INT64, 1, &k, 8),
        entry("empty", IV_UNS_DICT, 0, IV_DT_UINT8, 0, "", 0),
        entry("f", IV_UNS_NUM, 0, IV_DT_FLOAT32, 4, f, 16),
        entry("lost/child", IV_UNS_NUM, 1, IV_DT_INT64, 1, &k, 8),  /* no "lost" entry */
        entry("mask", IV_UNS_BOOL, 0, IV_DT_UINT8, 3, mask, 3),
        entry("nb", IV_UNS_DICT, 0, IV_DT_UINT8, 0, "", 0),
        entry("nb/params", IV_UNS_DICT, 0, IV_DT_UINT8, 0, "", 0),
        entry("nb/params/k", IV_UNS_NUM, 1, IV_DT_INT64, 1, &k, 8),
        entry("nb/u", IV_UNS_NUM, 0, IV_DT_UINT64, 2, big, 16),
        entry("none", IV_UNS_NUM, 0, IV_DT_INT32, 0, "", 0),
    };
    e[0].off = offs;
    iv_uns_skip_t sk[] = {{"grid", "a 2-D array"}};
    iv_uns_t u = {.e = e, .n = sizeof e / sizeof *e, .skip = sk, .n_skip = 1};
    char *doc = doc_of(&u, 0, 0);
    const char *want =
        "{\"uns\":{\"colors\":{\"dtype\":\"str\",\"shape\":[2],\"data\":[\"a\\\"b\",\"\\u00e9\"]},"
        "\"dtype\":{\"dtype\":{\"dtype\":\"int64\",\"shape\":[],\"data\":15}},\"empty\":{},"
        "\"f\":{\"dtype\":\"float32\",\"shape\":[4],\"data\":[\"NaN\",\"Infinity\",\"-Infinity\",-0.0]},"
        "\"mask\":{\"dtype\":\"bool\",\"shape\":[3],\"data\":[true,false,true]},"
        "\"nb\":{\"params\":{\"k\":{\"dtype\":\"int64\",\"shape\":[],\"data\":15}},"
        "\"u\":{\"dtype\":\"uint64\",\"shape\":[2],\"data\":[18446744073709551615,0]}},"
        "\"none\":{\"dtype\":\"int32\",\"shape\":[0],\"data\":[]}},"
        "\"skipped\":[{\"path\":\"grid\",\"reason\":\"a 2-D array\"}],\"skipped_truncated\":false}";
    /* The é may be written raw or escaped: compare after parsing. */
    cJSON *got = cJSON_Parse(doc), *exp = cJSON_Parse(want);
    ck_assert_ptr_nonnull(got);
    ck_assert_ptr_nonnull(exp);
    ck_assert_msg(cJSON_Compare(got, exp, 1), "%s", doc);
    cJSON_Delete(got);
    cJSON_Delete(exp);
    ck_assert_ptr_nonnull(strstr(doc, "-0.0]"));
    free(doc);

    /* No uns: an empty document. */
    doc = doc_of(NULL, 0, 0);
    ck_assert_str_eq(doc, "{\"uns\":{},\"skipped\":[],\"skipped_truncated\":false}");
    free(doc);

    /* Past the limit: an error, wherever it falls. */
    doc = doc_of(&u, 100, IV_ETOO_LARGE);
    free(doc);
}
END_TEST

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The document's value of a one-element float array of dtype dt. */
static double read_back(iv_dtype_t dt, const void *v)
{
    iv_uns_entry_t e = entry("x", IV_UNS_NUM, 1, dt, 1, v, 0);
    iv_uns_t u = {.e = &e, .n = 1};
    char *doc = doc_of(&u, 0, 0);
    const char *p = strstr(doc, "\"data\":");
    ck_assert_ptr_nonnull(p);
    p += 7;
    ck_assert_msg(strpbrk(p, ".e") != NULL, "%s: no '.' or exponent", doc);
    double d = strtod(p, NULL);
    /* The fewest digits: 9 at most for float32, 17 for float64. */
    size_t digits = 0;
    int lead = 1;  /* zeros before the first other digit are not significant */
    for (const char *q = p; *q && *q != 'e' && *q != '}'; q++) {
        if (*q < '0' || *q > '9') continue;
        lead &= *q == '0';
        digits += !lead;
    }
    size_t most = dt == IV_DT_FLOAT32 ? 9 + 1 : 17 + 1;  /* ".0" may add one */
    ck_assert_msg(digits <= most, "%s: %zu digits", doc, digits);
    free(doc);
    return d;
}

START_TEST(floats_read_back_bit_for_bit)
{
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 20000; i++) {
        uint32_t b32 = (uint32_t)next(&s);
        float f;
        memcpy(&f, &b32, 4);
        if (isfinite(f)) {
            float back = (float)read_back(IV_DT_FLOAT32, &f);
            ck_assert_msg(memcmp(&back, &f, 4) == 0, "float32 %08x: %.9g", b32, (double)f);
        }
        uint64_t b64 = next(&s);
        double d;
        memcpy(&d, &b64, 8);
        if (isfinite(d)) {
            double back = read_back(IV_DT_FLOAT64, &d);
            ck_assert_msg(memcmp(&back, &d, 8) == 0, "float64 %016llx", (unsigned long long)b64);
        }
    }
    /* Edge values: subnormals, the extremes, 0.1 in the fewest digits. */
    float fe[] = {1e-45f, 1.17549435e-38f, 3.4028235e38f, 0.1f, 16777216.0f, -0.0f};
    for (size_t i = 0; i < sizeof fe / sizeof *fe; i++) {
        float back = (float)read_back(IV_DT_FLOAT32, &fe[i]);
        ck_assert(memcmp(&back, &fe[i], 4) == 0);
    }
    double de[] = {5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1e21, -0.0};
    for (size_t i = 0; i < sizeof de / sizeof *de; i++) {
        double back = read_back(IV_DT_FLOAT64, &de[i]);
        ck_assert(memcmp(&back, &de[i], 8) == 0);
    }
    float tenth = 0.1f;
    iv_uns_entry_t e = entry("x", IV_UNS_NUM, 1, IV_DT_FLOAT32, 1, &tenth, 4);
    iv_uns_t u = {.e = &e, .n = 1};
    char *doc = doc_of(&u, 0, 0);
    ck_assert_ptr_nonnull(strstr(doc, "\"data\":0.1}"));
    free(doc);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("uns_doc");
    TCase *tc = tcase_create("uns_doc");
    tcase_add_test(tc, nests_and_types);
    tcase_add_test(tc, floats_read_back_bit_for_bit);
    suite_add_tcase(s, tc);
    return iv_check_run(s);
}
