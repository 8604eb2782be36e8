/* Internal helpers shared by the files of data/. Not API. */
#ifndef DG_DATA_IMPL_H
#define DG_DATA_IMPL_H

#include "dgrad/data.h"
#include "tensor/common_impl.h"

/* Formats into err (errcap bytes) when err is non-NULL; returns code. */
int dg__data_err(char *err, size_t errcap, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
