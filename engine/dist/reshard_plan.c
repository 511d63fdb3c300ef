/* reshard_plan.c - placeholder while the planner is written (same session). */
#include "dist/reshard.h"
#include <stdlib.h>
struct ms_plan_cache { int unused; };
struct ms_plan_cache *ms_plan_cache_create(void) { return calloc(1, sizeof(struct ms_plan_cache)); }
void ms_plan_cache_destroy(struct ms_plan_cache *c) { free(c); }
