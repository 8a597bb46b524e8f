/*
 * Jobs: the hand-off of work from the loop to the worker pool, and back.
 *
 * A job runs on a worker and ends with loop_post (server.c), which pushes
 * it on its loop's locked list of finished jobs and wakes that loop
 * (uv_async_send); the loop takes the whole list in one swap (on_async)
 * and hands each job to the done half of its type.  Workers never touch
 * loop objects: a job's inputs are copies (setup_t), and its results
 * travel back in the job.  Each job type keeps its two halves in one
 * file: setup_job.c (a query's set-up, a viewer route), stream_jobs.c
 * (prepare, one block, a whole JSON document, a count), load.c (a
 * dataset's load, its other orientation, its warm-up), routes_export.c
 * (an exported file and its pieces).  The query jobs look at their
 * stream's cancel flag between phases (job_cancelled), so that work for
 * a client that left stops early.
 */
#include "srv_datasets.h"
#include "srv_jobs.h"
#include "srv_loop.h"
#include "srv_qstream.h"

#include <stdlib.h>

void setup_free(setup_t *st)
{
    if (!st) return;
    free(st->body);
    free(st->query);
    free(st->accept);
    iv_query_free(st->q);
    free(st->dropped);
    iv_vreq_free(st->vr);
    free(st->dropped_hdr);
    free(st);
}

/* Loop thread (or after the loop stopped): a load job's reference on its
 * dataset is dropped here. */
void job_free(job_t *j)
{
    iv_buf_free(&j->out);
    free(j->tail[0]);
    free(j->tail[1]);
    setup_free(j->setup);
    ds_unref(j->srv, j->ds);
    free(j);
}

/* ---- cancelling (worker) ------------------------------------------------- */

int job_cancelled(const job_t *j)
{
    return j->qs && atomic_load_explicit(&j->qs->cancelled, memory_order_relaxed);
}

int job_cancel_rc(job_t *j)
{
    return iv_fail(&j->err, IV_ECANCELLED, "the client went away");
}

/* ---- running a job ------------------------------------------------------- */

/* The pool's entry for every job: its type's run half, unless the client
 * left while the job waited in the queue, then the hand-off. */
static void job_exec(void *arg)
{
    job_t *j = arg;
    double t0 = now_s();
    if (job_cancelled(j)) {
        j->rc = job_cancel_rc(j);
        j->cancelled = 1;
    } else {
        j->type->run(j);
    }
    j->secs = now_s() - t0;
    loop_post(j->lp, j);
}

int job_submit(job_t *j)
{
    if (!j->lp) j->lp = &j->srv->loops[0];
    return iv_pool_try_submit(j->srv->pool, job_exec, j);
}

int job_submit_server(job_t *j)
{
    if (!j->lp) j->lp = &j->srv->loops[0];
    return iv_pool_submit(j->srv->pool, job_exec, j);
}
