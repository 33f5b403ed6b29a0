"""A model folder for vLLM to serve, made offline: a Llama-shaped model with random weights and a
tokenizer wirebench ships.

    python -m harness.vllm_plugin.model OUT [--tokenizer wirebench|tekken] [--preset tiny|small] [--vision blip2]

Run it with the vLLM venv's Python (it needs ``transformers``). ``wirebench`` is the project's own
4,096-token BPE (``datasets/tokenizer.json``) with the chat template wirebench's server renders, so the
same prompts are the same tokens on both servers; ``tekken`` is Mistral's 131,072-token tokenizer from
mistral-common's wheel, served with ``--tokenizer-mode mistral``, so vLLM's messages carry ids and
logits as wide as a production model's. The weights are random: the text is noise, the compute real.
``--vision blip2`` makes a BLIP-2 instead (a small ViT and Q-Former before the same decoder, OPT-shaped
as vLLM's BLIP-2 expects; each image 32 tokens), so images go through vLLM's own processor and its
tensors over vLLM's engine link. BLIP-2 because its image processor runs without torchvision: LLaVA's
and PaliGemma's paths in vLLM 0.32 import one that needs it, and torchvision's wheels on the package
index here are CUDA builds that do not load beside the CPU torch. The folder records how it was made
(``wirebench.json``); made again with the same settings, it is left as it is.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.tokenizers.tokenizer import BOS_NAMES, EMBEDDED_TOKENIZER, EOS_NAMES, load_tokenizer

MADE_WITH = "wirebench.json"


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


# tiny: a step of a few ms on 2 cores, so a run's TTFT is mostly the server's own path, not compute.
PRESETS = {
    "tiny": Shape(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=768),
    "small": Shape(hidden=768, layers=8, heads=12, kv_heads=4, intermediate=2048),
}
MAX_POSITIONS = 4096


def _chat_template(bos: str) -> str:
    """The template of harness.tokenizers.tokenizer (its docstring), in Jinja for vLLM's chat endpoint."""
    return (
        bos + "{% for m in messages %}<|{{ m['role'] }}|>\n"
        "{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
        "{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )


def _special_names(tok: Any) -> tuple[str | None, str | None]:
    """The embedded tokenizer's BOS and EOS token names (None where it has none)."""
    bos = next((n for n in BOS_NAMES if tok.hf.token_to_id(n) is not None), None)
    eos = next((n for n in EOS_NAMES if tok.hf.token_to_id(n) is not None), None)
    return bos, eos


def _wirebench_tokenizer(out: Path) -> dict[str, Any]:
    """The embedded tokenizer as a Hugging Face folder; its special ids for the model's config."""
    tok = load_tokenizer()
    shutil.copyfile(EMBEDDED_TOKENIZER, out / "tokenizer.json")
    bos, eos = _special_names(tok)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "model_max_length": MAX_POSITIONS,
        "chat_template": _chat_template(bos or ""),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return {"vocab_size": tok.vocab_size, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def _tekken_tokenizer(out: Path) -> dict[str, Any]:
    """Mistral's tekken file as vLLM's mistral tokenizer mode finds it (``tekken.json`` in the folder)."""
    from harness.tokenizers.tekken import TEKKEN_FILE, load_tekken

    shutil.copyfile(TEKKEN_FILE, out / "tekken.json")
    tok = load_tekken()
    return {"vocab_size": tok.vocab_size, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def make_model(
    out: Path, tokenizer: str = "wirebench", preset: str = "tiny", seed: int = 0, vision: str | None = None
) -> bool:
    """Write the model folder; False when it exists already, made with the same settings."""
    made: dict[str, Any] = {"tokenizer": tokenizer, "preset": preset, "seed": seed, "shape": asdict(PRESETS[preset])}
    if vision:
        if tokenizer != "wirebench":
            raise ValueError("--vision: only with the wirebench tokenizer (it gets an <image> token)")
        made["vision"] = vision
    record = out / MADE_WITH
    if record.is_file() and json.loads(record.read_text()) == made:
        return False
    import torch

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = _blip2(out, PRESETS[preset]) if vision else _llama(out, tokenizer, PRESETS[preset])
    model.to(dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    record.write_text(json.dumps(made, indent=1))
    return True


def _llama(out: Path, tokenizer: str, shape: Shape) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    ids = _tekken_tokenizer(out) if tokenizer == "tekken" else _wirebench_tokenizer(out)
    config = LlamaConfig(
        vocab_size=ids["vocab_size"],
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=ids["bos_token_id"],
        eos_token_id=ids["eos_token_id"],
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


# The vision side of --vision blip2: small, so an image costs the engine little beside the text.
IMAGE_SIZE, PATCH, QUERY_TOKENS, VISION_HIDDEN = 224, 14, 32, 64


def _blip2(out: Path, shape: Shape) -> Any:
    """BLIP-2 with the embedded tokenizer plus an ``<image>`` token; its processor saved beside it."""
    from transformers import (
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        Blip2QFormerConfig,
        Blip2VisionConfig,
        BlipImageProcessor,
        OPTConfig,
        PreTrainedTokenizerFast,
    )

    bos, eos = _special_names(load_tokenizer())
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(EMBEDDED_TOKENIZER), bos_token=bos, eos_token=eos, model_max_length=MAX_POSITIONS
    )
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.image_token = "<image>"
    image_id = tok.convert_tokens_to_ids("<image>")
    assert isinstance(image_id, int)
    template = _chat_template(bos or "")
    tok.chat_template = template
    images = BlipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    Blip2Processor(
        image_processor=images, tokenizer=tok, num_query_tokens=QUERY_TOKENS, chat_template=template
    ).save_pretrained(out)
    text = OPTConfig(
        vocab_size=len(tok),
        hidden_size=shape.hidden,
        ffn_dim=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        word_embed_proj_dim=shape.hidden,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    vision = Blip2VisionConfig(
        hidden_size=VISION_HIDDEN,
        intermediate_size=2 * VISION_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
    )
    qformer = Blip2QFormerConfig(
        hidden_size=VISION_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * VISION_HIDDEN,
        encoder_hidden_size=VISION_HIDDEN,
    )
    config = Blip2Config(
        vision_config=vision.to_dict(),
        qformer_config=qformer.to_dict(),
        text_config=text.to_dict(),
        num_query_tokens=QUERY_TOKENS,
        image_token_index=image_id,
    )
    return Blip2ForConditionalGeneration(config)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.vllm_plugin.model", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the model folder to write")
    p.add_argument("--tokenizer", choices=("wirebench", "tekken"), default="wirebench")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="the model's shape")
    p.add_argument("--seed", type=int, default=0, help="of the random weights")
    p.add_argument("--vision", choices=("blip2",), default=None, help="a vision-language model (module docstring)")
    args = p.parse_args(argv)
    made = make_model(args.out, args.tokenizer, args.preset, args.seed, args.vision)
    kind = f", {args.vision} vision" if args.vision else ""
    print(f"{'made' if made else 'kept'} {args.out} ({args.preset}{kind}, {args.tokenizer} tokenizer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
