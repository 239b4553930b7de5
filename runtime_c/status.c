/* status.c: the text of each status code, for programs that use the C API without Python. */
#include "status.h"

const char *kiln_strerror(int status) {
    switch (status) {
    case KILN_OK: return "KILN_OK: success";
    case KILN_E_ARG: return "KILN_E_ARG: a null pointer or a count out of range";
    case KILN_E_TOKEN: return "KILN_E_TOKEN: a token id outside [0, n_vocab)";
    case KILN_E_CTX_FULL: return "KILN_E_CTX_FULL: the tokens do not fit in the sequence's context";
    case KILN_E_ROLLBACK: return "KILN_E_ROLLBACK: rollback to more positions than the sequence holds";
    case KILN_E_ROLLBACK_WINDOW: return "KILN_E_ROLLBACK_WINDOW: rollback further back than a sliding layer remembers";
    case KILN_E_OPEN: return "KILN_E_OPEN: the weights file cannot be opened or mapped";
    case KILN_E_WEIGHTS: return "KILN_E_WEIGHTS: the weights file is not the GGUF this library was compiled for";
    case KILN_E_NOMEM: return "KILN_E_NOMEM: the KV pool or the arena cannot be allocated";
    case KILN_E_PACKED: return "KILN_E_PACKED: the packed weights file is missing, or was written for other weights";
    case KILN_E_KV_FULL: return "KILN_E_KV_FULL: the KV pool has too few free pages for the step";
    case KILN_E_NO_SEQ: return "KILN_E_NO_SEQ: every sequence slot is open";
    case KILN_E_SEQ: return "KILN_E_SEQ: a sequence id out of range, or of a closed sequence";
    case KILN_E_BATCH: return "KILN_E_BATCH: a step with no rows, or more rows than the batch was planned for";
    case KILN_E_SHIFT_WINDOW: return "KILN_E_SHIFT_WINDOW: a shift would read positions a sliding window no longer holds";
    default: return "unknown status";
    }
}
