/* Internal helpers shared by the files of data/. Not API. */
#ifndef DG_DATA_IMPL_H
#define DG_DATA_IMPL_H

#include "dgrad/data.h"
#include "base/common_impl.h"


#endif
