"""Typed stubs of vkllm (the Rust extension vkllm._vkllm)."""

import os
from typing import Iterator, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

__version__: str

class VkllmError(Exception):
    """An engine failure (bad file, prompt or option, device error); the
    message is the engine's one sentence."""

class Logits:
    """Logits of shape (rows, n_vocab), float32. ``numpy.asarray(logits)``
    views them without a copy (read-only; the array keeps this alive)."""

    @property
    def shape(self) -> Tuple[int, int]: ...
    @property
    def __array_interface__(self) -> dict: ...
    def __len__(self) -> int: ...
    def __getitem__(self, row: int) -> list[float]: ...

class TextStream(Iterator[str]):
    """Pieces of generated text as the engine produces them; iterating
    waits with the GIL released. Dropping or closing it stops generation."""

    def __iter__(self) -> "TextStream": ...
    def __next__(self) -> str: ...
    def close(self) -> None: ...

Message = Mapping[str, str]

class Model:
    """A GGUF file or Hugging Face directory loaded onto a backend."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        backend: str = "auto",
        context: Optional[int] = None,
        threads: Optional[int] = None,
        kv_cache: Optional[Literal["f16", "f32"]] = None,
        sequences: Optional[int] = None,
    ) -> None:
        """``backend``: "auto", "cpu", "vulkan" or "vulkan:DEVICE";
        ``context``: KV-cache positions (default: the model's, at most
        8192); ``threads``: CPU threads (default: every core);
        ``kv_cache``: the cache's element type (default: f16 on Vulkan,
        f32 on the CPU); ``sequences``: most sequences
        ``generate_batch`` decodes in one pass (default 1)."""

    @property
    def backend(self) -> str: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def chat_template(self) -> Optional[str]: ...
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> str: ...
    def logits(self, tokens: Sequence[int]) -> Logits: ...
    @overload
    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        max_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        seed: Optional[int] = None,
        stop: Optional[Sequence[str]] = None,
        ignore_eos: bool = False,
        stream: Literal[False] = False,
        *,
        json_schema: Optional[Union[Mapping[str, object], str]] = None,
        json_object: bool = False,
        grammar: Optional[str] = None,
        regex: Optional[str] = None,
    ) -> str: ...
    @overload
    def generate(
        self,
        prompt: Union[str, Sequence[int]],
        max_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        seed: Optional[int] = None,
        stop: Optional[Sequence[str]] = None,
        ignore_eos: bool = False,
        *,
        stream: Literal[True],
        json_schema: Optional[Union[Mapping[str, object], str]] = None,
        json_object: bool = False,
        grammar: Optional[str] = None,
        regex: Optional[str] = None,
    ) -> TextStream: ...
    @overload
    def chat(
        self,
        messages: Sequence[Message],
        max_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        seed: Optional[int] = None,
        stop: Optional[Sequence[str]] = None,
        ignore_eos: bool = False,
        stream: Literal[False] = False,
        *,
        json_schema: Optional[Union[Mapping[str, object], str]] = None,
        json_object: bool = False,
        grammar: Optional[str] = None,
        regex: Optional[str] = None,
    ) -> str: ...
    @overload
    def chat(
        self,
        messages: Sequence[Message],
        max_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        seed: Optional[int] = None,
        stop: Optional[Sequence[str]] = None,
        ignore_eos: bool = False,
        *,
        stream: Literal[True],
        json_schema: Optional[Union[Mapping[str, object], str]] = None,
        json_object: bool = False,
        grammar: Optional[str] = None,
        regex: Optional[str] = None,
    ) -> TextStream: ...
    def generate_tokens(
        self,
        tokens: Sequence[int],
        max_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        seed: Optional[int] = None,
    ) -> list[int]: ...
    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        seed: Optional[int] = None,
    ) -> list[list[int]]:
        """Ids after each prompt, decoded together (up to ``sequences`` per
        pass): greedy by default; sampled with a temperature, prompt ``i``
        with ``seed + i``."""
