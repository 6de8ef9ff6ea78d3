#include "framework/data/csv_dataset.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include "framework/base/strings.h"
#include "framework/data/gzip.h"
#include "framework/error.h"

namespace keel {
namespace {

std::vector<std::string> SplitFields(const std::string& line, char delimiter) {
  std::vector<std::string> fields = StrSplit(line, delimiter);
  for (std::string& f : fields) f = StrTrim(f);
  return fields;
}

// A finite float spelled by the whole of `s`; false otherwise.
bool ParseFloat(const std::string& s, float* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtof(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*out);
}

// An integer ("3") or an integral decimal ("3.0", as pandas writes integer columns).
bool ParseLabel(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() + s.size() && errno == 0) {
    *out = v;
    return true;
  }
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(d) || d != std::floor(d) ||
      std::fabs(d) > 9007199254740992.0) {
    return false;
  }
  *out = static_cast<int64_t>(d);
  return true;
}

}  // namespace

CsvDataset::CsvDataset(const std::string& path, const std::string& label_column, CsvOptions options)
    : path_(path), options_(std::move(options)) {
  const std::string text = ReadMaybeGzippedFile(path);
  std::vector<std::string> header;
  int64_t label_index = -1;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (StrTrim(line).empty()) continue;
    std::vector<std::string> fields = SplitFields(line, options_.delimiter);

    if (header.empty()) {
      header = std::move(fields);
      std::set<std::string> seen;
      for (size_t i = 0; i < header.size(); ++i) {
        KEEL_ENFORCE(!header[i].empty(), path, ":", line_no, ": header column ", i + 1,
                     " has no name");
        KEEL_ENFORCE(seen.insert(header[i]).second, path, ":", line_no,
                     ": duplicate header column '", header[i], "'");
        if (header[i] == label_column) {
          label_index = static_cast<int64_t>(i);
        } else {
          feature_columns_.push_back(header[i]);
        }
      }
      KEEL_ENFORCE(label_index >= 0, path, ":", line_no, ": no label column '", label_column,
                   "' in the header (columns: ", line, ")");
      KEEL_ENFORCE(!feature_columns_.empty(), path, ":", line_no,
                   ": no feature columns besides the label '", label_column, "'");
      num_features_ = static_cast<int64_t>(feature_columns_.size());
      continue;
    }

    KEEL_ENFORCE(fields.size() == header.size(), path, ":", line_no, ": expected ", header.size(),
                 " fields as in the header, got ", fields.size());
    for (size_t i = 0; i < fields.size(); ++i) {
      if (static_cast<int64_t>(i) == label_index) {
        int64_t label = 0;
        KEEL_ENFORCE(ParseLabel(fields[i], &label), path, ":", line_no, ": label '", fields[i],
                     "' in column '", header[i], "' is not an integer");
        KEEL_ENFORCE(options_.num_classes <= 0 || (0 <= label && label < options_.num_classes),
                     path, ":", line_no, ": label ", label, " outside 0..",
                     options_.num_classes - 1);
        labels_.push_back(label);
      } else {
        float v = 0;
        KEEL_ENFORCE(ParseFloat(fields[i], &v), path, ":", line_no, ": field '", fields[i],
                     "' in column '", header[i], "' is not a finite number");
        features_.push_back(v);
      }
    }
  }
  KEEL_ENFORCE(!header.empty(), path, ": empty file, want a header row naming the columns");
}

Example CsvDataset::Get(int64_t index) const {
  KEEL_ENFORCE(0 <= index && index < size(), path_, ": index ", index, " outside [0, ", size(),
               ")");
  Tensor x(DType::kFloat32, {num_features_});
  std::copy(features_.begin() + index * num_features_,
            features_.begin() + (index + 1) * num_features_, x.data<float>());
  Tensor y(DType::kInt64, {1});
  y.data<int64_t>()[0] = labels_[index];
  return {std::move(x), std::move(y)};
}

}  // namespace keel
