"""kbv: KernelBench-Verified, an evaluator for LLM-generated GPU kernels that cannot be fooled."""

__version__ = "0.1.0"
