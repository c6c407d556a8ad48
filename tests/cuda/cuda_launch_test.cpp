// How GPU ranks meet their devices, through `mpirun shardkit train` as a user launches it: more ranks
// than GPUs is refused with a message that names the clash (NCCL would stop at "invalid usage"), and a
// launcher that hides all but one GPU from each rank (CUDA_VISIBLE_DEVICES per rank, as Slurm's
// --gpus-per-task does) trains: every rank sees device 0, of distinct GPUs. And a model shape the
// kernels lack is refused up front.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "tests/cli/cli_support.hpp"
#include "tests/cuda/require_gpus.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

std::string train_args(const testing::TempDir& dir) {
  return "train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --device cuda --data " +
         write_text_tokens(dir).string() + " --steps 2";
}

TEST(CudaLaunch, TwoRanksOnOneGpuAreRefusedWithTheClash) {
  REQUIRE_GPUS(1);
  testing::TempDir dir;
  const Result r = run(train_args(dir), "timeout -s KILL 120 " + mpirun(2), "CUDA_VISIBLE_DEVICES=0");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--device cuda: ranks 0 and 1 both took GPU "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("start at most one rank per GPU"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("invalid usage"), std::string::npos) << r.err;
}

TEST(CudaLaunch, EachRankWithItsOwnVisibleDeviceTrains) {
  REQUIRE_GPUS(1);
  const int ranks = std::min(testing::visible_gpus(), 2);
  testing::TempDir dir;
  // Open MPI names each process's node-local rank; the wrapper shows it that one GPU only.
  const std::string own_gpu = " sh -c 'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec \"$0\" \"$@\"'";
  const Result r = run(train_args(dir), "timeout -s KILL 240 " + mpirun(ranks) + own_gpu);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("CUDA device 0"), std::string::npos) << r.out;
}

// A model whose shape the CUDA kernels were not built for is refused before any GPU work, naming the
// model file -- not at the first forward pass, after its initialisation. Needs no GPU: the check comes
// first.
TEST(CudaLaunch, AHeadSizeTheKernelsLackIsRefusedNamingTheModel) {
  testing::TempDir dir;
  const auto model = dir / "heads48.json";
  std::ofstream(model) << R"({"n_layer": 1, "n_head": 2, "n_embd": 96, "vocab_size": 256, "n_positions": 64})";
  const Result r = run("train --config " + samples() + "tiny_zero2.json --model " + model.string() +
                       " --device cuda --data " + write_text_tokens(dir).string() + " --steps 1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("heads48.json: head size n_embd / n_head = 48, but the CUDA attention kernels are built for "
                       "32, 64 and 128"),
            std::string::npos)
      << r.err;

  // And a Llama one: head_dim 48.
  const auto llama = dir / "llama48.json";
  std::ofstream(llama) << R"({"model_type": "llama", "hidden_size": 96, "intermediate_size": 256,
      "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256,
      "max_position_embeddings": 64})";
  const Result l = run("train --config " + samples() + "tiny_zero2.json --model " + llama.string() +
                       " --device cuda --data " + write_text_tokens(dir).string() + " --steps 1");
  EXPECT_EQ(l.code, 2) << l.err;
  EXPECT_EQ(count_lines(l.err), 1) << l.err;
  EXPECT_NE(l.err.find("llama48.json: head_dim 48, but the CUDA attention kernels are built for 32, 64 and 128"),
            std::string::npos)
      << l.err;
}

}  // namespace
}  // namespace shardkit
