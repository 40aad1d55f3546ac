"""Single-turn generation: KernelBench-style prompts to an OpenAI-compatible endpoint, answers written
where `kbv eval` reads them (KernelBench's run layout and a JSONL).

    kbv.generate.api       generate(config) -> GenerateSummary; the records and the output files
    kbv.generate.prompts   templates (one per backend, package data) and their rendering
    kbv.generate.client    the ChatClient boundary, the retry policy, the OpenAI-SDK client and a fake
    kbv.generate.cache     the SQLite response cache
    kbv.generate.extract   which fenced block of a reply is the candidate
    kbv.generate.command   the `kbv generate` command (typer)

The `openai` SDK is optional (`pip install 'kernelbench-verified[generate]'`) and imported only when a
request has to be sent.
"""

from __future__ import annotations

from kbv.generate.api import (
                              GenerateConfig,
                              GenerateSummary,
                              Generation,
                              GenerationStatus,
                              SamplingParams,
                              generate,
)
from kbv.generate.client import ChatClient, FakeChatClient, RetryPolicy
from kbv.generate.prompts import Backend

__all__ = [
    "Backend", "ChatClient", "FakeChatClient", "GenerateConfig", "GenerateSummary", "Generation",
    "GenerationStatus", "RetryPolicy", "SamplingParams", "generate",
]
