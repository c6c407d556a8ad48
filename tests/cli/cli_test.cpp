// The shardkit binary as a user meets it: exit codes, one-line errors that name the file, --help
// for every subcommand, JSON output that parses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "ckpt/run_dir.hpp"
#include "ckpt/shard_format.hpp"
#include "tests/cli/cli_support.hpp"
#include "tests/support/test_support.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

// (Every command's --help: tests/cli/help_test.cpp.)
TEST(Cli, VersionNamesTheProgram) {
  const Result r = run("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("shardkit"), std::string::npos) << r.out;
}

TEST(Cli, BadInputIsOneLineAndExitCode2) {
  testing::TempDir dir;
  for (const std::string& args : {"ckpt verify " + (dir / "missing").string(), "ckpt inspect " + dir.path().string(),
                                  std::string("bench ckpt --size 12XB --dir ") + dir.path().string(),
                                  std::string("ckpt frobnicate"), std::string("ckpt ls")}) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    EXPECT_GE(count_lines(r.err), 1) << args;
  }
  const Result missing = run("ckpt verify " + (dir / "missing").string());
  EXPECT_EQ(count_lines(missing.err), 1) << missing.err;
  EXPECT_NE(missing.err.find((dir / "missing").string()), std::string::npos) << missing.err;
  const Result size = run("bench ckpt --size 12XB --dir " + dir.path().string());
  EXPECT_NE(size.err.find("--size"), std::string::npos) << size.err;
}

TEST(Cli, WriteListInspectVerifyDiffAndDetectDamage) {
  testing::TempDir dir;
  const std::string a = (dir / "a").string();
  const std::string b = (dir / "b").string();
  Result r = run("bench ckpt --size 8MiB --dir " + a + " --stage 1 --json", mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto bench = nlohmann::json::parse(r.out);
  EXPECT_GT(bench["bytes"].get<int64_t>(), 8 << 20);
  EXPECT_TRUE(bench["durable"].get<bool>());
  ASSERT_EQ(run("bench ckpt --size 8MiB --dir " + b + " --stage 3 --compress 3", mpirun(3)).code, 0);

  r = run("ckpt ls " + a + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto list = nlohmann::json::parse(r.out);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_TRUE(list[0]["committed"].get<bool>());
  EXPECT_TRUE(list[0]["latest"].get<bool>());
  EXPECT_EQ(list[0]["world_size"], 2);

  r = run("ckpt inspect " + b + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["layout"]["stage"], 3);
  r = run("ckpt inspect " + a);
  EXPECT_NE(r.out.find("ZeRO stage 1"), std::string::npos) << r.out;

  r = run("ckpt verify " + a);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("OK"), std::string::npos);

  // The same synthetic state written by 2 ranks at stage 1 and 3 ranks at stage 3, compressed.
  r = run("ckpt diff " + a + " " + b + " --json");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["within_tolerance"].get<bool>());

  // One flipped bit in a data chunk: verify fails, naming the shard file.
  const std::filesystem::path step = std::filesystem::path(a) / "step-00000001";
  const std::filesystem::path shard = step / ckpt::shard_file_name(1, 2);
  const testing::ChunkExtent chunk = testing::chunk_extent(shard, "exp_avg_sq", 0);
  testing::flip_bit(shard, chunk.offset + 100, 5);
  r = run("ckpt verify " + a);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(shard.string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("checksum mismatch"), std::string::npos) << r.err;
  r = run("ckpt diff " + a + " " + b);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;  // one line, no HDF5 error stack

  // A broken manifest: one line, exit 1, naming the manifest.
  std::ofstream(step / "manifest.json", std::ios::trunc) << "{\"format\": ";
  r = run("ckpt inspect " + a);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("manifest.json"), std::string::npos) << r.err;
}

TEST(Cli, SeedArticleConfigsTrainAsWritten) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  // train_batch_size 32 with 4 accumulation steps: micro-batches of 4 on 2 ranks; fp16 on CPU ranks.
  Result r = run("train --config " + samples() + "seed_zero2_fp16.json --model gpt2-tiny --data " + data +
                     " --steps 2 --threads 1 --metrics " + (dir / "m.jsonl").string(),
                 mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("notice: fp16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("batch 32 = 4 x 4 accumulation x 2 ranks"), std::string::npos) << r.out;
  // Every metrics line carries the contract's keys.
  std::ifstream metrics(dir / "m.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    const auto j = nlohmann::json::parse(line);
    for (const char* key :
         {"step", "loss", "lr", "grad_norm", "loss_scale", "skipped", "tokens", "step_ms", "tokens_per_s"}) {
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
    }
    EXPECT_EQ(j["loss_scale"], 65536.0);
    ++lines;
  }
  EXPECT_EQ(lines, 2);
  // "auto" batch sizes with micro-batches of 2: any world size.
  r = run("train --config " + samples() + "seed_zero2_auto.json --model gpt2-tiny --data " + data +
              " --steps 2 --threads 1",
          mpirun(3));
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("batch 6 = 2 x 1 accumulation x 3 ranks"), std::string::npos) << r.out;
  // 32 samples cannot be split over 3 ranks with 4 accumulation steps: one clear line, exit 2.
  r = run("train --config " + samples() + "seed_zero2_fp16.json --model gpt2-tiny --data " + data + " --steps 2",
          mpirun(3));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("train_batch_size 32 != train_micro_batch_size_per_gpu 2 * gradient_accumulation_steps 4 * "
                       "world size 3"),
            std::string::npos)
      << r.err;
}

// What samples/ ships runs as the README says: every config with gpt2-tiny, every model file with
// the small config, the sample text through `data encode`.
TEST(Cli, EverySampleConfigModelAndTextRuns) {
  testing::TempDir dir;
  const std::filesystem::path root = std::filesystem::path(SHARDKIT_SOURCE_DIR) / "samples";
  const std::string data = (dir / "text.bin").string();
  Result r = run("data encode " + (root / "data" / "checkpoints.txt").string() + " -o " + data);
  ASSERT_EQ(r.code, 0) << r.err;
  int runs = 0;
  const auto train = [&](const std::filesystem::path& config, const std::string& model) {
    ++runs;
    const Result t = run("train --config " + config.string() + " --model " + model + " --data " + data +
                             " --steps 1 --threads 1 --quiet",
                         mpirun(2));
    EXPECT_EQ(t.code, 0) << config << " with " << model << ": " << t.err;
  };
  for (const auto& entry : std::filesystem::directory_iterator(root / "configs")) train(entry.path(), "gpt2-tiny");
  for (const auto& entry : std::filesystem::directory_iterator(root / "models")) {
    train(root / "configs" / "tiny_zero2.json", entry.path().string());
  }
  EXPECT_GE(runs, 6) << "samples/configs and samples/models hold fewer files than the README lists";
}

TEST(Cli, TrainCheckpointsResumesAndEvaluates) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string run_dir = (dir / "run").string();
  Result r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data +
                     " --steps 4 --save-interval 2 --keep-last 1 --threads 1 --save-dir " + run_dir,
                 mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  auto list = nlohmann::json::parse(run("ckpt ls " + run_dir + " --json").out);
  ASSERT_EQ(list.size(), 1u) << "--keep-last 1";
  EXPECT_EQ(list[0]["step"], 4);
  EXPECT_EQ(list[0]["world_size"], 2);
  // Resume on 3 ranks at stage 3 and continue to step 6.
  r = run("train --config " + samples() + "tiny_zero3.json --model gpt2-tiny --data " + data +
              " --steps 6 --threads 1 --save-dir " + run_dir,
          mpirun(3));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_EQ(run("ckpt verify " + run_dir).code, 0);
  r = run("eval " + run_dir + " --data " + data + " --windows 4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto eval = nlohmann::json::parse(r.out);
  EXPECT_EQ(eval["tokens"], 4 * 64);
  EXPECT_GT(eval["loss"].get<double>(), 0.0);
  EXPECT_LT(eval["loss"].get<double>(), 5.6) << "worse than uniform over 256 tokens";
  // On 3 ranks, each scoring its batches of 8 windows (8, 8 and 4 of 20): the same bits as one process
  // (with as many compute threads: the CPU's products split their sums by thread).
  // (--device cpu: on a machine with fewer than 3 GPUs auto would take the GPU for one process only.)
  const std::string cpu_eval = "eval " + run_dir + " --data " + data + " --windows 20 --json --threads 1 --device cpu";
  r = run(cpu_eval);
  ASSERT_EQ(r.code, 0) << r.err;
  const Result spread = run(cpu_eval, mpirun(3));
  ASSERT_EQ(spread.code, 0) << spread.err;
  EXPECT_EQ(nlohmann::json::parse(spread.out), nlohmann::json::parse(r.out)) << "printed by rank 0 only, the same loss";
  // Its fp32 export, evaluated as Hugging Face weights (the folder, and its one file), scores the same.
  const std::string hf = (dir / "hf").string();
  ASSERT_EQ(run("convert consolidate " + run_dir + " -o " + hf + " --quiet").code, 0);
  for (const std::string& weights : {hf, hf + "/model.safetensors"}) {
    r = run("eval " + weights + " --data " + data + " --windows 4 --json");
    ASSERT_EQ(r.code, 0) << weights << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out), eval) << weights;
  }
  // A checkpoint of another model is refused with one line naming it.
  std::ofstream(dir / "small.json")
      << R"({"n_layer": 1, "n_head": 2, "n_embd": 64, "vocab_size": 256, "n_positions": 64})";
  // (A single process: mpirun's own exit status is not what is tested here.)
  r = run("train --config " + samples() + "tiny_zero2.json --model " + (dir / "small.json").string() + " --data " +
          data + " --steps 8 --resume " + run_dir);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds another model"), std::string::npos) << r.err;
  // A missing token file: exit 2, naming it.
  r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + (dir / "none.bin").string() +
          " --steps 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("none.bin"), std::string::npos) << r.err;
}

// A process killed (SIGKILL) while asynchronous checkpoints are being written leaves a run directory
// whose `latest` checkpoint verifies and resumes; an unfinished step directory is never mistaken for
// a checkpoint.
// eval's default device is auto: the CPU where no GPU can be used (none visible here, or a build
// without CUDA), said in the result with the reason, and the same loss as --device cpu.
TEST(Cli, EvalPicksTheCpuWhereNoGpuCanBeUsedAndSaysWhy) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string run_dir = (dir / "run").string();
  ASSERT_EQ(run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data +
                " --steps 1 --threads 1 --quiet --save-dir " + run_dir)
                .code,
            0);
  const std::string eval = "eval " + run_dir + " --data " + data + " --windows 2 --threads 1";
  const Result text = run(eval, "", "CUDA_VISIBLE_DEVICES=");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find(" on cpu (auto: "), std::string::npos) << text.out;
  const bool built_without = text.out.find("this shardkit was built without CUDA") != std::string::npos;
  EXPECT_TRUE(built_without || text.out.find("no GPU visible") != std::string::npos) << text.out;
  const Result automatic = run(eval + " --json", "", "CUDA_VISIBLE_DEVICES=");
  const Result cpu = run(eval + " --json --device cpu");
  ASSERT_EQ(automatic.code, 0) << automatic.err;
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  EXPECT_EQ(nlohmann::json::parse(automatic.out)["device"], "cpu");
  EXPECT_EQ(nlohmann::json::parse(automatic.out), nlohmann::json::parse(cpu.out));
}

TEST(Cli, ARunKilledDuringAsynchronousSavesResumesFromItsLatestCheckpoint) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::filesystem::path run_dir = dir / "run";
  const std::string pid_file = (dir / "pid").string();
  const std::string command = std::string(SHARDKIT_TEST_ENV) + " " + SHARDKIT_BINARY + " train --config " + samples() +
                              "tiny_zero2.json --model gpt2-tiny --data " + data +
                              " --steps 100000 --save-interval 1 --save-mode async --threads 1 --quiet --save-dir " +
                              run_dir.string() + " > " + (dir / "log").string() + " 2>&1 & echo $! > " + pid_file;
  ASSERT_EQ(std::system(command.c_str()), 0);
  struct KillOnExit {  // whatever fails below, the endless run does not outlive the test
    std::string pid_file;
    ~KillOnExit() {
      // Best effort: the run may have ended already.
      [[maybe_unused]] const int rc = std::system(("kill -9 $(cat " + pid_file + ") 2>/dev/null").c_str());
    }
  } guard{pid_file};
  // Wait until a few checkpoints are committed (saves run back to back), then kill without warning.
  for (int i = 0; i < 600; ++i) {
    const Result ls = run("ckpt ls " + run_dir.string() + " --json");
    if (ls.code == 0 && nlohmann::json::parse(ls.out).size() >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(std::system(("kill -9 $(cat " + pid_file + ")").c_str()), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Result r = run("ckpt verify " + run_dir.string());
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const auto list = nlohmann::json::parse(run("ckpt ls " + run_dir.string() + " --json").out);
  ASSERT_GE(list.size(), 3u);
  // `latest` names a committed checkpoint; it may lag one committed after it (a kill between the
  // manifest and the pointer), and a save in flight may have left a step directory without a manifest.
  // The next run resumes from the newest committed checkpoint.
  const std::string latest = ckpt::read_latest(run_dir).value_or("");
  bool latest_committed = false;
  std::string newest;
  for (const auto& c : list) {
    latest_committed |= c["name"] == latest && c["committed"].get<bool>();
    if (c["committed"].get<bool>()) newest = c["name"].get<std::string>();
  }
  ASSERT_TRUE(latest_committed) << latest;
  const int64_t newest_step = std::stoll(newest.substr(newest.find('-') + 1));
  r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data + " --steps " +
          std::to_string(newest_step + 2) + " --threads 1 --save-dir " + run_dir.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from " + (run_dir / newest).string()), std::string::npos) << r.out;
  EXPECT_EQ(run("ckpt verify " + run_dir.string()).code, 0);
  // An unknown save mode is refused like any bad option.
  r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data +
          " --steps 1 --save-mode sometimes");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--save-mode"), std::string::npos) << r.err;
  // A device staging copy of the snapshot has no meaning on CPU ranks.
  r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data +
          " --steps 1 --snapshot-staging device");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--snapshot-staging device needs --device cuda"), std::string::npos) << r.err;
  // Nor does a step for the CUDA profilers; and the step must be one the run takes.
  r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data +
          " --steps 1 --profile-step 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--profile-step needs --device cuda"), std::string::npos) << r.err;
  r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data +
          " --steps 2 --profile-step 3 --device cuda");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--profile-step 3 is not a step of this run (1 to --steps 2)"), std::string::npos) << r.err;
}

TEST(Cli, AReshardedCheckpointResumesAtItsWorldSizeAndContinuesTheRun) {
  testing::TempDir dir;
  const std::string data = write_text_tokens(dir).string();
  const std::string full = (dir / "full").string();
  Result r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data +
                     " --steps 6 --save-interval 2 --threads 1 --save-dir " + full + " --metrics " +
                     (dir / "full.jsonl").string(),
                 mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("convert reshard " + full + "/step-00000002 -o " + (dir / "three").string() +
          " --world-size 3 --stage 3 --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("train --config " + samples() + "tiny_zero3.json --model gpt2-tiny --data " + data +
              " --steps 6 --threads 1 --save-dir " + (dir / "three").string() + " --metrics " +
              (dir / "three.jsonl").string(),
          mpirun(3));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto uninterrupted = read_metrics(dir / "full.jsonl");
  const auto resumed = read_metrics(dir / "three.jsonl");
  ASSERT_EQ(uninterrupted.size(), 6u);
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed[i]["step"], uninterrupted[i + 2]["step"]);
    const double want = uninterrupted[i + 2]["loss"].get<double>();
    EXPECT_NEAR(resumed[i]["loss"].get<double>(), want, 1e-5 * want) << "step " << resumed[i]["step"];
  }
}

}  // namespace
}  // namespace shardkit
