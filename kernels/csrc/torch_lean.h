// What the kernels need from torch: the Tensor type, the three ops they call, and pybind11's tensor conversion for
// load_inline's bindings. <torch/extension.h> (all of libtorch's C++ API) took 38 s of a 44 s build; these, 17 s.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

namespace torch {
using namespace at;
constexpr auto kFloat32 = at::kFloat;  // <torch/types.h>'s names for the dtypes used here
constexpr auto kInt8 = at::kChar;
}  // namespace torch
