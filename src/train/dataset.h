// Labeled records -> the examples `deg train` trains on (train/tasks.h makes each): every
// task's train and dev files read, records turned into examples over the thread pool, empty
// arrays thinned by --empty-array-rate; and `--task` specs (TaskFiles).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "deg/train.h"
#include "engine/model.h"
#include "train/tasks.h"

namespace deg::train {

// A deterministic 64-bit mix (splitmix64's finaliser) for per-query sampling decisions.
uint64_t mix(uint64_t x);

struct Dataset {
  std::vector<TaskExample> train, dev;
  int64_t unlocated = 0;
};

// Every task's records as examples (`progress`: stage "prepare"). Throws deg::Error naming the
// file and record of a bad one, or when no training record is left.
Dataset build_dataset(const engine::DegModel& model, const FineTuneOptions& o,
                      const std::function<void(const FineTuneProgress&)>& progress);

}  // namespace deg::train
