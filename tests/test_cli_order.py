"""Every command takes its files before or after its options: `vitkit trust CKPT --out DIR
IMAGES` is read as `vitkit trust CKPT IMAGES --out DIR` (cli.main parses each command's
arguments intermixed)."""

import argparse

import pytest
import torch

import vitkit
from vitkit import cli, commands

CANDIDATES = ("7", "16", "0.5", "a")


def _parses(parser, argv) -> argparse.Namespace | None:
    try:
        return parser.parse_intermixed_args(argv)
    except SystemExit:
        return None


def _words(action: argparse.Action) -> list[str] | None:
    """Words that fill ``action``: none for a flag, else the first of its choices or of
    CANDIDATES that its type takes (twice where it takes several); None if none does."""
    if action.nargs == 0:
        return []
    many = 2 if action.nargs in ("*", "+") else action.nargs if isinstance(action.nargs, int) \
        else 1
    for word in ([str(c) for c in action.choices] if action.choices else CANDIDATES):
        try:
            if action.type is not None and not action.choices:
                action.type(word)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        return [word] * many
    return None


def _file(action: argparse.Action) -> list[str]:
    word = str(next(iter(action.choices))) if action.choices else "x.safetensors"
    return [word] * (2 if action.nargs in ("*", "+") else 1)


@pytest.mark.parametrize("name", list(commands.COMMANDS))
def test_files_may_come_after_the_options(name):
    cli.build_parser(name)
    parser = cli.PARSERS[name]
    positionals = [a for a in parser._actions if not a.option_strings]
    if not positionals:
        pytest.skip(f"vitkit {name} takes no files")
    files = [w for a in positionals for w in _file(a)]
    required = [w for a in parser._actions if a.option_strings and a.required
                for w in (a.option_strings[-1], *_words(a))]
    tried = 0
    for option in parser._actions:
        words = _words(option) if option.option_strings and not option.required else None
        if option.dest == "help" or words is None or _parses(parser, [
                *files, *required, option.option_strings[-1], *words]) is None:
            continue  # help, a required option (always given), or no value of ours fits
        flag = [option.option_strings[-1], *words]
        first = parser.parse_intermixed_args([*files, *required, *flag])
        # an option of several values takes the words after it: there the files go first
        several = option.nargs in ("*", "+")
        last = parser.parse_intermixed_args(
            [*required, *files, *flag] if several else [*flag, *required, *files])
        assert vars(first) == vars(last), (name, option.dest)
        assert all(getattr(last, a.dest) is not None for a in positionals)
        tried += 1
    others = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert tried >= min(2, len(others)), (name, tried)  # every command with options is tried


def test_trust_with_its_images_after_out(tmp_path, capsys):
    """The case the issue names, as a user types it."""
    from PIL import Image

    model = vitkit.create_model("vit_nano_patch4_32", num_classes=3)
    ckpt = vitkit.save_model(model, tmp_path / "m.safetensors")
    Image.fromarray((torch.rand(32, 32, 3) * 255).byte().numpy()).save(tmp_path / "a.png")
    assert cli.main(["trust", str(ckpt), "--out", str(tmp_path / "o"),
                     str(tmp_path / "a.png"), "--methods", "rollout"]) == 0
    assert (tmp_path / "o" / "trust.csv").exists()
