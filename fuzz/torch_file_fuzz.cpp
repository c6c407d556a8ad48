// The torch.save reader of `convert import-deepspeed` on arbitrary bytes: the first byte picks the
// target, the rest is its input.
//   even: the restricted unpickler on a data.pkl stream;
//   odd:  a whole .pt file (zip archive + pickle), opened as the importer opens a rank's file, then every
//         tensor its pickle reaches read in part.
// Every input must give a result or an Error, never a crash, hang, leak, out-of-bounds access or an
// allocation beyond the bounds. The seeds in fuzz/corpus/torch_file/ are small torch.save files of
// DeepSpeed-shaped dicts (tests/convert/make_deepspeed_fixture.py's stand-ins) and their pickles.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "base/error.hpp"
#include "convert/torch/torch_file.hpp"
#include "convert/torch/unpickler.hpp"
#include "fuzz/scratch.hpp"

namespace {

using namespace shardkit::convert::torch;

const std::filesystem::path& scratch() {
  static const shardkit::fuzz::Scratch s("torch", ".pt");
  return s.path();
}

// Reads a few elements of every tensor reachable from the root (the graph may have cycles).
void read_tensors(const TorchFile& file) {
  std::vector<const Value*> todo = {&file.root()};
  std::unordered_set<const Value*> seen;
  float out[8];
  while (!todo.empty() && seen.size() < 10000) {
    const Value* v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    if (v->kind == Value::Kind::kTensor) {
      const int64_t n = std::min<int64_t>(v->tensor.numel(), 8);
      try {
        file.read(v->tensor, 0, std::span<float>(out, static_cast<size_t>(n)), "fuzz");
      } catch (const shardkit::Error&) {
      }
    }
    for (const Value* item : v->items) todo.push_back(item);
    for (const auto& [key, value] : v->pairs) {
      todo.push_back(key);
      todo.push_back(value);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      unpickle(rest, "fuzz.pkl");
    } else {
      std::ofstream(scratch(), std::ios::binary | std::ios::trunc)
          .write(rest.data(), static_cast<std::streamsize>(rest.size()));
      const TorchFile file(scratch());
      read_tensors(file);
    }
  } catch (const shardkit::Error&) {
  }
  return 0;
}
