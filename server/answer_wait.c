/*
 * The answers' share of the memory budget (server.c's start_memory).
 *
 * Each matrix answer reserves the memory it works in before any decode,
 * for the stream's life (qs_free gives it back): a whole JSON document,
 * or a stream's window of blocks_ahead blocks, whichever is smaller for
 * its values; a window widened onto idle workers reserves its extra
 * blocks as it widens (qstream.c's qs_window).
 *
 * When the share is spent, a query waits for streams to end, in arrival
 * order across the whole server, for up to limits.answer_wait_ms: the
 * loop's reserve timer retries every RESERVE_TICK_MS while any wait
 * (answers that end on another loop give their memory back there), and
 * each loop retries after its finished jobs.  The order is the server's,
 * not each loop's: a loop takes memory for its oldest waiter only when no
 * other loop has an older one (reserve_oldest), else the memory its own
 * streams free would go to its own waiters first, and a query on a loop
 * whose streams end less often waited several times as long (at 64
 * connections on 16 cores, p99 2.4-3x the median with eight loops).  Past the wait the query gets 503 with Retry-After,
 * as at once when the wait is 0 or the answer needs more than the whole
 * share.  So a burst of large queries queues for the memory instead of
 * being refused while the answers before it finish, and the process
 * never holds more than the share.
 */
#include "srv_conn.h"
#include "srv_loop.h"
#include "srv_qstream.h"
#include "srv_respond.h"

#include <inttypes.h>
#include <stdio.h>

#define RESERVE_TICK_MS 2

/* The bytes an answer of q reserves (see the top of this file); sets
 * whether its window widens by reserving more. */
static uint64_t answer_need(const server_t *s, qstream_t *qs, const iv_query_t *q, iv_fmt_t fmt, int64_t hint)
{
    uint64_t values = hint >= 0 ? (uint64_t)hint : UINT64_MAX / 64;
    uint64_t need = values * 24 + (uint64_t)iv_query_n_rows(q) * 16 + 4096;
    uint64_t cap = fmt == IV_FMT_JSON ? s->cfg->limits.json_bytes : qs->base_ahead * BLOCK_WORK_BYTES;
    qs->window_reserved = fmt != IV_FMT_JSON && need >= cap;
    return need > cap ? cap : need;
}

static void refuse(conn_t *c)
{
    LP_METRIC(c->lp, m_->overloaded++);
    char msg[256];
    snprintf(msg, sizeof msg, "the memory the server gives answers being computed (%zu bytes of its "
             "memory budget) is in use; retry shortly", c->srv->mem.answers);
    send_error(c, 503, "memory_budget", msg, "Retry-After: 1\r\n");
}

static void wait_count(loop_t *lp, int d)
{
    lp->n_reserve_wait = d > 0 ? lp->n_reserve_wait + 1 : lp->n_reserve_wait - 1;
    if (d > 0 && lp->n_reserve_wait == 1)
        uv_timer_start(&lp->reserve, reserve_tick, RESERVE_TICK_MS, RESERVE_TICK_MS);
    else if (lp->n_reserve_wait == 0)
        uv_timer_stop(&lp->reserve);
}

/* The arrival number of the oldest waiter of any loop (UINT64_MAX: none). */
static uint64_t server_oldest(const server_t *s)
{
    uint64_t m = UINT64_MAX;
    for (unsigned i = 0; i < s->n_loops; i++) {
        uint64_t t = atomic_load_explicit(&s->loops[i].reserve_oldest, memory_order_relaxed);
        if (t < m) m = t;
    }
    return m;
}

static qstream_t *oldest_waiting(loop_t *lp);

/* Publishes the arrival number of lp's oldest waiter for the other loops. */
static void publish_oldest(loop_t *lp)
{
    qstream_t *qs = lp->n_reserve_wait ? oldest_waiting(lp) : NULL;
    atomic_store_explicit(&lp->reserve_oldest, qs ? qs->reserve_seq : UINT64_MAX, memory_order_relaxed);
}

int answer_take_now(server_t *s, uint64_t need)
{
    if (server_oldest(s) != UINT64_MAX) return -1;
    return iv_budget_take(&s->answers_left, need) == 0 ? 0 : -1;
}

int answer_reserve(conn_t *c, qstream_t *qs, const iv_query_t *q, const setup_res_t *res, int64_t hint)
{
    server_t *s = c->srv;
    loop_t *lp = c->lp;
    uint64_t need = answer_need(s, qs, q, res->fmt, hint);
    /* The oldest waiting query goes first: a newcomer takes memory only
     * when no query of any loop waits. */
    if (answer_take_now(s, need) == 0) {
        qs->reserved = need;
        return 0;
    }
    uint32_t wait = s->cfg->limits.answer_wait_ms;
    if (!wait || need > s->mem.answers) {
        refuse(c);
        return -1;
    }
    qs->reserve_need = need;
    qs->reserve_seq = atomic_fetch_add(&s->reserve_seq, 1);
    qs->reserve_until = uv_now(&lp->loop) + wait;
    qs->pending = *res;
    qs->reserve_wait = 1;
    wait_count(lp, 1);
    publish_oldest(lp);
    return 1;
}

void reserve_unwait(qstream_t *qs)
{
    if (!qs->reserve_wait) return;
    qs->reserve_wait = 0;
    wait_count(qs->lp, -1);
    publish_oldest(qs->lp);
}

static qstream_t *oldest_waiting(loop_t *lp)
{
    qstream_t *best = NULL;
    for (qstream_t *qs = lp->streams; qs; qs = qs->next_live)
        if (qs->reserve_wait && (!best || qs->reserve_seq < best->reserve_seq)) best = qs;
    return best;
}

static qstream_t *first_late(loop_t *lp, uint64_t now)
{
    for (qstream_t *qs = lp->streams; qs; qs = qs->next_live)
        if (qs->reserve_wait && now >= qs->reserve_until) return qs;
    return NULL;
}

/* Starting or refusing a stream may free streams (a refused one, or
 * others its connection closes), so each step looks again from the
 * list's head. */
void reserve_wake(loop_t *lp)
{
    server_t *s = lp->srv;
    qstream_t *qs;
    while ((qs = oldest_waiting(lp))) {
        if (!qs->c) {
            /* The client left; the stream goes with its last job. */
            reserve_unwait(qs);
            continue;
        }
        /* Another loop's older waiter goes first: its loop takes the
         * memory at its next tick or finished job. */
        if (qs->reserve_seq > server_oldest(s)) break;
        if (iv_budget_take(&s->answers_left, qs->reserve_need) != 0) break;
        qs->reserved = qs->reserve_need;
        reserve_unwait(qs);
        answer_go(qs, &qs->pending);
    }
    uv_update_time(&lp->loop);
    uint64_t now = uv_now(&lp->loop);
    while ((qs = first_late(lp, now))) {
        reserve_unwait(qs);
        if (qs->c) refuse(qs->c);
    }
}

void reserve_tick(uv_timer_t *t)
{
    loop_t *lp = t->data;
    loop_enter(lp);
    reserve_wake(lp);
    loop_leave(lp);
}
