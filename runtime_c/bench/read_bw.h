/* read_bw.h: the machine's read bandwidth (read_bw.c), for kiln bench. */
#ifndef KILN_READ_BW_H
#define KILN_READ_BW_H

#include <stddef.h>

/* bytes per second that n_threads threads read of one buffer of `bytes`, the best of `passes`;
   -1 on bad arguments or no memory */
double kiln_read_bandwidth(int n_threads, size_t bytes, int passes);

#endif
