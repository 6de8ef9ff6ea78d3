// A numeric CSV table: a header row naming the columns, then one example per row. The label
// column becomes "label" int64 [1]; every other column, in file order, becomes "features"
// float32 [F]. The file may be gzipped. Read and validated in the constructor: a row with the
// wrong number of fields, a field that is not a finite number, or a label that is not an integer
// (or outside 0..num_classes-1 when num_classes is set) is a keel::Error naming path:line.
// Blank lines and a trailing '\r' (CRLF files) are ignored; quoting is not supported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "framework/data/dataset.h"

namespace keel {

struct CsvOptions {
  char delimiter = ',';
  int64_t num_classes = -1;  // > 0: labels must lie in 0..num_classes-1
  std::string features_name = "features";
  std::string label_name = "label";
};

class CsvDataset : public Dataset {
 public:
  // `label_column` is a header name.
  CsvDataset(const std::string& path, const std::string& label_column, CsvOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  Example Get(int64_t index) const override;
  std::vector<std::string> names() const override {
    return {options_.features_name, options_.label_name};
  }

  int64_t num_features() const { return num_features_; }
  // The feature columns' header names, in order.
  const std::vector<std::string>& feature_columns() const { return feature_columns_; }

 private:
  std::string path_;
  CsvOptions options_;
  int64_t num_features_ = 0;
  std::vector<std::string> feature_columns_;
  std::vector<float> features_;  // size() * num_features
  std::vector<int64_t> labels_;
};

}  // namespace keel
