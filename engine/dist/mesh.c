/* mesh.c - ProcessMesh construction, validation, coordinates, groups and sub-meshes. */
#include "engine/dist/mesh.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core/xalloc.h"

ms_status ms_mesh_init(ms_mesh *m, int ndim, const int *shape, const char *const *names,
                       const int *ranks, ms_error *err) {
    memset(m, 0, sizeof *m);
    if (ndim < 1 || ndim > MS_MESH_MAX_DIMS)
        return ms_fail(err, MS_ERR_INVALID, "mesh has %d dims; meshscope supports 1 to %d", ndim,
                       MS_MESH_MAX_DIMS);
    long long size = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0)
            return ms_fail(err, MS_ERR_INVALID,
                           "mesh dim %d has size %d; every mesh dim must be positive", d, shape[d]);
        size *= shape[d];
        if (size > MS_MESH_MAX_RANKS)
            return ms_fail(err, MS_ERR_INVALID, "mesh has more than %d ranks", MS_MESH_MAX_RANKS);
    }
    for (int d = 0; d < ndim; d++) {
        const char *nm = names ? names[d] : NULL;
        if (nm && (!*nm || strlen(nm) >= MS_MESH_NAME_MAX))
            return ms_fail(err, MS_ERR_INVALID, "mesh dim %d name '%s' must have 1 to %d chars", d,
                           nm, MS_MESH_NAME_MAX - 1);
        if (nm)
            snprintf(m->names[d], MS_MESH_NAME_MAX, "%s", nm);
        else
            snprintf(m->names[d], MS_MESH_NAME_MAX, "d%d", d);
        for (int e = 0; e < d; e++)
            if (!strcmp(m->names[e], m->names[d]))
                return ms_fail(err, MS_ERR_INVALID, "mesh dims %d and %d are both named '%s'", e, d,
                               m->names[d]);
    }
    if (ranks) {
        for (long long i = 0; i < size; i++) {
            if (ranks[i] < 0)
                return ms_fail(err, MS_ERR_INVALID, "mesh rank id %d at position %lld is negative",
                               ranks[i], i);
            for (long long j = 0; j < i; j++)
                if (ranks[j] == ranks[i])
                    return ms_fail(err, MS_ERR_INVALID,
                                   "mesh rank id %d appears twice (positions %lld and %lld); "
                                   "each rank may appear once",
                                   ranks[i], j, i);
        }
    }
    m->ndim = ndim;
    m->size = (int)size;
    for (int d = 0; d < ndim; d++) m->shape[d] = shape[d];
    m->ranks = xmalloc(sizeof(int) * (size_t)size);
    for (int i = 0; i < m->size; i++) m->ranks[i] = ranks ? ranks[i] : i;
    return MS_OK;
}

void ms_mesh_free(ms_mesh *m) {
    if (!m) return;
    free(m->ranks);
    memset(m, 0, sizeof *m);
}

ms_status ms_mesh_copy(ms_mesh *dst, const ms_mesh *src, ms_error *err) {
    const char *names[MS_MESH_MAX_DIMS];
    for (int d = 0; d < src->ndim; d++) names[d] = src->names[d];
    return ms_mesh_init(dst, src->ndim, src->shape, names, src->ranks, err);
}

ms_status ms_mesh_parse(ms_mesh *m, const char *text, ms_error *err) {
    int shape[MS_MESH_MAX_DIMS];
    char names[MS_MESH_MAX_DIMS][MS_MESH_NAME_MAX];
    const char *name_ptrs[MS_MESH_MAX_DIMS] = {0};
    int ndim = 0;
    const char *p = text;
    while (isspace((unsigned char)*p) || *p == '[') p++;
    while (*p && *p != ']') {
        if (ndim == MS_MESH_MAX_DIMS)
            return ms_fail(err, MS_ERR_INVALID, "mesh '%s' has more than %d dims", text,
                           MS_MESH_MAX_DIMS);
        const char *eq = NULL;
        for (const char *q = p; *q && *q != 'x' && *q != ',' && *q != ']'; q++)
            if (*q == '=') eq = q;
        if (eq) {
            size_t n = (size_t)(eq - p);
            while (n && isspace((unsigned char)p[n - 1])) n--;
            if (n == 0 || n >= MS_MESH_NAME_MAX)
                return ms_fail(err, MS_ERR_INVALID, "mesh '%s': bad dim name", text);
            memcpy(names[ndim], p, n);
            names[ndim][n] = '\0';
            name_ptrs[ndim] = names[ndim];
            p = eq + 1;
        }
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            return ms_fail(err, MS_ERR_INVALID,
                           "mesh '%s': expected a size at '%s' (forms: 2x2, dp=2,tp=2, [2,3])",
                           text, p);
        if (v <= 0 || v > MS_MESH_MAX_RANKS)
            return ms_fail(err, MS_ERR_INVALID,
                           "mesh '%s': dim %d has size %ld; every mesh dim must be positive", text,
                           ndim, v);
        shape[ndim++] = (int)v;
        p = end;
        while (isspace((unsigned char)*p)) p++;
        if (*p == 'x' || *p == ',') p++;
        while (isspace((unsigned char)*p)) p++;
    }
    if (ndim == 0) return ms_fail(err, MS_ERR_INVALID, "mesh '%s' has no dims", text);
    return ms_mesh_init(m, ndim, shape, name_ptrs, NULL, err);
}

ms_status ms_mesh_check_subset(const ms_mesh *m, int world, ms_error *err) {
    for (int i = 0; i < m->size; i++)
        if (m->ranks[i] >= world)
            return ms_fail(err, MS_ERR_INVALID,
                           "mesh rank id %d is outside the world of %d ranks (0..%d)", m->ranks[i],
                           world, world - 1);
    return MS_OK;
}

ms_status ms_mesh_check_world(const ms_mesh *m, int world, ms_error *err) {
    if (m->size != world)
        return ms_fail(err, MS_ERR_INVALID,
                       "mesh has %d ranks but the world has %d; make the product of the mesh "
                       "dims equal the number of ranks",
                       m->size, world);
    return ms_mesh_check_subset(m, world, err);
}

int ms_mesh_index_of(const ms_mesh *m, int rank) {
    for (int i = 0; i < m->size; i++)
        if (m->ranks[i] == rank) return i;
    return -1;
}

bool ms_mesh_contains(const ms_mesh *m, int rank) {
    return ms_mesh_index_of(m, rank) >= 0;
}

bool ms_mesh_coords(const ms_mesh *m, int rank, int *coords) {
    int idx = ms_mesh_index_of(m, rank);
    if (idx < 0) return false;
    for (int d = m->ndim - 1; d >= 0; d--) {
        coords[d] = idx % m->shape[d];
        idx /= m->shape[d];
    }
    return true;
}

int ms_mesh_rank_at(const ms_mesh *m, const int *coords) {
    int idx = 0;
    for (int d = 0; d < m->ndim; d++) idx = idx * m->shape[d] + coords[d];
    return m->ranks[idx];
}

int ms_mesh_dim_by_name(const ms_mesh *m, const char *name) {
    for (int d = 0; d < m->ndim; d++)
        if (!strcmp(m->names[d], name)) return d;
    return -1;
}

ms_status ms_mesh_dim_group(const ms_mesh *m, int rank, int dim, int *out, ms_error *err) {
    int c[MS_MESH_MAX_DIMS];
    if (dim < 0 || dim >= m->ndim)
        return ms_fail(err, MS_ERR_INVALID, "mesh dim %d out of range (mesh has %d dims)", dim,
                       m->ndim);
    if (!ms_mesh_coords(m, rank, c))
        return ms_fail(err, MS_ERR_INVALID, "rank %d is not in the mesh", rank);
    for (int i = 0; i < m->shape[dim]; i++) {
        c[dim] = i;
        out[i] = ms_mesh_rank_at(m, c);
    }
    return MS_OK;
}

ms_status ms_mesh_submesh(const ms_mesh *m, int rank, const bool *keep, ms_mesh *out,
                          ms_error *err) {
    int c[MS_MESH_MAX_DIMS];
    if (!ms_mesh_coords(m, rank, c))
        return ms_fail(err, MS_ERR_INVALID, "rank %d is not in the mesh", rank);
    int shape[MS_MESH_MAX_DIMS], kd[MS_MESH_MAX_DIMS], nk = 0;
    const char *names[MS_MESH_MAX_DIMS];
    for (int d = 0; d < m->ndim; d++)
        if (keep[d]) {
            kd[nk] = d;
            names[nk] = m->names[d];
            shape[nk++] = m->shape[d];
        }
    if (nk == 0) return ms_fail(err, MS_ERR_INVALID, "sub-mesh keeps no dims");
    int size = 1;
    for (int i = 0; i < nk; i++) size *= shape[i];
    int *ranks = xmalloc(sizeof(int) * (size_t)size);
    for (int i = 0; i < size; i++) {
        int rem = i;
        for (int k = nk - 1; k >= 0; k--) {
            c[kd[k]] = rem % shape[k];
            rem /= shape[k];
        }
        ranks[i] = ms_mesh_rank_at(m, c);
    }
    ms_status st = ms_mesh_init(out, nk, shape, names, ranks, err);
    free(ranks);
    return st;
}

ms_status ms_mesh_slice(const ms_mesh *m, int dim, int index, ms_mesh *out, ms_error *err) {
    if (dim < 0 || dim >= m->ndim || index < 0 || index >= m->shape[dim])
        return ms_fail(err, MS_ERR_INVALID, "mesh slice dim %d index %d out of range", dim, index);
    if (m->ndim == 1) return ms_fail(err, MS_ERR_INVALID, "cannot slice a 1-d mesh to 0 dims");
    int c[MS_MESH_MAX_DIMS] = {0};
    c[dim] = index;
    bool keep[MS_MESH_MAX_DIMS];
    for (int d = 0; d < m->ndim; d++) keep[d] = d != dim;
    return ms_mesh_submesh(m, ms_mesh_rank_at(m, c), keep, out, err);
}

char *ms_mesh_str(const ms_mesh *m, char *buf, size_t len) {
    size_t n = 0;
    for (int d = 0; d < m->ndim && n < len; d++)
        n +=
            (size_t)snprintf(buf + n, len - n, "%s%s=%d", d ? " x " : "", m->names[d], m->shape[d]);
    if (n < len) n += (size_t)snprintf(buf + n, len - n, " [");
    for (int i = 0; i < m->size && n + 8 < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%d", i ? "," : "", m->ranks[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}
