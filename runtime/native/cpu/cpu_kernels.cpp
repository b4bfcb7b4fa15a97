// The CPU extension built as one translation unit (runtime/native/cpu/paged_attention.py's build_kernel): torch's
// headers take most of each source's compile time, and one unit reads them once (the build's CPU time on the 2-core
// box: 35 s as four units, 13 s as one; 11 s since each includes the ATen headers it uses, not ATen/ATen.h). Each
// source stays a file of its own concern.
#include "decode_step.cpp"
#include "paged_decode_attention.cpp"
#include "quantized_linear.cpp"
#include "spread.cpp"
