"""The CPU kernel of the Newton–Schulz iterations (``cpu.cpp`` next to this file), built on first use.

Each matrix of a batch runs all k iterations, and their recomputing backward, in a per-thread buffer of fused
vector products, instead of the 3k batched matmul calls of ``newton_schulz(impl="bmm")``; the normalisation by
‖X‖_F + eps (the norm taken by PyTorch) and the transpose of a tall matrix run inside it, forward and backward, each
element-wise step the IEEE operation autograd takes, so the values are those of the normalisation written in PyTorch
bit for bit (tests/memory/test_newton_schulz_cpu.py), without its eight passes over the batch. It takes float32 and
float64 CPU tensors; ``reference.newton_schulz(impl="cpu")`` runs it (the plan picks it where it builds; the
batched-matmul path otherwise).

The build (torch.utils.cpp_extension: a C++ compiler and ninja, about a minute) happens once per machine and
torch version; the library is cached under $TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions). A machine
without a compiler gets one warning and the batched-matmul path. ATLAS_LAB_NS_KERNEL=0 in the environment turns the
kernel off (impl "auto" then takes the batched-matmul path).
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import shutil
import sys
import warnings
from pathlib import Path

import torch

from ..operators import register_like_input

SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64)
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp"]


def _build_name() -> str:
    """A name per source, flags, torch, Python and CPU (the library is compiled with -march=native)."""
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
    key = "|".join([SOURCE.read_text(), *CFLAGS, torch.__version__, sys.version, platform.machine(), cpu])
    return "atlas_lab_newton_schulz_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def build_directory() -> Path:
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    return root / _build_name()


@functools.cache
def kernel():
    """The compiled module (forward, backward), or None where it cannot be built."""
    from torch.utils import cpp_extension

    name, directory = _build_name(), build_directory()
    if not any(directory.glob(f"{name}*.so")):
        print(f"atlas-lab: building the CPU Newton–Schulz kernel in {directory} (once, about a minute)",
              file=sys.stderr)
    directory.mkdir(parents=True, exist_ok=True)
    if shutil.which("ninja") is None:  # the pip package's binary, when its bin folder is not on PATH
        try:
            import ninja
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass
    try:
        with open(directory / "atlas-lab.flock", "a") as guard:  # released by the kernel if this process dies
            fcntl.flock(guard, fcntl.LOCK_EX)
            # torch's own build lock: a file that a process killed while loading leaves behind, after which every
            # load waits for it forever; under the flock no other loader holds it, so one found here is stale
            (directory / "lock").unlink(missing_ok=True)
            return cpp_extension.load(name, [str(SOURCE)], build_directory=str(directory), extra_cflags=CFLAGS,
                                      extra_ldflags=["-fopenmp"])
    except Exception as error:  # no compiler, no ninja, a failed build: the batched-matmul path still works
        warnings.warn(f"the CPU Newton–Schulz kernel did not build ({type(error).__name__}: {error}); "
                      "newton_schulz uses batched matmuls instead")
        return None


def norm(G: torch.Tensor) -> torch.Tensor:
    """‖G‖_F [M, 1, 1] of G [M, r, c], taken as reference.newton_schulz takes it: on the matrices the iterations run on
    (Gᵀ where r > c)."""
    return torch.linalg.matrix_norm(G.mT if G.shape[-2] > G.shape[-1] else G, keepdim=True)


@torch.library.custom_op("atlas_lab::newton_schulz_cpu", mutates_args=())
def newton_schulz_cpu(G: torch.Tensor, steps: int, a: float, b: float, c: float, eps: float) -> torch.Tensor:
    """NS_k(G / (‖G‖_F + eps)) for G [M, r, c] (CPU, float32/float64), on Gᵀ where r > c, in G's layout, by the
    compiled kernel: the normalisation and the transpose inside it. A registered operator (its shape function below,
    its backward the kernel's recomputing one), so ``torch.compile`` keeps it in one graph."""
    G = G.contiguous()
    return kernel().forward(G, (norm(G) + eps).view(-1), steps, a, b, c)


@torch.library.custom_op("atlas_lab::newton_schulz_cpu_backward", mutates_args=())
def newton_schulz_cpu_backward(G: torch.Tensor, grad: torch.Tensor, steps: int, a: float, b: float, c: float,
                               eps: float) -> torch.Tensor:
    """∂L/∂G from ∂L/∂NS_k: the kernel recomputes the iterates and takes the division's element-wise backward; the sum
    of its term t over each matrix (∂L/∂d, d = ‖G‖_F + eps) is PyTorch's, as autograd sums it; ``finish`` adds the
    norm's term. The same values as autograd through the normalisation in PyTorch (cpu.cpp)."""
    G = G.contiguous()
    n = norm(G)
    g1, t = kernel().backward(G, (n + eps).view(-1), grad.contiguous(), steps, a, b, c)
    return kernel().finish(G, n.view(-1), g1, t.sum((1, 2), keepdim=True).view(-1))


register_like_input(newton_schulz_cpu, newton_schulz_cpu_backward)


@torch.compiler.assume_constant_result
def available() -> bool:
    """Whether the kernel is not turned off (ATLAS_LAB_NS_KERNEL=0) and builds here: the same answer for the whole
    process, so a compiled graph takes it as a constant."""
    return os.environ.get("ATLAS_LAB_NS_KERNEL") != "0" and kernel() is not None


def applies(X: torch.Tensor) -> bool:
    """Whether the kernel takes X (float32/float64 on the CPU) and is available."""
    return X.device.type == "cpu" and X.dtype in DTYPES and available()
