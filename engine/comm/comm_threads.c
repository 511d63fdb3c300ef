#include "comm/comm_threads.h"
