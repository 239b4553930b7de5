/* vnni_peak.h: the machine's int8 multiply-add peak (vnni_peak.c), for kiln bench --profile. */
#ifndef KILN_VNNI_PEAK_H
#define KILN_VNNI_PEAK_H

const char *kiln_int8_isa(void);                 /* the instruction the peak is measured with */
double kiln_int8_peak(int n_threads, long iters); /* int8 MACs per second over n_threads threads; -1: none */
double kiln_int8_exact_peak(int n_threads, long iters); /* the same beside each block's float steps (vnni_peak.c) */
double kiln_amx_int8_peak(int n_threads, long iters); /* the same with AMX tile multiplies; -1: no AMX here */

#endif
