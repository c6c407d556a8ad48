// Writes what the PyTorch references (golden_pytorch.py, llama_golden.py) check: a model's initial
// weights for a seed, and the loss and every gradient of one forward/backward pass over the windows of
// a token file, computed by the family's CPU model. Files: OUT/init/<tensor>.f32, OUT/grad/<tensor>.f32 (raw
// little-endian fp32, row-major in the tensor table's shapes) and OUT/loss.json.
//
// Usage: golden_dump MODEL TOKENS.bin SEED OUT_DIR (MODEL: a preset or a JSON model file)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/cpu/gemm.hpp"
#include "model/registry.hpp"
#include "trainer/data.hpp"
#include "trainer/dense_params.hpp"
#include "trainer/init.hpp"

namespace {

void write_raw(const std::filesystem::path& path, const std::vector<float>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardkit::trainer;
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL TOKENS.bin SEED OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out_dir = argv[4];
  const uint64_t seed = std::stoull(argv[3]);
  shardkit::model::cpu::set_compute_threads(1);
  const auto model = shardkit::model::resolve_model(argv[1]);
  const auto& table = model->table();
  DenseParams params(table);
  const RandomInit init(*model, seed);
  for (size_t t = 0; t < table.size(); ++t)
    init_values(init, static_cast<int>(t), 0, params.values(static_cast<int>(t)));

  // Every window of the file, in order, as one batch.
  const TokenFile tokens(argv[2]);
  const int T = model->max_seq_len();
  const int B = static_cast<int>((tokens.size() - 1) / T);
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(static_cast<size_t>(B) * T);
  tokens.read(0, int64_t{B} * T, model->vocab_size(), inputs.data());
  tokens.read(1, int64_t{B} * T, model->vocab_size(), targets.data());
  const auto cpu = model->make_cpu_model({.batch = B, .seq_len = T});
  const double loss = cpu->forward_backward(params, inputs.data(), targets.data(), B, T, 1.0f);
  const double eval_loss = cpu->forward(params, inputs.data(), targets.data(), B, T);

  std::filesystem::create_directories(out_dir / "init");
  std::filesystem::create_directories(out_dir / "grad");
  for (size_t t = 0; t < table.size(); ++t) {
    write_raw(out_dir / "init" / (table[t].name + ".f32"), params.values(static_cast<int>(t)));
    write_raw(out_dir / "grad" / (table[t].name + ".f32"), params.gradient(static_cast<int>(t)));
  }
  std::ofstream(out_dir / "loss.json") << nlohmann::json{{"loss", loss},
                                                         {"eval_loss", eval_loss},
                                                         {"batch", B},
                                                         {"seq_len", T},
                                                         {"model", model->to_json()}}
                                              .dump()
                                       << "\n";
  return 0;
}
