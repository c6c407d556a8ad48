#include "convert/source.hpp"

#include <array>
#include <regex>

#include "base/error.hpp"
#include "base/file_util.hpp"
#include "base/json_input.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "ckpt/shard_format.hpp"
#include "convert/dcp/dcp_checkpoint.hpp"
#include "convert/deepspeed/ds_checkpoint.hpp"
#include "model/registry.hpp"

namespace shardkit::convert {
namespace {

// The config.json a Hugging Face Trainer run keeps beside its DeepSpeed checkpoint folder: in the folder
// given, or in the one above a tag folder. Empty when there is none.
std::filesystem::path find_hf_config(const std::filesystem::path& source) {
  std::error_code ec;
  for (const std::filesystem::path& dir : {source, std::filesystem::absolute(source).parent_path()}) {
    if (std::filesystem::is_regular_file(dir / "config.json", ec)) return dir / "config.json";
  }
  return {};
}

bool known_model_type(const nlohmann::json& config) {
  const auto type = config.find("model_type");
  if (type == config.end() || !type->is_string()) return false;
  for (const model::Family* f : model::families()) {
    for (const std::string& t : f->hf_model_types) {
      if (t == type->get<std::string>()) return true;
    }
  }
  return false;
}

CheckpointSource open_shardkit(const std::filesystem::path& path) {
  auto probe = std::make_shared<ckpt::CheckpointReader>(path);
  const ckpt::Manifest& m = probe->manifest();
  const std::string where = probe->step_dir().string();
  CheckpointSource s;
  s.path = probe->step_dir();
  s.table = &probe->tensors();
  s.trainer_state = m.trainer_state;
  s.config = m.config;
  s.model = m.model;
  s.world_size = m.layout.world_size;
  s.stage = m.layout.stage;
  s.chunk_elems = m.chunk_elems;
  if (m.trainer_state.contains("deepspeed")) {
    s.run = deepspeed::DeepSpeedRun::from_json(m.trainer_state["deepspeed"], where);
  } else {
    s.run_missing = where + ": trained by shardkit, it records no DeepSpeed parameter groups";
  }
  const std::array<std::string_view, 3> names = {ckpt::kMasterWeights, ckpt::kExpAvg, ckpt::kExpAvgSq};
  std::array<int, 3> states{};
  for (size_t i = 0; i < names.size(); ++i) states[i] = probe->find_state(names[i]);
  if (states[0] < 0) fail(ErrorKind::kInvalidInput, where + ": no '" + std::string(names[0]) + "' state");
  // AdamW's moments, or Lion's exp_avg alone: the states read by index are a prefix of `names`.
  s.has_moments = states[1] >= 0;
  s.states = m.states;
  const std::filesystem::path step_dir = probe->step_dir();
  s.reader = [step_dir, states, names]() -> StateReadFn {
    auto reader = std::make_shared<ckpt::CheckpointReader>(step_dir);
    return [reader, states, names](int state, int tensor, int64_t offset, std::span<float> out) {
      const int index = states[static_cast<size_t>(state)];
      if (index < 0) {
        fail(ErrorKind::kInvalidInput,
             reader->step_dir().string() + ": no '" + std::string(names[static_cast<size_t>(state)]) + "' state");
      }
      reader->read(tensor, index, offset, out);
    };
  };
  s.keep = probe;
  return s;
}

// The model a foreign checkpoint's tensors are checked against: the one named, or the one the Hugging
// Face config.json beside it describes when a family knows its model_type and computes what the file
// asks (null otherwise: the tensors convert as the files give them, and `import ... --model` names the
// field a family refused), and that config.json (null when there is none).
struct ForeignModel {
  std::shared_ptr<const model::Model> model;
  nlohmann::json hf_config;

  // As a manifest records the model: the family's, or the external one named after the checkpoint.
  nlohmann::json to_json(const std::filesystem::path& folder) const {
    if (model) return model->to_json();
    nlohmann::json j = {{"family", model::kExternalFamily}, {"name", folder.filename().string()}};
    if (hf_config.is_object()) j["hf_config"] = hf_config;
    return j;
  }
};

ForeignModel foreign_model(const std::filesystem::path& path, const std::string& model_name) {
  ForeignModel m;
  if (!model_name.empty()) {
    m.model = model::resolve_model(model_name);
    return m;
  }
  if (const std::filesystem::path config = find_hf_config(path); !config.empty()) {
    m.hf_config = read_json_file(config, json_limits::kConfig, ErrorKind::kInvalidInput);
    if (known_model_type(m.hf_config)) {
      try {
        m.model = model::model_from_hf_config(m.hf_config, config.string());
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kInvalidInput) throw;
      }
    }
  }
  return m;
}

// What every foreign source gives alike: its folder, table, counters, run and model, and readers that
// share the one opened checkpoint.
template <typename Checkpoint>
CheckpointSource foreign_source(std::shared_ptr<Checkpoint> ckpt, SourceFormat format, const ForeignModel& fm) {
  CheckpointSource s;
  s.path = ckpt->folder();
  s.format = format;
  s.table = &ckpt->table();
  s.trainer_state = ckpt->trainer_state();
  s.run = ckpt->run();
  s.run_missing = ckpt->run_missing();
  s.model = fm.to_json(ckpt->folder());
  s.reader = [ckpt]() -> StateReadFn {
    return
        [ckpt](int state, int tensor, int64_t offset, std::span<float> out) { ckpt->read(state, tensor, offset, out); };
  };
  s.keep = ckpt;
  return s;
}

// The parameter groups of a run shardkit trained: the two groups Hugging Face's Trainer makes (the
// decaying weights, then the biases and norms), with the optimizer's settings from the config: AdamW's,
// or with `lion` Lion's.
deepspeed::DeepSpeedRun run_of_model(const model::Model& m, const nlohmann::json& config, const nlohmann::json& state,
                                     bool lion) {
  const nlohmann::json params = config.is_object() && config.contains("optimizer") && config["optimizer"].is_object()
                                    ? config["optimizer"].value("params", nlohmann::json::object())
                                    : nlohmann::json::object();
  // shardkit's defaults for a config without these settings (trainer/ds_config.hpp).
  const double lr = params.value("lr", 1e-3);
  const nlohmann::json betas = params.value("betas", nlohmann::json::array({0.9, 0.999}));
  const double eps = params.value("eps", 1e-8);
  const double weight_decay = params.value("weight_decay", 0.0);
  deepspeed::DeepSpeedRun run;
  for (bool decays : {true, false}) {
    deepspeed::DeepSpeedRun::Group g;
    for (size_t t = 0; t < m.table().size(); ++t) {
      if (m.decays(static_cast<int>(t)) == decays) g.params.push_back(m.table()[t].name);
    }
    // The keys the optimizer reads from a group (torch.optim.AdamW's and DeepSpeed's FusedAdam's, or
    // DeepSpeed's FusedLion's); a loaded group replaces the optimizer's own whole.
    if (lion) {
      g.options = {{"lr", lr}, {"betas", betas}, {"weight_decay", decays ? weight_decay : 0.0}};
      if (!g.params.empty()) run.groups.push_back(std::move(g));
      continue;
    }
    g.options = {{"lr", lr},
                 {"betas", betas},
                 {"eps", eps},
                 {"weight_decay", decays ? weight_decay : 0.0},
                 {"bias_correction", true},
                 {"amsgrad", false},
                 {"foreach", nullptr},
                 {"maximize", false},
                 {"capturable", false},
                 {"differentiable", false},
                 {"fused", nullptr}};
    if (!g.params.empty()) run.groups.push_back(std::move(g));
  }
  if (const std::optional<model::HfName> tied = m.classify_hf_name("lm_head.weight");
      tied && tied->kind == model::HfName::kTiedOutput) {
    run.shared_params["lm_head.weight"] = tied->name;
  }
  if (config.is_object() && config.contains("scheduler")) {
    run.lr_scheduler = {
        {"last_batch_iteration",
         state.value("lr_scheduler", nlohmann::json::object()).value("last_batch_iteration", int64_t{-1})}};
  }
  return run;
}

}  // namespace

CheckpointSource open_deepspeed_source(const std::filesystem::path& path, const std::string& model_name) {
  const ForeignModel fm = foreign_model(path, model_name);
  auto ckpt = std::make_shared<deepspeed::DeepSpeedCheckpoint>(path, fm.model);
  const bool universal = ckpt->layout() == deepspeed::SourceLayout::kUniversal;
  CheckpointSource s = foreign_source(ckpt, SourceFormat::kDeepSpeed, fm);
  s.config = ckpt->ds_config();
  // A universal checkpoint has no world size of its own.
  s.world_size = universal ? 1 : ckpt->world_size();
  s.stage = universal ? 0 : ckpt->stage();
  // Adam's and AdamW's two moments, or Lion's one, under the names shardkit's optimizers give them.
  s.states = {std::string(ckpt::kMasterWeights)};
  s.states.insert(s.states.end(), ckpt->moments().begin(), ckpt->moments().end());
  return s;
}

CheckpointSource open_dcp_source(const std::filesystem::path& path, const std::string& model_name) {
  if (!is_dcp_checkpoint(path)) {
    fail(ErrorKind::kInvalidInput, path.string() + ": not a PyTorch DCP checkpoint folder (no .metadata file)");
  }
  const ForeignModel fm = foreign_model(path, model_name);
  CheckpointSource s = foreign_source(std::make_shared<dcp::DcpCheckpoint>(path, fm.model), SourceFormat::kDcp, fm);
  const auto& ckpt = *std::static_pointer_cast<const dcp::DcpCheckpoint>(s.keep);
  // FSDP's sharding of parameters, gradients and optimizer states is ZeRO's stage 3.
  s.world_size = ckpt.world_size();
  s.stage = 3;
  s.has_moments = ckpt.has_moments();
  s.states = s.has_moments ? ckpt::adamw_state_names() : std::vector<std::string>{std::string(ckpt::kMasterWeights)};
  return s;
}

bool holds_lion_states(const CheckpointSource& source) {
  return source.states == std::vector<std::string>{std::string(ckpt::kMasterWeights), std::string(ckpt::kExpAvg)};
}

void require_adamw_or_weights(const CheckpointSource& source, const std::string& target) {
  const std::vector<std::string> weights{std::string(ckpt::kMasterWeights)};
  if (source.states == ckpt::adamw_state_names() || source.states == weights) return;
  std::string held;
  for (const std::string& name : source.states) held += (held.empty() ? "" : ", ") + name;
  fail(ErrorKind::kInvalidInput, source.path.string() + ": holds the optimizer states [" + held +
                                     "] of a run of another "
                                     "optimizer than AdamW; " +
                                     target +
                                     " takes AdamW's (fp32, exp_avg, exp_avg_sq) or "
                                     "the master weights alone (convert consolidate exports the weights of any run)");
}

bool is_dcp_checkpoint(const std::filesystem::path& path) {
  return dcp::is_dcp_folder(path);
}

bool is_deepspeed_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path folder = path;
  if (std::filesystem::is_regular_file(path / "latest_universal", ec)) return true;
  if (std::filesystem::is_regular_file(path / "latest", ec)) {
    std::string tag = read_small_file(path / "latest", 4096, ErrorKind::kInvalidInput);
    while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
    if (tag.empty() || tag.find('/') != std::string::npos) return false;
    folder = path / tag;
  }
  if (std::filesystem::exists(folder / "manifest.json", ec)) return false;
  if (std::filesystem::is_directory(folder / "zero", ec)) return true;
  static const std::regex kOptim(R"((bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt)");
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    if (std::regex_match(entry.path().filename().string(), kOptim)) return true;
  }
  return false;
}

CheckpointSource open_checkpoint_source(const std::filesystem::path& path, const std::string& model) {
  if (is_dcp_checkpoint(path)) return open_dcp_source(path, model);
  return is_deepspeed_checkpoint(path) ? open_deepspeed_source(path, model) : open_shardkit(path);
}

deepspeed::DeepSpeedRun optimizer_run(const CheckpointSource& s) {
  if (s.run) return *s.run;
  if (model::is_external(s.model)) {
    fail(ErrorKind::kInvalidInput,
         s.run_missing + "; give --model to take the parameter groups from a model shardkit knows");
  }
  return run_of_model(*model::model_from_manifest(s.model, s.path.string()), s.config, s.trainer_state,
                      holds_lion_states(s));
}

}  // namespace shardkit::convert
