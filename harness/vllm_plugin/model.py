"""A model folder for vLLM to serve, made offline: a Llama-shaped model with random weights and a
tokenizer wirebench ships.

    python -m harness.vllm_plugin.model OUT [--tokenizer wirebench|tekken] [--preset tiny|small]

Run it with the vLLM venv's Python (it needs ``transformers``). ``wirebench`` is the project's own
4,096-token BPE (``datasets/tokenizer.json``) with the chat template wirebench's server renders, so the
same prompts are the same tokens on both servers; ``tekken`` is Mistral's 131,072-token tokenizer from
mistral-common's wheel, served with ``--tokenizer-mode mistral``, so vLLM's messages carry ids and
logits as wide as a production model's. The weights are random: the text is noise, the compute real.
The folder records how it was made (``wirebench.json``); made again with the same settings, it is left
as it is.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.wire.tokenizer import BOS_NAMES, EMBEDDED_TOKENIZER, EOS_NAMES, load_tokenizer

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
    """The template of harness.wire.tokenizer (its docstring), in Jinja for vLLM's chat endpoint."""
    return (
        bos + "{% for m in messages %}<|{{ m['role'] }}|>\n"
        "{% if m['content'] is string %}{{ m['content'] }}"
        "{% else %}{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
        "{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )


def _wirebench_tokenizer(out: Path) -> dict[str, Any]:
    """The embedded tokenizer as a Hugging Face folder; its special ids for the model's config."""
    tok = load_tokenizer()
    shutil.copyfile(EMBEDDED_TOKENIZER, out / "tokenizer.json")
    bos = next((n for n in BOS_NAMES if tok.hf.token_to_id(n) is not None), None)
    eos = next((n for n in EOS_NAMES if tok.hf.token_to_id(n) is not None), None)
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
    from harness.wire.tekken import TEKKEN_FILE, load_tekken

    shutil.copyfile(TEKKEN_FILE, out / "tekken.json")
    tok = load_tekken()
    return {"vocab_size": tok.vocab_size, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def make_model(out: Path, tokenizer: str = "wirebench", preset: str = "tiny", seed: int = 0) -> bool:
    """Write the model folder; False when it exists already, made with the same settings."""
    made = {"tokenizer": tokenizer, "preset": preset, "seed": seed, "shape": asdict(PRESETS[preset])}
    record = out / MADE_WITH
    if record.is_file() and json.loads(record.read_text()) == made:
        return False
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    ids = _tekken_tokenizer(out) if tokenizer == "tekken" else _wirebench_tokenizer(out)
    shape = PRESETS[preset]
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
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.to(dtype=torch.bfloat16)  # type: ignore[call-arg]  # transformers' wrapper hides nn.Module.to
    model.save_pretrained(out, safe_serialization=True)
    record.write_text(json.dumps(made, indent=1))
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.vllm_plugin.model", description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the model folder to write")
    p.add_argument("--tokenizer", choices=("wirebench", "tekken"), default="wirebench")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="the model's shape")
    p.add_argument("--seed", type=int, default=0, help="of the random weights")
    args = p.parse_args(argv)
    made = make_model(args.out, args.tokenizer, args.preset, args.seed)
    print(f"{'made' if made else 'kept'} {args.out} ({args.preset}, {args.tokenizer} tokenizer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
