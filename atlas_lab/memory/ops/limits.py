"""What the Triton kernels cover, without importing triton: the plan (memory/plan.py) reads it on every machine.

The kernels' own sizes: the chunk kernel holds a chunk of ≤ MAX_CHUNK tokens and D ≤ MAX_FEATURES features per
program; the MLP chunk kernels a chunk's window of ≤ MAX_MLP_KEYS keys and each weight matrix whole (MLP_ENTRIES);
the Newton–Schulz kernel a matrix of ≤ MAX_ROWS × MAX_COLS after its transpose to rows ≤ cols.
"""
MAX_FEATURES, MAX_CHUNK = 256, 64
MAX_ROWS, MAX_COLS = 128, 512
# The MLP kernels: a chunk's window keys (b + c − 1), and the entries of a weight matrix (each side padded to a power
# of two, ≥ 16; a gated pair counts twice: one block of twice the rows) whose backward fits one block's shared memory
# on sm_90 (232,448 bytes) with 4-byte dot operands, by optimiser; 2-byte operands take twice as many. Compiled for
# sm_90 (tests/kernels/sm90_resources.py, tf32), the backward at 64 × 256 (D 153, H 64, d_v 16, chunk 16, window 8):
# gd 209 KB, momentum 317 KB, muon 193 KB (its Newton–Schulz steps back in column tiles of W1: muon.TILE_BYTES); at
# 64 × 128: momentum 170 KB; muon at 64 × 256 with 32 keys 195 KB, in bfloat16 at 64 × 512 184 KB, 128 × 256 164 KB
# (and a gated pair of 64 × 153, one block of 128 × 256, 164 KB)
MAX_MLP_KEYS = 32
MLP_ENTRIES = {"gd": 64 * 256, "momentum": 64 * 128, "muon": 64 * 256}


def padded(n: int) -> int:
    """A block's side: n padded to a power of two, at least 16 (the kernels' tl.arange blocks)."""
    return max(16, 1 << (n - 1).bit_length())

COVERAGE = ("impl='triton' covers architecture 'linear' with an optimiser linear in the gradients (gd, momentum; "
            f"attentional_bias 'l2' or 'dot', any window and feature map, D ≤ {MAX_FEATURES}, chunk_size ≤ "
            f"{MAX_CHUNK}); architecture 'mlp' of depth 2 or 'gated_mlp', without output_norm, with the same "
            "optimisers and biases "
            f"(a window c with chunk_size + c − 1 ≤ {MAX_MLP_KEYS}, any feature map and activation, each weight's "
            f"padded entries ≤ {MLP_ENTRIES['gd']} with gd, {MLP_ENTRIES['momentum']} with momentum, twice that in "
            "16-bit; a gated pair counts twice); and optimizer 'muon': on 'mlp' of depth 2 or 'gated_mlp' in one "
            f"fused kernel where each weight has no more rows than columns and ≤ {MLP_ENTRIES['muon']} padded entries "
            "(twice that in 16-bit), else with architecture 'linear', 'mlp' or 'gated_mlp' with its Newton–Schulz a "
            f"batched kernel (weights up to {MAX_ROWS} × {MAX_COLS}); per-token reads with one gate per head, in "
            "float32, float16 or bfloat16 on CUDA (or the CPU under TRITON_INTERPRET=1); use impl='chunked' (or "
            "'auto') otherwise")
