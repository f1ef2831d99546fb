#pragma once

// Test fixtures for AWQ / GPTQ checkpoints: runs the independent Python packer
// (int4_checkpoint_packer.py, numpy) on a bundled model into a temporary directory, writing the
// quantized checkpoint and an f32 checkpoint of exactly its dequantized weights.

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace tandem::testing_util {

// Both directories live under `root`, removed when the PackedCheckpoint is destroyed.
struct PackedCheckpoint {
  std::string root;
  std::string quantized;  // the AWQ / GPTQ directory
  std::string dequant;    // f32 checkpoint of the values the quantized one means

  PackedCheckpoint(std::string r, std::string q, std::string d)
      : root(std::move(r)), quantized(std::move(q)), dequant(std::move(d)) {}
  PackedCheckpoint(PackedCheckpoint&& o) noexcept
      : root(std::move(o.root)), quantized(std::move(o.quantized)), dequant(std::move(o.dequant)) {
    o.root.clear();
  }
  PackedCheckpoint(const PackedCheckpoint&) = delete;
  PackedCheckpoint& operator=(const PackedCheckpoint&) = delete;
  ~PackedCheckpoint() {
    if (!root.empty()) std::filesystem::remove_all(root);
  }
};

// `args`: packer flags, e.g. "--format gptq --group 32 --act-order". `name` must be unique within
// the test binary run. Fails the current test when the packer fails.
inline PackedCheckpoint PackInt4Checkpoint(const std::string& model, const std::string& args,
                                           const std::string& name) {
  const std::string src = tandem::TestSourceDir();
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / ("tandem_int4_ckpt_" + name);
  std::filesystem::remove_all(root);
  PackedCheckpoint p(root.string(), (root / "quantized").string(), (root / "dequant").string());
  const std::string cmd =
      "/usr/bin/python3 " + src + "/tests/unit/common/engine/model/int4_checkpoint_packer.py " +
      src + "/models/" + model + " " + p.quantized + " " + args + " --dequant-out " + p.dequant;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return p;
}

}  // namespace tandem::testing_util
