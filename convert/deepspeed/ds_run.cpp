#include "convert/deepspeed/ds_run.hpp"

#include "base/error.hpp"
#include "base/json_input.hpp"

namespace shardkit::convert::deepspeed {

using torch::Value;
using torch::ValueBuilder;

namespace {

constexpr int kMaxDepth = 64;

nlohmann::json convert(const Value& v, const std::string& where, const std::string& path, int depth) {
  if (depth > kMaxDepth) fail(ErrorKind::kInvalidInput, where + ": " + path + " is nested too deeply");
  using Kind = Value::Kind;
  switch (v.kind) {
    case Kind::kNone:
      return nullptr;
    case Kind::kBool:
      return v.boolean;
    case Kind::kInt:
      return v.integer;
    case Kind::kFloat:
      return v.real;
    case Kind::kString:
      return v.text;
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kSet: {
      nlohmann::json a = nlohmann::json::array();
      for (size_t i = 0; i < v.items.size(); ++i) {
        a.push_back(convert(*v.items[i], where, path + "[" + std::to_string(i) + "]", depth + 1));
      }
      return a;
    }
    case Kind::kDict: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [key, value] : v.pairs) {
        std::string k;
        if (key->kind == Kind::kString) {
          k = key->text;
        } else if (key->kind == Kind::kInt) {
          k = std::to_string(key->integer);
        } else {
          fail(ErrorKind::kInvalidInput, where + ": " + path + " has a key that is " + key->describe());
        }
        o[k] = convert(*value, where, path + "['" + k + "']", depth + 1);
      }
      return o;
    }
    default:
      break;
  }
  fail(ErrorKind::kInvalidInput, where + ": " + path + " is " + v.describe() +
                                     ", which a checkpoint for DeepSpeed cannot carry over (numbers, strings, "
                                     "lists and dicts can)");
}

[[noreturn]] void corrupt(const std::string& where, const std::string& what) {
  fail(ErrorKind::kCorrupt, where + ": trainer_state.deepspeed: " + what);
}

}  // namespace

nlohmann::json to_json(const Value& v, const std::string& where, const std::string& path) {
  return convert(v, where, path, 0);
}

const Value* from_json(ValueBuilder& b, const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return b.none();
    case nlohmann::json::value_t::boolean:
      return b.boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return b.integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_float:
      return b.real(j.get<double>());
    case nlohmann::json::value_t::string:
      return b.str(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<const Value*> items;
      for (const auto& e : j) items.push_back(from_json(b, e));
      return b.list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      ValueBuilder::Pairs pairs;
      for (const auto& [k, e] : j.items()) pairs.emplace_back(b.str(k), from_json(b, e));
      return b.dict(std::move(pairs));
    }
    default:
      break;
  }
  return b.none();
}

nlohmann::json DeepSpeedRun::to_json() const {
  nlohmann::json g = nlohmann::json::array();
  for (const Group& group : groups) g.push_back({{"params", group.params}, {"options", group.options}});
  return {{"param_groups", g},
          {"shared_params", shared_params},
          {"lr_scheduler", lr_scheduler},
          {"adam_step", step_is_tensor ? "tensor" : "int"}};
}

DeepSpeedRun DeepSpeedRun::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) corrupt(where, "not an object");
  DeepSpeedRun run;
  const auto groups = j.find("param_groups");
  if (groups == j.end() || !groups->is_array() || groups->empty()) corrupt(where, "no param_groups");
  for (const nlohmann::json& g : *groups) {
    if (!g.is_object() || !g.contains("params") || !g["params"].is_array() || !g.contains("options") ||
        !g["options"].is_object()) {
      corrupt(where, "a parameter group without params and options");
    }
    Group group;
    for (const nlohmann::json& p : g["params"]) {
      if (!p.is_string()) corrupt(where, "a parameter name that is not a string");
      group.params.push_back(p.get<std::string>());
    }
    group.options = g["options"];
    run.groups.push_back(std::move(group));
  }
  run.shared_params = j.value("shared_params", nlohmann::json::object());
  if (!run.shared_params.is_object()) corrupt(where, "shared_params is not an object");
  for (const auto& [tied, holder] : run.shared_params.items()) {
    if (!holder.is_string()) corrupt(where, "shared_params[" + quoted_excerpt(tied) + "] is not a name");
  }
  run.lr_scheduler = j.value("lr_scheduler", nlohmann::json());
  run.step_is_tensor = j.value("adam_step", std::string("tensor")) != "int";
  return run;
}

}  // namespace shardkit::convert::deepspeed
