/* When a kernel may open its own OpenMP team. Header-only. */
#ifndef MOERL_KPAR_H
#define MOERL_KPAR_H

#ifdef _OPENMP
#include <omp.h>
#endif

/* True when `work` reaches the kernel's threshold `min_work` AND the caller is outside every
 * OpenMP region (omp_get_level() == 0). Inside a region — active, or inactive such as a
 * one-thread team — a kernel runs on the calling thread: the project never nests regions
 * (a nested region would add threads to cores that are already busy; README, threading). */
static inline int kpar(long work, long min_work) {
#ifdef _OPENMP
    return work >= min_work && omp_get_level() == 0;
#else
    (void)work;
    (void)min_work;
    return 0;
#endif
}

#endif
