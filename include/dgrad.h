/* dgrad — embeddable autograd engine with data-parallel training.
 * Umbrella header: includes every public module. */
#ifndef DGRAD_H
#define DGRAD_H

#include "dgrad/common.h"
#include "dgrad/trace.h"
#include "dgrad/tensor.h"
#include "dgrad/autograd.h"
#include "dgrad/swap.h"
#include "dgrad/ops.h"
#include "dgrad/nn.h"
#include "dgrad/optim.h"
#include "dgrad/data.h"
#include "dgrad/ddp.h"
#include "dgrad/pipe.h"
#include "dgrad/checkpoint.h"
#include "dgrad/run.h"

#endif
