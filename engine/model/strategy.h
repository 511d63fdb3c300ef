/* strategy.h - parallel strategies as placement annotations on a model's named values.
 *
 * A strategy is a mesh (dims named dp, tp, ...) plus rules "values whose name matches this
 * pattern get these placements". The built-in Megatron rules for tp:
 *   attention: c_attn weight/bias sharded by heads (column-parallel), c_proj weight by
 *   rows (row-parallel); MLP: c_fc column-parallel, c_proj row-parallel; the tied
 *   embedding vocab-parallel. The residual stream is replicated over tp, or, with sp,
 *   sharded on the sequence dim (so LayerNorm and dropout run on a slice of the sequence
 *   and the all-reduces become reduce-scatter + all-gather pairs). Data parallelism shards
 *   the batch dim of inputs and activations over dp. A third mesh dim, cp (context
 *   parallel), shards the sequence dim of the inputs and the residual stream over its own
 *   group; the attention rule, which needs whole sequences, makes the completion pass move
 *   qkv from sequence- to head-sharding with an all-to-all (as DeepSpeed-Ulysses does).
 *   Everything else the completion pass infers from the operators' SPMD rules.
 */
#ifndef MS_STRATEGY_H
#define MS_STRATEGY_H

#include <stdbool.h>

#include "engine/dist/mesh.h"
#include "engine/graph/graph.h"

#define MS_STRATEGY_MAX_RULES 64

typedef struct ms_strategy_rule {
    char pattern[96]; /* glob: '*' matches any run of characters */
    ms_placements pl; /* one entry per mesh dim */
} ms_strategy_rule;

typedef struct ms_strategy {
    int dp, tp, cp; /* cp > 1 adds the third mesh dim */
    bool sp;
    int n_rules; /* explicit rules (from JSON), tried before the built-in ones */
    ms_strategy_rule rules[MS_STRATEGY_MAX_RULES];
    char text[64]; /* "dp2 x tp2 +sp" */
} ms_strategy;

/* Checks mesh degrees wherever they are parsed (flags, strategy files, live switches): each
 * at least 1, their product at most MS_MESH_MAX_RANKS (computed without overflow) and, when
 * world > 0, equal to it. On success *ranks (may be NULL) is the product; errors name every
 * degree. */
ms_status ms_strategy_check_degrees(int dp, int tp, int cp, int world, int *ranks, ms_error *err);

/* dp x tp (+ sp) (x cp) with the built-in rules. Errors: those of ms_strategy_check_degrees
 * (world unknown); sp without tp > 1. */
ms_status ms_strategy_init(ms_strategy *s, int dp, int tp, int cp, bool sp, ms_error *err);
int ms_strategy_ranks(const ms_strategy *s);

/* Loads a strategy JSON file:
 *   {"mesh": {"dp": 2, "tp": 2}, "sp": false,
 *    "placements": {"h.*.mlp.c_fc.weight": "[R, S(1)]", ...}}
 * "placements" (optional) holds glob patterns over value names, tried before the built-in
 * rules. Errors name the file and the JSON path, e.g. "s.json: $.mesh.tp: expected a
 * positive integer". ms_strategy_from_json also takes the short form the live control API
 * uses, {"dp": 2, "tp": 2, "cp": 1, "sp": false} (degrees at the top level, no patterns). */
ms_status ms_strategy_load(const char *path, ms_strategy *s, ms_error *err);
ms_status ms_strategy_from_json(const char *json, size_t len, const char *name, ms_strategy *s,
                                ms_error *err);

/* The mesh "dp=D,tp=T" (",cp=C" when cp > 1) over world ranks 0..ranks-1. */
ms_status ms_strategy_mesh(const ms_strategy *s, ms_mesh *out, ms_error *err);

/* Checks the strategy against a model: tp (times cp) must divide the heads. */
ms_status ms_strategy_check_model(const ms_strategy *s, int n_head, int n_embd, ms_error *err);

/* The ms_shard_fn for ms_compile_opts (user = the strategy). */
bool ms_strategy_shard(void *user, const char *name, const ms_shape *shape, int mesh_ndim,
                       ms_placements *pl);

bool ms_glob_match(const char *pattern, const char *s);

#endif
