// Run outputs: DIR/metrics.jsonl (one JSON object per step: step, loss, lr, grad_norm, tokens,
// tokens_per_s, mfu, ...), DIR/events.jsonl (spikes, rollbacks, resumes) and the loss plot
// (DIR/loss.html with an inline SVG; DIR/loss.png too when libpng is available).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trex::train {

void append_jsonl(const std::filesystem::path& path, const nlohmann::json& j);  // one line, flushed
// Keeps the lines whose "step" is <= last_step (used on resume/rollback so the curve has no duplicates).
void truncate_metrics(const std::filesystem::path& path, int64_t last_step);
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path);

// Writes loss.html (and loss.png when built with libpng) from metrics.jsonl. Returns the files written.
std::vector<std::filesystem::path> write_loss_plot(const std::filesystem::path& metrics,
                                                   const std::filesystem::path& out_dir, const std::string& title);

}  // namespace trex::train
