#include "infer/model_loader.h"

#include "core/error.h"
#include "model/dsv4/checkpoint.h"

namespace trex::infer {

std::unique_ptr<dsv4::Model<float>> load_inference_model(const std::filesystem::path& model_dir, bool with_mtp) {
  const auto cfg_path = model_dir / "config.json";
  TREX_CHECK(std::filesystem::exists(cfg_path), "model directory {}: no config.json", model_dir.string());
  const dsv4::ModelConfig cfg = dsv4::load_model_config(cfg_path);
  const bool mtp = with_mtp && cfg.n_mtp > 0;
  dsv4::LoadOptions lo;
  if (!mtp) lo.filter = [](const std::string& name) { return name.rfind("mtp.", 0) != 0; };
  dsv4::StateDict state = dsv4::load_state_dict(model_dir, cfg, lo);
  dsv4::ModelOptions mo;
  mo.use_mtp = mtp;
  mo.balance_alpha = 0;
  auto model = std::make_unique<dsv4::Model<float>>(cfg, mo);
  model->load(state);
  return model;
}

}  // namespace trex::infer
