// The op_device attribute: the pipeline stage an op was built in ("stage:1";
// framework/dsl/pipeline.h), Paddle's op_device. Only forward ops carry it (and the grad ops that
// copy their forward op's attributes); transpiler/pipeline_pass.h places the rest. Like op_role,
// every op may carry it (framework/op/op_registry.cc).
#pragma once

#include <string>

namespace keel {

inline const std::string kOpDeviceAttr = "op_device";

}  // namespace keel
