/* status.c: the text of each status code, for programs that use the C API without Python. */
#include "status.h"

const char *kiln_strerror(int status) {
    switch (status) {
#define KILN_STATUS_TEXT(name, value, text) \
    case name: return #name ": " text;
        KILN_STATUS_LIST(KILN_STATUS_TEXT)
#undef KILN_STATUS_TEXT
    default: return "unknown status";
    }
}
