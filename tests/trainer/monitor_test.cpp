// The monitors piece by piece: the TensorBoard event file read back by the tests' own reader (framing,
// both CRCs, the Event protocol buffer), DeepSpeed's CSV names, columns and number format, the tags and
// x-axis of a step, config errors naming the key, and an output that fails dropped with one warning.
// tests/mpi/monitor_mpi_test.cpp checks a real training run's files against its records.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>

#include "base/error.hpp"
#include "tests/support/event_file_reader.hpp"
#include "tests/support/test_support.hpp"
#include "trainer/monitor/csv_files.hpp"
#include "trainer/monitor/event_file.hpp"
#include "trainer/monitor/monitors.hpp"

namespace shardkit::trainer::monitor {
namespace {

std::string slurp(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::filesystem::path> files_in(const std::filesystem::path& folder) {
  std::vector<std::filesystem::path> out;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(EventFile, AScalarEventIsTheProtocolBufferTensorBoardReads) {
  // Event{wall_time 1.5, step 12, summary{value{tag "a", simple_value 2}}}, worked out by hand.
  const std::string expected(
      "\x09\x00\x00\x00\x00\x00\x00\xf8\x3f"  // field 1, fixed64: 1.5
      "\x10\x0c"                              // field 2, varint: 12
      "\x2a\x0a"                              // field 5, 10 bytes: Summary
      "\x0a\x08"                              //   field 1, 8 bytes: Value
      "\x0a\x01\x61"                          //     tag "a"
      "\x15\x00\x00\x00\x40",                 //     simple_value 2.0f
      23);
  EXPECT_EQ(encode_scalar_event(1.5, 12, "a", 2.0f), expected);
  const std::string record = frame_record(expected);
  ASSERT_EQ(record.size(), 8 + 4 + expected.size() + 4);
  EXPECT_EQ(record.substr(0, 8), std::string("\x17\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(record.substr(12, expected.size()), expected);
}

TEST(EventFile, TheFileReadsBackWithItsFramingCrcsAndValues) {
  testing::TempDir dir;
  std::filesystem::path file;
  {
    EventFileSink sink(dir.path());
    file = sink.path();
    const std::vector<Scalar> step1 = {{"Train/Samples/train_loss", 5.25, 0}, {"Train/Samples/lr", 1e-4, 12}};
    const std::vector<Scalar> step2 = {{"Train/Samples/train_loss", 4.75, 12}, {"Train/Samples/lr", 2e-4, 24}};
    sink.write(step1);
    sink.write(step2);
  }
  EXPECT_EQ(file.parent_path(), dir.path());
  EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u) << file;
  const std::vector<testing::Event> events = testing::read_event_file(file);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].values.empty());
  EXPECT_GT(events[0].wall_time, 1.7e9) << "seconds since 1970";
  const std::vector<std::tuple<std::string, float, int64_t>> want = {{"Train/Samples/train_loss", 5.25f, 0},
                                                                     {"Train/Samples/lr", 1e-4f, 12},
                                                                     {"Train/Samples/train_loss", 4.75f, 12},
                                                                     {"Train/Samples/lr", 2e-4f, 24}};
  for (size_t i = 0; i < want.size(); ++i) {
    const testing::Event& e = events[i + 1];
    ASSERT_EQ(e.values.size(), 1u) << i;
    EXPECT_EQ(e.values[0].tag, std::get<0>(want[i])) << i;
    EXPECT_EQ(e.values[0].simple_value, std::get<1>(want[i])) << i;
    EXPECT_EQ(e.step, std::get<2>(want[i])) << i;
    EXPECT_GE(e.wall_time, events[0].wall_time);
  }
}

TEST(EventFile, TheTestsReaderRefusesAFlippedBitInTheLengthOrTheData) {
  testing::TempDir dir;
  std::filesystem::path file;
  {
    EventFileSink sink(dir.path());
    file = sink.path();
    const Scalar s{"x", 1.0, 1};
    sink.write({&s, 1});
  }
  const std::string good = slurp(file);
  const size_t second = frame_record(encode_file_version_event(0)).size();  // the scalar's record
  for (const auto& [offset, problem] :
       {std::pair<size_t, std::string>{second + 1, "length's CRC"}, {second + 14, "data's CRC"}}) {
    std::string bad = good;
    bad[offset] = static_cast<char>(bad[offset] ^ 0x10);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bad;
    try {
      testing::read_event_file(file);
      ADD_FAILURE() << "a flipped bit at " << offset << " was read";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(problem), std::string::npos) << e.what();
    }
  }
}

TEST(CsvFiles, NamesAndColumnsAreDeepSpeeds) {
  EXPECT_EQ(csv_file_name("Train/Samples/train_loss"), "Train_Samples_train_loss.csv");
  EXPECT_EQ(csv_file_name("Train/Samples/a b"), "Train_Samples_a_b.csv");
  EXPECT_EQ(csv_column("Train/Samples/train_loss"), "train_loss");
  EXPECT_EQ(csv_column("loss"), "loss");
}

TEST(CsvFiles, NumbersAreWrittenAsPythonsStrOfAFloat) {
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // Python 3's repr() of each value.
  const std::vector<std::pair<double, std::string>> cases = {
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1.0, "1.0"},
      {65536.0, "65536.0"},
      {0.0001, "0.0001"},
      {1e-05, "1e-05"},
      {0.00015, "0.00015"},
      {5e-05, "5e-05"},
      {1e+16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {123456789012345678.0, "1.2345678901234568e+17"},
      {1.5e-300, "1.5e-300"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {0.1, "0.1"},
      {1.0 / 3, "0.3333333333333333"},
      {std::ldexp(1.0, -20), "9.5367431640625e-07"},
      {-2.5, "-2.5"},
      {48.527545999999994, "48.527545999999994"},
      {kNan, "nan"},
      {kInf, "inf"},
      {-kInf, "-inf"},
      {9999999999999998.0, "9999999999999998.0"},
      {0.001, "0.001"},
      {12345.678, "12345.678"},
  };
  for (const auto& [value, text] : cases) EXPECT_EQ(python_float(value), text);
}

TEST(CsvFiles, OneFilePerTagWithItsHeaderOnceEvenAcrossARestart) {
  testing::TempDir dir;
  const std::vector<Scalar> first = {{"Train/Samples/train_loss", 5.5, 0}, {"Train/Samples/lr", 0.0001, 12}};
  CsvSink(dir.path()).write(first);
  // A resumed run: a new sink appends under the header already there.
  const Scalar later{"Train/Samples/train_loss", 5.25, 12};
  CsvSink(dir.path()).write({&later, 1});
  EXPECT_EQ(files_in(dir.path()),
            (std::vector<std::filesystem::path>{dir / "Train_Samples_lr.csv", dir / "Train_Samples_train_loss.csv"}));
  EXPECT_EQ(slurp(dir / "Train_Samples_train_loss.csv"), "step,train_loss\r\n0,5.5\r\n12,5.25\r\n");
  EXPECT_EQ(slurp(dir / "Train_Samples_lr.csv"), "step,lr\r\n12,0.0001\r\n");
}

StepRecord record(bool skipped) {
  return {.step = 3,
          .loss = 5.5,
          .lr = 1e-4,
          .grad_norm = skipped ? std::nan("") : 0.75,
          .skipped = skipped,
          .tokens_per_s = 1000,
          .forward_ms = 10,
          .backward_ms = 20,
          .reduce_ms = 3,
          .optimizer_ms = 4};
}

std::vector<std::tuple<std::string, double, int64_t>> flat(const std::vector<Scalar>& scalars) {
  std::vector<std::tuple<std::string, double, int64_t>> out;
  for (const Scalar& s : scalars) out.emplace_back(s.tag, s.value, s.samples);
  return out;
}

TEST(StepScalars, DeepSpeedsTagsAndXAxisThenShardkitsOwn) {
  StepContext c;
  c.samples_before = 24;
  c.samples_after = 36;
  c.next_lr = 2e-4;
  using Row = std::tuple<std::string, double, int64_t>;
  EXPECT_EQ(flat(step_scalars(record(false), c)), (std::vector<Row>{{"Train/Samples/train_loss", 5.5, 24},
                                                                    {"Train/Samples/lr", 2e-4, 36},
                                                                    {"Train/Samples/tokens_per_s", 1000, 36},
                                                                    {"Train/Samples/grad_norm", 0.75, 36}}));
  // fp16's loss scale and wall_clock_breakdown's times; a skipped step has no gradient norm.
  c.loss_scale = 32768;
  c.wall_clock_breakdown = true;
  EXPECT_EQ(flat(step_scalars(record(true), c)),
            (std::vector<Row>{{"Train/Samples/train_loss", 5.5, 24},
                              {"Train/Samples/lr", 2e-4, 36},
                              {"Train/Samples/loss_scale", 32768, 36},
                              {"Train/Samples/elapsed_time_ms_forward", 10, 36},
                              {"Train/Samples/elapsed_time_ms_backward", 23, 36},
                              {"Train/Samples/elapsed_time_ms_backward_inner", 20, 36},
                              {"Train/Samples/elapsed_time_ms_backward_allreduce", 3, 36},
                              {"Train/Samples/elapsed_time_ms_step", 4, 36},
                              {"Train/Samples/tokens_per_s", 1000, 36}}));
  EXPECT_EQ(flat({checkpoint_scalar(1.5, 48)}),
            (std::vector<Row>{{"Train/Samples/checkpoint_training_lost_ms", 1.5, 48}}));
}

MonitorConfig both(const std::filesystem::path& output_path) {
  MonitorConfig config;
  config.tensorboard = {true, output_path.string(), "job"};
  config.csv_monitor = {true, output_path.string(), "DeepSpeedJobName"};
  return config;
}

TEST(Monitors, EachOutputWritesIntoOutputPathSlashJobName) {
  testing::TempDir dir;
  std::vector<std::string> log;
  Monitors monitors(both(dir / "out"), "cfg.json", [&](const std::string& line) { log.push_back(line); });
  const Scalar s{"Train/Samples/lr", 0.5, 12};
  monitors.write({&s, 1});
  ASSERT_EQ(files_in(dir / "out/job").size(), 1u);
  EXPECT_EQ(testing::read_event_file(files_in(dir / "out/job")[0]).size(), 2u);
  EXPECT_EQ(slurp(dir / "out/DeepSpeedJobName/Train_Samples_lr.csv"), "step,lr\r\n12,0.5\r\n");
  ASSERT_EQ(monitors.describe().size(), 2u);
  EXPECT_NE(monitors.describe()[1].find("CSV files"), std::string::npos);
  EXPECT_TRUE(log.empty());
}

TEST(Monitors, AFolderThatCannotBeMadeIsAConfigErrorNamingTheKey) {
  testing::TempDir dir;
  std::ofstream(dir / "a-file") << "x";
  MonitorConfig config;
  config.csv_monitor = {true, (dir / "a-file").string(), "job"};
  try {
    Monitors(config, "cfg.json", [](const std::string&) {});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("cfg.json: csv_monitor.output_path / csv_monitor.job_name: ", 0), 0u) << message;
    EXPECT_NE(message.find("(expected a folder shardkit can write)"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(Monitors, AnOutputThatFailsIsReportedOnceAndDroppedWhileTheOthersGoOn) {
  testing::TempDir dir;
  std::vector<std::string> log;
  Monitors monitors(both(dir / "out"), "cfg.json", [&](const std::string& line) { log.push_back(line); });
  // The CSV folder disappears under the run: its next file cannot be created.
  std::filesystem::remove_all(dir / "out/DeepSpeedJobName");
  const Scalar a{"Train/Samples/lr", 0.5, 12};
  const Scalar b{"Train/Samples/lr", 0.25, 24};
  monitors.write({&a, 1});
  monitors.write({&b, 1});
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].rfind("warning: CSV files (one per tag) to ", 0), 0u) << log[0];
  EXPECT_NE(log[0].find("training goes on"), std::string::npos) << log[0];
  EXPECT_EQ(monitors.describe().size(), 1u);
  EXPECT_EQ(testing::read_event_file(files_in(dir / "out/job")[0]).size(), 3u) << "TensorBoard went on";
}

TEST(Monitors, WandbAndCometSayWhereTheMetricsGoInstead) {
  MonitorConfig config;
  config.wandb = true;
  EXPECT_EQ(network_monitor_notes(config, "runs/m.jsonl", {"TensorBoard events to tb/x"}),
            std::vector<std::string>{"wandb.enabled ignored: Weights & Biases is a network service that shardkit does "
                                     "not talk to; the metrics go to --metrics runs/m.jsonl (`shardkit report` "
                                     "charts it); TensorBoard events to tb/x"});
  config.wandb = false;
  config.comet = true;
  const std::vector<std::string> none = network_monitor_notes(config, "", {});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_NE(none[0].find("comet.enabled ignored: Comet is a network service"), std::string::npos) << none[0];
  EXPECT_NE(none[0].find("nothing records the metrics: give --metrics FILE"), std::string::npos) << none[0];
  EXPECT_TRUE(network_monitor_notes(MonitorConfig{}, "", {}).empty());
}

}  // namespace
}  // namespace shardkit::trainer::monitor
