// Shape legend used by every kernel header:
//   B  = batch size           T  = sequence length (<= block_size)
//   C  = channels (n_embd)    NH = number of heads, hs = C / NH
//   V  = vocabulary size      OC = output channels of a matmul
//   N  = rows = B * T
// Tensors are row-major; "(B,T,C)" means index [b][t][c] = b*T*C + t*C + c.
//
// Backward kernels say in their comment whether they ADD TO (+=) or
// OVERWRITE (=) their gradient outputs. Most add: the model zeroes
// gradients once per step and lets several consumers accumulate.
#pragma once
