// model/checkpoint_weights.cpp: sample and eval read a checkpoint's weights without its optimiser
// state. The model they get equals libtorch's full read (FLASHCOS_CHECKPOINT_FULL_READ=1) for
// rope and learned-position checkpoints, with and without optimiser state, only the weights'
// bytes are read, and damaged files still fail with the full read's messages.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "model/checkpoint.h"
#include "model/checkpoint_weights.h"
#include "model/gpt.h"
#include "tests/model_test_util.h"
#include "tests/shell_util.h"

namespace fs = std::filesystem;
using flashcos::model::GPT;
using flashcos::model::ModelConfig;

namespace {

class CheckpointWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("flashcos_weights_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    test_shell::remove_tree(dir_.string());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    unsetenv("FLASHCOS_CHECKPOINT_FULL_READ");
    test_shell::remove_tree(dir_.string());
  }
  std::string str(const std::string& name) const { return (dir_ / name).string(); }
  // A trained-one-step model and its checkpoint (with Adam's state when with_optimizer).
  std::string save(const ModelConfig& cfg, bool with_optimizer, GPT* out = nullptr) {
    torch::manual_seed(11);
    GPT model(cfg);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
    model->loss(torch::randint(0, 256, {2, 33}, torch::kLong)).backward();
    opt.step();
    flashcos::model::TrainState st;
    st.step = 3;
    const auto path = str(cfg.pos + (with_optimizer ? "_opt.pt" : ".pt"));
    flashcos::model::save_checkpoint(path, model, with_optimizer ? &opt : nullptr, cfg, st);
    if (out) *out = model;
    return path;
  }
  static GPT load(const std::string& path, bool full, flashcos::model::CheckpointMeta* meta) {
    if (full) setenv("FLASHCOS_CHECKPOINT_FULL_READ", "1", 1);
    auto m = flashcos::model::load_model(path, torch::kCPU, meta);
    unsetenv("FLASHCOS_CHECKPOINT_FULL_READ");
    return m;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(CheckpointWeights, SameModelAsTheFullReadForEveryLayout) {
  for (const std::string pos : {"rope", "learned", "none"}) {
    for (bool with_optimizer : {true, false}) {
      GPT saved(flashcos::test::small_ctx64(pos));
      const auto path = save(flashcos::test::small_ctx64(pos), with_optimizer, &saved);
      flashcos::model::CheckpointMeta fast_meta, full_meta;
      GPT fast = load(path, false, &fast_meta);
      GPT full = load(path, true, &full_meta);
      EXPECT_EQ(fast_meta.model.to_json(), full_meta.model.to_json());
      EXPECT_EQ(fast_meta.state.step, 3);
      EXPECT_EQ(fast_meta.state.train_config_json, full_meta.state.train_config_json);
      const auto a = fast->named_parameters(), b = full->named_parameters(), c = saved->named_parameters();
      ASSERT_EQ(a.size(), b.size());
      for (const auto& p : a) {
        EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << pos << " " << p.key();
        EXPECT_TRUE(torch::equal(p.value(), c[p.key()])) << pos << " " << p.key();
      }
      EXPECT_FALSE(fast->is_training());
      auto window = torch::randint(0, 256, {1, 20}, torch::kLong);
      EXPECT_TRUE(torch::equal(fast->forward(window), full->forward(window))) << pos;
    }
  }
}

// Only the model's bytes are read: Adam's two moments per parameter stay in the file.
TEST_F(CheckpointWeights, ReadsTheWeightsNotTheOptimiserState) {
  const auto cfg = flashcos::test::small_ctx64("rope");
  const auto path = save(cfg, true);
  GPT model(cfg, /*initialise=*/false);
  flashcos::model::WeightsReader reader(path);
  reader.load_into(model);
  size_t weight_bytes = 0;
  for (const auto& p : model->parameters()) weight_bytes += p.numel() * p.element_size();
  EXPECT_EQ(reader.bytes_read(), weight_bytes);
  EXPECT_LT(reader.bytes_read() * 2, static_cast<size_t>(fs::file_size(path)));
}

// A damaged or foreign file gives the full read's error; a checkpoint of another shape does too.
TEST_F(CheckpointWeights, DamagedFilesGiveTheFullReadsErrors) {
  const auto good = save(flashcos::test::small_ctx64("rope"), true);
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(str("cut.pt"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  std::ofstream(str("junk.pt")) << "not a checkpoint";
  auto error_of = [](const std::string& path, bool full) {
    try {
      flashcos::model::CheckpointMeta meta;
      (void)load(path, full, &meta);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const auto& p : {str("cut.pt"), str("junk.pt"), str("missing.pt")}) {
    const auto fast = error_of(p, false);
    EXPECT_EQ(fast, error_of(p, true));
    EXPECT_NE(fast, "no error") << p;
  }
  EXPECT_NE(error_of(str("cut.pt"), false).find("corrupt"), std::string::npos);
  // The reader itself refuses a model whose shape is not the file's.
  auto other = flashcos::test::small_ctx64("rope");
  other.dim = 48;
  GPT wrong(other, false);
  flashcos::model::WeightsReader reader(good);
  try {
    reader.load_into(wrong);
    ADD_FAILURE() << "a model of another shape loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
  }
}
