#include "testkit.h"
static void placeholder(void **state) { (void)state; }
static const struct CMUnitTest tests[] = {cmocka_unit_test(placeholder)};
MT_MAIN("placeholder", tests)
