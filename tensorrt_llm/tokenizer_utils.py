"""Tokenizers for checkpoints and engines: load one from a folder or a .gguf file, and
copy one next to converted weights so a checkpoint/engine folder is self-contained."""
import shutil
from pathlib import Path

# The files Hugging Face tokenizers are saved as (whichever of them a model has).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")


def load_tokenizer(path):
    """A transformers tokenizer from a folder holding tokenizer files, or from a .gguf file."""
    from transformers import AutoTokenizer
    path = Path(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if not path.is_dir() or not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files in {path}")
    return AutoTokenizer.from_pretrained(str(path))


def pad_end_ids(tokenizer) -> tuple[int, int]:
    """(pad_id, end_id): generation stops at end_id (EOS); pad_id falls back to it."""
    end_id = tokenizer.eos_token_id
    if end_id is None:
        raise ValueError("the tokenizer has no EOS token")
    pad_id = tokenizer.pad_token_id
    return (end_id if pad_id is None else pad_id), end_id


def save_tokenizer(source, output_dir) -> list[Path]:
    """Writes the tokenizer of `source` (a Hugging Face model folder or a .gguf file) into
    output_dir as Hugging Face tokenizer files. Returns the files written; none when a
    model folder has no tokenizer."""
    source, output_dir = Path(source), Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if source.suffix == ".gguf":
        return [Path(p) for p in load_tokenizer(source).save_pretrained(str(output_dir))
                if Path(p).is_file()]
    written = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            written.append(Path(shutil.copy2(source / name, output_dir / name)))
    return written
