#include "comm/comm_mpi.h"
