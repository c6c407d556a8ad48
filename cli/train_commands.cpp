// `shardkit train`, `shardkit eval` and `shardkit data encode`.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "base/write_target.hpp"
#include "cli/commands.hpp"
#include "cli/console.hpp"
#include "cli/ranks.hpp"
#include "model/registry.hpp"
#include "trainer/byte_tokens.hpp"
#include "trainer/device_choice.hpp"
#include "trainer/eval.hpp"
#include "trainer/trainer.hpp"

namespace shardkit::cli {
namespace {

struct TrainCli {
  trainer::TrainOptions options;
  // Words the command line takes, turned into options' enums once, at this border.
  std::string device = "cpu", save_mode = "async", snapshot_staging = "auto";
  std::string config, data, save_dir, metrics, init_from;
};

int run_train(TrainCli& o, int* argc, char*** argv) {
  o.options.config = o.config;
  o.options.data = o.data;
  o.options.save_dir = o.save_dir;
  o.options.metrics = o.metrics;
  o.options.init_from = o.init_from;
  o.options.device = o.device == "cuda" ? trainer::ComputeDevice::kCuda : trainer::ComputeDevice::kCpu;
  o.options.save_mode = o.save_mode == "sync" ? trainer::SaveMode::kSync : trainer::SaveMode::kAsync;
  o.options.snapshot_staging = o.snapshot_staging == "device" ? trainer::SnapshotStaging::kDevice
                               : o.snapshot_staging == "host" ? trainer::SnapshotStaging::kHost
                               : o.snapshot_staging == "none" ? trainer::SnapshotStaging::kNone
                                                              : trainer::SnapshotStaging::kAuto;
  return run_on_ranks(argc, argv, [&](comm::MpiCollective& world) {
    trainer::Trainer t(world, o.options);
    t.run();
    return 0;
  });
}

}  // namespace

void add_train_commands(CLI::App& app, Action& action, int* argc, char*** argv) {
  auto o = std::make_shared<TrainCli>();
  CLI::App* train =
      app.add_subcommand("train",
                         "Train a model (GPT-2 or Llama family) with ZeRO (stages 0-3) on MPI ranks, saving "
                         "sharded checkpoints");
  train
      ->add_option("--config", o->config,
                   "DeepSpeed JSON config: batch sizes, ZeRO stage, optimizer, scheduler, fp16/bf16 (examples in "
                   "samples/configs/)")
      ->required();
  train
      ->add_option("--model", o->options.model,
                   "Preset (" + model::preset_list() +
                       "), a Hugging Face config.json (GPT2LMHeadModel or LlamaForCausalLM), or a JSON model file "
                       "(docs/FORMAT.md)")
      ->required();
  train
      ->add_option("--seq-len", o->options.seq_len,
                   "Tokens per sample (default: the model's longest, n_positions or max_position_embeddings)")
      ->check(CLI::NonNegativeNumber);
  train
      ->add_option("--data", o->data,
                   "Token file of 16- or 32-bit ids, format told by its first bytes: raw little-endian uint16 "
                   "(nanoGPT's train.bin), llm.c's (uint16 GPT-2 or uint32 Llama 3), or NumPy .npy of <u2 or <u4; "
                   "'shardkit data encode' makes one from a text")
      ->required();
  train->add_option("--steps", o->options.steps, "Total optimizer steps; a resumed run continues to this number")
      ->required()
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--lr", o->options.lr,
                   "Learning rate where the config's optimizer.params.lr is \"auto\" (as Hugging Face's Trainer "
                   "fills it) or the config has no optimizer; a different number in the config is an error")
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--warmup-steps", o->options.warmup_steps,
                   "Warmup steps where the config's scheduler.params.warmup_num_steps is \"auto\"; a different "
                   "number in the config is an error")
      ->check(CLI::NonNegativeNumber);
  train->add_option("--save-dir", o->save_dir,
                    "Run directory for checkpoints (step-NNNNNNNN folders and 'latest'); without it nothing is saved");
  train
      ->add_option("--save-interval", o->options.save_interval,
                   "Save every K steps (and at the end) into --save-dir; 0: only at the end (default 0)")
      ->check(CLI::NonNegativeNumber);
  train
      ->add_option("--save-mode", o->save_mode,
                   "async (default): training continues while the checkpoint is written and committed; sync: it waits")
      ->check(CLI::IsMember({"async", "sync"}));
  train
      ->add_option("--snapshot-staging", o->snapshot_staging,
                   "Where a save copies the optimizer states to, so that training may go on. device (GPU ranks): "
                   "GPU memory (milliseconds; drained to host memory while training goes on); host: host memory "
                   "(from a GPU, the next optimizer step waits for that copy); none (states in host memory: CPU "
                   "ranks or offload_optimizer): no copy, the next optimizer step waits until the save is written; "
                   "auto (default): the first of these with room. States swapped to NVMe are always saved "
                   "without a copy")
      ->check(CLI::IsMember({"auto", "device", "host", "none"}));
  train
      ->add_option_function<std::string>(
          "--on-save-error", [o](const std::string& v) { o->options.stop_on_save_error = v == "stop"; },
          "continue (default): a failed save (full disk, I/O error) is reported -- a warning and a checkpoint_error "
          "metrics event -- and training goes on, the next save is tried; stop: the run ends with the error")
      ->check(CLI::IsMember({"continue", "stop"}));
  train->add_option("--keep-last", o->options.keep_last, "Keep only the newest K checkpoints (default 0: keep all)")
      ->check(CLI::NonNegativeNumber);
  train->add_option(
      "--resume", o->options.resume,
      "auto (default): continue from --save-dir's newest checkpoint that loads (a damaged one is skipped with "
      "a warning), if any; none; or a checkpoint path "
      "(any world size and ZeRO stage). The save directory is locked for the run (one job per folder) "
      "and what killed saves left there is removed at start");
  train
      ->add_option("--device", o->device,
                   "cpu (default): fp32 on MPI ranks; cuda: one GPU per rank (local rank -> device), NCCL (builds "
                   "with CUDA only)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train->add_option("--metrics", o->metrics,
                    "Append one JSON object per step and per checkpoint to this file (rank 0)");
  train->add_option("--seed", o->options.seed, "Seed of initialisation and data order (default 1234)");
  train->add_option("--init-from", o->init_from,
                    "Start from Hugging Face weights of the same model (.safetensors file or folder, with config.json) "
                    "instead "
                    "of a random initialisation; ignored when a checkpoint is resumed");
  train->add_option("--threads", o->options.threads, "Compute threads per rank (default: cores / ranks per node)")
      ->check(CLI::NonNegativeNumber);
  train->add_flag("--activation-checkpointing", o->options.activation_checkpointing,
                  "Keep only each transformer block's input in the forward pass and recompute the block in the "
                  "backward pass: activation memory of one block plus the block inputs, for a second forward pass "
                  "of the blocks; the same losses. The config's activation_checkpointing section turns it on too "
                  "(its cpu_checkpointing keeps the inputs in host memory on GPUs)");
  train
      ->add_option("--profile-step", o->options.profile_step,
                   "GPU runs: put optimizer step N alone inside the CUDA profiler API's range, for nsys "
                   "--capture-range=cudaProfilerApi or ncu --profile-from-start off (bench/gpu_step_profile.sh)")
      ->check(CLI::PositiveNumber);
  train->add_flag("-q,--quiet", o->options.quiet,
                  "No console output but errors (no step lines or warnings; --metrics is still written)");
  train->footer(
      "Example: mpirun -n 2 shardkit train --config samples/configs/tiny_zero2.json --model gpt2-tiny \\\n"
      "           --data runs/text.bin --steps 100 --save-dir runs/tiny --save-interval 50 --metrics runs/tiny.jsonl");
  train->callback([&action, o, argc, argv] { action = [o, argc, argv] { return run_train(*o, argc, argv); }; });

  struct EvalCli {
    std::string checkpoint, data;
    int64_t windows = 0;
    int seq_len = 0;
    int threads = 0;
    std::string device = "auto", dtype = "fp32";
    bool json = false;
    bool quiet = false;
  };
  auto e = std::make_shared<EvalCli>();
  CLI::App* eval = app.add_subcommand(
      "eval", "Mean next-token cross-entropy of a checkpoint's or Hugging Face weights over a token file");
  eval->add_option("CKPT", e->checkpoint,
                   "Step directory, run directory (follows 'latest'), or Hugging Face weights: a save_pretrained "
                   "folder, or a .safetensors file with config.json beside it")
      ->required();
  eval->add_option("--data", e->data,
                   "Token file (raw, llm.c or .npy, as for train), every id within the model's vocabulary")
      ->required();
  eval->add_option("--windows", e->windows,
                   "Windows of --seq-len tokens to score, from the start of the file (default 0: every full "
                   "window, at most 64)")
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--seq-len", e->seq_len, "Tokens per window (default: the model's longest sequence)")
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--threads", e->threads, "Compute threads a rank (default: the node's cores shared by its ranks)")
      ->check(CLI::NonNegativeNumber);
  eval->add_option("--device", e->device,
                   "auto (default): cuda where this build has CUDA and every rank has a GPU of its own, else cpu "
                   "(the result says which, and why); cpu (fp32, the reference); cuda (a GPU a rank, forward "
                   "passes only)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  eval->add_option("--dtype", e->dtype,
                   "Compute precision on the GPU: fp32 (the CPU's loss to about 1e-5), bf16 or fp16 (about 1e-2; "
                   "weights rounded from fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  eval->add_flag("--json", e->json, "Print {\"loss\", \"tokens\", \"device\"} on one line instead of a sentence");
  eval->add_flag("-q,--quiet", e->quiet, "No progress output on stderr (the result is still printed)");
  eval->footer(
      "On several MPI ranks each rank holds the whole model and scores a share of the windows; the loss is the "
      "same bits on any number of ranks.\n"
      "Example: shardkit eval runs/tiny --data runs/text.bin --windows 16 --json\n"
      "         mpirun -n 8 shardkit eval runs/xl --data runs/val.bin --windows 4096 --device cuda --dtype bf16");
  eval->callback([&action, e, argc, argv] {
    action = [e, argc, argv] {
      return run_on_ranks(argc, argv, [&](comm::MpiCollective& world) {
        const bool root = world.rank() == 0;
        Progress progress("eval", e->quiet || !root, "tokens");
        trainer::EvalOptions options;
        options.windows = e->windows;
        options.seq_len = e->seq_len;
        options.threads = e->threads;
        const trainer::DeviceChoice device = trainer::choose_device(e->device, world);
        options.cuda = device.cuda;
        options.dtype = e->dtype == "bf16"   ? ckpt::DType::kBF16
                        : e->dtype == "fp16" ? ckpt::DType::kF16
                                             : ckpt::DType::kF32;
        if (!options.cuda && e->dtype != "fp32") {
          fail(ErrorKind::kInvalidInput, "--dtype " + e->dtype + " is a GPU precision and eval runs on the CPU (" +
                                             device.reason + "): use it with a GPU");
        }
        const trainer::EvalResult r = trainer::evaluate(e->checkpoint, e->data, options, world,
                                                        [&](int64_t d, int64_t t) { progress.update(d, t); });
        progress.finish();
        if (!root) return 0;
        // The device goes with the result (not on a line of its own): an error stays one line.
        const char* device_name = device.cuda ? "cuda" : "cpu";
        if (e->json) {
          std::cout << nlohmann::json{{"loss", r.loss}, {"tokens", r.tokens}, {"device", device_name}}.dump() << "\n";
        } else {
          std::printf("loss %.6f over %lld tokens (%lld windows) on %s (%s)\n", r.loss,
                      static_cast<long long>(r.tokens), static_cast<long long>(r.windows), device_name,
                      device.reason.c_str());
        }
        return 0;
      });
    };
  });

  struct EncodeCli {
    std::string text, output;
    bool quiet = false;
  };
  auto d = std::make_shared<EncodeCli>();
  CLI::App* data = app.add_subcommand("data", "Prepare token files for train and eval");
  data->require_subcommand(1);
  CLI::App* encode =
      data->add_subcommand("encode", "Byte-level tokenisation of a text file: one token per byte (vocabulary 256)");
  encode->add_option("TEXT", d->text, "Input text file (any bytes: UTF-8 is encoded byte by byte)")->required();
  encode
      ->add_option("-o,--output", d->output,
                   "Token file to write (uint16 little-endian), replaced if it exists; its folder must exist")
      ->required();
  encode->add_flag("-q,--quiet", d->quiet, "No progress output on stderr (the summary line is still printed)");
  encode->footer("Example: shardkit data encode samples/data/checkpoints.txt -o runs/text.bin");
  encode->callback([&action, d] {
    action = [d] {
      refuse_overlap(d->text, d->output);  // the text would be replaced by its own tokens
      Progress progress("encode", d->quiet);
      const int64_t n =
          trainer::encode_bytes(d->text, d->output, [&](int64_t done, int64_t total) { progress.update(done, total); });
      progress.finish();
      print_line(stdout, "%s: %lld tokens (byte-level, vocabulary 256)", d->output.c_str(), static_cast<long long>(n));
      return 0;
    };
  });
}

}  // namespace shardkit::cli
