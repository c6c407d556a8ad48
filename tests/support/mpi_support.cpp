#include "tests/support/mpi_support.hpp"

#include <fstream>

namespace shardkit::testing {

SharedDir::SharedDir(comm::MpiCollective& world) : world_(world) {
  std::string path;
  if (world.rank() == 0) {
    local_ = std::make_unique<TempDir>();
    path = local_->path().string();
  }
  path_ = world.broadcast(path);
}

SharedDir::~SharedDir() {
  world_.barrier();
}  // nobody reads while rank 0 deletes

std::filesystem::path SharedDir::write_tokens(const std::string& name, int count) {
  const std::filesystem::path file = path_ / name;
  if (world_.rank() == 0) {
    // Structured enough to learn from: a few interleaved periodic patterns.
    std::ofstream out(file, std::ios::binary);
    for (int i = 0; i < count; ++i) {
      const uint16_t t = static_cast<uint16_t>(32 + (i * 7 + (i / 13) * 3 + (i / 97)) % 90);
      out.write(reinterpret_cast<const char*>(&t), sizeof(t));
    }
  }
  world_.barrier();
  return file;
}

std::filesystem::path SharedDir::write_json(const std::string& name, const nlohmann::json& content) {
  const std::filesystem::path file = path_ / name;
  if (world_.rank() == 0) std::ofstream(file) << content.dump(2);
  world_.barrier();
  return file;
}

std::vector<trainer::StepRecord> train(comm::MpiCollective& comm, const trainer::TrainOptions& options) {
  trainer::Trainer t(comm, options);
  return t.run();
}

std::vector<trainer::StepRecord> train_on_rank0(comm::MpiCollective& world, const trainer::TrainOptions& options) {
  nlohmann::json out = nlohmann::json::array();
  if (world.rank() == 0) {
    comm::MpiCollective self(MPI_COMM_SELF);
    trainer::Trainer t(self, options);
    for (const trainer::StepRecord& r : t.run()) out.push_back({r.step, r.loss, r.lr, r.loss_scale});
  }
  std::vector<trainer::StepRecord> records;
  for (const auto& r : nlohmann::json::parse(world.broadcast(out.dump()))) {
    trainer::StepRecord rec;
    rec.step = r[0].get<int64_t>();
    rec.loss = r[1].get<double>();
    rec.lr = r[2].get<double>();
    rec.loss_scale = r[3].get<double>();
    records.push_back(rec);
  }
  return records;
}

}  // namespace shardkit::testing
