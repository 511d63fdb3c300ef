#include "dist/dtensor.h"
