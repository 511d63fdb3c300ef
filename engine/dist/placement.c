/* placement.c - placements: parsing, printing, validation, the split rule and boxes. */
#include "engine/dist/placement.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool ms_placement_eq(ms_placement a, ms_placement b) {
    if (a.kind != b.kind) return false;
    if (a.kind == MS_PL_SHARD) return a.dim == b.dim && a.order == b.order;
    if (a.kind == MS_PL_PARTIAL) return a.reduce == b.reduce;
    return true;
}

bool ms_placement_same_kind(ms_placement a, ms_placement b) {
    if (a.kind != b.kind) return false;
    if (a.kind == MS_PL_SHARD) return a.dim == b.dim;
    if (a.kind == MS_PL_PARTIAL) return a.reduce == b.reduce;
    return true;
}

ms_placements ms_placements_replicated(int n) {
    ms_placements pl = {.n = n};
    for (int m = 0; m < n; m++) pl.p[m] = ms_pl_replicate();
    return pl;
}

bool ms_placements_eq(const ms_placements *a, const ms_placements *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (!ms_placement_eq(a->p[i], b->p[i])) return false;
    return true;
}

void ms_placements_default_order(ms_placements *pl) {
    for (int m = 0; m < pl->n; m++) {
        if (pl->p[m].kind != MS_PL_SHARD) {
            pl->p[m].order = 0;
            continue;
        }
        int k = 0;
        for (int e = 0; e < m; e++)
            if (pl->p[e].kind == MS_PL_SHARD && pl->p[e].dim == pl->p[m].dim) k++;
        pl->p[m].order = (int8_t)k;
    }
}

int ms_shard_chain(const ms_placements *pl, int d, int *mesh_dims) {
    int n = 0;
    for (int k = 0; k < pl->n; k++)
        for (int m = 0; m < pl->n; m++)
            if (pl->p[m].kind == MS_PL_SHARD && pl->p[m].dim == d && pl->p[m].order == k)
                mesh_dims[n++] = m;
    return n;
}

bool ms_placements_has_partial(const ms_placements *pl) {
    for (int m = 0; m < pl->n; m++)
        if (pl->p[m].kind == MS_PL_PARTIAL) return true;
    return false;
}

ms_status ms_placements_validate(const ms_placements *pl, int mesh_ndim, int tensor_ndim,
                                 ms_error *err) {
    char buf[128];
    if (pl->n != mesh_ndim)
        return ms_fail(err, MS_ERR_INVALID,
                       "placements %s have %d entries but the mesh has %d dims; give one "
                       "placement per mesh dim",
                       ms_placements_str(pl, buf, sizeof buf), pl->n, mesh_ndim);
    int lin = 0, maxop = -1, minop = -1;
    for (int m = 0; m < pl->n; m++) {
        ms_placement p = pl->p[m];
        if (p.kind == MS_PL_SHARD) {
            if (p.dim < 0 || p.dim >= tensor_ndim)
                return ms_fail(err, MS_ERR_INVALID,
                               "placements %s: S(%d) on mesh dim %d, but the tensor has %d dims "
                               "(valid: S(0)..S(%d))",
                               ms_placements_str(pl, buf, sizeof buf), p.dim, m, tensor_ndim,
                               tensor_ndim - 1);
            int count = 0, seen = 0;
            for (int e = 0; e < pl->n; e++)
                if (pl->p[e].kind == MS_PL_SHARD && pl->p[e].dim == p.dim) {
                    count++;
                    if (pl->p[e].order == p.order) seen++;
                }
            if (p.order < 0 || p.order >= count || seen != 1)
                return ms_fail(err, MS_ERR_INVALID,
                               "placements %s: the nesting orders of the mesh dims sharding "
                               "tensor dim %d must be 0..%d, each once",
                               ms_placements_str(pl, buf, sizeof buf), p.dim, count - 1);
        } else if (p.kind == MS_PL_PARTIAL) {
            if (p.reduce >= MS_REDUCE_COUNT)
                return ms_fail(err, MS_ERR_INVALID, "placements: unknown partial op %d", p.reduce);
            if (p.reduce == MS_REDUCE_SUM || p.reduce == MS_REDUCE_AVG) lin++;
            if (p.reduce == MS_REDUCE_MAX) maxop = m;
            if (p.reduce == MS_REDUCE_MIN) minop = m;
        } else if (p.kind != MS_PL_REPLICATE) {
            return ms_fail(err, MS_ERR_INVALID, "placements: unknown kind %d", p.kind);
        }
    }
    if ((maxop >= 0) + (minop >= 0) + (lin > 0) > 1)
        return ms_fail(err, MS_ERR_INVALID,
                       "placements %s mix partial ops that do not commute (sum/avg with max or "
                       "min, or max with min); reduce one of them first",
                       ms_placements_str(pl, buf, sizeof buf));
    return MS_OK;
}

static const char *skip_ws(const char *p) {
    while (isspace((unsigned char)*p)) p++;
    return p;
}

/* Matches a word case-insensitively; advances *p on success. */
static bool eat_word(const char **p, const char *w) {
    size_t n = strlen(w);
    if (strncasecmp(*p, w, n) != 0) return false;
    *p += n;
    return true;
}

ms_status ms_placements_parse(const char *text, ms_placements *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    char safe[MS_SAFE_LEN], at[MS_SAFE_LEN]; /* the text may come from a file */
    const char *p = skip_ws(text);
    bool bracket = *p == '[';
    if (bracket) p++;
    bool explicit_order = false, implicit_order = false;
    for (;;) {
        p = skip_ws(p);
        if (*p == ']' || *p == '\0') break;
        if (out->n == MS_MESH_MAX_DIMS)
            return ms_fail(err, MS_ERR_INVALID, "placements '%s': more than %d entries",
                           ms_safe_str(safe, sizeof safe, text), MS_MESH_MAX_DIMS);
        ms_placement pl;
        const char *start = p;
        if (eat_word(&p, "Replicate") || eat_word(&p, "R")) {
            pl = ms_pl_replicate();
            p = skip_ws(p);
            if (*p == '(') {
                p = skip_ws(p + 1);
                if (*p != ')') goto bad;
                p++;
            }
        } else if (eat_word(&p, "Shard") || eat_word(&p, "S")) {
            p = skip_ws(p);
            if (*p != '(') goto bad;
            char *end;
            long d = strtol(p + 1, &end, 10);
            if (end == p + 1 || d < 0 || d > 127) goto bad;
            pl = ms_pl_shard((int)d);
            p = skip_ws(end);
            if (*p == ',') {
                long k = strtol(p + 1, &end, 10);
                if (end == p + 1 || k < 0 || k >= MS_MESH_MAX_DIMS) goto bad;
                pl.order = (int8_t)k;
                explicit_order = true;
                p = skip_ws(end);
            } else {
                implicit_order = true;
            }
            if (*p != ')') goto bad;
            p++;
        } else if (eat_word(&p, "Partial") || eat_word(&p, "P")) {
            p = skip_ws(p);
            ms_reduce_op op = MS_REDUCE_SUM;
            if (*p == '(') {
                p = skip_ws(p + 1);
                int found = -1;
                for (int o = 0; o < MS_REDUCE_COUNT; o++)
                    if (eat_word(&p, ms_reduce_op_name((ms_reduce_op)o))) {
                        found = o;
                        break;
                    }
                if (found < 0) {
                    p = skip_ws(p);
                    if (*p != ')') goto bad;
                } else {
                    op = (ms_reduce_op)found;
                }
                p = skip_ws(p);
                if (*p != ')') goto bad;
                p++;
            }
            pl = ms_pl_partial(op);
        } else {
            goto bad;
        }
        out->p[out->n++] = pl;
        p = skip_ws(p);
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == ']' || *p == '\0') break;
        (void)start;
        goto bad;
    }
    if (bracket && *p != ']')
        return ms_fail(err, MS_ERR_INVALID, "placements '%s': missing ']'",
                       ms_safe_str(safe, sizeof safe, text));
    if (bracket) p++;
    p = skip_ws(p);
    if (*p) goto bad;
    if (out->n == 0)
        return ms_fail(err, MS_ERR_INVALID, "placements '%s' are empty; write e.g. [S(0), R]",
                       ms_safe_str(safe, sizeof safe, text));
    if (explicit_order && implicit_order)
        return ms_fail(err, MS_ERR_INVALID,
                       "placements '%s': give the nesting order for all shards (S(d,k)) or none",
                       ms_safe_str(safe, sizeof safe, text));
    if (!explicit_order) ms_placements_default_order(out);
    return MS_OK;
bad:
    return ms_fail(err, MS_ERR_INVALID,
                   "placements '%s': cannot parse at '%s'; expected e.g. [S(0), R, P(sum)] with "
                   "entries R, S(dim), S(dim,order) or P(sum|avg|max|min)",
                   ms_safe_str(safe, sizeof safe, text), ms_safe_str(at, sizeof at, p));
}

static bool order_is_default(const ms_placements *pl, int m) {
    int k = 0;
    for (int e = 0; e < m; e++)
        if (pl->p[e].kind == MS_PL_SHARD && pl->p[e].dim == pl->p[m].dim) k++;
    return pl->p[m].order == k;
}

char *ms_placement_str(ms_placement p, char *buf, size_t len) {
    if (p.kind == MS_PL_SHARD)
        snprintf(buf, len, "S(%d)", p.dim);
    else if (p.kind == MS_PL_PARTIAL)
        snprintf(buf, len, "P(%s)", ms_reduce_op_name((ms_reduce_op)p.reduce));
    else
        snprintf(buf, len, "R");
    return buf;
}

char *ms_placements_str(const ms_placements *pl, char *buf, size_t len) {
    bool all_default = true;
    for (int m = 0; m < pl->n; m++)
        if (pl->p[m].kind == MS_PL_SHARD && !order_is_default(pl, m)) all_default = false;
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int m = 0; m < pl->n && n < len; m++) {
        ms_placement p = pl->p[m];
        const char *sep = m ? ", " : "";
        if (p.kind == MS_PL_SHARD && !all_default)
            n += (size_t)snprintf(buf + n, len - n, "%sS(%d,%d)", sep, p.dim, p.order);
        else {
            char one[16];
            n += (size_t)snprintf(buf + n, len - n, "%s%s", sep,
                                  ms_placement_str(p, one, sizeof one));
        }
    }
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

void ms_split_part(int64_t n, int parts, int index, int64_t *offset, int64_t *len) {
    int64_t base = n / parts, extra = n % parts;
    *len = base + (index < extra ? 1 : 0);
    *offset = index * base + (index < extra ? index : extra);
}

void ms_local_box(const ms_placements *pl, const ms_mesh *mesh, const int *coords, int ndim,
                  const int64_t *gshape, int64_t *start, int64_t *len) {
    for (int d = 0; d < ndim; d++) {
        start[d] = 0;
        len[d] = gshape[d];
        int chain[MS_MESH_MAX_DIMS];
        int n = ms_shard_chain(pl, d, chain);
        for (int i = 0; i < n; i++) {
            int m = chain[i];
            int64_t off, l;
            ms_split_part(len[d], mesh->shape[m], coords[m], &off, &l);
            start[d] += off;
            len[d] = l;
        }
    }
}
