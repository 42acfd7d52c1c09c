"""init_model: random-weight checkpoints that transformers and the CPU engine both load, written atomically."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from backend.cpu_engine.checkpoint import load_config
from backend.cpu_engine.init_model import SIZES, create_checkpoint, main


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.slow  # imports transformers
def test_checkpoint_loads_in_transformers_with_fast_tokenizer(family: str, tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    path = create_checkpoint(tmp_path / "m", family=family, size="tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.is_fast
    assert tok.eos_token and tok.bos_token and tok.pad_token
    assert tok.eos_token_id is not None and tok.pad_token_id is not None
    ids = tok("A scheduler is a patient thing.")["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "A scheduler is a patient thing."
    assert (ids[0] == tok.bos_token_id) == (family == "llama")  # Llama prepends <s>
    cfg = AutoConfig.from_pretrained(path)
    ours = load_config(path)
    assert cfg.vocab_size == ours.vocab_size == len(tok) and ours.vocab_size <= SIZES["tiny"]["vocab"]
    assert ours.num_layers == 2 and ours.hidden_size == 64 and ours.num_heads == 4
    assert ours.num_kv_heads == (2 if family == "llama" else 4)
    assert ours.eos_token_id == tok.eos_token_id


def test_same_seed_same_weights_and_existing_checkpoint_is_kept(tmp_path: Path) -> None:
    a = create_checkpoint(tmp_path / "a", seed=7)
    b = create_checkpoint(tmp_path / "b", seed=7)
    c = create_checkpoint(tmp_path / "c", seed=8)
    read = lambda p: (Path(p) / "model.safetensors").read_bytes()  # noqa: E731
    assert read(a) == read(b) != read(c)
    mtime = (Path(a) / "model.safetensors").stat().st_mtime_ns
    assert create_checkpoint(tmp_path / "a", seed=7) == a
    assert (Path(a) / "model.safetensors").stat().st_mtime_ns == mtime


def test_concurrent_writers_never_expose_half_a_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "shared"
    errors: list[BaseException] = []
    seen_partial: list[list[str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if target.exists():
                names = sorted(p.name for p in target.iterdir())
                if "config.json" not in names or "model.safetensors" not in names or "tokenizer.json" not in names:
                    seen_partial.append(names)

    def write() -> None:
        try:
            create_checkpoint(target, family="llama")
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    watcher = threading.Thread(target=watch)
    watcher.start()
    writers = [threading.Thread(target=write) for _ in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    watcher.join()
    assert not errors and not seen_partial
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_refuses_non_empty_foreign_folder_and_bad_args(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        create_checkpoint(tmp_path / "x")
    with pytest.raises(ValueError, match="family"):
        create_checkpoint(tmp_path / "y", family="bert")
    with pytest.raises(ValueError, match="size"):
        create_checkpoint(tmp_path / "y", size="huge")


def test_cli_main_and_small_size(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "s"), "--family", "llama", "--size", "small", "--weights-seed", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "s")
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 4 and cfg["hidden_size"] == 256 and cfg["architectures"] == ["LlamaForCausalLM"]
