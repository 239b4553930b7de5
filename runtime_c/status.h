/* status.h: the status codes of a kiln model's C API. 0 is success; every failure is negative
 * and leaves the model as it was. */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

enum kiln_status {
    KILN_OK = 0,
    KILN_E_ARG = -1,             /* a null pointer or a count out of range */
    KILN_E_TOKEN = -2,           /* a token id outside [0, n_vocab) */
    KILN_E_CTX_FULL = -3,        /* the tokens do not fit in the sequence's context */
    KILN_E_ROLLBACK = -4,        /* rollback to more positions than the sequence holds */
    KILN_E_ROLLBACK_WINDOW = -5, /* rollback further back than a sliding layer's pages remember */
    KILN_E_OPEN = -6,            /* the weights file cannot be opened or mapped */
    KILN_E_WEIGHTS = -7,         /* the weights file is not the one this library was compiled for */
    KILN_E_NOMEM = -8,           /* the KV pool or the arena cannot be allocated */
    KILN_E_PACKED = -9,          /* the packed weights file is missing, or was written for other weights */
    KILN_E_KV_FULL = -10,        /* the KV pool has too few free pages for the step */
    KILN_E_NO_SEQ = -11,         /* every sequence slot is open */
    KILN_E_SEQ = -12,            /* a sequence id out of range, or of a closed sequence */
    KILN_E_BATCH = -13,          /* a step with no rows, or more rows than the batch was planned for */
    KILN_E_SHIFT_WINDOW = -14    /* a shift would make a sliding window read positions its pages no longer hold */
};

/* the status's name and meaning, for a C program's messages ("unknown status" for any other value) */
const char *kiln_strerror(int status);

#endif
