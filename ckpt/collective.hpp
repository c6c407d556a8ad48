// The collectives the save protocol needs, as an interface, so that ckpt/ depends on no
// communication library: comm/ implements it over MPI, SingleProcess covers one process.
#pragma once

#include <string>
#include <vector>

namespace shardkit::ckpt {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank 0 receives every rank's string, in rank order; the other ranks receive an empty vector.
  virtual std::vector<std::string> gather(const std::string& mine) = 0;
  // Every rank receives rank 0's string (the argument is ignored on the other ranks).
  virtual std::string broadcast(const std::string& from_root) = 0;
};

// A group of one process.
class SingleProcess final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<std::string> gather(const std::string& mine) override { return {mine}; }
  std::string broadcast(const std::string& from_root) override { return from_root; }
};

}  // namespace shardkit::ckpt
