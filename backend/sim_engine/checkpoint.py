"""A checkpoint folder for the simulated engine, as `model.init` writes it: the named model's config.json (its
published dimensions, profiles.py MODELS) and a tokenizer trained on the shipped corpus, and no weights (nothing
computes with them). `python -m backend.sim_engine.checkpoint DIR --model llama-3.1-8b`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Sequence

from backend.cpu_engine.init_model import publish_folder, special_ids, train_tokenizer, write_model_files

from .profiles import DEFAULT_MODEL, MODELS, model_config

#: the trained tokenizer's vocabulary: as large as the corpus gives words for
TOKENIZER_VOCAB = 2048
FAMILY = "llama"


def is_complete(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, name)) for name in ("config.json", "tokenizer.json"))


def create_sim_checkpoint(out_dir: str | os.PathLike[str], model: str = DEFAULT_MODEL) -> str:
    """Write the folder (atomically: built beside it, renamed into place); an existing complete one is kept."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    out = os.path.abspath(os.fspath(out_dir))
    if os.path.isdir(out) and is_complete(out):
        return out
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        tok = train_tokenizer(FAMILY, TOKENIZER_VOCAB)
        ids = special_ids(FAMILY, tok)
        config = {**model_config(model), **{f"{k}_token_id": ids[k] for k in ("bos", "eos", "pad")}}
        write_model_files(tmp, FAMILY, tok, config, int(config["max_position_embeddings"]))
        return publish_folder(tmp, out, is_complete)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backend.sim_engine.checkpoint", description=__doc__)
    ap.add_argument("dir")
    ap.add_argument("--model", choices=tuple(MODELS), default=DEFAULT_MODEL)
    args = ap.parse_args(argv)
    print(create_sim_checkpoint(args.dir, args.model))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
