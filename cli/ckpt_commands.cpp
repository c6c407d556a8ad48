// `shardkit ckpt ls | inspect | verify | diff`.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/xxh64.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/diff.hpp"
#include "ckpt/run_dir.hpp"
#include "cli/commands.hpp"
#include "cli/console.hpp"

namespace shardkit::cli {
namespace {

using nlohmann::json;

// A --json result: non-ASCII as \u escapes, so that neither a control character nor a byte that is
// not UTF-8 (a file name can hold any) reaches the terminal, and the JSON stays valid.
void print_json(const json& value) {
  std::cout << value.dump(2, ' ', true, json::error_handler_t::replace) << "\n";
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string storage_string(const ckpt::Manifest& m) {
  return "chunks of " + format_count(m.chunk_elems) + " elements, " +
         (m.compression_level > 0 ? "zstd level " + std::to_string(m.compression_level) : std::string("uncompressed")) +
         ", xxh64 per chunk";
}

int run_ls(const std::string& run_dir, bool as_json) {
  const auto list = ckpt::list_checkpoints(run_dir);
  if (as_json) {
    json out = json::array();
    for (const auto& c : list) {
      json e = {{"name", c.name}, {"step", c.step}, {"committed", c.committed}, {"latest", c.latest}};
      if (c.manifest) {
        e["world_size"] = c.manifest->layout.world_size;
        e["stage"] = c.manifest->layout.stage;
        e["bytes"] = c.manifest->total_bytes();
        e["created"] = c.manifest->created;
      } else {
        e["problem"] = c.problem;
      }
      out.push_back(std::move(e));
    }
    print_json(out);
    return 0;
  }
  if (list.empty()) {
    print_line(stdout, "%s: no checkpoints", run_dir.c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"", "CHECKPOINT", "STATUS", "RANKS", "STAGE", "SIZE", "CREATED"}};
  for (const auto& c : list) {
    if (c.manifest) {
      rows.push_back({c.latest ? "*" : "", c.name, "committed", std::to_string(c.manifest->layout.world_size),
                      std::to_string(c.manifest->layout.stage),
                      format_bytes(static_cast<double>(c.manifest->total_bytes())), c.manifest->created});
    } else {
      rows.push_back({c.latest ? "*" : "", c.name, "NOT COMMITTED: " + c.problem, "", "", "", ""});
    }
  }
  print_table(rows);
  return 0;
}

int run_inspect(const std::string& path, bool as_json) {
  const std::filesystem::path step_dir = ckpt::resolve_checkpoint(path);
  const ckpt::Manifest m = ckpt::read_manifest(step_dir);
  if (as_json) {
    json out = ckpt::manifest_to_json(m);
    out["path"] = step_dir.string();
    out["total_bytes"] = m.total_bytes();
    print_json(out);
    return 0;
  }
  const ckpt::Layout layout(m.tensors, m.layout);
  std::string states;
  for (const auto& s : m.states) states += (states.empty() ? "" : ", ") + s;
  print_table({{"checkpoint", step_dir.string()},
               {"format", "shardkit-checkpoint v" + std::to_string(m.format_version) + ", written by " + m.writer +
                              " at " + m.created},
               {"uid", m.checkpoint_uid},
               {"step", std::to_string(m.step)},
               {"layout", std::to_string(m.layout.world_size) + " ranks, ZeRO stage " + std::to_string(m.layout.stage) +
                              ", alignment " + std::to_string(m.layout.alignment) + ", " +
                              format_count(layout.flat_size()) + " elements per rank"},
               {"states", states},
               {"storage", storage_string(m)},
               {"size", format_bytes(static_cast<double>(m.total_bytes())) + " in " + std::to_string(m.shards.size()) +
                            " shards"},
               {"tensors", format_count(static_cast<int64_t>(m.tensors.size())) + " (" +
                               format_count(m.tensors.total_elements()) + " elements)"}});
  std::printf("\n");
  std::vector<std::vector<std::string>> rows = {{"TENSOR", "SHAPE", "DTYPE", "ELEMENTS"}};
  for (const auto& t : m.tensors) {
    rows.push_back({t.name, shape_string(t.shape), std::string(ckpt::dtype_name(t.dtype)), format_count(t.numel())});
  }
  print_table(rows, 2);
  std::printf("\n");
  rows = {{"RANK", "FILE", "BYTES", "DIGEST"}};
  for (const auto& s : m.shards) {
    rows.push_back({std::to_string(s.rank), s.file, format_count(s.bytes), to_hex(s.digest)});
  }
  print_table(rows, 2);
  if (!m.trainer_state.empty()) {
    std::printf("\n");
    print_line(stdout, "trainer state: %s", m.trainer_state.dump().c_str());
  }
  if (!m.model.empty()) print_line(stdout, "model: %s", m.model.dump().c_str());
  return 0;
}

int run_verify(const std::string& path, bool quiet) {
  ckpt::CheckpointReader reader(path);
  Progress progress("verify", quiet);
  const ckpt::VerifyReport report = reader.verify([&](int64_t d, int64_t t) { progress.update(d, t); });
  progress.finish();
  const std::string where = reader.step_dir().string();
  if (!report.ok()) {
    for (const std::string& p : report.problems) print_line(stderr, "shardkit: corrupt: %s", p.c_str());
    print_line(stderr, "shardkit: %s FAILED verification: %zu problem(s)", where.c_str(), report.problems.size());
    return 1;
  }
  print_line(stdout, "%s: OK (%d shards, %s chunks, %s checked)", where.c_str(), report.shards_checked,
             format_count(report.chunks_checked).c_str(),
             format_bytes(static_cast<double>(report.bytes_checked)).c_str());
  return 0;
}

int run_diff(const std::string& a_path, const std::string& b_path, double tolerance, bool as_json, bool quiet) {
  ckpt::CheckpointReader a(a_path);
  ckpt::CheckpointReader b(b_path);
  Progress progress("diff", quiet);
  const ckpt::DiffReport report = ckpt::diff_checkpoints(a, b, [&](int64_t d, int64_t t) { progress.update(d, t); });
  progress.finish();
  const bool ok = report.within(tolerance);
  if (as_json) {
    json entries = json::array();
    for (const auto& e : report.entries) {
      entries.push_back({{"tensor", e.tensor},
                         {"state", e.state},
                         {"numel", e.numel},
                         {"max_abs_diff", e.max_abs_diff},
                         {"differing", e.differing}});
    }
    json out = {{"a", a.step_dir().string()},
                {"b", b.step_dir().string()},
                {"tolerance", tolerance},
                {"max_abs_diff", report.max_abs_diff()},
                {"within_tolerance", ok},
                {"only_in_a", report.only_in_a},
                {"only_in_b", report.only_in_b},
                {"shape_mismatch", report.shape_mismatch},
                {"tensors", entries}};
    print_json(out);
    return ok ? 0 : 1;
  }
  for (const auto& n : report.only_in_a) print_line(stdout, "only in A: %s", n.c_str());
  for (const auto& n : report.only_in_b) print_line(stdout, "only in B: %s", n.c_str());
  for (const auto& n : report.shape_mismatch) print_line(stdout, "shape differs: %s", n.c_str());
  std::vector<std::vector<std::string>> rows = {{"TENSOR", "STATE", "ELEMENTS", "DIFFERING", "MAX |A-B|"}};
  int64_t identical = 0;
  for (const auto& e : report.entries) {
    if (e.differing == 0) {
      ++identical;
      continue;
    }
    char diff[32];
    std::snprintf(diff, sizeof(diff), "%.3g", e.max_abs_diff);
    rows.push_back({e.tensor, e.state, format_count(e.numel), format_count(e.differing), diff});
  }
  if (rows.size() > 1) print_table(rows);
  print_line(stdout, "%s vs %s: %s of %zu tensor states bit-identical, max |A-B| = %.3g, tolerance %.3g: %s",
             a.step_dir().c_str(), b.step_dir().c_str(), format_count(identical).c_str(), report.entries.size(),
             report.max_abs_diff(), tolerance, ok ? "MATCH" : "DIFFERENT");
  return ok ? 0 : 1;
}

}  // namespace

void add_ckpt_commands(CLI::App& app, Action& action) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "List, inspect, verify and compare checkpoints");
  ckpt->require_subcommand(1);

  // Options live as long as the app; shared_ptr keeps them alive inside the callbacks.
  struct Options {
    std::string path, other;
    bool json = false, quiet = false;
    double tolerance = 0;
  };
  auto o = std::make_shared<Options>();

  CLI::App* ls = ckpt->add_subcommand(
      "ls", "List the checkpoints of a run directory: status, ranks, ZeRO stage, size, creation time (* marks latest)");
  ls->add_option("RUN_DIR", o->path, "Run directory (holds step-NNNNNNNN folders and 'latest')")->required();
  ls->add_flag("--json", o->json,
               "Print a JSON array instead of a table: name, step, committed, latest, and world_size, stage, bytes, "
               "created of a committed checkpoint or the problem of another");
  ls->footer("Example: shardkit ckpt ls runs/tiny");
  ls->callback([&action, o] { action = [o] { return run_ls(o->path, o->json); }; });

  CLI::App* inspect = ckpt->add_subcommand("inspect", "Show a checkpoint's layout, tensors, shards and trainer state");
  inspect->add_option("CKPT", o->path, "Step directory, or run directory (follows 'latest')")->required();
  inspect->add_flag("--json", o->json, "Print the manifest as JSON, with path and total_bytes added");
  inspect->footer("Example: shardkit ckpt inspect runs/tiny/step-00000100");
  inspect->callback([&action, o] { action = [o] { return run_inspect(o->path, o->json); }; });

  CLI::App* verify = ckpt->add_subcommand("verify", "Check every byte of a checkpoint against its checksums");
  verify->add_option("CKPT", o->path, "Step directory, or run directory (follows 'latest')")->required();
  verify->add_flag("-q,--quiet", o->quiet, "No progress output on stderr (problems and the result are still printed)");
  verify->footer(
      "Exit status 0 only when every shard is present, consistent with the manifest and every chunk matches its\n"
      "checksum; otherwise each problem is printed, naming the file, state and tensors, and the status is 1.\n"
      "Example: shardkit ckpt verify runs/tiny");
  verify->callback([&action, o] { action = [o] { return run_verify(o->path, o->quiet); }; });

  CLI::App* diff = ckpt->add_subcommand(
      "diff", "Per-tensor max |A-B| of weights and optimizer states of two checkpoints (any world sizes/stages)");
  diff->add_option("A", o->path, "First checkpoint (step or run directory)")->required();
  diff->add_option("B", o->other, "Second checkpoint (step or run directory)")->required();
  diff->add_option("--tol", o->tolerance, "Largest |A-B| still counted as a match (default 0: exact)")
      ->check(CLI::NonNegativeNumber);
  diff->add_flag("--json", o->json,
                 "Print a JSON report: max_abs_diff and differing elements per tensor and state, tensors only in A or "
                 "B, shape mismatches");
  diff->add_flag("-q,--quiet", o->quiet, "No progress output on stderr (the report is still printed)");
  diff->footer(
      "Exit status 0 when both hold the same tensors and states and no difference exceeds --tol, else 1.\n"
      "Example: shardkit ckpt diff runs/tiny/step-00000100 runs/tiny-3x --tol 1e-6");
  diff->callback(
      [&action, o] { action = [o] { return run_diff(o->path, o->other, o->tolerance, o->json, o->quiet); }; });
}

}  // namespace shardkit::cli
