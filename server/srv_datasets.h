/*
 * Datasets (load.c, reload.c): their loads, the document each is
 * answered with, their memory, and reloads.  A dataset (sds_t, a
 * registry entry) is changed on loop 0 only; the other loops read it
 * under the shared lock (srv_loop.h, loop_enter).
 */
#ifndef IV_SRV_DATASETS_H
#define IV_SRV_DATASETS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "metrics.h"
#include "srv_common.h"

/* Datasets loading (load.c): the load, other-orientation and warm jobs,
 * both halves (load_submit starts one, loop thread).  The document parts
 * are called wherever the dataset is not changing under them; ds_unref
 * and ds_retire are for the loop thread. */
void load_submit(server_t *s, sds_t *d, uint64_t gen, int replace, int reloaded);
void ds_unref(server_t *s, sds_t *d);
void ds_retire(server_t *s, sds_t *d);
void ds_memory(const sds_t *d, iv_metrics_ds_mem_t *m);
void put_memory(iv_buf_t *b, const sds_t *d);
void build_doc(sds_t *d);
/* Where a ready dataset's other orientation comes from (config.h's
 * other_orientation, the dataset's companion and transpose budget, the
 * stream's size); OTHER_NONE: it gets none. */
enum { OTHER_NONE = 0, OTHER_MEMORY, OTHER_DISK, OTHER_COMPANION };
int other_plan(const server_t *s, const sds_t *d);

/* The dataset served under an id (routes.c).  Loop thread. */
sds_t *find_ds(server_t *s, const char *id, size_t n);

/* A reload in progress (see reload_start). */
typedef struct reload {
    uint64_t gen;
    unsigned waiting;     /* its load jobs not back yet, plus one while it is being set up */
    iv_buf_t added, removed, reloaded, failed;   /* JSON array members */
    size_t unchanged;
    loop_t *waiter_lp;    /* the admin request to answer: its loop and */
    uint64_t waiter;      /* connection id, or 0 */
    double t0;
    char why[64];
} reload_t;

/* Reloads (reload.c).  Loop thread.  A load of the running reload (its
 * gen) that came back is noted in the reload's summary (reload_note:
 * added, reloaded or failed), then counted off (reload_step). */
void reload_free(reload_t *op);
void reload_start(server_t *s, const char *why, loop_t *waiter_lp, uint64_t waiter);
void reload_note(reload_t *op, const job_t *j, const sds_t *d);
void reload_step(server_t *s);
/* The answer to an admin reload, sent on the waiter's loop if it is still there. */
void reload_reply(server_t *s, loop_t *lp, uint64_t id, int status, const char *code,
                  const char *msg, iv_buf_t *body, const char *extra);

#endif
