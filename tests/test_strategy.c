/* test_strategy.c - the strategy value: its parser, name, short JSON, identity and validator.
 *
 * - The parser against a table of good inputs (each with the name it must get) and bad ones
 *   (each with the words its message must contain).
 * - Round trip: parsing the short JSON of a few thousand strategies gives them back, and
 *   distinct strategies get distinct names.
 * - ms_strategy_equal tells every knob apart.
 * - The validator: one refusal per rule, in words that name the problem; what the planner
 *   prices but the engine does not run is refused as such.
 * - Files: a missing path and a folder are named as such.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/plan/validate.h"
#include "tests/testkit.h"

static ms_strategy plain(int dp, int tp, int cp, bool sp) {
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_init(&s, dp, tp, cp, sp, &err), MS_OK);
    return s;
}

/* --- the parser: good inputs ------------------------------------------------------------------ */

static void parses_good_inputs(void **state) {
    (void)state;
    static const struct {
        const char *json, *name;
    } good[] = {
        {"{\"dp\": 2, \"tp\": 2}", "dp2 x tp2"},
        {"{\"dp\": 2, \"tp\": 2, \"sp\": true}", "dp2 x tp2 +sp"},
        {"{\"dp\": 2, \"tp\": 2, \"cp\": 1, \"sp\": false}", "dp2 x tp2"},
        {"{\"mesh\": {\"dp\": 1, \"tp\": 2, \"cp\": 2}, \"sp\": true}", "dp1 x tp2 +sp x cp2"},
        {"{\"mesh\": {\"dp\": 4}}", "dp4 x tp1"},
        {"  {\"dp\": 4}\n\t ", "dp4 x tp1"},
        {"{\"dp\": 2, \"pp\": 2, \"zero\": 1, \"recompute\": true, \"precision\": \"bf16\"}",
         "dp2 x tp1 x pp2 zero1 recompute bf16"},
        {"{\"dp\": 1, \"recompute\": \"selective\"}", "dp1 x tp1 selective-recompute"},
        {"{\"dp\": 1, \"recompute\": false, \"precision\": \"fp32\"}", "dp1 x tp1"},
        {"{\"dp\": 1, \"recompute\": \"none\", \"zero\": 0}", "dp1 x tp1"},
        {"{\"dp\": 4, \"micro_batch\": 2}", "dp4 x tp1 mb2"},
        {"{\"dp\": 4, \"micro_batches\": 4}", "dp4 x tp1 m4"},
        {"{\"dp\": 4, \"micro_batches\": 1, \"micro_batch\": 2}", "dp4 x tp1 m1 mb2"},
        {"{\"pp\": 4, \"schedule\": \"interleaved\", \"virtual_stages\": 2}",
         "dp1 x tp1 x pp4 interleaved v2"},
        {"{\"pp\": 2, \"schedule\": \"zb-h1\", \"pp_layers\": [3, 1]}",
         "dp1 x tp1 x pp2 zb-h1 layers=3,1"},
        {"{\"dp\": 2, \"bucket_mb\": 25}", "dp2 x tp1 bucket25MB"},
        {"{\"tp\": 2, \"head_replicated\": true}", "dp1 x tp2 head-replicated"},
        {"{\"tp\": 2, \"head_replicated\": false}", "dp1 x tp2"},
        {"{\"dp\": 2, \"bucket_mb\": 0}", "dp2 x tp1"}, /* as --bucket-mb 0: no buckets */
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        ms_strategy s;
        ms_error err = {0};
        ms_status st =
            ms_strategy_parse_json(good[i].json, strlen(good[i].json), "t", &s, NULL, &err);
        if (st != MS_OK) fail_msg("%s: %s", good[i].json, err.msg);
        char name[MS_STRATEGY_NAME_MAX];
        ms_strategy_name(&s, name, sizeof name);
        if (strcmp(name, good[i].name))
            fail_msg("%s: named '%s', want '%s'", good[i].json, name, good[i].name);
    }
    /* the fields behind the names */
    ms_strategy s;
    ms_error err = {0};
    const char *j = "{\"dp\": 4, \"micro_batch\": 2}";
    assert_int_equal(ms_strategy_parse_json(j, strlen(j), "t", &s, NULL, &err), MS_OK);
    int mb = 0, m = 0;
    assert_int_equal(s.micro_batches, 0);
    assert_true(ms_strategy_micro(&s, 32, &mb, &m) && mb == 2 && m == 4);
    assert_false(ms_strategy_micro(&s, 12, &mb, &m)); /* 3 per rank: no size-2 micro-batches */
    j = "{\"mesh\": {\"dp\": 1, \"tp\": 2}, \"placements\": {\"h.*.mlp.c_fc.weight\": \"[R, "
        "S(1)]\", "
        "\"wte.weight\": \"[R, R]\"}}";
    ms_placement_rules rules;
    assert_int_equal(ms_strategy_parse_json(j, strlen(j), "f.json", &s, &rules, &err), MS_OK);
    assert_int_equal(rules.n, 2);
    assert_string_equal(rules.r[0].pattern, "h.*.mlp.c_fc.weight");
    assert_int_equal(rules.r[0].pl.n, 2);
    /* recompute: true and "full" are the same knob */
    ms_strategy a, b;
    const char *ja = "{\"dp\": 1, \"recompute\": true}",
               *jb = "{\"dp\": 1, \"recompute\": \"full\"}";
    assert_int_equal(ms_strategy_parse_json(ja, strlen(ja), "a", &a, NULL, &err), MS_OK);
    assert_int_equal(ms_strategy_parse_json(jb, strlen(jb), "b", &b, NULL, &err), MS_OK);
    assert_true(ms_strategy_equal(&a, &b));
    /* the plain short form is the one the dashboard has always shown */
    char buf[MS_STRATEGY_JSON_MAX];
    ms_strategy p = plain(2, 2, 1, false);
    assert_string_equal(ms_strategy_short_json(&p, buf, sizeof buf),
                        "{\"dp\": 2, \"tp\": 2, \"sp\": false}");
    p = plain(1, 2, 2, true);
    assert_string_equal(ms_strategy_short_json(&p, buf, sizeof buf),
                        "{\"dp\": 1, \"tp\": 2, \"sp\": true, \"cp\": 2}");
}

/* --- the parser: bad inputs ------------------------------------------------------------------- */

static void refuses_bad_inputs(void **state) {
    (void)state;
    static const struct {
        const char *json;
        bool with_rules;
        const char *want[2];
    } bad[] = {
        {"{\"dp\": 2,", false, {"malformed JSON", NULL}},
        {"", false, {"malformed JSON", NULL}},
        {"{\"dp\": 2} x", false, {"text after the JSON value", NULL}},
        {"{\"dp\": 2}{\"dp\": 4}", false, {"text after the JSON value", NULL}},
        {"[1, 2]", false, {"$: expected an object", NULL}},
        {"{\"dp\": 2, \"dp\": 4}", false, {"$.dp: duplicate key", NULL}},
        {"{\"mesh\": {\"tp\": 2, \"tp\": 4}}", false, {"$.mesh.tp: duplicate key", NULL}},
        {"{\"dp\": 2, \"tq\": 2}", false, {"$.tq: unknown key", "did you mean \"tp\""}},
        {"{\"dp\": 2, \"zeros\": 1}", false, {"$.zeros", "did you mean \"zero\""}},
        {"{\"dp\": 2, \"microbatches\": 4}", false, {"$.microbatches", "\"micro_batches\""}},
        {"{\"dp\": 2, \"percision\": \"bf16\"}", false, {"$.percision", "\"precision\""}},
        {"{\"mesh\": {\"dp\": 2, \"sp\": true}}", false, {"$.mesh.sp: unknown key", NULL}},
        {"{\"mesh\": 3}", false, {"$.mesh: expected an object", NULL}},
        {"{\"mesh\": {\"dp\": 2}, \"tp\": 2}", false, {"$.tp", "not both"}},
        {"{\"sp\": true}", false, {"no degrees", NULL}},
        {"{\"dp\": 0}", false, {"$.dp", "1..65536"}},
        {"{\"dp\": 1.5}", false, {"$.dp", "got 1.5"}},
        {"{\"dp\": \"two\"}", false, {"$.dp", "\"two\""}},
        {"{\"dp\": 1e300}", false, {"$.dp", "a degree"}},
        {"{\"mesh\": {\"dp\": 2, \"tp\": \"two\"}}", false, {"$.mesh.tp", NULL}},
        {"{\"dp\": 65536, \"tp\": 65536}", false, {"more than 16777216 ranks", NULL}},
        {"{\"dp\": 4096, \"tp\": 4096, \"pp\": 4096, \"cp\": 4096}", false, {"more than", NULL}},
        {"{\"dp\": 1, \"sp\": 1}", false, {"$.sp", "true or false"}},
        {"{\"dp\": 1, \"zero\": 4}", false, {"$.zero", "0..3"}},
        {"{\"dp\": 1, \"zero\": -1}", false, {"$.zero", "ZeRO stage"}},
        {"{\"dp\": 1, \"bucket_mb\": -5}", false, {"$.bucket_mb", "got -5"}},
        {"{\"dp\": 1, \"bucket_mb\": \"25\"}", false, {"$.bucket_mb", NULL}},
        {"{\"dp\": 1, \"precision\": \"fp16\"}", false, {"$.precision", "\"bf16\""}},
        {"{\"dp\": 1, \"recompute\": \"partial\"}", false, {"$.recompute", "\"selective\""}},
        {"{\"dp\": 1, \"recompute\": 1}", false, {"$.recompute", "true / false"}},
        {"{\"dp\": 1, \"schedule\": \"zigzag\"}", false, {"$.schedule", "\"zb-h1\""}},
        {"{\"dp\": 1, \"micro_batches\": 0}", false, {"$.micro_batches", "micro-batch count"}},
        {"{\"dp\": 1, \"micro_batch\": -2}", false, {"$.micro_batch", NULL}},
        {"{\"dp\": 1, \"virtual_stages\": 0}", false, {"$.virtual_stages", NULL}},
        {"{\"dp\": 1, \"pp_layers\": []}", false, {"$.pp_layers", "one per pipeline stage"}},
        {"{\"dp\": 1, \"pp_layers\": 4}", false, {"$.pp_layers", NULL}},
        {"{\"dp\": 1, \"pp_layers\": [2, 0]}", false, {"$.pp_layers[1]", "layer count"}},
        {"{\"dp\": 1, \"head_replicated\": \"no\"}", false, {"$.head_replicated", "true or false"}},
        {"{\"tp\": 2, \"vocab_parallel\": false}",
         false,
         {"$.vocab_parallel", "\"head_replicated\": true"}},
        {"{\"mesh\": {\"tp\": 2}, \"placements\": {\"x\": \"[R, R]\"}}",
         false,
         {"$.placements", "--strategy file"}},
        {"{\"mesh\": {\"tp\": 2}, \"placements\": {\"x\": \"[R]\"}}",
         true,
         {"$.placements[\"x\"]", NULL}},
        {"{\"mesh\": {\"tp\": 2}, \"placements\": {\"x\": 3}}",
         true,
         {"$.placements[\"x\"]", NULL}},
        {"{\"mesh\": {\"tp\": 2}, \"placements\": [1]}", true, {"$.placements", "an object"}},
        {"{\"mesh\": {\"tp\": 2}, \"placements\": {\"h.*\": \"[R, R]\", \"h.*\": \"[R, S(0)]\"}}",
         true,
         {"$.placements.h.*: duplicate key", NULL}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ms_strategy s;
        ms_placement_rules rules;
        ms_error err = {0};
        ms_status st = ms_strategy_parse_json(bad[i].json, strlen(bad[i].json), "in.json", &s,
                                              bad[i].with_rules ? &rules : NULL, &err);
        printf("refused %-60s %s\n", bad[i].json, err.msg);
        if (st != MS_ERR_INVALID) fail_msg("%s: accepted (status %d)", bad[i].json, st);
        if (strncmp(err.msg, "in.json: ", 9))
            fail_msg("%s: the message does not name the input: %s", bad[i].json, err.msg);
        for (int k = 0; k < 2; k++)
            if (bad[i].want[k] && !strstr(err.msg, bad[i].want[k]))
                fail_msg("%s: wanted '%s' in: %s", bad[i].json, bad[i].want[k], err.msg);
        if (bad[i].with_rules) assert_int_equal(rules.n, 0);
    }
    /* a length that stops inside the text: only that much is read */
    const char *j = "{\"dp\": 2} trailing";
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_parse_json(j, 9, "t", &s, NULL, &err), MS_OK);
    assert_int_equal(s.dp, 2);
}

/* --- round trip and names ------------------------------------------------------------------- */

static void round_trip_and_names(void **state) {
    (void)state;
    enum { N = 4096 };
    ms_strategy *all = calloc(N, sizeof *all);
    char(*names)[MS_STRATEGY_NAME_MAX] = calloc(N, sizeof *names);
    assert_non_null(all);
    assert_non_null(names);
    int n = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift: a fixed spread over every knob */
    while (n < N) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ms_strategy s;
        ms_strategy_defaults(&s);
        s.dp = 1 + (int)(x % 64);
        s.tp = 1 << (x >> 6) % 4;
        s.pp = 1 + (int)((x >> 8) % 4);
        s.cp = 1 + (int)((x >> 10) % 3);
        s.sp = (x >> 12) & 1;
        s.zero = (int)((x >> 13) % 4);
        s.recompute = (uint8_t)((x >> 15) % MS_RECOMPUTE_COUNT);
        s.precision = (uint8_t)((x >> 17) % MS_PRECISION_COUNT);
        s.micro_batches = (int)((x >> 18) % 5);
        s.micro_batch = s.micro_batches == 0 ? 1 + (int)((x >> 21) % 4) : (int)((x >> 21) % 3);
        s.schedule = (uint8_t)((x >> 23) % MS_SCHEDULE_COUNT);
        s.virtual_stages = 1 + (int)((x >> 25) % 3);
        if ((x >> 27) & 1)
            for (int i = 0; i < s.pp; i++) s.pp_layers[i] = (uint16_t)(1 + (x >> (28 + i)) % 7);
        s.bucket_mb = (x >> 33) & 1 ? (float)((x >> 34) % 1000) / 8 + 0.1f : 0;
        s.head_replicated = (x >> 44) & 1;
        char json[MS_STRATEGY_JSON_MAX];
        ms_strategy_short_json(&s, json, sizeof json);
        ms_strategy back;
        ms_error err = {0};
        if (ms_strategy_parse_json(json, strlen(json), "rt", &back, NULL, &err) != MS_OK)
            fail_msg("%s: %s", json, err.msg);
        if (!ms_strategy_equal(&s, &back)) fail_msg("%s does not parse back to itself", json);
        bool seen = false;
        for (int i = 0; i < n && !seen; i++) seen = ms_strategy_equal(&all[i], &s);
        if (seen) continue;
        all[n] = s;
        ms_strategy_name(&s, names[n], sizeof names[n]);
        assert_true(strlen(names[n]) < MS_STRATEGY_NAME_MAX - 1);
        n++;
    }
    /* a name shows every knob: distinct strategies, distinct names */
    for (int i = 0; i < n; i++)
        for (int k = i + 1; k < n; k++)
            if (!strcmp(names[i], names[k])) fail_msg("'%s' names two strategies", names[i]);
    printf("%d strategies round-tripped, e.g. %s\n", n, names[0]);
    /* the longest strategy fits the buffers */
    ms_strategy big;
    ms_strategy_defaults(&big);
    big.dp = big.tp = big.cp = 65536, big.pp = MS_STRATEGY_MAX_STAGES;
    big.sp = true, big.zero = 3, big.recompute = MS_RECOMPUTE_SELECTIVE;
    big.precision = MS_PRECISION_BF16, big.micro_batches = 1 << 24, big.micro_batch = 1 << 24;
    big.schedule = MS_SCHEDULE_INTERLEAVED, big.virtual_stages = 1024, big.bucket_mb = 1048575.5f;
    big.head_replicated = true;
    for (int i = 0; i < MS_STRATEGY_MAX_STAGES; i++) big.pp_layers[i] = 65535;
    char name[MS_STRATEGY_NAME_MAX + 1], json[MS_STRATEGY_JSON_MAX + 1];
    memset(name, 0, sizeof name);
    ms_strategy_name(&big, name, sizeof name);
    ms_strategy_short_json(&big, json, sizeof json);
    printf("longest: %zu bytes of name, %zu of JSON\n", strlen(name), strlen(json));
    assert_true(strlen(name) < MS_STRATEGY_NAME_MAX);
    assert_true(strlen(json) < MS_STRATEGY_JSON_MAX);
    /* truncation keeps the buffer terminated */
    char small[8];
    assert_string_equal(ms_strategy_name(&big, small, sizeof small), "dp65536");
    free(all);
    free(names);
}

static void equality(void **state) {
    (void)state;
    ms_strategy a = plain(2, 2, 1, true), b = a;
    assert_true(ms_strategy_equal(&a, &b));
    ms_strategy v[15];
    for (int i = 0; i < 15; i++) v[i] = a;
    v[0].dp = 4, v[1].tp = 4, v[2].pp = 2, v[3].cp = 2, v[4].sp = false, v[5].zero = 1;
    v[6].recompute = MS_RECOMPUTE_FULL, v[7].precision = MS_PRECISION_BF16;
    v[8].micro_batches = 2, v[9].micro_batch = 1, v[10].schedule = MS_SCHEDULE_GPIPE;
    v[11].virtual_stages = 2, v[12].pp_layers[0] = 3, v[13].bucket_mb = 25;
    v[14].head_replicated = true;
    for (int i = 0; i < 15; i++) {
        if (ms_strategy_equal(&a, &v[i])) fail_msg("knob %d not compared", i);
        assert_false(ms_strategy_equal(&v[i], &a));
    }
    /* overflow-safe size: ms_strategy_init refuses such a mesh, a hand-made value counts -1 */
    ms_strategy w;
    ms_error err = {0};
    assert_int_equal(ms_strategy_init(&w, 65536, 65536, 65536, false, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "needs more than"));
    ms_strategy_defaults(&w);
    w.dp = w.tp = w.cp = 65536;
    assert_int_equal(ms_strategy_ranks(&w), -1);
    w.dp = 0;
    assert_int_equal(ms_strategy_ranks(&w), -1);
    assert_int_equal(ms_strategy_ranks(&a), 4);
}

/* --- the validator ---------------------------------------------------------------------------- */

static ms_model_config tiny(void) {
    return (ms_model_config){.model_type = MS_MODEL_GPT2,
                             .n_layer = 4,
                             .n_head = 4,
                             .n_embd = 64,
                             .vocab_size = 256,
                             .n_positions = 128,
                             .layer_norm_epsilon = 1e-5};
}

static ms_strategy with(const char *json) {
    ms_strategy s;
    ms_error err = {0};
    if (ms_strategy_parse_json(json, strlen(json), "t", &s, NULL, &err) != MS_OK)
        fail_msg("%s: %s", json, err.msg);
    return s;
}

static void validator_refusals(void **state) {
    (void)state;
    ms_model_config cfg = tiny();
    ms_job_shape job = {.world = 4, .batch = 8, .seq = 64};
    ms_error err = {0};
    /* what the engine runs */
    const char *ok[] = {"{\"dp\": 4}",
                        "{\"dp\": 2, \"tp\": 2, \"sp\": true}",
                        "{\"tp\": 2, \"cp\": 2}",
                        "{\"tp\": 4, \"sp\": true}",
                        "{\"dp\": 4, \"micro_batches\": 1}",
                        "{\"dp\": 4, \"zero\": 1}",
                        "{\"dp\": 2, \"tp\": 2, \"zero\": 3}",
                        "{\"dp\": 2, \"pp\": 2, \"zero\": 2, \"micro_batches\": 2}",
                        "{\"dp\": 4, \"micro_batch\": 2}",
                        "{\"dp\": 4, \"micro_batches\": 2}",
                        "{\"dp\": 4, \"bucket_mb\": 25}",
                        "{\"dp\": 4, \"zero\": 2, \"bucket_mb\": 25}",
                        "{\"dp\": 4, \"micro_batch\": 1}",
                        "{\"dp\": 2, \"pp\": 2}",
                        "{\"dp\": 2, \"pp\": 2, \"micro_batches\": 2, \"schedule\": \"zb-h1\"}",
                        "{\"tp\": 2, \"pp\": 2, \"micro_batches\": 4, \"schedule\": \"gpipe\"}",
                        "{\"dp\": 2, \"pp\": 2, \"schedule\": \"interleaved\", "
                        "\"virtual_stages\": 2, \"micro_batches\": 2}",
                        "{\"dp\": 4, \"recompute\": true}",
                        "{\"dp\": 2, \"pp\": 2, \"recompute\": \"selective\"}",
                        "{\"dp\": 2, \"tp\": 2, \"zero\": 3, \"precision\": \"bf16\"}",
                        "{\"tp\": 4, \"head_replicated\": true}",
                        "{\"dp\": 2, \"tp\": 2, \"sp\": true, \"head_replicated\": true}"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        ms_strategy s = with(ok[i]);
        if (ms_strategy_validate(&s, &cfg, &job, 1e12, &err) != MS_OK)
            fail_msg("%s refused: %s", ok[i], err.msg);
    }
    /* a recompute mode the engine does not know stays an error */
    ms_strategy unknown = with("{\"dp\": 4}");
    unknown.recompute = MS_RECOMPUTE_COUNT;
    assert_int_equal(ms_strategy_validate(&unknown, &cfg, &job, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "unknown recompute mode 3"));
    /* not well-formed for this job */
    static const struct {
        const char *json;
        int world, batch, seq;
        const char *want;
    } bad[] = {
        {"{\"dp\": 2}", 4, 8, 64, "dp2 x tp1 needs 2 ranks but the job runs on 4"},
        {"{\"tp\": 8}", 8, 8, 64, "tensor-parallel degree 8 does not divide the 4 attention heads"},
        {"{\"tp\": 2, \"cp\": 4}", 8, 8, 64, "tp x cp = 8"},
        {"{\"pp\": 3, \"schedule\": \"interleaved\", \"virtual_stages\": 2, \"micro_batches\": 3}",
         3, 9, 64, "the interleaved schedule needs equal stages"},
        {"{\"pp\": 2, \"pp_layers\": [1, 1, 2]}", 2, 8, 64, "pp_layers lists 3 stages but pp is 2"},
        {"{\"pp\": 2, \"pp_layers\": [1, 2]}", 2, 8, 64,
         "pp_layers adds up to 3 layers but the model has 4"},
        {"{\"dp\": 4}", 4, 8, 256, "the sequence 256 exceeds n_positions 128"},
        {"{\"dp\": 1, \"cp\": 4}", 4, 8, 30, "cp 4 does not divide the sequence length 30"},
        {"{\"dp\": 4, \"sp\": true}", 4, 8, 64, "sp without tp"},
        {"{\"dp\": 4}", 4, 6, 64, "the batch 6 is not divisible by dp 4"},
        {"{\"dp\": 4, \"micro_batches\": 3}", 4, 8, 64,
         "3 micro-batches do not make the 2 sequences per dp rank"},
        {"{\"dp\": 4, \"micro_batch\": 3}", 4, 8, 64, "micro-batches of 3 sequences do not make"},
        {"{\"dp\": 4, \"micro_batches\": 2, \"micro_batch\": 2}", 4, 8, 64,
         "2 micro-batches of 2 sequences do not make"},
        {"{\"dp\": 4, \"schedule\": \"gpipe\"}", 4, 8, 64,
         "the gpipe schedule orders pipeline stages; use it with pp 2 or more"},
        {"{\"pp\": 2, \"dp\": 2, \"schedule\": \"interleaved\"}", 4, 8, 64,
         "the interleaved schedule takes 2 or more virtual stages"},
        {"{\"pp\": 2, \"dp\": 2, \"virtual_stages\": 2}", 4, 8, 64,
         "virtual_stages 2 with the 1f1b schedule"},
        {"{\"pp\": 2, \"dp\": 2, \"schedule\": \"interleaved\", \"virtual_stages\": 4, "
         "\"micro_batches\": 2}",
         4, 8, 64, "pp 2 x virtual_stages 4 does not divide the 4 layers"},
        {"{\"pp\": 4, \"schedule\": \"interleaved\", \"virtual_stages\": 1, \"micro_batches\": 2}",
         4, 8, 64, "takes 2 or more"},
        {"{\"pp\": 2, \"dp\": 2, \"schedule\": \"interleaved\", \"virtual_stages\": 2, "
         "\"micro_batches\": 1}",
         4, 8, 64, "a multiple of pp 2"},
        {"{\"dp\": 4, \"head_replicated\": true}", 4, 8, 64, "needs tp 2 or more"},
        {"{\"dp\": 4, \"recompute_layers\": 2}", 4, 8, 64,
         "recompute_layers 2 limits full recompute to the first layers of each chunk; give it "
         "with recompute full"},
        {"{\"dp\": 4, \"recompute\": \"full\", \"recompute_layers\": 5}", 4, 8, 64,
         "recompute_layers 5 exceeds the model's 4 layers; give at most 4"},
        {"{\"tp\": 4, \"zero\": 1}", 4, 8, 64,
         "ZeRO stage 1 with dp 1: ZeRO shards over data parallelism: give dp >= 2 or zero 0"},
        /* pipelines: more stages than layers, chunks that split layers, the interleaved
         * schedule's groups of pp micro-batches, each with the fix */
        {"{\"pp\": 8}", 8, 8, 64,
         "pp 8 exceeds the 4 layers: every stage needs at least one layer; use a pp that divides "
         "n_layer (at most 4)"},
        {"{\"pp\": 2, \"dp\": 2, \"schedule\": \"interleaved\", \"virtual_stages\": 3, "
         "\"micro_batches\": 2}",
         4, 8, 64,
         "the 2 layers per stage (n_layer / pp) cannot be cut into 3 chunks; use "
         "virtual_stages 2"},
        {"{\"pp\": 4, \"schedule\": \"interleaved\", \"virtual_stages\": 2, "
         "\"micro_batches\": 4}",
         4, 8, 64, "use the 1f1b schedule (a stage of one layer does not split)"},
        {"{\"pp\": 2, \"dp\": 2, \"schedule\": \"interleaved\", \"virtual_stages\": 2, "
         "\"pp_layers\": [2, 2], \"micro_batches\": 2}",
         4, 8, 64, "leave pp_layers out"},
        {"{\"pp\": 2, \"schedule\": \"interleaved\", \"virtual_stages\": 2, "
         "\"micro_batches\": 3}",
         2, 12, 64,
         "the interleaved schedule needs the micro-batches (3) to be a multiple of pp 2; use 2 "
         "or 4 micro-batches"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ms_strategy s = with(bad[i].json);
        ms_job_shape j = {.world = bad[i].world, .batch = bad[i].batch, .seq = bad[i].seq};
        ms_error e2 = {0};
        ms_status st = ms_strategy_validate(&s, &cfg, &j, 0, &e2);
        printf("refused: %-44s %s\n", bad[i].json, e2.msg);
        if (st != MS_ERR_INVALID) fail_msg("%s: accepted", bad[i].json);
        if (!strstr(e2.msg, bad[i].want))
            fail_msg("%s: wanted '%s' in: %s", bad[i].json, bad[i].want, e2.msg);
        /* the planner's check refuses the same */
        assert_int_equal(ms_strategy_check(&s, &cfg, &j, &err), MS_ERR_INVALID);
    }
    /* values no parser makes, from code that fills the struct itself */
    ms_strategy s = plain(4, 1, 1, false);
    s.zero = 5;
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "ZeRO stage 5 does not exist"));
    s = plain(4, 1, 1, false);
    s.precision = 9;
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "precision 9"));
    s = plain(4, 1, 1, false);
    s.dp = 1 << 20;
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 0, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "degrees must be in 1..65536"));
    /* memory: the compiled program against a cap */
    s = plain(4, 1, 1, false);
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 1e4, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "over memory: needs"));
    assert_int_equal(ms_strategy_validate(&s, &cfg, &job, 1e12, &err), MS_OK);
}

/* --- files ------------------------------------------------------------------------------------ */

static void files(void **state) {
    (void)state;
    char dir[] = "/tmp/ms-strategy-XXXXXX";
    assert_non_null(mkdtemp(dir));
    ms_strategy s;
    ms_placement_rules rules;
    ms_error err = {0};
    assert_int_equal(ms_strategy_load(dir, &s, &rules, &err), MS_ERR_IO);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "strategy file"));
    assert_non_null(strstr(err.msg, "not a regular file"));
    char path[256];
    snprintf(path, sizeof path, "%s/missing.json", dir);
    assert_int_equal(ms_strategy_load(path, &s, &rules, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "missing.json"));
    assert_non_null(strstr(err.msg, "cannot open"));
    snprintf(path, sizeof path, "%s/s.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(
        "{\"mesh\": {\"dp\": 2, \"tp\": 2}, \"sp\": true,\n \"placements\": {\"wte.weight\": \"[R, "
        "S(0)]\"}}\n",
        f);
    fclose(f);
    assert_int_equal(ms_strategy_load(path, &s, &rules, &err), MS_OK);
    char name[MS_STRATEGY_NAME_MAX];
    assert_string_equal(ms_strategy_name(&s, name, sizeof name), "dp2 x tp2 +sp");
    assert_int_equal(rules.n, 1);
    f = fopen(path, "w");
    fputs("{\"mesh\": {\"dp\": 2}}\n{\"mesh\": {\"dp\": 4}}\n", f);
    fclose(f);
    assert_int_equal(ms_strategy_load(path, &s, &rules, &err), MS_ERR_INVALID);
    assert_non_null(strstr(err.msg, "s.json: text after the JSON value"));
    remove(path);
    rmdir(dir);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(parses_good_inputs),   cmocka_unit_test(refuses_bad_inputs),
    cmocka_unit_test(round_trip_and_names), cmocka_unit_test(equality),
    cmocka_unit_test(validator_refusals),   cmocka_unit_test(files),
};

MT_MAIN("strategy", tests)
