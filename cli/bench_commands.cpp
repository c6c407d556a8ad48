// `shardkit bench ckpt | checksum`.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "ckpt/bench.hpp"
#include "ckpt/shard_format.hpp"
#include "cli/commands.hpp"
#include "cli/console.hpp"
#include "cli/ranks.hpp"

namespace shardkit::cli {
namespace {

using nlohmann::json;

struct CkptOptions {
  std::string size = "1GiB";
  std::string dir;
  int stage = 1;
  int repeat = 1;
  int compress = 0;
  int threads = 0;
  int64_t chunk_elems = 0;
  bool no_fsync = false;
  bool json = false;
  bool quiet = false;
};

int run_bench_ckpt(const CkptOptions& o, int* argc, char*** argv) {
  ckpt::SaveBenchOptions options;
  options.bytes = parse_size(o.size, "--size");
  options.dir = o.dir;
  options.stage = o.stage;
  options.repeat = o.repeat;
  options.shard.compression_level = o.compress;
  options.shard.threads = o.threads;
  options.shard.chunk_elems = o.chunk_elems;
  options.shard.durable = !o.no_fsync;
  return run_on_ranks(argc, argv, [&](comm::MpiCollective& world) {
    Progress progress("bench ckpt", o.quiet || world.rank() != 0);  // one report for the whole job
    options.progress = [&](int64_t done, int64_t total) { progress.update(done, total); };
    const ckpt::SaveBenchResult r = ckpt::run_save_bench(world, options);
    progress.finish();
    if (world.rank() != 0) return 0;
    if (o.json) {
      json out = {{"bytes", r.bytes},
                  {"seconds", r.seconds},
                  {"gb_per_s", r.gb_per_s()},
                  {"durable", r.durable},
                  {"ranks", world.size()},
                  {"stage", o.stage},
                  {"compression_level", o.compress},
                  {"all_seconds", r.all_seconds},
                  {"checkpoint", r.last_checkpoint.string()}};
      std::cout << out.dump() << "\n";
    } else {
      std::printf("bench ckpt: %d rank(s), stage %d, %s, %s\n", world.size(), o.stage,
                  o.compress > 0 ? ("zstd level " + std::to_string(o.compress)).c_str() : "uncompressed",
                  r.durable ? "durable (fsync)" : "page cache (no fsync)");
      print_table({{"bytes", "seconds (median)", "GB/s", "repeats", "checkpoint"},
                   {format_bytes(static_cast<double>(r.bytes)), std::to_string(r.seconds), std::to_string(r.gb_per_s()),
                    std::to_string(r.all_seconds.size()), r.last_checkpoint.string()}});
    }
    return 0;
  });
}

struct ChecksumOptions {
  std::string size = "1GiB";
  bool json = false;
  bool quiet = false;
};

int run_bench_checksum(const ChecksumOptions& o) {
  Progress progress("bench checksum", o.quiet);
  const ckpt::ChecksumBenchResult r = ckpt::run_checksum_bench(
      parse_size(o.size, "--size"), [&](int64_t done, int64_t total) { progress.update(done, total); });
  progress.finish();
  if (o.json) {
    std::cout
        << json{{"bytes", r.bytes}, {"xxh64_gb_per_s", r.xxh64_gb_per_s}, {"memcpy_gb_per_s", r.memcpy_gb_per_s}}.dump()
        << "\n";
  } else {
    print_table({{"bytes", "xxh64 GB/s (1 core)", "memcpy GB/s (1 core)"},
                 {format_bytes(static_cast<double>(r.bytes)), std::to_string(r.xxh64_gb_per_s),
                  std::to_string(r.memcpy_gb_per_s)}});
  }
  return 0;
}

}  // namespace

void add_bench_commands(CLI::App& app, Action& action, int* argc, char*** argv) {
  CLI::App* bench = app.add_subcommand("bench", "Measure checkpoint write speed and checksum speed");
  bench->require_subcommand(1);

  auto o = std::make_shared<CkptOptions>();
  CLI::App* ckpt = bench->add_subcommand(
      "ckpt",
      "Time the durable write of a synthetic sharded checkpoint (run under mpirun: every rank writes its share)");
  ckpt->add_option("--size", o->size,
                   "Payload of the whole checkpoint, fp32 weights + 2 Adam moments, e.g. 256MiB or 8GB (default 1GiB, "
                   "at least 1KiB)");
  ckpt->add_option("--dir", o->dir,
                   "Run directory to write into (after its newest step); of the checkpoints this run writes, only "
                   "the last is kept")
      ->required();
  ckpt->add_option("--stage", o->stage, "ZeRO stage of the layout (default 1)")->check(CLI::Range(0, 3));
  ckpt->add_option("--repeat", o->repeat,
                   "Checkpoints to write, one after the other; the median time is reported (default 1)")
      ->check(CLI::Range(1, 1000));
  ckpt->add_option("--compress", o->compress, "zstd level 1-19 for the shard datasets (default 0: none)")
      ->check(CLI::Range(0, 19));
  ckpt->add_option("--threads", o->threads,
                   "Shard writer threads per rank, compressing and writing (default 0: from the hardware)")
      ->check(CLI::Range(0, 256));
  ckpt->add_option("--chunk-elems", o->chunk_elems,
                   "fp32 elements per HDF5 chunk, each with its own checksum (default 0: 262144 = 1 MiB)")
      ->check(CLI::Range(int64_t{0}, ckpt::kMaxChunkElems));
  ckpt->add_flag("--no-fsync", o->no_fsync,
                 "Write through the page cache without fsync: measures the write into memory, not the disk");
  ckpt->add_flag("--json", o->json,
                 "Print {\"bytes\", \"seconds\", \"gb_per_s\", \"durable\", ...} on one line instead of a table");
  ckpt->add_flag("-q,--quiet", o->quiet, "No progress output on stderr (the result is still printed)");
  ckpt->footer("Example: mpirun -n 2 shardkit bench ckpt --size 1GiB --dir /tmp/bench --json");
  ckpt->callback([&action, o, argc, argv] { action = [o, argc, argv] { return run_bench_ckpt(*o, argc, argv); }; });

  auto c = std::make_shared<ChecksumOptions>();
  CLI::App* checksum =
      bench->add_subcommand("checksum", "Measure the XXH64 checksum speed of one core, with memcpy's for scale");
  checksum->add_option("--size", c->size,
                       "Buffer hashed and copied, in memory, e.g. 256MiB (default 1GiB, at least 1KiB; twice "
                       "this is allocated)");
  checksum->add_flag("--json", c->json,
                     "Print {\"bytes\", \"xxh64_gb_per_s\", \"memcpy_gb_per_s\"} on one line instead of a table");
  checksum->add_flag("-q,--quiet", c->quiet, "No progress output on stderr (the result is still printed)");
  checksum->footer("Example: shardkit bench checksum --size 256MiB");
  checksum->callback([&action, c] { action = [c] { return run_bench_checksum(*c); }; });
}

}  // namespace shardkit::cli
