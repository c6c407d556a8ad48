// `shardkit convert reshard | consolidate | import | import-deepspeed | import-dcp | export-deepspeed |
// export-dcp`.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include "base/error.hpp"
#include "cli/commands.hpp"
#include "cli/console.hpp"
#include "convert/consolidate.hpp"
#include "convert/export_dcp.hpp"
#include "convert/export_deepspeed.hpp"
#include "convert/import.hpp"
#include "convert/import_checkpoint.hpp"
#include "convert/reshard.hpp"
#include "convert/source.hpp"
#include "model/registry.hpp"

namespace shardkit::cli {
namespace {

// Options every converter takes.
struct Common {
  std::string max_memory = "2GiB";
  int threads = 0;
  bool force = false;
  bool quiet = false;
};

void add_common(CLI::App* app, Common& c) {
  app->add_option("--max-memory", c.max_memory,
                  "Bound on the buffers in flight, all threads together, e.g. 512MiB or 8GB (default 2GiB, "
                  "at least 128MiB)");
  app->add_option("--threads", c.threads,
                  "I/O threads (default 0: from the hardware, at most 8; 1 when HDF5 is not thread-safe)")
      ->check(CLI::Range(0, 256));
  app->add_flag("--force", c.force, "Replace the output if it exists (default: refuse to)");
  app->add_flag("-q,--quiet", c.quiet, "No progress output on stderr (the result is still printed)");
}

convert::ConvertOptions options_from(const Common& c, Progress& progress) {
  convert::ConvertOptions o;
  o.max_memory = parse_size(c.max_memory, "--max-memory");
  o.threads = c.threads;
  o.force = c.force;
  o.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
  return o;
}

// The source, output folder and ranks of an export to another tool's format.
void add_export_target(CLI::App* app, std::string& source, std::string& output, int& world_size,
                       const std::string& output_help, const std::string& world_help) {
  app->add_option("CKPT", source,
                  "Step directory, or run directory (follows 'latest'), or a DeepSpeed or DCP checkpoint folder")
      ->required();
  app->add_option("-o,--output", output, output_help + "; must not exist unless --force")->required();
  app->add_option("--world-size", world_size, world_help)->required()->check(CLI::PositiveNumber);
}

// What a checkpoint for DeepSpeed is written with.
struct DeepSpeedTargetCli {
  std::string dtype;
  int64_t sub_group_size = 0;
  std::string model;
  bool universal = false;
};

void add_deepspeed_target(CLI::App* app, DeepSpeedTargetCli& t) {
  app->add_option("--dtype", t.dtype,
                  "The DeepSpeed run's type: bf16 (the bf16_ file names), fp16 or fp32 (default: what the "
                  "source's config enables)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app->add_option("--sub-group-size", t.sub_group_size,
                  "Stage 3: the run's zero_optimization.sub_group_size (default: the source's config's, else "
                  "DeepSpeed's 1e9)")
      ->check(CLI::PositiveNumber);
  app->add_option("--model", t.model,
                  "For a DeepSpeed source: a preset or model file, to check its tensors against (default: none, "
                  "any model)");
}

int run_export_deepspeed(const std::string& source, const std::string& output, int world_size, int stage,
                         const DeepSpeedTargetCli& t, const Common& common) {
  convert::DeepSpeedExportRequest r;
  r.source = source;
  r.output = output;
  r.world_size = world_size;
  if (stage >= 0) r.stage = stage;
  if (!t.dtype.empty()) r.dtype = ckpt::parse_dtype(t.dtype == "fp32" ? "f32" : t.dtype == "fp16" ? "f16" : "bf16");
  if (t.sub_group_size > 0) r.sub_group_size = t.sub_group_size;
  r.model = t.model;
  r.universal = t.universal;
  Progress progress("export-deepspeed", common.quiet);
  const convert::DeepSpeedExportResult result = convert::export_deepspeed(r, options_from(common, progress));
  progress.finish();
  print_line(stdout, "%s: step %lld, %d ranks, ZeRO stage %d, %s (DeepSpeed's load_checkpoint reads %s)",
             result.tag_dir.c_str(), static_cast<long long>(result.step), result.world_size, result.stage,
             result.dtype == ckpt::DType::kF32    ? "fp32"
             : result.dtype == ckpt::DType::kBF16 ? "bf16"
                                                  : "fp16",
             output.c_str());
  return 0;
}

int run_export_dcp(const std::string& source, const std::string& output, int world_size, const std::string& model,
                   const Common& common) {
  convert::DcpExportRequest r;
  r.source = source;
  r.output = output;
  r.world_size = world_size;
  r.model = model;
  Progress progress("export-dcp", common.quiet);
  const convert::DcpExportResult result = convert::export_dcp(r, options_from(common, progress));
  progress.finish();
  print_line(stdout, "%s: step %lld, %d ranks' shards%s (torch.distributed.checkpoint.load reads it)",
             result.folder.c_str(), static_cast<long long>(result.step), result.world_size,
             result.optimizer ? ", model and optimizer" : ", model only");
  return 0;
}

// `import-deepspeed` and `import-dcp`.
struct ImportCheckpointCli {
  convert::SourceFormat format = convert::SourceFormat::kDeepSpeed;
  Common common;
  std::string source, output, model;
  int world_size = 0;
  int stage = -1;
};

int run_import_checkpoint(const ImportCheckpointCli& c) {
  convert::CheckpointImportRequest r;
  r.source = c.source;
  r.format = c.format;
  r.output = c.output;
  r.model = c.model;
  if (c.world_size > 0) r.world_size = c.world_size;
  if (c.stage >= 0) r.stage = c.stage;
  Progress progress(c.format == convert::SourceFormat::kDcp ? "import-dcp" : "import-deepspeed", c.common.quiet);
  const convert::CheckpointImportResult result = convert::import_checkpoint(r, options_from(c.common, progress));
  progress.finish();
  print_line(stdout, "%s: step %lld, %d ranks, ZeRO stage %d", result.step_dir.c_str(),
             static_cast<long long>(result.step), result.world_size, result.stage);
  return 0;
}

struct ReshardCli {
  Common common;
  std::string source, output, to;
  int world_size = 0;
  int stage = -1;
  int compress = -1;
  DeepSpeedTargetCli deepspeed;
};

int run_reshard(const ReshardCli& c) {
  // A DeepSpeed folder comes out as a DeepSpeed folder unless --to says otherwise; every kind goes
  // through one pass from source to target, never through an intermediate copy.
  const bool from_dcp = convert::is_dcp_checkpoint(c.source);
  const bool from_deepspeed = !from_dcp && convert::is_deepspeed_checkpoint(c.source);
  const std::string to = c.to.empty() ? (from_deepspeed ? "deepspeed" : from_dcp ? "dcp" : "shardkit") : c.to;
  if (to == "deepspeed") return run_export_deepspeed(c.source, c.output, c.world_size, c.stage, c.deepspeed, c.common);
  if (to == "dcp") {
    if (c.stage >= 0) fail(ErrorKind::kInvalidInput, "--stage: a DCP checkpoint is FSDP's full sharding; give none");
    return run_export_dcp(c.source, c.output, c.world_size, c.deepspeed.model, c.common);
  }
  if (from_deepspeed || from_dcp) {
    return run_import_checkpoint({from_dcp ? convert::SourceFormat::kDcp : convert::SourceFormat::kDeepSpeed, c.common,
                                  c.source, c.output, c.deepspeed.model, c.world_size, c.stage});
  }
  Progress progress("reshard", c.common.quiet);
  convert::ReshardRequest r;
  r.source = c.source;
  r.output = c.output;
  r.world_size = c.world_size;
  if (c.stage >= 0) r.stage = c.stage;
  if (c.compress >= 0) r.compression_level = c.compress;
  const auto step_dir = convert::reshard(r, options_from(c.common, progress));
  progress.finish();
  print_line(stdout, "%s: %d ranks%s", step_dir.c_str(), c.world_size,
             c.stage >= 0 ? (", ZeRO stage " + std::to_string(c.stage)).c_str() : "");
  return 0;
}

struct ConsolidateCli {
  Common common;
  std::string source, output, format = "safetensors", dtype = "fp32", max_shard_size = "5GB", model;
  bool with_optimizer = false;
};

int run_consolidate(const ConsolidateCli& c) {
  convert::ConsolidateRequest r;
  r.source = c.source;
  r.output = c.output;
  r.format = c.format == "hdf5"           ? convert::ExportFormat::kHdf5
             : c.format == "hdf5-virtual" ? convert::ExportFormat::kHdf5Virtual
                                          : convert::ExportFormat::kSafetensors;
  r.dtype = c.dtype == "bf16" ? ckpt::DType::kBF16 : c.dtype == "fp16" ? ckpt::DType::kF16 : ckpt::DType::kF32;
  r.with_optimizer = c.with_optimizer;
  r.model = c.model;
  r.max_shard_bytes = static_cast<uint64_t>(parse_size(c.max_shard_size, "--max-shard-size"));
  if (r.max_shard_bytes == 0) fail(ErrorKind::kInvalidInput, "--max-shard-size must be positive");
  Progress progress("consolidate", c.common.quiet);
  const std::vector<std::string> files = convert::consolidate(r, options_from(c.common, progress));
  progress.finish();
  for (const std::string& f : files) print_line(stdout, "%s", (std::filesystem::path(c.output) / f).c_str());
  return 0;
}

struct ImportCli {
  Common common;
  std::string weights, output;
  int world_size = 1;
  int stage = 0;
};

int run_import(const ImportCli& c) {
  convert::ImportRequest r;
  r.weights = c.weights;
  r.output = c.output;
  r.world_size = c.world_size;
  r.stage = c.stage;
  Progress progress("import", c.common.quiet);
  const auto step_dir = convert::import_weights(r, options_from(c.common, progress));
  progress.finish();
  print_line(stdout, "%s: step 0, %d ranks, ZeRO stage %d", step_dir.c_str(), c.world_size, c.stage);
  return 0;
}

}  // namespace

void add_convert_commands(CLI::App& app, Action& action) {
  CLI::App* convert = app.add_subcommand(
      "convert",
      "Reshard checkpoints, export consolidated weights, import Hugging Face weights, move DeepSpeed and PyTorch "
      "DCP checkpoints in and out");
  convert->require_subcommand(1);

  auto r = std::make_shared<ReshardCli>();
  CLI::App* reshard = convert->add_subcommand(
      "reshard",
      "Rewrite a checkpoint for another world size and/or ZeRO stage (weights, Adam moments, trainer state)");
  reshard
      ->add_option("CKPT", r->source,
                   "Step directory, or run directory (follows 'latest'); or a DeepSpeed checkpoint folder (holding "
                   "'latest', or a tag folder such as global_step100); or a PyTorch DCP folder (holding .metadata)")
      ->required();
  reshard
      ->add_option("-o,--output", r->output,
                   "New folder (a run directory, or for --to deepspeed DeepSpeed's 'latest' and global_stepN/); "
                   "must not exist unless --force")
      ->required();
  reshard
      ->add_option("--to", r->to,
                   "What to write: shardkit (a checkpoint), deepspeed (what DeepSpeed's save_checkpoint writes "
                   "for that many ranks and stage) or dcp (what torch.distributed.checkpoint.save writes for an "
                   "FSDP2 model on that many ranks). Default: the source's kind")
      ->check(CLI::IsMember({"shardkit", "deepspeed", "dcp"}));
  reshard->add_option("--world-size", r->world_size, "Ranks (data-parallel world size) of the new layout")
      ->required()
      ->check(CLI::PositiveNumber);
  reshard->add_option("--stage", r->stage, "ZeRO stage of the new layout (default: the source's)")
      ->check(CLI::Range(0, 3));
  reshard
      ->add_option("--compress", r->compress,
                   "zstd level 1-19 of the new shards, or 0 for none (default: the source's)")
      ->check(CLI::Range(0, 19));
  add_deepspeed_target(reshard, r->deepspeed);
  add_common(reshard, r->common);
  reshard->footer(
      "Example: shardkit convert reshard runs/tiny -o runs/tiny-3x --world-size 3 --stage 3\n"
      "DeepSpeed to DeepSpeed: shardkit convert reshard ds_run/checkpoints -o ds_run/for-8 --world-size 8 --stage 2");
  reshard->callback([&action, r] { action = [r] { return run_reshard(*r); }; });

  auto c = std::make_shared<ConsolidateCli>();
  CLI::App* consolidate = convert->add_subcommand(
      "consolidate", "Export full weights: safetensors for Hugging Face transformers, HDF5, or an HDF5 virtual view");
  consolidate
      ->add_option("CKPT", c->source,
                   "Step directory, or run directory (follows 'latest'), or a DeepSpeed or DCP checkpoint folder")
      ->required();
  consolidate->add_option("-o,--output", c->output, "New directory for the export; must not exist unless --force")
      ->required();
  consolidate
      ->add_option("--format", c->format,
                   "safetensors (default: model.safetensors + config.json, which the family's from_pretrained loads: "
                   "GPT2LMHeadModel, LlamaForCausalLM), "
                   "hdf5 (model.h5, one dataset per tensor), or hdf5-virtual (view.h5: virtual datasets over "
                   "the shard files, no copy)")
      ->check(CLI::IsMember({"safetensors", "hdf5", "hdf5-virtual"}));
  consolidate
      ->add_option("--dtype", c->dtype,
                   "fp32 (default); bf16 or fp16, rounded to nearest even, with --format safetensors only")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  consolidate->add_flag("--with-optimizer", c->with_optimizer,
                        "Also export the Adam moments (fp32): tensors optimizer.exp_avg.<name> and "
                        "optimizer.exp_avg_sq.<name>; in the virtual view, groups /exp_avg and /exp_avg_sq");
  consolidate->add_option("--max-shard-size", c->max_shard_size,
                          "Split safetensors output above this size into model-0000i-of-0000n files with an index "
                          "(default 5GB, as Hugging Face)");
  consolidate->add_option("--model", c->model,
                          "For a DeepSpeed or DCP source: the model that was trained, a preset or model file / Hugging "
                          "Face config.json, to export in its family's layout with its config.json (default: a "
                          "config.json beside the source; otherwise the checkpoint's own tensor names)");
  add_common(consolidate, c->common);
  consolidate->footer("Example: shardkit convert consolidate runs/tiny -o export/tiny --dtype bf16");
  consolidate->callback([&action, c] { action = [c] { return run_consolidate(*c); }; });

  auto i = std::make_shared<ImportCli>();
  CLI::App* import_hf = convert->add_subcommand(
      "import",
      "Turn Hugging Face safetensors (+ config.json; GPT-2 or Llama family) into a checkpoint at step 0 to fine-tune "
      "from");
  import_hf
      ->add_option("WEIGHTS", i->weights,
                   "A .safetensors file (config.json beside it) or a folder with model.safetensors or "
                   "model.safetensors.index.json")
      ->required();
  import_hf
      ->add_option("-o,--output", i->output,
                   "New run directory (receives step-00000000/ and 'latest'); must not exist unless --force")
      ->required();
  import_hf->add_option("--world-size", i->world_size, "Ranks of the layout (default 1)")->check(CLI::PositiveNumber);
  import_hf->add_option("--stage", i->stage, "ZeRO stage of the layout (default 0)")->check(CLI::Range(0, 3));
  add_common(import_hf, i->common);
  import_hf->footer(
      "Example: shardkit convert import hf/gpt2 -o runs/ft --world-size 2 --stage 2\n"
      "Then fine-tune: mpirun -n 2 shardkit train --config ds.json --model gpt2 --data d.bin --steps 100 "
      "--save-dir runs/ft");
  import_hf->callback([&action, i] { action = [i] { return run_import(*i); }; });

  const auto add_import = [&](const char* name, convert::SourceFormat format, const std::string& about,
                              const std::string& source_help, const std::string& default_world_size,
                              const std::string& default_stage, const std::string& example) {
    auto d = std::make_shared<ImportCheckpointCli>();
    d->format = format;
    CLI::App* cmd = convert->add_subcommand(name, about);
    cmd->add_option("CKPT", d->source, source_help)->required();
    cmd->add_option("-o,--output", d->output,
                    "New run directory (receives step-NNNNNNNN/ and 'latest'); must not exist unless --force")
        ->required();
    cmd->add_option("--model", d->model,
                    "The model that was trained, to train or evaluate it in shardkit: a preset (" +
                        model::preset_list() +
                        ") or a JSON model file / Hugging Face config.json (default: a config.json in the folder or "
                        "the one above it when its model_type is gpt2 or llama; otherwise none: the checkpoint's own "
                        "tensors, to reshard, consolidate and export)");
    cmd->add_option("--world-size", d->world_size, "Ranks of the layout (default: " + default_world_size + ")")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--stage", d->stage, "ZeRO stage of the layout (default: " + default_stage + ")")
        ->check(CLI::Range(0, 3));
    add_common(cmd, d->common);
    cmd->footer(example +
                "\nThen resume: mpirun -n 2 shardkit train --config ds.json --model gpt2 --data d.bin --steps 100 "
                "--save-dir runs/ft");
    cmd->callback([&action, d] { action = [d] { return run_import_checkpoint(*d); }; });
  };
  add_import("import-deepspeed", convert::SourceFormat::kDeepSpeed,
             "Turn a DeepSpeed ZeRO checkpoint (stage 1-3, or ds_to_universal's universal checkpoint) of any model "
             "into a checkpoint: fp32 weights, Adam moments and step; no Python needed",
             "DeepSpeed checkpoint folder holding 'latest' (or 'latest_universal'), or a tag folder such as "
             "global_step100",
             "the DeepSpeed run's data-parallel size; 1 for a universal checkpoint",
             "the DeepSpeed run's; 0 for a universal checkpoint",
             "Example: shardkit convert import-deepspeed ds_run/checkpoints -o runs/ft --model gpt2");
  add_import("import-dcp", convert::SourceFormat::kDcp,
             "Turn a PyTorch Distributed Checkpoint (torch.distributed.checkpoint.save of an FSDP2 or torchtitan "
             "run) of any model into a checkpoint: weights, AdamW moments and step; no Python needed",
             "DCP checkpoint folder (holding .metadata and the __R_0.distcp files), e.g. torchtitan's "
             "outputs/checkpoint/step-1000",
             "the ranks that saved it", "3, FSDP's full sharding",
             "Example: shardkit convert import-dcp outputs/checkpoint/step-1000 -o runs/ft --world-size 2");

  struct ExportDcpCli {
    Common common;
    std::string source, output, model;
    int world_size = 0;
  };
  auto x = std::make_shared<ExportDcpCli>();
  CLI::App* export_dcp = convert->add_subcommand(
      "export-dcp",
      "Write a checkpoint as torch.distributed.checkpoint.save writes an FSDP2 model and its AdamW optimizer on "
      "--world-size ranks (get_state_dict's keys): dcp.load and set_state_dict resume from it at any world size");
  add_export_target(export_dcp, x->source, x->output, x->world_size,
                    "New folder: receives .metadata and __R_0.distcp (pass it to dcp.load)",
                    "Ranks whose shards the files hold");
  export_dcp->add_option("--model", x->model,
                         "For a DeepSpeed or DCP source: a preset or model file, to check its tensors against "
                         "(default: none, any model)");
  add_common(export_dcp, x->common);
  export_dcp->footer(
      "Example: shardkit convert export-dcp ds_run/checkpoints -o dcp/step-100 --world-size 8\n"
      "Then, on 8 ranks: model_sd, optim_sd = get_state_dict(model, optim); dcp.load({'model': model_sd, 'optim': "
      "optim_sd}, checkpoint_id='dcp/step-100'); set_state_dict(model, optim, model_state_dict=model_sd, "
      "optim_state_dict=optim_sd)");
  export_dcp->callback([&action, x] {
    action = [x] { return run_export_dcp(x->source, x->output, x->world_size, x->model, x->common); };
  });

  struct ExportDeepSpeedCli {
    Common common;
    std::string source, output;
    int world_size = 0;
    int stage = -1;
    DeepSpeedTargetCli target;
  };
  auto e = std::make_shared<ExportDeepSpeedCli>();
  CLI::App* export_ds = convert->add_subcommand(
      "export-deepspeed",
      "Write a checkpoint as DeepSpeed's save_checkpoint does for a run of --world-size ranks at a ZeRO stage: "
      "DeepSpeed's load_checkpoint resumes from it with the same weights, Adam moments and step");
  add_export_target(export_ds, e->source, e->output, e->world_size,
                    "New folder: receives 'latest' and global_stepN/ (pass it to load_checkpoint)",
                    "Data-parallel ranks of the DeepSpeed run");
  export_ds->add_option("--stage", e->stage, "ZeRO stage 1-3 of the DeepSpeed run (default: the source's, at least 1)")
      ->check(CLI::Range(1, 3));
  add_deepspeed_target(export_ds, e->target);
  export_ds->add_flag("--universal", e->target.universal,
                      "Write ds_to_universal's layout instead (latest_universal, zero/<parameter>/), for "
                      "load_universal at stage 1 or 2");
  add_common(export_ds, e->common);
  export_ds->footer(
      "Example: shardkit convert export-deepspeed runs/tiny -o ds_run/checkpoints --world-size 8 --stage 3 "
      "--dtype bf16\n"
      "Then, in the DeepSpeed run on 8 ranks: engine.load_checkpoint('ds_run/checkpoints')");
  export_ds->callback([&action, e] {
    action = [e] { return run_export_deepspeed(e->source, e->output, e->world_size, e->stage, e->target, e->common); };
  });
}

}  // namespace shardkit::cli
