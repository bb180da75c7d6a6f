/* The gradient compression codecs live in src/dist/compress.h (below dist: the MPI reducer runs
 * them). This header keeps the old include path for the config readers above dist. */
#ifndef MOERL_PARALLEL_COMPRESS_H
#define MOERL_PARALLEL_COMPRESS_H

#include "dist/compress.h"

#endif
