/* test_job.c - decisions a job makes before its ranks start (job/job.h): the gradient bucket
 * a run takes when --bucket-mb is left at its default. */
#include <stdio.h>

#include "tests/testkit.h"

#include "job/job.h"

static ms_strategy strategy(int dp, int tp, int cp) {
    ms_strategy s;
    ms_error err = {0};
    assert_int_equal(ms_strategy_init(&s, dp, tp, cp, false, &err), MS_OK);
    return s;
}

/* On CUDA, gradients reduced over dp or cp go in JOB_CUDA_BUCKET_MB buckets by default. */
static void cuda_default_buckets_reduced_gradients(void **state) {
    (void)state;
    ms_strategy dp2 = strategy(2, 1, 1), cp2 = strategy(1, 2, 2), tp4 = strategy(1, 4, 1);
    assert_true(job_bucket_mb(-1, false, &dp2, MS_DEVICE_CUDA) == JOB_CUDA_BUCKET_MB);
    assert_true(job_bucket_mb(-1, false, &cp2, MS_DEVICE_CUDA) == JOB_CUDA_BUCKET_MB);
    /* nothing to reduce over dp or cp: no buckets */
    assert_true(job_bucket_mb(-1, false, &tp4, MS_DEVICE_CUDA) == 0);
}

/* Elsewhere the default is none; a flag or a strategy file always wins. */
static void flag_and_file_win(void **state) {
    (void)state;
    ms_strategy dp2 = strategy(2, 1, 1);
    for (int kind = MS_DEVICE_CPU; kind <= MS_DEVICE_FENCED; kind++)
        if (kind != MS_DEVICE_CUDA)
            assert_true(job_bucket_mb(-1, false, &dp2, (ms_device_kind)kind) == 0);
    assert_true(job_bucket_mb(0, false, &dp2, MS_DEVICE_CUDA) == 0);
    assert_true(job_bucket_mb(4, false, &dp2, MS_DEVICE_CPU) == 4);
    dp2.bucket_mb = 0;
    assert_true(job_bucket_mb(-1, true, &dp2, MS_DEVICE_CUDA) == 0); /* the file said none */
    dp2.bucket_mb = 8;
    assert_true(job_bucket_mb(-1, true, &dp2, MS_DEVICE_CUDA) == 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cuda_default_buckets_reduced_gradients),
        cmocka_unit_test(flag_and_file_win),
    };
    return cmocka_run_group_tests_name("job", tests, NULL, NULL);
}
