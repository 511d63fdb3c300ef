/* hooks.c - communicator probes and recording helpers (see hooks.h). */
#include "profiler/record/hooks.h"

#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "engine/core/xalloc.h"

#define PAIR_CACHE 64

struct ms_comm_probe {
    const ms_trace_state *ts;
    ms_recorder *rec;
    int mesh_dim;
    int32_t group;
    /* Point-to-point: the {sender, receiver} group id per peer and direction, registered
     * once; a cached peer is stored as peer for sends and -1 - peer for receives. */
    int pair_peer[PAIR_CACHE];
    int32_t pair_group[PAIR_CACHE];
    int n_pairs;
};

static int32_t register_group(ms_recorder *rec, const char *name, int n, const int *ranks) {
    ms_group g = {.size = n};
    ms_ev_strcpy(g.name, sizeof g.name, NULL, name);
    for (int i = 0; i < n && i < MS_EV_GROUP_MAX; i++) g.ranks[i] = ranks[i];
    return ms_recorder_group(rec, &g);
}

static void fill_coll(ms_event *e, const ms_comm_probe *p, const ms_comm_event *ev) {
    memset(e, 0, sizeof *e);
    e->kind = MS_EV_COLL;
    e->phase = MS_PHASE_OTHER;
    e->t0_ns = ev->t_start_ns;
    e->t1_ns = ev->t_end_ns;
    ms_ev_coll *c = &e->u.coll;
    c->coll = (uint8_t)ev->kind;
    c->reduce = (uint8_t)ev->op;
    c->mesh_dim = (int16_t)p->mesh_dim;
    c->group = p->group;
    c->group_size = ms_comm_size(ev->comm);
    c->group_rank = ms_comm_rank(ev->comm);
    c->seq = ev->seq;
    c->bytes = ev->bytes;
    c->dtype = (uint8_t)ev->dtype;
    ms_ev_strcpy(c->algo, sizeof c->algo, NULL, ev->algo);
    c->flow = ev->async ? 0 : p->ts->flow; /* a bucket serves several reshards, none alone */
    c->root = ev->root < 0 ? 0 : ev->root;
    c->async = ev->async;
    c->queued_ns =
        ev->async && ev->t_start_ns > ev->t_issue_ns ? ev->t_start_ns - ev->t_issue_ns : 0;
}

/* The group id of {sender, receiver} for a transfer between me and peer; cached so the hot
 * path rarely takes the table's mutex. Both sides of a transfer name the same group. */
static int32_t pair_group(ms_comm_probe *p, const ms_comm *comm, int peer, bool recv) {
    int key = recv ? -1 - peer : peer;
    for (int i = 0; i < p->n_pairs; i++)
        if (p->pair_peer[i] == key) return p->pair_group[i];
    int me = ms_comm_world_rank(comm, ms_comm_rank(comm)), other = ms_comm_world_rank(comm, peer);
    int pair[2] = {recv ? other : me, recv ? me : other};
    int32_t id = register_group(p->rec, "p2p", 2, pair);
    if (p->n_pairs < PAIR_CACHE) {
        p->pair_peer[p->n_pairs] = key;
        p->pair_group[p->n_pairs++] = id;
    }
    return id;
}

static void observe(void *user, const ms_comm_event *ev) {
    ms_comm_probe *p = user;
    if (!p->ts->recorder) return; /* recording paused (train --trace-from) */
    ms_event e;
    if (ev->kind != MS_COLL_P2P) {
        fill_coll(&e, p, ev);
        ms_recorder_push(p->rec, &e);
        return;
    }
    /* One event per transfer, on the pair's own group {sender, receiver}: the sender's carries
     * the traffic (who talked to whom), the receiver's shows its wait. */
    for (int i = 0; i < ev->n_p2p; i++) {
        const ms_p2p_op *op = &ev->p2p[i];
        bool recv = op->kind == MS_P2P_RECV;
        fill_coll(&e, p, ev);
        e.u.coll.group = pair_group(p, ev->comm, op->peer, recv);
        e.u.coll.group_size = 2;
        e.u.coll.group_rank = recv ? 1 : 0;
        e.u.coll.recv = recv;
        e.u.coll.bytes = op->count * ms_comm_dtype_size(ev->dtype);
        ms_recorder_push(p->rec, &e);
    }
}

ms_comm_probe *ms_comm_probe_attach(const ms_trace_state *ts, ms_comm *c, int mesh_dim) {
    if (!ts->recorder || !c) return NULL;
    ms_comm_probe *p = xcalloc(1, sizeof *p);
    p->ts = ts;
    p->rec = ts->recorder;
    p->mesh_dim = mesh_dim;
    int n = ms_comm_size(c);
    int *ranks = xmalloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) ranks[i] = ms_comm_world_rank(c, i);
    p->group = register_group(p->rec, ms_comm_name(c), n, ranks);
    free(ranks);
    ms_comm_set_observer(c, observe, p);
    return p;
}

void ms_comm_probe_free(ms_comm_probe *p) {
    free(p);
}

static void emit(void *recorder, const ms_event *e) {
    ms_recorder_push(recorder, e);
}

const ms_trace_sink_ops ms_recorder_sink = {
    .emit = emit, .probe_attach = ms_comm_probe_attach, .probe_free = ms_comm_probe_free};

void ms_record_into(ms_ctx *ctx, ms_recorder *rec) {
    ms_ctx_set_sink(ctx, rec, rec ? &ms_recorder_sink : NULL);
}
