/*
 * Routes (routes.c, routes_query.c, routes_export.c): the dispatch of a
 * request to its route, the 100-continue precheck, and the routes'
 * entry points.  Loop thread; a route that computes hands the work to a
 * job (srv_jobs.h) or a query stream (srv_qstream.h).
 */
#ifndef IV_SRV_ROUTES_H
#define IV_SRV_ROUTES_H

#include "http.h"
#include "metrics.h"
#include "srv_common.h"

/* A refusal decided before any work: the answer to send. */
typedef struct rfail {
    int status;
    const char *code;
    char msg[200];
    const char *extra;
    iv_route_t route;
} rfail_t;

/* Routes (routes.c).  Loop thread. */
int method_ok(conn_t *c, int allow_post);
void dispatch(conn_t *c);
int route_precheck(conn_t *c, const iv_http_req_t *r, rfail_t *f);

/* Routes computed on a worker (routes_query.c).  Loop thread. */
void route_query(conn_t *c, sds_t *d, int count);
/* Refuses (415) a POST body that is not JSON (form-urlencoded and text
 * pass: curl -d sends them); 1 when it was refused. */
int body_type_refused(conn_t *c);
void route_viewer(conn_t *c, sds_t *d, int vroute, const char *sub);

/* The export route (routes_export.c).  Loop thread. */
void route_export(conn_t *c, sds_t *d);

#endif
