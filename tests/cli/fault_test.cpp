// Faults injected into real runs of `shardkit train` on 2 ranks: a kill -9 at each instant of the save
// protocol, a full disk (injected, and a real small tmpfs where the test may mount one), a second job
// on the same save directory. After each: no committed checkpoint is lost, the newest one verifies,
// and the next run cleans up and continues exactly as the uninterrupted run did.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ckpt/run_dir.hpp"
#include "ckpt/run_lock.hpp"
#include "ckpt/shard_format.hpp"
#include "tests/cli/cli_support.hpp"
#include "tests/support/event_file_reader.hpp"

namespace shardkit {
namespace {

using namespace testing::cli;

// `steps` of gpt2-tiny on 2 ranks, a checkpoint every 2 steps.
std::string train_args(const std::filesystem::path& data, const std::filesystem::path& run_dir,
                       const std::filesystem::path& metrics, const std::string& extra = "", int steps = 6) {
  return "train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data.string() + " --steps " +
         std::to_string(steps) + " --save-interval 2 --threads 1 --save-dir " + run_dir.string() + " --metrics " +
         metrics.string() + " " + extra;
}

std::string latest_of(const std::filesystem::path& run_dir) {
  return ckpt::read_latest(run_dir).value_or("(no latest)");
}

// The loss of every step in a metrics file, by step (a resumed run appends its steps after the first
// run's: the last record of a step wins).
std::map<int64_t, double> losses(const std::filesystem::path& metrics) {
  std::map<int64_t, double> out;
  for (const auto& r : read_metrics(metrics)) out[r["step"].get<int64_t>()] = r["loss"].get<double>();
  return out;
}

struct Point {
  const char* name;
  int rank;
  bool commits;  // the checkpoint of step 4 is committed when the process dies here
};

TEST(Faults, AKillAtEachPointOfTheSaveProtocolLosesNothingAndTheRunContinuesExactly) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  Result r = run(train_args(data, dir / "reference", dir / "reference.jsonl"), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto reference = losses(dir / "reference.jsonl");
  ASSERT_EQ(reference.size(), 6u);

  const std::vector<Point> points = {{"save-start", 1, false},    {"shard-partial", 1, false},
                                     {"shard-written", 0, false}, {"manifest.json.tmp", 0, false},
                                     {"manifest.json", 0, true},  {"latest.tmp", 0, true},
                                     {"latest", 0, true}};
  for (const Point& p : points) {
    SCOPED_TRACE(p.name);
    const std::filesystem::path run_dir = dir / p.name, metrics = dir / (std::string(p.name) + ".jsonl");
    const std::string fault = "SHARDKIT_FAULT=" + std::string(p.name) +
                              " SHARDKIT_FAULT_RANK=" + std::to_string(p.rank) + " SHARDKIT_FAULT_STEP=4";
    r = run(train_args(data, run_dir, metrics), mpirun(2), fault);
    ASSERT_NE(r.code, 0) << "the fault did not fire";
    // What the kill left: the newest checkpoint verifies; `latest` names step 2, or step 4 when the
    // kill came after it was updated.
    r = run("ckpt verify " + run_dir.string());
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_EQ(latest_of(run_dir), std::string(p.name) == "latest" ? "step-00000004" : "step-00000002");
    EXPECT_EQ(std::filesystem::exists(run_dir / "step-00000004" / "manifest.json"), p.commits);

    // The next run removes the leftovers and continues from the newest committed checkpoint.
    r = run(train_args(data, run_dir, metrics), mpirun(2));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(
        r.out.find(std::string("resumed from ") + (run_dir / (p.commits ? "step-00000004" : "step-00000002")).string()),
        std::string::npos)
        << r.out;
    if (!p.commits) {
      EXPECT_NE(r.out.find("(a save that never committed: no manifest)"), std::string::npos) << r.out;
    }
    for (const auto& entry : std::filesystem::recursive_directory_iterator(run_dir)) {
      EXPECT_NE(entry.path().extension(), ".tmp") << entry.path() << " survived the restart";
    }
    EXPECT_EQ(run("ckpt verify " + run_dir.string()).code, 0);
    EXPECT_EQ(latest_of(run_dir), "step-00000006");
    EXPECT_EQ(losses(metrics), reference) << "the resumed run differs from the uninterrupted one";
  }
}

// --resume auto skips damaged checkpoints, each with a warning naming the damage, loads the newest
// sound one, moves the damaged ones aside, and the run continues as the uninterrupted one did.
TEST(Faults, ResumeSkipsDamagedCheckpointsWithAWarningAndContinuesExactly) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const std::filesystem::path run_dir = dir / "run";
  Result r = run(train_args(data, run_dir, dir / "m.jsonl"), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto reference = losses(dir / "m.jsonl");

  // Step 6: one flipped bit in rank 1's data. Step 4: rank 0's shard truncated.
  const std::filesystem::path flipped = run_dir / "step-00000006" / ckpt::shard_file_name(1, 2);
  testing::flip_bit(flipped, testing::chunk_extent(flipped, "exp_avg", 0).offset + 64, 3);
  const std::filesystem::path truncated = run_dir / "step-00000004" / ckpt::shard_file_name(0, 2);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) / 2);
  r = run(train_args(data, run_dir, dir / "m.jsonl"), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("warning: skipping " + (run_dir / "step-00000006").string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(flipped.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checksum mismatch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(truncated.string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from " + (run_dir / "step-00000002").string()), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(run_dir / "step-00000006.damaged"));
  EXPECT_EQ(losses(dir / "m.jsonl"), reference);
  EXPECT_EQ(run("ckpt verify " + run_dir.string()).code, 0);

  // A broken manifest: skipped with a warning naming it.
  std::ofstream(run_dir / "step-00000006" / "manifest.json", std::ios::trunc) << "{\"format\": ";
  r = run(train_args(data, run_dir, dir / "m.jsonl", "", 8), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("warning: skipping " + (run_dir / "step-00000006").string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("manifest.json"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from " + (run_dir / "step-00000004").string()), std::string::npos) << r.out;
  EXPECT_EQ(latest_of(run_dir), "step-00000008");
}

// A shard whose metadata crashes libhdf5 (the crash is injected into the isolated parse of rank 1's
// shard of step 6) is a damaged checkpoint like any other: skipped with the crash named.
TEST(Faults, ResumeMovesPastAShardThatCrashesTheHdf5Parser) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const std::filesystem::path run_dir = dir / "run";
  Result r = run(train_args(data, run_dir, dir / "m.jsonl"), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto reference = losses(dir / "m.jsonl");

  r = run(train_args(data, run_dir, dir / "m.jsonl"), mpirun(2),
          "SHARDKIT_FAULT=shard-index-crash SHARDKIT_FAULT_RANK=1 SHARDKIT_FAULT_STEP=6");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("warning: skipping " + (run_dir / "step-00000006").string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(ckpt::shard_file_name(1, 2) + ": reading its HDF5 metadata crashed (signal 11, SIGSEGV)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("resumed from " + (run_dir / "step-00000004").string()), std::string::npos) << r.out;
  EXPECT_EQ(losses(dir / "m.jsonl"), reference);
}

TEST(Faults, AFullDiskFailsThatSaveOnlyAndTrainingGoesOnUnlessToldToStop) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const std::string enospc = "SHARDKIT_FAULT=enospc SHARDKIT_FAULT_RANK=1 SHARDKIT_FAULT_STEP=4";
  Result r = run(train_args(data, dir / "run", dir / "m.jsonl"), mpirun(2), enospc);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint of step 4 failed"), std::string::npos) << r.out;
  const auto events = read_metrics(dir / "m.jsonl", true);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1]["event"], "checkpoint_error");
  EXPECT_EQ(events[1]["step"], 4);
  EXPECT_NE(events[1]["error"].get<std::string>().find("No space left on device"), std::string::npos);
  EXPECT_EQ(events[2]["event"], "checkpoint") << "the next save is tried, and succeeds";
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "step-00000004")) << "a failed save leaves nothing";
  EXPECT_EQ(latest_of(dir / "run"), "step-00000006");
  EXPECT_EQ(run("ckpt verify " + (dir / "run").string()).code, 0);

  r = run(train_args(data, dir / "stop", dir / "stop.jsonl", "--on-save-error stop"), mpirun(2), enospc);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_EQ(latest_of(dir / "stop"), "step-00000002");
  EXPECT_EQ(run("ckpt verify " + (dir / "stop").string()).code, 0);
}

// What a save costs training is measured, not assumed: a snapshot made slower by a known delay (on CPU
// ranks the copy runs inside save()) costs training at least that delay, and the event says so.
// tiny_zero2.json with both monitors writing into `output_path` (DeepSpeed's default job name).
std::filesystem::path monitors_config(const testing::TempDir& dir, const std::filesystem::path& output_path) {
  nlohmann::json config = nlohmann::json::parse(slurp(samples() + "tiny_zero2.json"));
  config["tensorboard"] = {{"enabled", true}, {"output_path", output_path.string()}};
  config["csv_monitor"] = {{"enabled", true}, {"output_path", output_path.string()}};
  const std::filesystem::path file = dir / "monitors.json";
  std::ofstream(file) << config.dump();
  return file;
}

// A disk that fills up under the monitors (injected at step 3 of 6) stops them, each with one warning;
// training, its metrics and every checkpoint go on.
TEST(Faults, AFullDiskUnderTheMonitorsStopsThemNotTrainingOrSaves) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const std::string args = "train --config " + monitors_config(dir, dir / "monitors").string() +
                           " --model gpt2-tiny --data " + data.string() +
                           " --steps 6 --save-interval 2 --threads 1 --save-dir " + (dir / "run").string() +
                           " --metrics " + (dir / "m.jsonl").string();
  const Result r = run(args, "", "SHARDKIT_FAULT=monitor-enospc SHARDKIT_FAULT_STEP=3");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* output : {"warning: TensorBoard events to ", "warning: CSV files (one per tag) to "}) {
    const size_t at = r.out.find(output);
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(output, at + 1), std::string::npos) << "warned twice: " << r.out;
    EXPECT_NE(r.out.find("No space left on device", at), std::string::npos) << r.out;
  }
  EXPECT_EQ(latest_of(dir / "run"), "step-00000006");
  EXPECT_EQ(run("ckpt verify " + (dir / "run").string()).code, 0);
  EXPECT_EQ(read_metrics(dir / "m.jsonl").size(), 6u);
  // Steps 1 and 2 reached the files; nothing after.
  const std::filesystem::path folder = dir / "monitors" / "DeepSpeedJobName";
  std::vector<int64_t> loss_x;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().filename().string().find("tfevents") == std::string::npos) continue;
    for (const auto& e : testing::read_event_file(entry.path())) {
      for (const auto& v : e.values) {
        if (v.tag == "Train/Samples/train_loss") loss_x.push_back(e.step);
      }
    }
  }
  EXPECT_EQ(loss_x, (std::vector<int64_t>{0, 12}));
  const std::string losses = slurp(folder / "Train_Samples_train_loss.csv");
  EXPECT_EQ(losses.rfind("step,train_loss\r\n0,", 0), 0u) << losses;
  EXPECT_EQ(count_lines(losses), 3) << losses;
}

TEST(Faults, ASlowSnapshotCostsTrainingItsDelayAndTheCheckpointEventSaysSo) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const double delay_ms = 700;
  const Result r = run(train_args(data, dir / "run", dir / "m.jsonl"), mpirun(2),
                       "SHARDKIT_FAULT=slow-snapshot SHARDKIT_FAULT_STEP=4 SHARDKIT_FAULT_DELAY_MS=700");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("training lost"), std::string::npos) << r.out;
  const auto events = read_metrics(dir / "m.jsonl", true);
  ASSERT_EQ(events.size(), 3u);
  for (const auto& e : events) {
    ASSERT_EQ(e["event"], "checkpoint") << e.dump();
    EXPECT_DOUBLE_EQ(e["training_lost_ms"].get<double>(),
                     e["loop_blocked_ms"].get<double>() + e["device_wait_ms"].get<double>());
    EXPECT_EQ(e["device_wait_ms"].get<double>(), 0.0) << "CPU ranks copy inside save()";
  }
  EXPECT_EQ(events[1]["step"], 4);
  EXPECT_GE(events[1]["training_lost_ms"].get<double>(), delay_ms);
  EXPECT_LT(events[0]["training_lost_ms"].get<double>(), delay_ms) << "the fault is armed for step 4 only";
}

// Removing the checkpoints beyond --keep-last comes after the commit and is not the save's write: a
// prune made slower by a known delay shows in the event's prune_ms, not in write_ms, which figures
// compare with dd's write of the same bytes.
TEST(Faults, PruningAfterTheCommitIsTimedApartFromTheWrite) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const double delay_ms = 1500;
  const Result r = run(train_args(data, dir / "run", dir / "m.jsonl", "--keep-last 1"), mpirun(2),
                       "SHARDKIT_FAULT=slow-prune SHARDKIT_FAULT_STEP=4 SHARDKIT_FAULT_DELAY_MS=1500");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto events = read_metrics(dir / "m.jsonl", true);
  ASSERT_EQ(events.size(), 3u);
  ASSERT_EQ(events[1]["step"], 4);
  EXPECT_GE(events[1]["prune_ms"].get<double>(), delay_ms) << events[1].dump();
  for (const auto& e : events) {
    EXPECT_LT(e["write_ms"].get<double>(), delay_ms) << e.dump();
    if (e["step"] != 4) {
      EXPECT_LT(e["prune_ms"].get<double>(), delay_ms) << e.dump();
    }
  }
  EXPECT_EQ(latest_of(dir / "run"), "step-00000006");
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "step-00000002"));
  EXPECT_FALSE(std::filesystem::exists(dir / "run" / "step-00000004"));
}

// Without a snapshot copy (--snapshot-staging none: for states too large to be held twice in host
// memory) the save reads the live states and the next optimizer step waits until it is done: a save
// made slower by a known delay costs the step what of it the step's passes do not cover, and the
// event says so as the step's wait.
// Saving every step (each save meeting the step after the one before), the checkpoint of step 4 holds
// exactly step 4's states: resumed, it continues the uninterrupted run bit for bit.
TEST(Faults, WithoutASnapshotCopyTheStepWaitsForTheSaveAndTheCheckpointIsExact) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const double delay_ms = 2000;  // well above a step of the sanitizer build
  Result r = run(train_args(data, dir / "slow", dir / "slow.jsonl", "--snapshot-staging none"), mpirun(2),
                 "SHARDKIT_FAULT=slow-snapshot SHARDKIT_FAULT_STEP=4 SHARDKIT_FAULT_DELAY_MS=2000");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint snapshots: none: a save reads the live optimizer states"), std::string::npos)
      << r.out;
  const auto events = read_metrics(dir / "slow.jsonl", true);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1]["step"], 4);
  // The next step's forward and backward passes run beside the save; its optimizer waits for the rest,
  // so that step cannot end before the delayed reading does, however fast or slow its passes are.
  const auto steps = read_metrics(dir / "slow.jsonl");
  ASSERT_EQ(steps.size(), 6u);
  ASSERT_EQ(steps[4]["step"], 5);
  EXPECT_GE(steps[4]["step_ms"].get<double>() + events[1]["loop_blocked_ms"].get<double>(), 0.98 * delay_ms)
      << steps[4].dump() << " " << events[1].dump();
  EXPECT_GE(events[1]["device_wait_ms"].get<double>(), 0.0) << events[1].dump();
  EXPECT_LE(events[1]["device_wait_ms"].get<double>(), events[1]["write_ms"].get<double>()) << events[1].dump();
  EXPECT_LT(events[1]["loop_blocked_ms"].get<double>(), 0.2 * delay_ms) << events[1].dump();
  EXPECT_DOUBLE_EQ(events[1]["training_lost_ms"].get<double>(),
                   events[1]["loop_blocked_ms"].get<double>() + events[1]["device_wait_ms"].get<double>());

  r = run("train --config " + samples() + "tiny_zero2.json --model gpt2-tiny --data " + data.string() +
              " --steps 6 --save-interval 1 --threads 1 --snapshot-staging none --save-dir " +
              (dir / "every").string() + " --metrics " + (dir / "every.jsonl").string(),
          mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run(train_args(data, dir / "resumed", dir / "resumed.jsonl",
                     "--resume " + (dir / "every" / "step-00000004").string()),
          mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto full = losses(dir / "every.jsonl"), resumed = losses(dir / "resumed.jsonl");
  ASSERT_EQ(resumed.size(), 2u);
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, full.at(step)) << "step " << step;
}

// A real full disk: a tmpfs with room for one checkpoint and a half. With --keep-last 1 the second
// checkpoint needs room next to the first (the older one goes only after the newer one commits).
TEST(Faults, ARealFullDiskKeepsThePreviousCheckpoint) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  Result r = run(train_args(data, dir / "probe", dir / "probe.jsonl", "", 2), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  uintmax_t bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir / "probe")) {
    if (e.is_regular_file()) bytes += e.file_size();
  }
  const std::filesystem::path mnt = dir / "small";
  std::filesystem::create_directories(mnt);
  const std::string options = "size=" + std::to_string(bytes * 3 / 2 / 4096 * 4096);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, options.c_str()) != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root): the injected-ENOSPC test covers the logic";
  }
  struct Unmount {
    std::filesystem::path at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{mnt};
  r = run(train_args(data, mnt / "run", dir / "full.jsonl", "--keep-last 1"), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto events = read_metrics(dir / "full.jsonl", true);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["event"], "checkpoint");
  EXPECT_EQ(events[1]["event"], "checkpoint_error");
  EXPECT_EQ(events[2]["event"], "checkpoint_error");
  EXPECT_EQ(latest_of(mnt / "run"), "step-00000002");
  EXPECT_EQ(run("ckpt verify " + (mnt / "run").string()).code, 0);
  EXPECT_FALSE(std::filesystem::exists(mnt / "run" / "step-00000004"));
}

// A 6-step run on 2 ranks whose rank 1 meets `fault` (SHARDKIT_FAULT and the rest) as step 3 starts,
// after the synchronous save of step 2 committed; and how long the job took to end. `timeout` only
// guards the test against the hang it looks for: 120 s, twice what any of these runs may take.
struct FaultedRun {
  Result result;
  double seconds = 0;
};
FaultedRun run_with_fault_at_step_3(const testing::TempDir& dir, const std::string& fault) {
  const auto data = write_text_tokens(dir);
  const auto start = std::chrono::steady_clock::now();
  FaultedRun out;
  out.result = run(train_args(data, dir / "run", dir / "m.jsonl", "--save-mode sync"),
                   "timeout -s KILL 120 " + mpirun(2), fault + " SHARDKIT_FAULT_RANK=1 SHARDKIT_FAULT_STEP=3");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

// One rank fails on its own while the other waits in a collective for it: the job ends, with the
// failing rank's message, instead of hanging.
TEST(Faults, ARankThatFailsAloneEndsTheJobInsteadOfHangingIt) {
  testing::TempDir dir;
  const auto [r, seconds] = run_with_fault_at_step_3(dir, "SHARDKIT_FAULT=step-error");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("shardkit: error (rank 1 of 2): step 3: injected failure"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 60.0);
  EXPECT_EQ(latest_of(dir / "run"), "step-00000002") << "the checkpoint before the failure is intact";
}

// One rank stalls (alive, asleep) outside the collectives while the other waits in the step's first
// collective for it: once SHARDKIT_COLLECTIVE_TIMEOUT passes, the waiting rank's watchdog ends the job
// with a line naming it, the collective and the wait.
TEST(Faults, ARankThatStallsIsEndedByTheCollectiveWatchdogWithinTheTimeout) {
  testing::TempDir dir;
  const auto [r, seconds] = run_with_fault_at_step_3(dir, "SHARDKIT_FAULT=stall SHARDKIT_COLLECTIVE_TIMEOUT=10");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("shardkit: rank 0 of 2: collective watchdog: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("for the other ranks (SHARDKIT_COLLECTIVE_TIMEOUT 10 s): a rank stalled or died"),
            std::string::npos)
      << r.err;
  EXPECT_LT(seconds, 60.0) << "the job hung until the test's own timeout killed it";
  EXPECT_EQ(latest_of(dir / "run"), "step-00000002") << "the checkpoint before the stall is intact";
}

// One rank is killed (SIGKILL, as by the OOM killer) as a step starts: the job ends with an error
// instead of leaving the other rank in the step's collectives.
TEST(Faults, ARankKilledMidRunEndsTheJobInsteadOfHangingIt) {
  testing::TempDir dir;
  const auto [r, seconds] = run_with_fault_at_step_3(dir, "SHARDKIT_FAULT=step-kill");
  EXPECT_NE(r.code, 0) << "the fault did not fire";
  EXPECT_LT(seconds, 60.0) << "the job hung until the test's own timeout killed it";
  EXPECT_EQ(latest_of(dir / "run"), "step-00000002") << "the checkpoint before the kill is intact";
}

TEST(Faults, ASecondJobOnTheSameSaveDirectoryIsRefusedAndAStaleLockIsTakenOver) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const std::filesystem::path run_dir = dir / "run";
  {
    std::string previous;
    const ckpt::RunLock held(run_dir, "a test", &previous);
    EXPECT_TRUE(previous.empty());
    const Result r = run(train_args(data, run_dir, dir / "m.jsonl"), mpirun(2));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("is in use by pid " + std::to_string(::getpid())), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(".shardkit.lock"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(run_dir / "latest")) << "the refused job wrote nothing";
  }
  // A lock file whose holder died (a kill -9 leaves its content behind) does not block.
  std::ofstream(run_dir / ckpt::kLockFileName)
      << "pid 999999 on elsewhere since 2026-01-01T00:00:00Z (shardkit train)\n";
  const Result r = run(train_args(data, run_dir, dir / "m.jsonl"), mpirun(2));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("from pid 999999 on elsewhere"), std::string::npos) << r.out;
  EXPECT_EQ(latest_of(run_dir), "step-00000006");
}

// The error's kind survives the trip from rank 0 to every rank: another job's lock is bad input (exit
// 2, above), a save directory the system cannot create is an I/O error (exit 1).
TEST(Faults, ASaveDirectoryTheSystemCannotCreateIsAnIoErrorOnEveryRank) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  std::ofstream(dir / "file") << "a file where a directory should be";
  const Result r = run(train_args(data, dir / "file" / "run", dir / "m.jsonl"), mpirun(2));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("file/run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cannot create directory"), std::string::npos) << r.err;
}

// tiny_zero2.json with the optimizer states swapped to `nvme_path` (NVMe offload), in `dir`.
std::filesystem::path write_nvme_config(const testing::TempDir& dir, const std::filesystem::path& nvme_path) {
  nlohmann::json config = nlohmann::json::parse(slurp(samples() + "tiny_zero2.json"));
  config["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", nvme_path.string()}};
  config["aio"] = {{"block_size", 65536}};
  std::ofstream(dir / "nvme.json") << config.dump();
  return dir / "nvme.json";
}

// The disk of the swap fills up halfway through a run (both ranks' swap writes fail with ENOSPC in
// step 3): the run ends with a line naming the swap file and the system's error, and the checkpoint
// committed before (step 2) is intact.
TEST(Faults, ASwapDiskThatFillsUpEndsTheRunAndKeepsTheLastCheckpoint) {
  if (!SHARDKIT_HAVE_LIBURING) GTEST_SKIP() << "this build has no liburing: NVMe offload is refused";
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  std::filesystem::create_directory(dir / "nvme");
  const std::string args = "train --config " + write_nvme_config(dir, dir / "nvme").string() +
                           " --model gpt2-tiny --steps 6 --save-interval 2 --save-mode sync --threads 1 --data " +
                           data.string() + " --save-dir " + (dir / "run").string();
  const Result r = run(args, "timeout -s KILL 120 " + mpirun(2), "SHARDKIT_FAULT=swap-enospc SHARDKIT_FAULT_STEP=3");
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.err.find((dir / "nvme").string() + "/shardkit-"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("-optimizer-rank"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(": No space left on device"), std::string::npos) << r.err;
  EXPECT_EQ(latest_of(dir / "run"), "step-00000002");
  EXPECT_EQ(run("ckpt verify " + (dir / "run").string()).code, 0);
}

// A folder for the swap that is not there: refused at start-up, one line naming it.
TEST(Faults, AMissingNvmePathIsRefusedNamingIt) {
  testing::TempDir dir;
  const auto data = write_text_tokens(dir);
  const Result r = run("train --config " + write_nvme_config(dir, dir / "absent").string() +
                       " --model gpt2-tiny --steps 1 --threads 1 --data " + data.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find((dir / "absent").string() + ": nvme_path does not exist (expected a writable directory)"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace shardkit
