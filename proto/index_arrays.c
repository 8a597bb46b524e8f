/*
 * Integer index arrays of a request body, read ahead of cJSON (see
 * index_arrays.h).
 *
 * A scan of the text, without recursion: the root object's members are
 * walked one by one, and so are those of its "obs" and "var" objects;
 * every other value is skipped by counting brackets outside strings.  A
 * text the scan does not understand ends it with nothing taken.
 */
#include "index_arrays.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int enabled = 1;

void iv_index_arrays_enable(int on) { atomic_store(&enabled, on); }

struct scan {
    const char *s;
    size_t len, i;
    size_t inside[2][2];   /* each axis's taken array: [from, to) between its brackets */
};

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void skip_ws(struct scan *sc)
{
    while (sc->i < sc->len && is_ws(sc->s[sc->i])) sc->i++;
}

/* Takes the character c (after white space): 1, or 0 when another is next. */
static int take(struct scan *sc, char c)
{
    skip_ws(sc);
    if (sc->i >= sc->len || sc->s[sc->i] != c) return 0;
    sc->i++;
    return 1;
}

/* A string from its opening quote: 1 with *raw set when it holds no
 * backslash (its text is then what it means), 0 at the end of the text. */
static int skip_string(struct scan *sc, int *raw)
{
    *raw = 1;
    for (sc->i++; sc->i < sc->len; sc->i++) {
        char c = sc->s[sc->i];
        if (c == '"') {
            sc->i++;
            return 1;
        }
        if (c == '\\') {
            *raw = 0;
            sc->i++;
        }
    }
    return 0;
}

/* A key and its colon: 1 with [*k, *k + *n) its text, 0 when the text is
 * not a plain key there (an escape in it included). */
static int key(struct scan *sc, const char **k, size_t *n)
{
    skip_ws(sc);
    if (sc->i >= sc->len || sc->s[sc->i] != '"') return 0;
    size_t at = sc->i + 1;
    int raw;
    if (!skip_string(sc, &raw) || !raw) return 0;
    *k = sc->s + at;
    *n = sc->i - 1 - at;
    return take(sc, ':');
}

static int key_is(const char *k, size_t n, const char *want)
{
    return n == strlen(want) && !memcmp(k, want, n);
}

/* Any value, skipped: strings whole, containers by their brackets, a
 * number or literal up to the next delimiter.  0 when the text ends. */
static int skip_value(struct scan *sc)
{
    skip_ws(sc);
    int depth = 0, raw;
    while (sc->i < sc->len) {
        char c = sc->s[sc->i];
        if (c == '"') {
            if (!skip_string(sc, &raw)) return 0;
            if (depth == 0) return 1;
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) return 1;   /* a literal's end, the bracket not ours */
            if (--depth == 0) {
                sc->i++;
                return 1;
            }
        } else if (depth == 0 && (c == ',' || is_ws(c))) {
            return 1;
        }
        sc->i++;
    }
    return depth == 0;
}

/* Appends v to a's integers, doubling its room. */
static int push(iv_index_array_t *a, size_t *cap, int64_t v)
{
    if ((size_t)a->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        int64_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return 0;
        a->v = nv;
        *cap = nc;
    }
    a->v[a->n++] = v;
    return 1;
}

/* One integer as the header says, from sc->i: 1 with *v, or 0. */
static int plain_int(struct scan *sc, int64_t *v)
{
    const char *s = sc->s;
    size_t i = sc->i;
    int neg = i < sc->len && s[i] == '-';
    i += (size_t)neg;
    size_t d0 = i;
    int64_t x = 0;
    /* Up to 16 digits read, so that a 16th says the number is too long. */
    while (i < sc->len && s[i] >= '0' && s[i] <= '9' && i - d0 < 16) x = x * 10 + (s[i++] - '0');
    size_t digits = i - d0;
    if (digits == 0 || digits > 15 || (digits > 1 && s[d0] == '0')) return 0;
    if (i < sc->len && (s[i] == '.' || s[i] == 'e' || s[i] == 'E')) return 0;
    *v = neg ? -x : x;
    sc->i = i;
    return 1;
}

/* The array at sc->i ('[') read into a when it is integers only: 1 with
 * sc->i past its ']', or 0 with a emptied and sc->i where it was. */
static int int_array(struct scan *sc, iv_index_array_t *a)
{
    size_t start = sc->i, cap = 0;
    sc->i++;
    a->n = 0;
    if (take(sc, ']')) goto done;
    for (;;) {
        int64_t v;
        skip_ws(sc);
        if (!plain_int(sc, &v) || !push(a, &cap, v)) break;
        if (take(sc, ',')) continue;
        if (take(sc, ']')) goto done;
        break;
    }
    free(a->v);
    a->v = NULL;
    a->n = 0;
    sc->i = start;
    return 0;
done:
    if (!a->v && !(a->v = malloc(sizeof *a->v))) {
        sc->i = start;
        return 0;
    }
    a->taken = 1;
    return 1;
}

/* The members of axis ax's object ("obs" or "var"), from its '{': its
 * first "index" array taken into a, the span between its brackets kept.
 * 0 when the text is not understood. */
static int axis_object(struct scan *sc, iv_index_array_t *a, int ax)
{
    sc->i++;
    if (take(sc, '}')) return 1;
    for (int seen = 0;;) {
        const char *k;
        size_t kn;
        if (!key(sc, &k, &kn)) return 0;
        skip_ws(sc);
        size_t at = sc->i;
        int first = !seen && key_is(k, kn, "index");
        seen |= first;
        if (first && at < sc->len && sc->s[at] == '[') {
            if (int_array(sc, a)) {
                sc->inside[ax][0] = at + 1;
                sc->inside[ax][1] = sc->i - 1;
            } else if (!skip_value(sc)) {
                return 0;
            }
        } else if (!skip_value(sc)) {
            return 0;
        }
        if (take(sc, ',')) continue;
        return take(sc, '}');
    }
}

/* The root object's members: 1 when the whole object was understood. */
static int root_object(struct scan *sc, iv_index_array_t pre[2])
{
    if (!take(sc, '{')) return 0;
    if (take(sc, '}')) return 1;
    int seen[2] = {0, 0};
    for (;;) {
        const char *k;
        size_t kn;
        if (!key(sc, &k, &kn)) return 0;
        int ax = key_is(k, kn, "obs") ? 0 : key_is(k, kn, "var") ? 1 : -1;
        skip_ws(sc);
        int first = ax >= 0 && !seen[ax];
        if (first) seen[ax] = 1;
        if (first && sc->i < sc->len && sc->s[sc->i] == '{') {
            if (!axis_object(sc, &pre[ax], ax)) return 0;
        } else if (!skip_value(sc)) {
            return 0;
        }
        if (take(sc, ',')) continue;
        return take(sc, '}');
    }
}

void iv_index_arrays_free(iv_index_array_t pre[2])
{
    for (int a = 0; a < 2; a++) {
        free(pre[a].v);
        pre[a] = (iv_index_array_t){0, 0, NULL};
    }
}

char *iv_index_arrays_take(const char *body, size_t len, iv_index_array_t pre[2])
{
    pre[0] = pre[1] = (iv_index_array_t){0, 0, NULL};
    if (!atomic_load(&enabled) || len == 0) return NULL;
    struct scan sc = {body, len, 0, {{0, 0}, {0, 0}}};
    char *copy = NULL;
    if (root_object(&sc, pre) && (pre[0].taken || pre[1].taken) && (copy = malloc(len))) {
        memcpy(copy, body, len);
        for (int a = 0; a < 2; a++)
            if (pre[a].taken) memset(copy + sc.inside[a][0], ' ', sc.inside[a][1] - sc.inside[a][0]);
        return copy;
    }
    iv_index_arrays_free(pre);
    return NULL;
}
