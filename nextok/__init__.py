"""nextok: an LLM inference server for code generation.

`from nextok import LLM, SamplingParams` is the offline API; the server lives in `nextok.server`
and is imported only when used, so `import nextok` needs neither FastAPI nor uvicorn.
"""
from nextok.sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":  # lazy: importing torch and the model code costs seconds
        from nextok.llm import LLM

        return LLM
    raise AttributeError(name)
