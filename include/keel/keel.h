// keel: the one header a user includes.
//   Program, ProgramGuard, layers::, optimizer::, lr_schedule::, gradient_merge::, Executor,
//   save/load, keel::Init, fleet:: (data-parallel training), SummaryWriter (TensorBoard), the
//   data API (Dataset, DataLoader, MNIST, CSV) and Trainer (the training loop with checkpoints
//   and evaluation).
#pragma once

#include <glog/logging.h>  // LOG(INFO) in user programs

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "fleet/fleet.h"
#include "framework/autodiff/backward.h"
#include "framework/data/csv_dataset.h"
#include "framework/data/data_loader.h"
#include "framework/data/dataset.h"
#include "framework/data/mnist_dataset.h"
#include "framework/data/tensor_dataset.h"
#include "framework/dsl/gradient_merge.h"
#include "framework/dsl/initializer.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/lr_schedule.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/dsl/tensor_parallel.h"
#include "framework/error.h"
#include "framework/init.h"
#include "framework/io/io.h"
#include "framework/ir/program.h"
#include "framework/runtime/tensor.h"
#include "framework/summary/summary_writer.h"
#include "trainer/trainer.h"
