"""What the Triton kernels cover, without importing triton: the plan (memory/plan.py) reads it on every machine.

The kernels' own sizes: the chunk kernel holds a chunk of ≤ MAX_CHUNK tokens and D ≤ MAX_FEATURES features per
program; the MLP chunk kernel a chunk's window of ≤ MAX_MLP_KEYS keys and each weight matrix (≤ MAX_MLP_WEIGHT entries)
whole; the Newton–Schulz kernel a matrix of ≤ MAX_ROWS × MAX_COLS after its transpose to rows ≤ cols.
"""
MAX_FEATURES, MAX_CHUNK = 256, 64
MAX_ROWS, MAX_COLS = 128, 512
MAX_MLP_KEYS, MAX_MLP_WEIGHT = 64, 64 * 256  # the MLP kernel: a chunk's window keys, entries of a weight on chip

COVERAGE = ("impl='triton' covers architecture 'linear' with an optimiser linear in the gradients (gd, momentum; "
            f"attentional_bias 'l2' or 'dot', any window and feature map, D ≤ {MAX_FEATURES}, chunk_size ≤ "
            f"{MAX_CHUNK}); architecture 'mlp' of depth 2 without output_norm with the same optimisers and biases "
            f"(a window c with chunk_size + c − 1 ≤ {MAX_MLP_KEYS}, any feature map and activation, each weight ≤ "
            f"{MAX_MLP_WEIGHT} entries); and optimizer 'muon' with architecture 'linear', 'mlp' or "
            f"'gated_mlp' (weights up to {MAX_ROWS} × {MAX_COLS}); per-token reads with one gate per head, in float32, "
            "float16 or bfloat16 on CUDA (or the CPU under TRITON_INTERPRET=1); use impl='chunked' (or 'auto') "
            "otherwise")
