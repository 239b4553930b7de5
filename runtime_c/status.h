/* status.h: the status codes of a kiln model's C API. 0 is success; every failure is negative
 * and leaves the model as it was.
 *
 * One table: the enum, kiln_strerror's text (status.c) and Python's messages (which key theirs by
 * the names cffi reads from the enum) all come from KILN_STATUS_LIST. */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#define KILN_STATUS_LIST(X)                                                                                      \
    X(KILN_OK, 0, "success")                                                                                     \
    X(KILN_E_ARG, -1, "a null pointer or a count out of range")                                                 \
    X(KILN_E_TOKEN, -2, "a token id outside [0, n_vocab)")                                                      \
    X(KILN_E_CTX_FULL, -3, "the tokens do not fit in the sequence's context")                                   \
    X(KILN_E_ROLLBACK, -4, "rollback to more positions than the sequence holds")                                \
    X(KILN_E_ROLLBACK_WINDOW, -5, "rollback further back than a sliding layer remembers")                       \
    X(KILN_E_OPEN, -6, "the weights file cannot be opened or mapped")                                           \
    X(KILN_E_WEIGHTS, -7, "the weights file is not the GGUF this library was compiled for")                     \
    X(KILN_E_NOMEM, -8, "the KV pool or the arena cannot be allocated")                                         \
    X(KILN_E_PACKED, -9, "the packed weights file is missing, or was written for other weights")                \
    X(KILN_E_KV_FULL, -10, "the KV pool has too few free pages for the step")                                   \
    X(KILN_E_NO_SEQ, -11, "every sequence slot is open")                                                        \
    X(KILN_E_SEQ, -12, "a sequence id out of range, or of a closed sequence")                                   \
    X(KILN_E_BATCH, -13, "a step with no rows, or more rows than the batch was planned for")                    \
    X(KILN_E_SHIFT_WINDOW, -14, "a shift would read positions a sliding window no longer holds")             \
    X(KILN_E_RECURRENT, -15, "a recurrent layer's state cannot drop or borrow positions (rollback, shift, prefix)")

enum kiln_status {
#define KILN_STATUS_ENUM(name, value, text) name = value,
    KILN_STATUS_LIST(KILN_STATUS_ENUM)
#undef KILN_STATUS_ENUM
};

/* the status's name and meaning, for a C program's messages ("unknown status" for any other value) */
const char *kiln_strerror(int status);

#endif
