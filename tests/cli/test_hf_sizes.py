"""hf:gpt2 was built at pipecast's width 512 and vocabulary 8,192 (46.3M parameters), not
GPT-2's own configuration, without a word: where a Hugging Face model is built at other sizes
than its own, one line says so and names the flags that build its own."""

from __future__ import annotations

import pytest

from pipecast.cli.common import note_sizes, workload_from_args
from pipecast.cli.main import build_parser
from pipecast.values.data.registry import get_spec
from pipecast.values.models.sources import hf_config, hf_sizes
from pipecast.values.models.workload import Workload

transformers = pytest.importorskip("transformers")


def test_gpt2_at_pipecasts_defaults_is_said_to_differ_from_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    own = transformers.GPT2Config()  # GPT-2's own sizes, as Hugging Face defines them
    note_sizes(Workload(model="hf:gpt2", dataset="tokens"))
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    assert "hf:gpt2 is built at width 512, heads 8, vocabulary 8,192, positions 256" in out
    assert (
        f"its own configuration has width {own.n_embd}, heads {own.n_head}, vocabulary "
        f"{own.vocab_size:,}, positions {own.n_positions:,} (--width {own.n_embd} --heads "
        f"{own.n_head} --vocab {own.vocab_size} --seq-len {own.n_positions})"
    ) in out


def test_the_flags_it_names_build_the_models_own_configuration() -> None:
    own = transformers.GPT2Config()
    spec = get_spec("tokens", seq_len=own.n_positions, vocab=own.vocab_size)
    assert hf_sizes("gpt2", spec, width=own.n_embd, heads=own.n_head) == ""
    assert "layers 2" in hf_sizes("gpt2", spec, width=own.n_embd, heads=own.n_head, layers=2)


def test_a_zoo_model_gets_no_note(capsys: pytest.CaptureFixture[str]) -> None:
    note_sizes(Workload(model="gpt", dataset="tokens"))
    assert capsys.readouterr().out == ""


def test_hf_llama_is_built_with_the_ffn_and_key_value_heads_given() -> None:
    """--ffn and --kv-heads reach Llama's config (Llama 3's 8 key/value heads of 32 and its
    FFN of 3.5 widths); without them a new width still takes 4 x width and as many
    key/value heads as heads."""
    spec = get_spec("tokens", seq_len=16, vocab=64)
    config = hf_config("llama", spec, width=64, heads=4, kv_heads=2, ffn=224)
    assert (config.intermediate_size, config.num_key_value_heads, config.head_dim) == (224, 2, 16)
    config = hf_config("llama", spec, width=64, heads=4)
    assert (config.intermediate_size, config.num_key_value_heads) == (256, 4)
    assert "key/value heads 2" in hf_sizes("llama", spec, width=64, heads=4, kv_heads=2)


@pytest.mark.parametrize("verb", ["profile", "recommend", "train", "models"])
def test_every_verb_with_heads_takes_kv_heads(verb: str) -> None:
    argv = [verb, "--model", "llama", "--heads", "8", "--kv-heads", "2", "--ffn", "96"]
    workload = workload_from_args(build_parser().parse_args(argv))
    assert (workload.heads, workload.kv_heads, workload.ffn) == (8, 2, 96)
    assert workload.build("meta")[1].attn.k.out_features == 2 * 512 // 8
