// A real training run with DeepSpeed's tensorboard and csv_monitor sections enabled, on 1-4 ranks: rank
// 0 alone writes one event file and one CSV file per tag into output_path/job_name; the event file,
// read by the tests' own reader (framing, both CRCs, the Event protocol buffer), and the CSV files hold
// every scalar of every step the trainer returned, with DeepSpeed's tags and x-axis.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "comm/mpi.hpp"
#include "tests/support/event_file_reader.hpp"
#include "tests/support/mpi_support.hpp"
#include "trainer/ds_config.hpp"
#include "trainer/lr_schedule.hpp"
#include "trainer/trainer.hpp"

namespace shardkit {
namespace {

using trainer::StepRecord;

constexpr int64_t kBatch = 24;  // train_batch_size: the x-axis advances by it every step
constexpr int64_t kSteps = 6;

// (samples, value) of one tag, in the order written.
using Series = std::vector<std::pair<int64_t, double>>;

std::map<std::string, Series> from_events(const std::vector<testing::Event>& events) {
  std::map<std::string, Series> out;
  for (const testing::Event& e : events) {
    for (const testing::SummaryValue& v : e.values) out[v.tag].emplace_back(e.step, v.simple_value);
  }
  return out;
}

// Every CSV file of `folder` by file name: its header row and its rows, each checked to end in "\r\n".
struct CsvFile {
  std::string header;
  Series rows;
};
std::map<std::string, CsvFile> read_csv_folder(const std::filesystem::path& folder) {
  std::map<std::string, CsvFile> out;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().extension() != ".csv") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    CsvFile& file = out[entry.path().filename().string()];
    std::string line;
    while (std::getline(in, line)) {
      EXPECT_TRUE(!line.empty() && line.back() == '\r') << entry.path() << ": a row without \\r\\n";
      line.pop_back();
      if (file.header.empty()) {
        file.header = line;
        continue;
      }
      const size_t comma = line.find(',');
      file.rows.emplace_back(std::stoll(line.substr(0, comma)), std::strtod(line.c_str() + comma + 1, nullptr));
    }
  }
  return out;
}

// What the run must have written, from its records: DeepSpeed's tags (the loss at the samples before
// the step, the rest after it; lr and loss_scale as they are once the step is done, i.e. what the next
// step uses) and shardkit's own.
std::map<std::string, Series> expected(const std::vector<StepRecord>& records, double last_lr) {
  std::map<std::string, Series> out;
  for (size_t i = 0; i < records.size(); ++i) {
    const StepRecord& r = records[i];
    const int64_t before = static_cast<int64_t>(i) * kBatch, after = before + kBatch;
    const bool last = i + 1 == records.size();
    out["Train/Samples/train_loss"].emplace_back(before, r.loss);
    out["Train/Samples/lr"].emplace_back(after, last ? last_lr : records[i + 1].lr);
    if (!last) out["Train/Samples/loss_scale"].emplace_back(after, records[i + 1].loss_scale);
    out["Train/Samples/elapsed_time_ms_forward"].emplace_back(after, r.forward_ms);
    out["Train/Samples/elapsed_time_ms_backward"].emplace_back(after, r.backward_ms + r.reduce_ms);
    out["Train/Samples/elapsed_time_ms_backward_inner"].emplace_back(after, r.backward_ms);
    out["Train/Samples/elapsed_time_ms_backward_allreduce"].emplace_back(after, r.reduce_ms);
    out["Train/Samples/elapsed_time_ms_step"].emplace_back(after, r.optimizer_ms);
    out["Train/Samples/tokens_per_s"].emplace_back(after, r.tokens_per_s);
    if (!r.skipped) out["Train/Samples/grad_norm"].emplace_back(after, r.grad_norm);
  }
  return out;
}

TEST(MonitorMpi, TensorBoardAndCsvHoldEveryStepsScalarsWithDeepSpeedsTagsAndXAxis) {
  comm::MpiCollective world(MPI_COMM_WORLD);
  testing::SharedDir ws(world);
  ws.write_tokens("tokens.bin", 6000);
  const nlohmann::json config = {
      {"train_batch_size", kBatch},
      {"gradient_accumulation_steps", 2},
      {"zero_optimization", {{"stage", 2}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-3}}}}},
      {"scheduler", {{"type", "WarmupDecayLR"}, {"params", {{"warmup_num_steps", 3}, {"total_num_steps", 20}}}}},
      // A window of 2 doubles the scale every other step: the loss_scale series moves.
      {"fp16", {{"enabled", true}, {"initial_scale_power", 10}, {"loss_scale_window", 2}}},
      {"wall_clock_breakdown", true},
      {"tensorboard", {{"enabled", true}, {"output_path", (ws / "tb").string()}, {"job_name", "run"}}},
      {"csv_monitor", {{"enabled", true}, {"output_path", (ws / "csv").string()}}}};
  trainer::TrainOptions o;
  o.config = ws.write_json("monitors.json", config);
  o.model = "gpt2-tiny";
  o.data = ws / "tokens.bin";
  o.steps = kSteps;
  o.save_dir = ws / "ckpt";
  o.save_interval = 2;
  o.save_mode = trainer::SaveMode::kSync;  // each save's scalar is written right after its step
  o.resume = "none";
  o.threads = 1;
  o.quiet = true;
  const std::vector<StepRecord> records = testing::train(world, o);
  ASSERT_EQ(records.size(), static_cast<size_t>(kSteps));
  if (world.rank() == 0) {
    // The rate the scheduler holds after the last step.
    const trainer::DsConfig ds = trainer::parse_ds_config(config, world.size(), {}, "monitors.json");
    int64_t applied = 0;
    for (const StepRecord& r : records) applied += r.skipped ? 0 : 1;
    const double last_lr = trainer::LrSchedule(ds.scheduler, ds.optimizer.lr).lr(applied - 1);
    const std::map<std::string, Series> want = expected(records, last_lr);

    std::vector<std::filesystem::path> event_files;
    for (const auto& entry : std::filesystem::directory_iterator(ws / "tb/run")) event_files.push_back(entry.path());
    ASSERT_EQ(event_files.size(), 1u) << "one event file, rank 0's";
    const std::vector<testing::Event> events = testing::read_event_file(event_files[0]);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events[0].file_version, "brain.Event:2");
    std::map<std::string, Series> got = from_events(events);
    // Saves at steps 2, 4 and 6: what each cost training, at the samples of its step.
    const Series saves = got["Train/Samples/checkpoint_training_lost_ms"];
    got.erase("Train/Samples/checkpoint_training_lost_ms");
    ASSERT_EQ(saves.size(), 3u);
    for (size_t i = 0; i < saves.size(); ++i) {
      EXPECT_EQ(saves[i].first, static_cast<int64_t>(2 * (i + 1)) * kBatch);
      EXPECT_GE(saves[i].second, 0.0);
    }
    // The last step's loss scale is the scaler's after it: there only, not compared with a record.
    ASSERT_EQ(got["Train/Samples/loss_scale"].size(), static_cast<size_t>(kSteps));
    got["Train/Samples/loss_scale"].pop_back();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [tag, series] : want) {
      SCOPED_TRACE(tag);
      ASSERT_EQ(got[tag].size(), series.size());
      for (size_t i = 0; i < series.size(); ++i) {
        EXPECT_EQ(got[tag][i].first, series[i].first) << "x of step " << i + 1;
        EXPECT_EQ(got[tag][i].second, static_cast<float>(series[i].second)) << "step " << i + 1;
      }
    }
    EXPECT_NE(want.at("Train/Samples/loss_scale").front().second, want.at("Train/Samples/loss_scale").back().second);

    // The CSV files: DeepSpeed's names and headers, the same rows at full precision.
    const std::map<std::string, CsvFile> csv = read_csv_folder(ws / "csv/DeepSpeedJobName");
    ASSERT_EQ(csv.size(), want.size() + 1);
    for (const auto& [tag, series] : want) {
      const std::string name = tag.substr(0, 5) + "_Samples_" + tag.substr(std::string("Train/Samples/").size());
      SCOPED_TRACE(name);
      ASSERT_TRUE(csv.contains(name + ".csv"));
      const CsvFile& file = csv.at(name + ".csv");
      EXPECT_EQ(file.header, "step," + tag.substr(tag.rfind('/') + 1));
      const size_t compared = tag == "Train/Samples/loss_scale" ? series.size() : file.rows.size();
      ASSERT_EQ(file.rows.size(), tag == "Train/Samples/loss_scale" ? series.size() + 1 : series.size());
      for (size_t i = 0; i < compared; ++i) EXPECT_EQ(file.rows[i], series[i]) << "step " << i + 1;
    }
    const CsvFile& lost = csv.at("Train_Samples_checkpoint_training_lost_ms.csv");
    EXPECT_EQ(lost.header, "step,checkpoint_training_lost_ms");
    ASSERT_EQ(lost.rows.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(lost.rows[i].first, saves[i].first);
      EXPECT_EQ(static_cast<float>(lost.rows[i].second), static_cast<float>(saves[i].second));
    }
  }
  world.barrier();
}

}  // namespace
}  // namespace shardkit
