// Tensors as safetensors files (https://github.com/huggingface/safetensors format: u64 LE header
// length, JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, raw LE
// data). Readers check every size and offset against the file before trusting it; a bad file is a
// keel::Error naming it.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "framework/runtime/tensor.h"

namespace keel {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
std::string EncodeSafetensors(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {});
// `what` names the source in errors (usually the file path).
NamedTensors DecodeSafetensors(const std::string& bytes, const std::string& what,
                               std::map<std::string, std::string>* metadata = nullptr);
void SaveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata = {});
NamedTensors LoadSafetensors(const std::string& path,
                             std::map<std::string, std::string>* metadata = nullptr);

}  // namespace keel
