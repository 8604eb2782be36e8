/* Device -> backend. */
#include <stdio.h>

#include "backends/backend.h"
#include "dgrad_config.h"

const dg__backend *dg__backend_get(int device) {
  if (device == DG_CPU) return &dg__cpu_backend;
  return NULL; /* no CUDA backend in this build yet */
}

const char *dg__device_name(int device, char *buf, size_t cap) {
  if (device == DG_CPU) snprintf(buf, cap, "cpu");
  else if (device >= DG_CUDA) snprintf(buf, cap, "cuda:%d", device - DG_CUDA);
  else snprintf(buf, cap, "device %d", device);
  return buf;
}
