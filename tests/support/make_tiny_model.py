"""Write a tiny random-weight Llama in Hugging Face format that vLLM loads offline.

Why: no model weights can be downloaded on our machines, yet the integration tests,
benchmarks and the demo need a real vLLM engine serving a real model. A 2-layer Llama
with hidden size 128 starts in seconds on CPU and its KV cache costs exactly
2 layers * 2 (K, V) * 4 KV heads * 32 head_dim * 2 bytes (bf16) = 1024 bytes a token,
which makes capacity arithmetic in tests exact.

This script runs inside the vLLM venv (it needs torch and transformers, which the main
.venv does not have); tests/support/tiny_model.py calls it once and caches the result.
Everything is deterministic for a given spec: the training text comes from a seeded
generator, the weights from a seeded torch generator.

Usage: python make_tiny_model.py OUT_DIR SPEC_JSON
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

# No BOS is added by the tokenizer (no post-processor), so the prompt token count that the
# gateway computes with `tokenizers` from tokenizer.json equals vLLM's usage.prompt_tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]

_WORDS_TEXT = (
    "the a an pool tier tenant budget token cache engine model request queue admit reject "
    "borrow floor slot prompt output stream chat completion kube operator gateway priority "
    "latency throughput window replica canary stable rollout capacity memory block page "
    "hello world data value number system user assistant question answer please thanks "
    "is are was be to of in on for with and or not this that it we you they"
)


def build_training_text(seed: int, sentences: int) -> list[str]:
    """Seeded pseudo-English plus digits and punctuation, enough to learn ~2k merges."""
    rng = random.Random(seed)
    vocabulary = _WORDS_TEXT.split()
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qu", "ph", "str"]
    lines = []
    for _ in range(sentences):
        words = []
        for _ in range(rng.randint(4, 18)):
            if rng.random() < 0.7:
                words.append(rng.choice(vocabulary))
            elif rng.random() < 0.5:
                words.append("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
            else:
                words.append(str(rng.randint(0, 99999)))
        sentence = " ".join(words)
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ",", ";"]))
    return lines


def write_tokenizer(out: Path, spec: dict[str, int]) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(build_training_text(spec["seed"], spec["sentences"]), trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call,unused-ignore]
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=spec["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # Keep the template in tokenizer_config.json too (newer transformers write it to
    # chat_template.jinja only); vLLM and older readers find it in either place.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return tok.get_vocab_size()


def write_model(out: Path, spec: dict[str, int], vocab: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if vocab > spec["vocab_size"]:
        raise SystemExit(f"tokenizer vocab {vocab} exceeds model vocab {spec['vocab_size']}")
    torch.manual_seed(spec["seed"])
    config = LlamaConfig(
        vocab_size=spec["vocab_size"],
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        head_dim=spec["head_dim"],
        max_position_embeddings=spec["max_position_embeddings"],
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(str(out), safe_serialization=True)


def main() -> None:
    out = Path(sys.argv[1])
    spec = json.loads(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out, spec)
    write_model(out, spec, vocab)
    print(json.dumps({"out": str(out), "tokenizer_vocab": vocab}))


if __name__ == "__main__":
    main()
