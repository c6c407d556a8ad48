// How a tensor starts (before any pretrained weights): by its role in the model, never by its name.
// Apart from the Model interface so that device code, which draws the values, can include it.
#pragma once

namespace shardkit::model {

struct InitRule {
  enum Kind { kZeros, kOnes, kNormal } kind = kZeros;
  float std = 0;  // kNormal: values N(0, std^2)
};

}  // namespace shardkit::model
