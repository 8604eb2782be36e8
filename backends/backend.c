/* Device -> backend. */
#include <stdio.h>

#include "backends/backend.h"
#include "dgrad_config.h"

/* The CPU backend is built in; another registers itself for its devices
 * (a CUDA backend at start-up, tests a stand-in device). */
static const dg__backend *g_backends[DG__MAX_DEVICES] = {&dg__cpu_backend};

const dg__backend *dg__backend_get(int device) {
  return device >= 0 && device < DG__MAX_DEVICES ? g_backends[device] : NULL;
}

int dg__backend_register(int device, const dg__backend *be) {
  if (device <= DG_CPU || device >= DG__MAX_DEVICES) return DG_EINVAL;
  g_backends[device] = be;
  return DG_OK;
}

const char *dg__device_name(int device, char *buf, size_t cap) {
  if (device == DG_CPU) snprintf(buf, cap, "cpu");
  else if (device >= DG_CUDA) snprintf(buf, cap, "cuda:%d", device - DG_CUDA);
  else snprintf(buf, cap, "device %d", device);
  return buf;
}
