#pragma once

// Test fixtures for fp8 checkpoints as published: runs the independent Python packer
// (fp8_checkpoint_packer.py, numpy) on a bundled model into a temporary directory, writing the
// fp8 checkpoint and an f32 checkpoint of exactly its dequantized weights.

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/common/engine/model/int4_checkpoint_util.h"
#include "tests/util/test_paths.h"

namespace tandem::testing_util {

// `args`: packer flags, e.g. "--format compressed-tensors --strategy tensor --dtype bf16". `name`
// must be unique within the test binary run. Fails the current test when the packer fails.
inline PackedCheckpoint PackFp8Checkpoint(const std::string& model, const std::string& args,
                                          const std::string& name) {
  const std::string src = tandem::TestSourceDir();
  const std::filesystem::path root =
      std::filesystem::path(::testing::TempDir()) / ("tandem_fp8_ckpt_" + name);
  std::filesystem::remove_all(root);
  PackedCheckpoint p(root.string(), (root / "quantized").string(), (root / "dequant").string());
  const std::string cmd =
      "/usr/bin/python3 " + src + "/tests/unit/common/engine/model/fp8_checkpoint_packer.py " +
      src + "/models/" + model + " " + p.quantized + " " + args + " --dequant-out " + p.dequant;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return p;
}

}  // namespace tandem::testing_util
