"""Transformer rows of the sweep: Hugging Face ``transformers`` models built from their configs
with seeded weights, exported with ``torch.export`` and imported with TVM's
``from_exported_program``.

Nothing is downloaded: each model is its architecture's config at a published size (or a stated
reduction of it), initialized by ``transformers`` under ``torch.manual_seed(0)``. No tokenizer
ships inside an installed wheel, so token ids are seeded; images are the sweep's photos; audio is
a synthesized signal turned into log-mel features by ``WhisperFeatureExtractor`` (built from its
arguments, with no files).

What TVM's importer needs, found by trying (each wrapper below passes it explicitly):

- decoders take an explicit all-ones ``attention_mask``: without one, ``transformers`` 5 looks for
  packed sequences with a ``cumsum`` over a boolean tensor, which TVM compiles to a kernel that
  fails ("Check failed: t.MatchesCode(kDLFloat)");
- BERT-style encoders with a symbolic sequence length take ``position_ids`` and
  ``token_type_ids``: the default ones slice a 512-long buffer to ``min(seq, 512)``, which makes
  the embedding sum's shape unknown, and TVM's VM cannot lower that add.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Seed of the weights and of the token ids.
SEED = 0


@dataclass(frozen=True)
class TransformerModel:
    """One transformer row: how to build it, at the sweep's size and at the tests' tiny size."""

    name: str
    task: str  # encoder | classification | causal-lm
    size: str  # what was built, for the row
    tiny_size: str


@dataclass
class Built:
    """A wrapped ``torch.nn.Module`` ready for ``torch.export`` and its input batches."""

    module: object
    batches: list  # each a list of numpy arrays in the module's argument order
    dynamic_shapes: object = None  # for torch.export: a tuple per argument, or None
    notes: list = None


MODELS = {
    "bert_base": TransformerModel(
        "bert_base", "encoder",
        "BERT-base (12 layers, hidden 768, 12 heads), symbolic sequence length: batches of "
        "64 and 40 tokens", "2 layers, hidden 64, sequences of 16 and 9 tokens"),
    "distilbert_base": TransformerModel(
        "distilbert_base", "encoder",
        "DistilBERT-base (6 layers, hidden 768, 12 heads), 2 sequences of 64 tokens",
        "2 layers, hidden 64, 16 tokens"),
    "vit_small_224": TransformerModel(
        "vit_small_224", "classification",
        "ViT-S/16 (12 layers, hidden 384, 6 heads) at 224 px, 1000 classes, 4 photos",
        "2 layers, hidden 64, 32 px, patch 16"),
    "whisper_base_encoder": TransformerModel(
        "whisper_base_encoder", "encoder",
        "Whisper-base encoder (6 layers, d_model 512, 8 heads, 80 mels) on 5 s of audio "
        "(250 positions; the published model takes 30 s)", "2 layers, d_model 64, 1 s"),
    "gpt2_small": TransformerModel(
        "gpt2_small", "causal-lm",
        "GPT-2 small (12 layers, hidden 768, 12 heads, vocabulary 50257), 48 tokens",
        "2 layers, hidden 64, vocabulary 1000, 16 tokens"),
    "llama_smollm_135m": TransformerModel(
        "llama_smollm_135m", "causal-lm",
        "LLaMA architecture at SmolLM-135M's shape (30 layers, hidden 576, 9 heads, 3 key/value "
        "heads, SwiGLU 1536, vocabulary 49152, tied embeddings), 32 tokens",
        "2 layers, hidden 64, 4 heads, 2 key/value heads, vocabulary 1000, 16 tokens"),
}


#: The ``transformers`` classes and config arguments of the models whose weights the GPU bundle
#: regenerates on its host (``bundle_runner.torch_model``, kind ``transformers``), so that the
#: registry's export and the host build the same config: ``(config class, arguments, tiny
#: arguments, model class, wrapper)``.
CONFIGS = {
    "bert_base": ("BertConfig", {},  # the defaults are BERT-base
                  {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "intermediate_size": 128}, "BertModel", "encoder"),
    "llama_smollm_135m": (
        "LlamaConfig",  # SmolLM-135M's shape
        {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
         "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": True},
        {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000},
        "LlamaForCausalLM", "causal_lm"),
}


def _config(name: str, tiny: bool):
    import transformers

    config_class, full, small, _, _ = CONFIGS[name]
    return getattr(transformers, config_class)(**(small if tiny else full))


def torch_spec(name: str, tiny: bool = False) -> dict:
    """How the GPU bundle's runner rebuilds model ``name`` (a key of :data:`CONFIGS`) with the
    weights :func:`build` gives it: its ``transformers`` config and classes, the wrapper, the
    seed and the argument names (``bundle_runner.torch_model``, kind ``transformers``)."""
    config_class, full, small, model_class, wrapper = CONFIGS[name]
    return {"kind": "transformers", "config_class": config_class,
            "config": dict(small if tiny else full), "model_class": model_class,
            "wrapper": wrapper, "seed": SEED, "inputs": ["input_ids", "attention_mask"]}


# ------------------------------------------------------------------------------ inputs
def token_ids(count: int, length: int, vocab: int, low: int = 1000) -> list[np.ndarray]:
    """``count`` seeded ``(1, length)`` int64 id rows drawn from ``[low, vocab)``, which skips
    the special and unused ids that BERT-family vocabularies keep at the start."""
    rng = np.random.default_rng(SEED)
    low = low if vocab > 2 * low else 1
    return [rng.integers(low, vocab, size=(1, length), dtype=np.int64) for _ in range(count)]


def synthetic_speech(seconds: float, rate: int = 16000, voice: int = 0) -> np.ndarray:
    """A voice-like float32 waveform: a gliding fundamental with harmonics, syllable-rate
    amplitude bursts and a little noise (seeded), peak 0.5. ``voice`` 1, 2... raise the pitch
    and the syllable rate and reseed the noise: another speaker (0 is the sweep's default)."""
    rng = np.random.default_rng(SEED + voice)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 140.0 + 35.0 * voice + 30.0 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    harmonics = sum(np.sin(k * phase) / k for k in range(1, 9))
    syllables = np.clip(np.sin(2 * np.pi * (3.0 + 0.4 * voice) * t), 0.0, None) ** 2
    signal = harmonics * syllables + 0.05 * rng.normal(size=t.size)
    return (0.5 * signal / np.max(np.abs(signal))).astype(np.float32)


def log_mel(audio: np.ndarray, seconds: float, mels: int) -> np.ndarray:
    """Whisper's log-mel input features ``(1, mels, 100 * seconds)`` for ``audio``."""
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=mels, sampling_rate=16000, hop_length=160,
                                        chunk_length=int(seconds), n_fft=400)
    features = extractor(audio, sampling_rate=16000, return_tensors="np").input_features
    return np.ascontiguousarray(features.astype(np.float32))


def vit_pixels(count: int, size: int) -> np.ndarray:
    """The sweep's photos as ViT input: ``(count, 3, size, size)`` scaled to [-1, 1] (the
    mean and std of 0.5 that ViT's image processor uses); past the bundled photos, mirrored
    (:func:`relay_amp.eval.models.photo_pixels`)."""
    from .data import normalize
    from .models import photo_pixels

    return normalize(photo_pixels(count, size, distinct=True), mean=(0.5, 0.5, 0.5),
                     std=(0.5, 0.5, 0.5))


# ------------------------------------------------------------------------------ wrappers
def _torch():
    import torch

    return torch


def _encoder_wrapper(model, explicit_positions: bool):
    torch = _torch()

    class Encoder(torch.nn.Module):
        """(last hidden state, pooled vector): the pooler's output where the model has one,
        else the first ([CLS]) token's hidden state."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            kwargs = {}
            if explicit_positions:
                kwargs = {"token_type_ids": torch.zeros_like(input_ids),
                          "position_ids": torch.arange(input_ids.shape[1]).unsqueeze(0)}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            hidden = out.last_hidden_state
            pooled = getattr(out, "pooler_output", None)
            return hidden, hidden[:, 0] if pooled is None else pooled

    return Encoder()


def _causal_lm_wrapper(model):
    torch = _torch()

    class CausalLM(torch.nn.Module):
        """Next-token logits of every position, with an explicit attention mask."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              use_cache=False).logits

    return CausalLM()


def _whisper_wrapper(encoder):
    torch = _torch()

    class WhisperEncoder(torch.nn.Module):
        """(last hidden state, its mean over time)."""

        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_features):
            hidden = self.encoder(input_features=input_features).last_hidden_state
            return hidden, hidden.mean(dim=1)

    return WhisperEncoder()


def _vit_wrapper(model):
    torch = _torch()

    class ViT(torch.nn.Module):
        """Class logits."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).logits

    return ViT()


# ------------------------------------------------------------------------------ builders
def _ids_and_masks(ids: list) -> list:
    return [[row, np.ones_like(row)] for row in ids]


def _bert(tiny: bool, count: int) -> Built:
    import transformers

    torch = _torch()
    config = _config("bert_base", tiny)
    model = transformers.BertModel(config).eval()
    lengths = (16, 9) if tiny else (64, 40)
    rng_rows = [token_ids(1, n, config.vocab_size)[0] for n in lengths]
    for i in range(len(lengths), count):  # further rows alternate the two lengths
        rng_rows.append(token_ids(i + 1, lengths[i % 2], config.vocab_size)[i])
    seq = torch.export.Dim("seq", min=2, max=config.max_position_embeddings)
    return Built(_encoder_wrapper(model, explicit_positions=True), _ids_and_masks(rng_rows),
                 ({1: seq}, {1: seq}),
                 ["symbolic sequence length: one compiled module runs both batches",
                  "position_ids and token_type_ids passed explicitly (TVM cannot lower the "
                  "default ones' min(seq, 512) slice)"])


def _distilbert(tiny: bool, count: int) -> Built:
    import transformers

    config = (transformers.DistilBertConfig(dim=64, n_layers=2, n_heads=2, hidden_dim=128)
              if tiny else transformers.DistilBertConfig())  # the defaults are DistilBERT-base
    model = transformers.DistilBertModel(config).eval()
    ids = token_ids(max(1 if tiny else 2, count), 16 if tiny else 64, config.vocab_size)
    return Built(_encoder_wrapper(model, explicit_positions=False), _ids_and_masks(ids))


def _vit(tiny: bool, count: int) -> Built:
    import transformers

    if tiny:
        config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=128,
                                        image_size=32, patch_size=16, num_labels=10)
    else:  # ViT-S/16 (DeiT-small's shape)
        config = transformers.ViTConfig(hidden_size=384, num_hidden_layers=12,
                                        num_attention_heads=6, intermediate_size=1536,
                                        image_size=224, patch_size=16, num_labels=1000)
    model = transformers.ViTForImageClassification(config).eval()
    batch = 1 if tiny else 2
    pixels = vit_pixels(max(2 if tiny else 4, count * batch), config.image_size)
    batches = [[pixels[i:i + batch]] for i in range(0, len(pixels), batch)]
    return Built(_vit_wrapper(model), batches)


def _whisper(tiny: bool, count: int) -> Built:
    import transformers

    seconds = 1 if tiny else 5
    positions = 50 * seconds  # 100 frames a second, halved by the second convolution
    if tiny:
        config = transformers.WhisperConfig(d_model=64, encoder_layers=2,
                                            encoder_attention_heads=2, encoder_ffn_dim=128,
                                            decoder_layers=1, decoder_attention_heads=2,
                                            decoder_ffn_dim=128, num_mel_bins=80,
                                            max_source_positions=positions)
    else:  # Whisper-base
        config = transformers.WhisperConfig(d_model=512, encoder_layers=6,
                                            encoder_attention_heads=8, encoder_ffn_dim=2048,
                                            decoder_layers=6, decoder_attention_heads=8,
                                            decoder_ffn_dim=2048, num_mel_bins=80,
                                            max_source_positions=positions)
    from transformers.models.whisper.modeling_whisper import (
        WhisperEncoder,
    )

    encoder = WhisperEncoder(config).eval()
    batches = [[log_mel(synthetic_speech(seconds, voice=i), seconds, config.num_mel_bins)]
               for i in range(max(1, count))]
    return Built(_whisper_wrapper(encoder), batches,
                 notes=["input: log-mel features of a synthesized voice-like signal"
                        + (f" ({len(batches)} voices)" if len(batches) > 1 else "")])


def _gpt2(tiny: bool, count: int) -> Built:
    import transformers

    config = (transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=1000,
                                      bos_token_id=999, eos_token_id=999)
              if tiny else transformers.GPT2Config())  # the defaults are GPT-2 small
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = token_ids(max(1, count), 16 if tiny else 48, config.vocab_size)
    return Built(_causal_lm_wrapper(model), _ids_and_masks(ids),
                 notes=["explicit all-ones attention_mask (without it TVM cannot compile "
                        "transformers' packed-sequence check)"])


def _llama(tiny: bool, count: int) -> Built:
    import transformers

    config = _config("llama_smollm_135m", tiny)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = token_ids(max(1, count), 16 if tiny else 32, config.vocab_size)
    return Built(_causal_lm_wrapper(model), _ids_and_masks(ids),
                 notes=["explicit all-ones attention_mask (without it TVM cannot compile "
                        "transformers' packed-sequence check)"])


_BUILDERS = {"bert_base": _bert, "distilbert_base": _distilbert, "vit_small_224": _vit,
             "whisper_base_encoder": _whisper, "gpt2_small": _gpt2,
             "llama_smollm_135m": _llama}


def build(name: str, tiny: bool = False, batches: int | None = None) -> Built:
    """The wrapped model ``name`` (a key of :data:`MODELS`) with seeded weights, and its input
    batches; ``tiny`` gives the small configuration the tests use. ``batches`` asks for at least
    that many input batches (None: the model's own, which a larger count extends: further
    seeded token rows, photos or voices; the first batches stay the same)."""
    if name not in _BUILDERS:
        raise KeyError(f"unknown transformer model {name!r}; known: {', '.join(_BUILDERS)}")
    torch = _torch()
    torch.manual_seed(SEED)
    with torch.no_grad():
        built = _BUILDERS[name](tiny, batches or 0)
    built.notes = list(built.notes or [])
    return built


def reference_outputs(built: Built) -> list:
    """PyTorch's float32 outputs for every batch (lists of numpy arrays)."""
    torch = _torch()
    results = []
    with torch.no_grad():
        for batch in built.batches:
            out = built.module(*[torch.from_numpy(x) for x in batch])
            out = out if isinstance(out, tuple) else (out,)
            results.append([o.numpy() for o in out])
    return results


def to_relax(built: Built):
    """``torch.export`` the wrapped module on its first batch (with its dynamic shapes, if any)
    and import it as ``relay-amp convert`` imports a ``.pt2``; weights become constants of the
    module."""
    from ..cli.frontends import exported_to_relax

    torch = _torch()
    example = tuple(torch.from_numpy(x) for x in built.batches[0])
    with torch.no_grad():
        exported = torch.export.export(built.module, example,
                                       dynamic_shapes=built.dynamic_shapes)
    return exported_to_relax(exported, keep_params_as_input=False)


__all__ = ["MODELS", "TransformerModel", "Built", "build", "to_relax", "reference_outputs",
           "token_ids", "synthetic_speech", "log_mel", "vit_pixels", "SEED", "CONFIGS",
           "torch_spec"]
