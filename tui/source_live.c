/* source_live.c - the TUI's source in the same process: the live model's snapshots and
 * control queue. Both calls are built for this (a pointer copy under the live model's
 * snapshot mutex; a bounded queue), so the UI thread never waits on a training step. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/core/xalloc.h"
#include "tui/source.h"

typedef struct live_src {
    ms_live *live;
    bool have;
    uint64_t version;
} live_src;

static const ms_snapshot *live_poll(void *self) {
    live_src *ls = self;
    if (ls->have && ms_live_version(ls->live) == ls->version) return NULL;
    const ms_snapshot *s = ms_live_acquire(ls->live);
    if (!s) return NULL;
    if (ls->have && s->version == ls->version) {
        ms_snapshot_release(s);
        return NULL;
    }
    ls->have = true;
    ls->version = s->version;
    return s;
}

static void live_release(void *self, const ms_snapshot *s) {
    (void)self;
    if (s) ms_snapshot_release(s);
}

static ms_status live_post(void *self, const ms_live_req *req, ms_error *err) {
    live_src *ls = self;
    return ms_live_post(ls->live, req, err);
}

static bool live_trouble(void *self, char *buf, size_t cap) {
    (void)self, (void)buf, (void)cap;
    return false;
}

static void live_destroy(void *self) {
    free(self);
}

static const ms_tui_source_ops live_ops = {
    .poll = live_poll,
    .release = live_release,
    .post = live_post,
    .trouble = live_trouble,
    .destroy = live_destroy,
};

ms_tui_source *ms_tui_source_live(ms_live *live) {
    live_src *ls = xcalloc(1, sizeof *ls);
    ls->live = live;
    ms_tui_source *s = xcalloc(1, sizeof *s);
    s->ops = &live_ops;
    s->self = ls;
    s->in_process = true;
    snprintf(s->where, sizeof s->where, "in-process");
    return s;
}

void ms_tui_source_destroy(ms_tui_source *s) {
    if (!s) return;
    if (s->ops && s->ops->destroy) s->ops->destroy(s->self);
    free(s);
}
