/* main.c - the meshscope binary: the command line of cli/meshscope.h. */
#include "cli/meshscope.h"

int main(int argc, char **argv) {
    return meshscope_main(argc, argv);
}
