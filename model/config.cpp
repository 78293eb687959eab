#include "model/config.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <stdexcept>

namespace flashcos::model {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("model config: " + what);
}

}  // namespace

void ModelConfig::validate() const {
  require(vocab >= 2, "vocab must be >= 2, got " + std::to_string(vocab));
  require(dim >= 1, "--dim must be >= 1, got " + std::to_string(dim));
  require(depth >= 1, "--depth must be >= 1, got " + std::to_string(depth));
  require(heads >= 1, "--heads must be >= 1, got " + std::to_string(heads));
  require(dim_head >= 1, "--dim-head must be >= 1, got " + std::to_string(dim_head));
  require(max_seq_len >= 1, "max_seq_len must be >= 1, got " + std::to_string(max_seq_len));
  require(l2norm_groups >= 1 && dim_head % l2norm_groups == 0,
          "l2norm groups (" + std::to_string(l2norm_groups) + ") must divide --dim-head " + std::to_string(dim_head));
  require(attention == "cosine" || attention == "exp" || attention == "softmax" || attention == "fastmax",
          "--attention must be cosine, exp, softmax or fastmax, got '" + attention + "'");
  require(attn_scale > 0 && attn_scale <= 1e4, "--attn-scale must be in (0, 10000], got " + std::to_string(attn_scale));
  require(pos == "rope" || pos == "learned" || pos == "none", "--pos must be rope, learned or none, got '" + pos + "'");
  require(rope_base > 1 && std::isfinite(rope_base), "--rope-base must be a finite number > 1, got " + std::to_string(rope_base));
  require(pos != "rope" || (dim_head / l2norm_groups) % 2 == 0,
          "--pos rope rotates pairs of features: --dim-head / --l2norm-groups (" +
              std::to_string(dim_head / l2norm_groups) + ") must be even");
  require(!(attention == "exp" && attention_impl == "sdpa"),
          "--attention exp is unnormalised: libtorch's sdpa cannot compute it; use --attention-impl plain, tiled "
          "or fused (the fused kernel: --use-cuda-kernel when training)");
  require(attention_impl == "plain" || attention_impl == "sdpa" || attention_impl == "tiled" ||
              attention_impl == "fused",
          "--attention-impl must be plain, sdpa, tiled or fused (the fused kernel: --use-cuda-kernel when training), got '" +
              attention_impl + "'");
  require(!(attention_impl == "fused" && attention == "softmax"),
          "the fused kernel (--use-cuda-kernel, --attention-impl fused) runs cosine, exp or fastmax attention; "
          "--attention softmax has no fused kernel here");
  require(fastmax_p == 1 || fastmax_p == 2, "--fastmax-p must be 1 or 2, got " + std::to_string(fastmax_p));
}

double ModelConfig::parameters_at_least() const {
  const double d = static_cast<double>(dim), inner = static_cast<double>(heads) * static_cast<double>(dim_head);
  return static_cast<double>(depth) * (4.0 * d * inner + 8.0 * d * d) + 2.0 * static_cast<double>(vocab) * d;
}

std::string ModelConfig::to_json() const {
  nlohmann::json j = {{"vocab", vocab},
                      {"dim", dim},
                      {"depth", depth},
                      {"heads", heads},
                      {"dim_head", dim_head},
                      {"max_seq_len", max_seq_len},
                      {"attn_scale", attn_scale},
                      {"l2norm_groups", l2norm_groups},
                      {"attention", attention},
                      {"pos", pos},
                      {"rope_base", rope_base},
                      {"attention_impl", attention_impl},
                      {"deterministic", deterministic},
                      {"fastmax_p", fastmax_p},
                      {"fastmax_a0", fastmax_a0},
                      {"fastmax_a1", fastmax_a1},
                      {"fastmax_a2", fastmax_a2},
                      {"fastmax_temperature", fastmax_temperature},
                      {"fastmax_normalize", fastmax_normalize}};
  return j.dump();
}

ModelConfig ModelConfig::from_json(const std::string& text) {
  ModelConfig c;
  try {
    auto j = nlohmann::json::parse(text);
    c.vocab = j.at("vocab");
    c.dim = j.at("dim");
    c.depth = j.at("depth");
    c.heads = j.at("heads");
    c.dim_head = j.at("dim_head");
    c.max_seq_len = j.at("max_seq_len");
    c.attn_scale = j.at("attn_scale");
    c.l2norm_groups = j.at("l2norm_groups");
    c.attention = j.at("attention");
    c.attention_impl = j.at("attention_impl");
    c.pos = j.value("pos", std::string("learned"));  // older checkpoints: learned positions
    c.rope_base = j.value("rope_base", c.rope_base);
    c.deterministic = j.value("deterministic", c.deterministic);
    c.fastmax_p = j.value("fastmax_p", c.fastmax_p);
    c.fastmax_a0 = j.value("fastmax_a0", c.fastmax_a0);
    c.fastmax_a1 = j.value("fastmax_a1", c.fastmax_a1);
    c.fastmax_a2 = j.value("fastmax_a2", c.fastmax_a2);
    c.fastmax_temperature = j.value("fastmax_temperature", c.fastmax_temperature);
    c.fastmax_normalize = j.value("fastmax_normalize", c.fastmax_normalize);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("model config in checkpoint is malformed: ") + e.what());
  }
  c.validate();
  return c;
}

int64_t ModelConfig::num_parameters() const {
  const int64_t inner = heads * dim_head;
  const int64_t attn = 3 * dim * inner + inner * dim;
  const int64_t ff = dim * 4 * dim + 4 * dim + 4 * dim * dim + dim;
  const int64_t block = attn + ff + 4 * dim;  // two LayerNorms
  const int64_t positions = pos == "learned" ? max_seq_len * dim : 0;
  return vocab * dim + positions + depth * block + 2 * dim + dim * vocab + vocab;
}

}  // namespace flashcos::model
