"""hf:gpt2 was built at pipecast's width 512 and vocabulary 8,192 (46.3M parameters), not
GPT-2's own configuration, without a word: where a Hugging Face model is built at other sizes
than its own, one line says so and names the flags that build its own."""

from __future__ import annotations

import pytest

from pipecast.cli.common import note_sizes
from pipecast.values.data.registry import get_spec
from pipecast.values.models.sources import hf_sizes
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
