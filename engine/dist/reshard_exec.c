#include "dist/reshard.h"
