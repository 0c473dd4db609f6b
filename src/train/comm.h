// The ranks of a data-parallel training run and the one collective it needs: a sum over ranks.
// Each rank trains on its share of every step's micro-batches (PretrainOptions::micro_batches:
// micro-batch m goes to rank m % size), the ranks sum their gradients, and every rank takes the
// same optimizer step on the same sums, so their parameters stay bitwise equal. A sum adds the
// ranks' values in rank order, so the result does not depend on which rank computes it, and one
// rank holding every micro-batch adds its gradients in the same order (its backward adds each
// micro-batch's gradients into the ones before): a run of several ranks gives the parameters of
// one rank doing the whole step's micro-batches (TrainDataParallel).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "deg/train.h"
#include "train/distributed.h"

namespace deg::train {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x[0, n) <- the sum over ranks of their x[0, n), added in rank order; every rank gets the
  // same bits. x lives where the run's training ops keep their tensors.
  virtual void sum(float* x, int64_t n) const = 0;
  virtual void sum(double* x, int64_t n) const = 0;
  double sum(double v) const {
    sum(&v, 1);
    return v;
  }
};

// One process training alone: sums are the rank's own values.
std::unique_ptr<Comm> solo_comm();

// `n` ranks as threads of this process, over host memory (the CPU's training ops): the group
// in which tests run data-parallel training without a launcher. Rank r of the group is the
// r-th element; each must be used from one thread, and every rank must make the same sequence
// of calls (as with any collective).
std::vector<std::unique_ptr<Comm>> local_comms(int n);

// Rank launch.rank of a multi-process launch, over TCP and host memory (the CPU's training ops):
// rank 0 listens on launch.master_port, the others connect to launch.master_addr (retrying for
// up to `timeout_s`); a sum gathers every rank's buffer at rank 0, which adds them in rank order
// and sends the total back. Throws deg::Error when the launch lacks a rank or MASTER_ADDR /
// MASTER_PORT, when the ranks do not meet in time, or when a peer goes away or disagrees.
std::unique_ptr<Comm> tcp_comm(const Launch& launch, double timeout_s = 300);

// The group `command` trains in, from the process's launch (launch_from_env): alone, or on the
// CPU the TCP group of a launch of several processes. On a GPU (`device` as the options give
// it) a launch of several is refused (require_one_process: a GPU group needs NCCL, not built).
std::unique_ptr<Comm> launch_comm(const std::string& command, const std::string& device);

// `deg pretrain` as rank comm.rank() of comm.size(): every rank reads the same data stream
// (its loader stays in step with the others) and trains on its micro-batches; rank 0 alone
// validates, writes metrics.jsonl and checkpoints and reports progress. --max-seconds sizes the
// run from rank 0's pace. micro_batches must be a multiple of comm.size().
PretrainResult pretrain_ranked(const PretrainOptions& options, const Comm& comm,
                               const std::function<void(const PretrainProgress&)>& on_progress);

// `deg train` as rank comm.rank() of comm.size(): every rank reads the tasks and draws the same
// batches, and takes every size()-th record of each (the kinds' loss weights are the whole
// batch's); rank 0 alone prepares --out (the others open it after), evaluates, decides an early
// stop, writes, calibrates and reports.
FineTuneResult fine_tune_ranked(const FineTuneOptions& options, const Comm& comm,
                                const std::function<void(const FineTuneProgress&)>& on_progress);

}  // namespace deg::train
