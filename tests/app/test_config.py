"""RunConfig (app/config.py): built from argparse's namespace, it records exactly the flags the
command parsed, in argparse's order, as results.json's ``config`` always has."""

import json
from pathlib import Path

import pytest

from attnmetrics.app.config import RunConfig
from attnmetrics.app.parser import build_parser
from attnmetrics.app.recipes import recipe_defaults

ARGVS = [
    ["run", "--dataset", "sst", "--data-dir", "d", "--skip", "adversarial", "--consistent-adversary", "0.5", "1"],
    ["run", "--encoder", "gpt", "--pretrained", "pre", "--orders", "attention", "random"],
    ["run", "--dataset", "sst", "--integrated-gradients", "4", "--input-x-gradient"],
    ["train", "--model", "hf:minilm", "--out", "o"],
    ["evaluate", "runs/x", "--out", "o", "--limit", "5"],
    ["run", "--dataset", "sst", "--random-removal", "not-first", "--eraser-rounding", "floor"],
]


@pytest.mark.parametrize("argv", ARGVS, ids=lambda a: a[0])
def test_to_dict_is_the_parsed_namespace(argv):
    args = build_parser().parse_args(argv)
    if args.command in ("run", "train"):
        recipe_defaults(args)
    recorded = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    config = RunConfig.from_namespace(args)
    assert config.to_dict() == recorded
    assert json.dumps(config.to_dict()) == json.dumps(recorded)  # the keys' order too


def test_flags_the_command_lacks_keep_their_defaults():
    config = RunConfig.from_namespace(build_parser().parse_args(["evaluate", "r", "--out", "o"]))
    assert config.protocol is None and config.consistent_adversary is None and not config.diagnostic
    assert "protocol" not in config.to_dict() and config.model_run == Path("r")
    with pytest.raises(AttributeError):
        config.out = Path("elsewhere")  # frozen
